"""Presenting a RewriteResult: rich tables for people, one JSON document for pipelines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphmem.analysis.inspect import order_spread
from graphmem.report.inspect_report import shows_spread, spread_sentence, threads_label
from graphmem.report.tables import print_table
from graphmem.rewrite import MIN_SAVING, RewriteResult
from graphmem.units import format_bytes, format_shape

if TYPE_CHECKING:  # rich is imported by the renderers: JSON output needs none of it
    from rich.console import Console


def rewrite_document(result: RewriteResult, output: str, plot: str | None = None) -> dict:
    plan, choice = result.plan, result.choice
    return {
        "model": str(result.model.path),
        "output": output,
        "plot": plot,
        "format": result.model.format.value,
        "function": result.model.function_name,
        "policy": choice.policy,
        "policy_note": choice.note,
        "fallback": choice.fallback,
        "checkpoints": [c.name for c in result.checkpoints],
        "checkpoint_details": result.checkpoints,
        "copied_ops": plan.copied_ops,
        "rewired_inputs": plan.rewired_inputs,
        "segments": plan.segments,
        "segments_not_held_back": plan.not_held_back,
        "kept_not_recomputable": plan.kept_blocked,
        "kept_statistics": plan.kept_statistics,
        "checkpoints_to_tree_roots": plan.checkpoints_to_tree_roots,
        "checkpoints_past_fusions": plan.checkpoints_past_fusions,
        "held_through_identity": plan.held_through_identity,
        "reshapes_aligned": plan.reshapes_aligned,
        "update_guards": plan.update_guards,
        "groups_released_to_avoid_cycles": plan.cycle_breaks,
        "shape_readers_released": plan.shape_readers_released,
        "weight_gradients_run_first": plan.order_edges,
        "nodes": {"before": result.nodes_before, "after": result.nodes_after},
        "reverted": result.reverted,
        "early_updates": result.early,
        "in_place_terms": result.passes.get("in-place terms"),
        "pool_first": result.passes.get("pool first"),
        "late_gradients": result.passes.get("late gradients"),
        "removed_ops_guard": result.passes.get("removed ops guard"),
        "regroup_guard": result.passes.get("regroup guard"),
        "reader_barriers": result.passes.get("reader barriers"),
        "fusion_guard": result.passes.get("fusion guard"),
        "loop_bodies_v1": _loops_v1_doc(result),
        "budget": None if result.budget is None else {
            "budget_bytes": result.budget_bytes, "method": result.budget.method,
            "plan": result.budget.chosen,
            "feasible": result.budget.feasible, "min_peak_bytes": result.budget.min_peak,
            "model_peak_bytes": result.budget.model_peak,
            "extra_flops": result.budget.extra_flops,
            "forward_flops": result.budget.total_flops},
        "before": _estimate_doc(result.before, result.swap is not None),
        "after": _estimate_doc(result.after, result.swap is not None),
        "modelled_step_time": _step_time_doc(result),
        "loop_bodies": None if result.loops is None else {
            "policy": result.loops.policy, "loops": result.loops.loops,
            "left_whole": result.loops.skipped},
        "swap": None if result.swap is None else {
            "pairs": result.swap.pairs, "swapped_tensors": result.swap.swapped_tensors,
            "bytes_moved_per_step": result.swap.bytes_moved, "skipped": result.swap.skipped},
    }


def _loops_v1_doc(result: RewriteResult) -> dict | None:
    """Recompute inside v1 loops: per rewritten loop, the values no longer stacked and the
    bytes per iteration; loops left alone and why. None when the pass did not run."""
    lp = result.loops_v1
    if lp is None:
        return None
    return {"loops": lp.loops, "skipped": lp.skipped,
            "freed_bytes_per_step": lp.freed_bytes if not result.reverted else 0}


def _step_time_doc(result: RewriteResult) -> dict | None:
    ratio = result.modelled_step_time
    return None if ratio is None else {"one_thread": round(ratio[0], 3),
                                       "two_threads": round(ratio[1], 3)}


def _estimate_doc(est, swapping: bool) -> dict:
    doc = {"estimated_peak_bytes": est.estimated_bytes,
           "ranking_peak_bytes": est.peak_bytes,  # variables kept in their chunks
           "persistent_bytes": est.persistent_bytes,
           "peak_op": est.peak_op, "peak_phase": est.phase,
           "peak_by_device": est.peak_by_device,
           "notes": est.notes, "peak_spread": order_spread(est)}
    if swapping:
        doc["host_peak_bytes"] = est.host_peak_bytes
    return doc


SHOWN_ROWS = 20  # rows per table in the terminal; --json has them all


def _more(console: Console, count: int, what: str) -> None:
    if count > SHOWN_ROWS:
        console.print(f"... and {count - SHOWN_ROWS} more {what} (see --json)")


def render_rewrite(result: RewriteResult, output: str, console: Console,
                   plot: str | None = None) -> None:
    from rich.table import Table

    plan, choice = result.plan, result.choice
    console.print(f"[bold]{result.model.path}[/] -> [bold]{output}[/]")
    console.print(f"policy [bold]{choice.policy}[/]: {choice.note}")
    if choice.unmatched:
        console.print(f"[yellow]not found or not recomputable[/]: {', '.join(choice.unmatched)}")
    t = Table(title=f"checkpoints: {len(result.checkpoints)}", title_justify="left")
    t.add_column("tensor", overflow="fold")
    t.add_column("shape")
    t.add_column("bytes", justify="right", no_wrap=True)
    for c in result.checkpoints[:SHOWN_ROWS]:
        t.add_row(c.name, format_shape(c.shape), format_bytes(c.bytes))
    if result.checkpoints:
        print_table(console, t)
        _more(console, len(result.checkpoints), "checkpoints")
    s = Table(title=f"recompute: {plan.copied_ops} ops copied in {len(plan.segments)} segments, "
                    f"{plan.rewired_inputs} backward inputs rewired", title_justify="left")
    s.add_column("segment", justify="right")
    s.add_column("after checkpoint", overflow="fold", ratio=1)
    s.add_column("ops", justify="right")
    s.add_column("copies", justify="right")
    s.add_column("held back by (backward ops)", overflow="fold", ratio=2)
    for seg in plan.segments[:SHOWN_ROWS]:
        trig = "\n".join(seg.triggers[:2]) + (f"\n(+{len(seg.triggers) - 2} more)"
                                               if len(seg.triggers) > 2 else "")
        if trig and seg.ahead:
            trig = "next segment's: " + trig
        s.add_row(str(seg.index), seg.checkpoint or "(start)", str(len(seg.targets)),
                  str(seg.copied_ops), trig or "[red]nothing[/]")
    if plan.segments:
        print_table(console, s)
        _more(console, len(plan.segments), "segments")
    for why, count in plan.kept_blocked.items():
        console.print(f"[yellow]kept[/]: {count} saved activations, not recomputable: {why}")
    if plan.kept_statistics:
        console.print(f"[yellow]kept[/]: {plan.kept_statistics} saved activations, batch "
                      "statistics (an unfused batch norm's moments): not recomputed")
    if plan.checkpoints_to_tree_roots:
        console.print(f"[yellow]moved[/]: {plan.checkpoints_to_tree_roots} checkpoints inside "
                      "a sum or product Grappler regroups, to its result (TF rounds it as "
                      "in the original)")
    if plan.checkpoints_past_fusions:
        console.print(f"[yellow]moved[/]: {plan.checkpoints_past_fusions} checkpoints on an op "
                      "TensorFlow merges with its reader into one kernel, to the reader's "
                      "result (TF rounds it as in the original)")
    if plan.not_held_back:
        console.print(f"[red]warning[/]: segments {plan.not_held_back} have no trigger; their "
                      "copies may run during the forward pass and save nothing")
    if plan.cycle_breaks:
        console.print(f"[yellow]note[/]: {plan.cycle_breaks} groups of copies are not held "
                      "back: their triggers would have waited for each other's copies")
    if result.loops is not None:
        _render_loops(result, console)
    _render_loops_v1(result, console)
    if result.swap is not None:
        _render_swap(result, console)
    if result.early is not None:
        e = result.early
        console.print(f"early updates: {e.updates} optimizer updates run as soon as their "
                      f"gradient is ready ({e.edges} control edges"
                      + (f", {e.release_edges} from the last readers of their variables"
                         if e.release_edges else "")
                      + (f"; {e.covered} slot writes move with them" if e.covered else "")
                      + ")"
                      + (f"; split {', '.join(e.split_identityn)} (one Identity per gradient)"
                         if e.split_identityn else "")
                      + "".join(f"; {n} skipped: {why}" for why, n in e.skipped.items()))
        if e.loop_sums_held:
            console.print(f"loop sums: {e.loop_sums_held} weight-gradient terms in v1 gradient "
                          "loops wait for their running sum (iterations no longer run ahead "
                          "holding them)")
        if e.last_readers:
            console.print(f"last readers: {e.last_readers} gradients are read last by an "
                          "element-wise op, which writes into their buffer "
                          f"({format_bytes(e.last_reader_bytes)} no longer allocated beside them)")
        if e.late_terms:
            console.print(f"late terms: {e.late_terms} weight-decay terms are computed just "
                          f"before the gradient they are added to ({format_bytes(e.late_term_bytes)}"
                          " no longer waits through the backward pass)")
    pool_first = result.passes.get("pool first")
    if pool_first is not None and pool_first.pools:
        console.print(f"pool first: {len(pool_first.pools)} max poolings' gradients mask the "
                      "incoming gradient before they scatter it, into the pooled input's "
                      f"buffer ({format_bytes(pool_first.bytes)} no longer allocated beside it)")
    in_place = result.passes.get("in-place terms")
    if in_place is not None and in_place.terms:
        console.print(f"in-place terms: {len(in_place.terms)} weight-decay terms are added into "
                      f"their gradient in {in_place.pieces} pieces "
                      f"({format_bytes(in_place.bytes)} no longer allocated beside it)")
    late = result.passes.get("late gradients")
    if late is not None and late.moved:
        console.print(f"late gradients: {len(late.moved)} weight gradients far larger than "
                      "their inputs wait for the backward pass's lowest point "
                      f"({format_bytes(sum(m.bytes for m in late.moved))}; largest: "
                      f"{late.moved[0].gradient}, after {late.moved[0].after})"
                      + (f"; {late.ungated} taken out of tf.gradients' gate, which made the "
                         "input gradient beside each wait for it" if late.ungated else ""))
    removed = result.passes.get("removed ops guard")
    if removed is not None and removed.changed:
        console.print(f"removed-ops guard: {removed.edges_moved} ordering edges moved and "
                      f"{removed.edges_dropped} left out, off ops TensorFlow removes (an "
                      "edge would keep one, and change how it regroups the ops around it)")
    regroup = result.passes.get("regroup guard")
    if regroup is not None and (regroup.changed or regroup.trees_changed):
        console.print(f"regroup guard: {regroup.edges_moved} ordering edges moved and "
                      f"{regroup.edges_dropped} left out, off {regroup.trees} sums and "
                      "products TensorFlow regroups (an edge on one would change its "
                      "rounding)" + (f"; {regroup.trees_changed} still differ and may round "
                                     "differently" if regroup.trees_changed else ""))
    barriers = result.passes.get("reader barriers")
    if barriers is not None and barriers.barriers:
        console.print(f"reader barriers: {barriers.barriers} sums and products read once "
                      "by an op of their kind (the original's were read more) are read "
                      "through an Identity TensorFlow keeps, so that it does not regroup "
                      "them with that op")
    guard = result.passes.get("fusion guard")
    if guard is not None and guard.edges_removed:
        console.print(f"fusion guard: {guard.edges_removed} ordering edges left out (each "
                      "would close a cycle once TensorFlow merges a weight gradient with "
                      "its bias gradient)")
    b, a = result.before, result.after
    ratio = f" ({a.estimated_bytes / b.estimated_bytes:.2f}x)" if b.estimated_bytes else ""
    console.print(f"estimated step peak: {format_bytes(b.estimated_bytes)} -> "
                  f"[bold]{format_bytes(a.estimated_bytes)}[/]{ratio}, persistent "
                  f"{format_bytes(a.persistent_bytes)}")
    for label, est in (("before", b), ("after", a)):
        if est.estimated_bytes > est.peak_bytes:
            console.print(f"  {label}: {format_bytes(est.peak_bytes)} as plans are ranked "
                          "(one inter-op thread, the variables kept in their chunks), up to "
                          f"{format_bytes(est.estimated_bytes)} with what else a training "
                          "run may reach: two threads, updates that give variables new "
                          "buffers (whole values assigned, copies made while a read is "
                          "pending or of a value a constant initialized) and so move the "
                          "allocator's chunks from step to step, oneDNN's workspaces")
    times = result.modelled_step_time
    if times is not None and not result.reverted:
        console.print(f"modelled step time: {times[0]:.2f}x at one inter-op thread, "
                      f"{times[1]:.2f}x at two (from FLOPs and bytes moved, not measured)")
    console.print(f"nodes: {result.nodes_before} -> {result.nodes_after}")
    if result.reverted:
        console.print("[yellow]the rewrite would not lower the estimated highest peak by "
                      f"{MIN_SAVING:.0%} or more (or one tower's): wrote the graph "
                      "unchanged[/] (--keep-worse keeps it)")
    width = 30
    top = max(b.estimated_bytes, a.estimated_bytes, 1)
    for label, est, color in (("before", b, "blue"), ("after ", a, "green")):
        bar = "█" * max(1, round(width * est.estimated_bytes / top))
        console.print(f"  {label} [{color}]{bar}[/] {format_bytes(est.estimated_bytes)}")
    for label, est in (("before", b), ("after", a)):
        console.print(f"  peak {label}: at {est.peak_op}{_phase_note(est.phase)}")
    for label, est in (("before", b), ("after", a)):
        if shows_spread(est.estimated_bytes, est.lowest_peak_bytes):
            console.print("  " + spread_sentence(
                est.estimated_bytes, est.lowest_peak_bytes,
                threads_label(est.phase, est.highest_threads), est.lowest_phase, label,
                high_walk=est.highest_walk, low_walk=est.lowest_walk,
                carried=est.estimated_bytes > max((o.peak_bytes for o in est.orders),
                                                  default=0)))
    if plot:
        console.print(f"plot written to {plot}")


def _phase_note(phase: str | None) -> str:
    """Where the peak falls when it is in a training run's first steps only."""
    if phase == "warm-up":
        return " (in a training run's first ~90 steps, when TensorFlow runs small ops apart)"
    return ""


def _render_loops(result: RewriteResult, console: Console) -> None:
    loops = result.loops
    for lp in loops.loops:
        saved = "unknown bytes" if lp.bytes_saved_per_iteration is None else \
            format_bytes(lp.bytes_saved_per_iteration)
        console.print(f"loop bodies ({loops.policy}): {lp.loop}: {len(lp.rebuilt)} of "
                      f"{lp.accumulated_before} accumulated values rebuilt in "
                      f"{lp.gradient_loop} ({lp.copied_ops} ops copied), {saved} less per "
                      "iteration"
                      + (f"; lists now hold {', '.join(lp.now_accumulated)}"
                         if lp.now_accumulated else "")
                      + (f"; {lp.sums_held_back} gradient sums made to wait for their "
                         "running total" if lp.sums_held_back else ""))
        console.print(f"  no longer accumulated: {', '.join(lp.rebuilt)}")
    for name, why in loops.skipped.items():
        if why != "no tensor lists for a gradient loop":
            console.print(f"[yellow]loop left whole[/]: {name}: {why}")


def _render_loops_v1(result: RewriteResult, console: Console) -> None:
    lp = result.loops_v1
    if lp is None:
        return
    for loop in lp.loops:
        steps = f"x {loop.trip_count} iterations" if loop.trip_count else "per iteration"
        console.print(
            f"recompute in loop [bold]{loop.frame}[/]: {len(loop.recomputed)} values no longer "
            f"stacked ({format_bytes(loop.freed_bytes_per_iteration)} per iteration, {steps}),"
            f" recomputed by {loop.copied_ops} ops in {loop.gradient_frame}"
            + (f"; {len(loop.new_stacks)} kept values given a stack "
               f"({format_bytes(loop.added_bytes_per_iteration)} per iteration)"
               if loop.new_stacks else "")
            + "".join(f"; {n} still stacked: {why}" for why, n in loop.still_stacked.items()))
    for skip in lp.skipped:
        console.print(f"[yellow]loop {skip['frame']} left as it is[/]: {skip['why']}")


def _render_swap(result: RewriteResult, console: Console) -> None:
    from rich.table import Table

    swap = result.swap
    t = Table(title=f"swap: {swap.swapped_tensors} tensors in {len(swap.pairs)} swap pairs, "
                    f"{format_bytes(swap.bytes_moved)} moved per step", title_justify="left")
    t.add_column("tensor")
    t.add_column("bytes", justify="right")
    t.add_column("swap-in")
    t.add_column("trigger")
    t.add_column("ahead", justify="right")
    for p in swap.pairs[:SHOWN_ROWS]:
        t.add_row(p.tensor, format_bytes(p.bytes), p.swap_in.rsplit("/", 1)[-1],
                  p.trigger or "[red]none[/]", f"{p.distance} ({p.how})" if p.distance else "-")
    if swap.pairs:
        print_table(console, t)
        _more(console, len(swap.pairs), "swap pairs")
    for why, count in swap.skipped.items():
        console.print(f"[yellow]not swapped[/]: {count} tensors, {why}")
    console.print(f"host memory: peak {format_bytes(result.after.host_peak_bytes)} "
                  "(not counted in the device peak below)")
