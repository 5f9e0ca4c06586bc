"""The rich terminal view of InspectFacts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphmem.analysis.inspect import InspectFacts
from graphmem.report.tables import print_table
from graphmem.units import format_bytes, format_shape

if TYPE_CHECKING:  # rich is imported by the renderers: JSON output needs none of it
    from rich.console import Console


def render_inspect(facts: InspectFacts, console: Console) -> None:
    from rich.table import Table

    m = facts.model
    where = m["path"] + f"  [dim]{m['format']}"
    if m["tags"]:
        where += f", tags {','.join(m['tags'])}"
    if m["function"]:
        where += f", function {m['function']}"
    console.print(f"[bold]{where}[/]")
    r = facts.regions
    console.print(
        f"{facts.nodes} nodes: {r['forward']} forward, {r['backward']} backward, "
        f"{r['optimizer']} optimizer, {r['state_updates']} state updates, {r['other']} other")
    console.print(f"loss: {', '.join(facts.loss) or '[yellow]not found[/]'}")
    sa = facts.saved_activations
    if facts.sizes_unknown:
        console.print(f"[yellow]sizes unknown[/]: {facts.sizes_unknown} to see bytes and the "
                      "estimated peak")
    else:
        _render_peak(facts, console)
    total = "" if sa["total_bytes"] is None else f", {format_bytes(sa['total_bytes'])}"
    t = Table(title=f"saved activations: {sa['count']} tensors{total}", title_justify="left")
    t.add_column("tensor")
    t.add_column("shape")
    t.add_column("dtype")
    t.add_column("bytes", justify="right")
    for s in sa["largest"]:
        t.add_row(s.name, format_shape(s.shape), s.dtype, format_bytes(s.bytes))
    print_table(console, t)

    ops = Table(title="most frequent op types", title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, count in facts.top_op_types:
        ops.add_row(op, str(count))
    v = facts.variables
    var = Table(title=f"variables: {v['count']}, {format_bytes(v['total_bytes'])}",
                title_justify="left")
    var.add_column("variable")
    var.add_column("shape")
    var.add_column("bytes", justify="right")
    for x in v["largest"][:5]:
        var.add_row(x.name, format_shape(x.shape), format_bytes(x.bytes))
    print_table(console, ops)
    print_table(console, var)
    console.print("devices: " + ", ".join(f"{d} ({n})" for d, n in facts.devices.items()))
    cf = facts.control_flow
    if cf["v1_frames"] or cf["v2_ops"]:
        console.print(f"control flow: {len(cf['v1_frames'])} v1 loop frames, "
                      f"{len(cf['v2_ops'])} v2 While/If ops")
        for lp in cf.get("loops", []):
            trip = lp.trip_count if lp.trip_count is not None else "unknown"
            console.print(f"  loop {lp.name} ({lp.kind}): {trip} iterations ({lp.how}), "
                          f"{lp.accumulators} values accumulated per iteration")
    for u in facts.untouched:
        ex = f" (e.g. {', '.join(u.examples[:3])})" if u.examples else ""
        console.print(f"[yellow]not touched[/]: {u.count} {u.what}: {u.why}{ex}")


def _render_peak(facts: InspectFacts, console: Console) -> None:
    from rich.table import Table

    batch = ""
    if facts.batch_size:
        source = {"signature": ", from a signature", "--feed": ", from --feed"}
        batch = f" (batch {facts.batch_size}{source.get(facts.batch_from, '')})"
    peak = facts.peak
    console.print(f"estimated step peak: [bold]{format_bytes(facts.estimated_peak_bytes)}[/] "
                  f"above persistent {format_bytes(facts.persistent_bytes)}{batch}")
    console.print(f"peak at {peak['op']} (op {peak['position'] + 1} of {peak['of']})"
                  f"{_PHASE_NOTE.get(peak['phase'], '')}")
    if shows_spread(peak["highest_bytes"], peak["lowest_bytes"]):
        console.print(spread_sentence(peak["highest_bytes"], peak["lowest_bytes"],
                                      threads_label(peak["highest_phase"],
                                                    peak["highest_threads"]),
                                      peak["lowest_phase"], high_walk=peak["highest_walk"],
                                      low_walk=peak["lowest_walk"],
                                      carried=peak["highest_bytes"] > max(
                                          (o["peak_bytes"] for o in peak["orders"]),
                                          default=0)))
    for note in facts.estimate_notes:
        console.print(f"[yellow]estimate may be low[/]: {note}")
    if facts.floor.get("bytes"):
        parts = ", ".join(f"{p['role']} {p['name']} {format_bytes(p['bytes'])}"
                          for p in facts.floor["parts"][:3])
        console.print(f"floor: [bold]{format_bytes(facts.floor['bytes'])}[/], no recompute "
                      f"or swap plan peaks lower ({facts.floor['op']} runs with {parts})")
    if peak["live"]:
        lt = Table(title=f"live at the peak ({peak['op']}), largest first",
                   title_justify="left")
        lt.add_column("tensor", overflow="fold")
        lt.add_column("shape")
        lt.add_column("bytes", justify="right", no_wrap=True)
        for x in peak["live"]:
            lt.add_row(x.name, format_shape(x.shape), format_bytes(x.bytes))
        print_table(console, lt)


# said where the peak is in TF's first ~90 steps, not in the steady state after them
_PHASE_NOTE = {"warm-up": " (in a training run's first ~90 steps, when TensorFlow runs small "
                          "ops apart)"}


def spread_sentence(high: int, low: int, high_phase: str, low_phase: str,
                    label: str = "", high_walk: str = "", low_walk: str = "",
                    carried: bool = False) -> str:
    """In plain words: the peak depends on the order TF runs independent ops in. Two
    orders of one phase (the warm-up's) are told apart by their walks (how each takes
    TF's ready ops, schedule.py's WALK_*), when given. `carried`: the highest is above
    every order's own step, from what earlier steps leave in the allocator (variables
    given new chunks, memory.py)."""
    what = f"the {label} peak" if label else "the peak"
    if low_phase == high_phase:  # several orders of one phase (the warm-up's): said once
        walks = low_walk and high_walk and low_walk != high_walk
        span = (f"from {format_bytes(low)}{f' ({low_walk})' if walks else ''} to "
                f"{format_bytes(high)}{f' ({high_walk})' if walks else ''}, both in "
                f"{low_phase} orders")
    else:
        span = f"from {format_bytes(low)} ({low_phase}) to {format_bytes(high)} ({high_phase})"
    cause = " and with what earlier steps leave in its allocator" if carried else ""
    return (f"{what} varies with TensorFlow's op order{cause}: {span}, "
            f"{format_bytes(high - low)} apart ({high / max(low, 1):.2f}x); a training run "
            f"reaches the highest, which gates use")


def threads_label(phase: str, threads: int) -> str:
    """An order's phase, and its threads when more than one run ops side by side."""
    return phase if threads == 1 else f"{phase}, {threads} inter-op threads"


def shows_spread(high: int, low: int) -> bool:
    """Whether the orders' peaks differ enough to say so (1%: a few chunks' rounding is
    no spread a user can act on)."""
    return high - low > high // 100

