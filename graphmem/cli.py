"""The command line: `graphmem inspect`, `graphmem rewrite`, `graphmem verify`.

Commands only parse options, call the analyses and passes, and hand results to a report.
Errors a user can act on (GraphmemError) become one line on stderr and an exit code.
"""

from __future__ import annotations

import gc
import os
import sys
from functools import wraps
from pathlib import Path

import click

from graphmem import __version__
from graphmem import options as valid  # option value checks
from graphmem.errors import GraphmemError, UsageError

FORMATS = ["meta", "meta_text", "graphdef", "graphdef_text", "saved_model"]


def _console():
    from rich.console import Console  # imported for tables only: --json runs need none

    return Console(highlight=False, soft_wrap=True)


def model_options(fn):
    """Options that say which graph of a model file to read."""
    fn = click.option("--format", "fmt", type=click.Choice(FORMATS),
                      help="Input format (default: from the path and contents).")(fn)
    fn = click.option("--tag", help="SavedModel MetaGraphDef tags, comma separated.")(fn)
    fn = click.option("--function", help="Work on this function of the graph's library "
                                         "(TF2 train steps live there).")(fn)
    fn = click.option("--batch-size", type=valid.BATCH_SIZE,
                      help="Size of unknown leading (batch) dimensions.")(fn)
    fn = click.option("--backward-scope", multiple=True, metavar="REGEX", type=valid.REGEX,
                      help="Name scope(s) of the backward pass (default: gradients*/ and "
                           "gradient_tape/). Repeatable.")(fn)
    return fn


def estimate_options(fn):
    """Options about the memory estimate, shared by inspect and rewrite."""
    fn = click.option("--grappler", is_flag=True,
                      help="Estimate on the graph as Grappler will run it (fusions, pruning; "
                           "TF1 graphs, needs TensorFlow).")(fn)
    fn = click.option("--plot", type=click.Path(), metavar="FILE.svg|FILE.png",
                      help="Draw estimated memory over the step.")(fn)
    fn = click.option("--max-peak", metavar="SIZE", type=valid.SIZE,
                      help="Exit 1 when the estimated step peak is above SIZE (e.g. 1.5GiB, "
                           "300MB): a CI gate.")(fn)
    return fn


def swap_options(fn):
    """The swap pass's knobs (IBM LMS's, under these names)."""
    opts = [
        click.option("--swap", is_flag=True,
                     help="Swap saved activations to host memory and back (with a recompute "
                          "policy: swap its checkpoints)."),
        click.option("--swap-threshold", metavar="SIZE", default="0", type=valid.SIZE,
                     help="Swap only tensors at least this large (e.g. 4MiB)."),
        click.option("--swap-max-tensors", type=valid.COUNT, metavar="N",
                     help="Swap at most N tensors (earliest in the forward pass first)."),
        click.option("--swap-include", multiple=True, metavar="REGEX", type=valid.REGEX,
                     help="Only swap tensors whose op name or type matches. Repeatable."),
        click.option("--swap-exclude", multiple=True, metavar="REGEX", type=valid.REGEX,
                     help="Never swap tensors whose op name or type matches. Repeatable."),
        click.option("--swap-start", multiple=True, metavar="SCOPE", type=valid.SCOPE,
                     help="Start the forward walk at these scopes or op names (default: the "
                          "whole forward pass). Repeatable."),
        click.option("--swap-in-ahead", default="1:10", show_default=True, metavar="LB:UB",
                     help="Trigger a swap-in between LB and UB backward ops ahead of its "
                          "reader."),
        click.option("--swap-fuse", is_flag=True,
                     help="One swap-in per tensor for all its backward readers."),
        click.option("--swap-branches", is_flag=True,
                     help="Also swap for forward readers far from the producer."),
        click.option("--swap-branch-threshold", default=20, show_default=True, metavar="N",
                     type=valid.NON_NEGATIVE,
                     help="Topological distance that makes a forward reader far."),
        click.option("--device", "swap_device", metavar="DEVICE",
                     help="Device whose memory is saved (default: each tensor's own)."),
        click.option("--host-device", default="/device:CPU:0", show_default=True,
                     help="Where swapped tensors wait."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _swap_options_from(kw: dict):
    if not kw.pop("swap"):
        for key in list(kw):
            kw.pop(key)
        return None
    from graphmem.passes.swap import SwapOptions
    from graphmem.units import parse_size

    lb, ub = valid.parse_ahead(kw.pop("swap_in_ahead"))
    return SwapOptions(
        threshold=parse_size(kw.pop("swap_threshold")),
        max_tensors=kw.pop("swap_max_tensors"),
        include=list(kw.pop("swap_include")), exclude=list(kw.pop("swap_exclude")),
        start=list(kw.pop("swap_start")), ahead=(lb, ub),
        fuse=kw.pop("swap_fuse"), branches=kw.pop("swap_branches"),
        branch_threshold=kw.pop("swap_branch_threshold"), device=kw.pop("swap_device"),
        host=kw.pop("host_device"))


def _parse_max_peak(text):
    if text is None:
        return None
    from graphmem.units import parse_size

    return parse_size(text)


def _gate(peak: int, limit: int | None, what: str) -> None:
    if limit is not None and peak > limit:
        from graphmem.errors import CheckFailed
        from graphmem.units import format_bytes

        raise CheckFailed(f"{what} {format_bytes(peak)} is above the limit "
                          f"{format_bytes(limit)} (by {format_bytes(peak - limit)})")


def handles_errors(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        # The graph structures are millions of small containers without reference cycles:
        # the cyclic collector would rescan the whole heap ever more often as they grow
        # (superlinear on big graphs) and find nothing. Plain reference counting frees them.
        gc.disable()
        try:
            return fn(*args, **kwargs)
        except GraphmemError as exc:
            click.echo(f"graphmem: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except BrokenPipeError:  # output piped into `head` and the like
            sys.stderr.close()
            sys.exit(0)
        except KeyboardInterrupt:
            click.echo("graphmem: interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug: one line unless asked for the traceback
            if os.environ.get("GRAPHMEM_DEBUG"):
                raise
            click.echo(f"graphmem: internal error: {type(exc).__name__}: {exc} "
                       "(set GRAPHMEM_DEBUG=1 for a traceback)", err=True)
            sys.exit(3)
    return wrapper


class _Group(click.Group):
    """Click's own usage errors (a bad option value, a missing argument) as one line
    `graphmem: error: ...` and exit 2, like every other bad input, instead of click's
    three-line usage block."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `graphmem`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.ClickException as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"graphmem: error: {message}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("graphmem: interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="graphmem")
def main() -> None:
    """Rewrite TensorFlow training graphs so that training needs less memory."""


def _open(model: str, fmt, tag, function, batch_size=None):
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    loaded = load_model(Path(model), fmt, tag, function)
    return Workspace.open(loaded, batch_size=batch_size)


@main.command()
@click.argument("model", type=click.Path())
@model_options
@estimate_options
@click.option("--top", default=10, show_default=True, type=valid.NON_NEGATIVE,
              help="How many of the largest to list.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@handles_errors
def inspect(model, fmt, tag, function, batch_size, backward_scope, grappler, plot, max_peak,
            top, as_json):
    """Summarize a training graph: regions, saved activations, variables, memory."""
    from graphmem.analysis.inspect import gather_facts

    limit = _parse_max_peak(max_peak)
    if plot:
        valid.check_plot(plot, model)
    ws = _open(model, fmt, tag, function, batch_size)
    facts, _ = gather_facts(ws, batch_size, backward_scope or None, top, grappler,
                            keep_timeline=bool(plot))
    if plot:
        from graphmem.report.plot import Series, write_plot

        write_plot(plot, [Series("estimated", facts.timeline)],
                   f"graphmem inspect {Path(model).name}")
    if as_json:
        from graphmem.report.json_out import emit

        facts.timeline = []
        emit(facts)
    else:
        from graphmem.report.inspect_report import render_inspect

        render_inspect(facts, _console())
    _gate(facts.estimated_peak_bytes, limit, "estimated step peak")


@main.command()
@click.argument("model", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Where to write the rewritten model (same format as the input).")
@model_options
@click.option("--policy", type=click.Choice(["memory", "speed", "collection", "names", "budget",
                                            "none"]),
              help="How checkpoints are chosen (default: memory; none with --swap; budget "
                   "with --budget).")
@click.option("--budget", metavar="SIZE|FRACTION", type=valid.BUDGET,
              help="With --policy budget: the cheapest plan whose estimated peak fits SIZE "
                   "(2GiB) or FRACTION of the original peak (0.5).")
@click.option("--checkpoints", "patterns", multiple=True, metavar="PATTERN",
              type=valid.PATTERN,
              help="Keep tensors whose name contains PATTERN or matches it as a regex "
                   "(implies --policy names). Repeatable.")
@swap_options
@estimate_options
@click.option("--early-updates/--no-early-updates", default=True, show_default=True,
              help="Run each optimizer update as soon as its gradient is ready, so weight "
                   "gradients do not pile up until the end of the backward pass.")
@click.option("--recompute-loops", is_flag=True,
              help="Let the policy recompute whole v2 loops (While ops whose functions only "
                   "read state): the loop runs again before its gradient instead of keeping "
                   "its per-step values. Pays on stacked recurrent layers; costs a loop run.")
@click.option("--loop-bodies/--no-loop-bodies", "loop_bodies", default=None,
              help="Recompute inside loops: a loop's gradient rebuilds each iteration's values "
                   "from the loop-carried state and step inputs instead of keeping them all "
                   "(v2 While tensor lists, v1 stacks; an LSTM keeps h, c and x_t, not its "
                   "gates). Default: on with every recompute policy (speed keeps matmul "
                   "outputs), off with --policy none.")
@click.option("--keep-worse", is_flag=True,
              help="Keep the rewrite even when it raises the estimated peak (by default the "
                   "graph is written unchanged then).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@handles_errors
def rewrite(model, output, fmt, tag, function, batch_size, backward_scope, policy, budget,
            patterns, grappler, plot, max_peak, early_updates, recompute_loops, loop_bodies,
            keep_worse, as_json, **swap_kw):
    """Rewrite a training graph to need less memory and write it to OUTPUT."""
    from graphmem.rewrite import RewriteOptions, rewrite_file

    valid.check_output(output, "output", model)
    if plot:
        valid.check_plot(plot, model, others=(output,))
    limit = _parse_max_peak(max_peak)
    swap = _swap_options_from(swap_kw)
    if budget is not None and policy not in (None, "budget"):
        raise UsageError("--budget goes with --policy budget")
    policy = policy or ("budget" if budget is not None else
                        "none" if swap and not patterns else "memory")
    if policy == "budget" and not budget:
        raise UsageError("--policy budget needs --budget SIZE or FRACTION (e.g. 2GiB, 0.5)")
    options = RewriteOptions(policy, list(patterns), batch_size, list(backward_scope) or None,
                             grappler, keep_timeline=bool(plot), swap=swap,
                             keep_worse=keep_worse, early_updates=early_updates,
                             budget=budget, recompute_loops=recompute_loops,
                             loop_recompute=loop_bodies)
    result = rewrite_file(model, output, options, fmt, tag, function)
    if plot:
        from graphmem.report.plot import Series, write_plot

        write_plot(plot, [Series("original", result.before.timeline),
                          Series(f"rewritten ({policy})", result.after.timeline)],
                   f"graphmem rewrite {Path(model).name}")
    if as_json:
        from graphmem.report.json_out import emit
        from graphmem.report.rewrite_report import rewrite_document

        emit(rewrite_document(result, str(output)))
    else:
        from graphmem.report.rewrite_report import render_rewrite

        render_rewrite(result, str(output), _console())
    final = result.before if result.reverted else result.after
    _gate(final.peak_bytes, limit, "estimated step peak after the rewrite")
    if result.budget_bytes is not None and final.peak_bytes > result.budget_bytes:
        from graphmem.errors import CheckFailed
        from graphmem.units import format_bytes

        raise CheckFailed(
            f"--budget not met: the lowest plan found peaks at "
            f"{format_bytes(final.peak_bytes)}, above the budget "
            f"{format_bytes(result.budget_bytes)} (by "
            f"{format_bytes(final.peak_bytes - result.budget_bytes)}); it was written to "
            f"{output} (`graphmem plan` shows the lowest peaks reachable)")


@main.command()
@click.argument("original", type=click.Path())
@click.argument("rewritten", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Input format of both.")
@click.option("--tag", help="SavedModel MetaGraphDef tags, comma separated.")
@click.option("--steps", default=5, show_default=True, type=valid.COUNT,
              help="Training steps to run on each graph.")
@click.option("--warmup", default=0, show_default=True, type=valid.NON_NEGATIVE,
              help="Steps to run (and compare) before the measured ones; 120 measures TF's "
                   "steady state (its executor runs small ops differently for ~90 steps).")
@click.option("--batch-size", default=8, show_default=True, type=valid.BATCH_SIZE,
              help="Size of unknown batch dimensions in random feeds.")
@click.option("--feed", "feeds", multiple=True, metavar="NAME=FILE.npy",
              help="Feed a placeholder from a .npy file instead of random data.")
@click.option("--train-op", help="The op one training step runs (default: `train_op` "
                                 "collection, or the optimizer's last op).")
@click.option("--loss", help="The loss tensor (default: `losses` collection, or found).")
@click.option("--rtol", default=1e-5, show_default=True, type=valid.TOLERANCE,
              help="Relative tolerance.")
@click.option("--atol", default=1e-6, show_default=True, type=valid.TOLERANCE,
              help="Absolute tolerance.")
@click.option("--threads", default=1, show_default=True, type=valid.COUNT,
              help="inter_op_parallelism_threads for both sessions.")
@click.option("--seed", default=0, show_default=True, type=valid.SEED,
              help="Seed of the random feeds.")
@click.option("--exact", is_flag=True,
              help="Demand bit-identical training: zero tolerances, and Grappler off (a "
                   "rewrite can change which ops Grappler fuses or simplifies, which moves "
                   "results by float rounding).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@handles_errors
def verify(original, rewritten, fmt, tag, steps, warmup, batch_size, feeds, train_op, loss,
           rtol, atol, threads, seed, exact, as_json):
    """Train ORIGINAL and REWRITTEN side by side; compare losses, variables and peak memory.

    Exits 1 when training differs beyond the tolerances."""
    from graphmem.errors import CheckFailed
    from graphmem.runtime.train_runner import RunSpec, load_feed_files
    from graphmem.runtime.verify import verify as run_verify

    spec = RunSpec(train_op, loss, None, batch_size, load_feed_files(list(feeds)), seed, threads,
                   grappler=not exact)
    if exact:
        rtol = atol = 0.0
    result = run_verify(original, rewritten, spec, steps, rtol, atol, fmt, tag, warmup=warmup)
    if as_json:
        from graphmem.report.json_out import emit
        from graphmem.report.verify_report import verify_document

        emit(verify_document(result))
    else:
        from graphmem.report.verify_report import render_verify

        render_verify(result, _console())
    if not result.same_training:
        raise CheckFailed(differs_message(result, exact))


ROUNDING = 1e-4  # differences below this, with Grappler on, are most likely its fusions


def differs_message(result, exact: bool) -> str:
    """The one error line of a failed verify. With Grappler on, a correct rewrite can still
    differ by float rounding (Grappler fuses ops only where an intermediate has one reader,
    and a rewrite changes reader counts): say so, and how to compare without it."""
    text = "training differs: " + "; ".join(result.mismatches[:3])
    if not exact and max(result.max_loss_diff, result.max_variable_diff) < ROUNDING:
        text += ("; all differences are below 1e-4, as when Grappler fuses the two graphs "
                 "differently: `--exact` compares them with Grappler off")
    return text


@main.command()
@click.argument("model", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Input format.")
@click.option("--tag", help="SavedModel MetaGraphDef tags, comma separated.")
@click.option("--function", help="Work on this function of the graph's library.")
@click.option("--batch-size", type=valid.BATCH_SIZE,
              help="Size of unknown leading (batch) dimensions.")
@click.option("--points", default=8, show_default=True, type=click.IntRange(min=2, max=64),
              help="Budgets between the smallest reachable peak and the original peak.")
@click.option("--plot", type=click.Path(), metavar="FILE.svg|FILE.png",
              help="Draw the curve.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@handles_errors
def plan(model, fmt, tag, function, batch_size, points, plot, as_json):
    """Trade-off between peak memory and extra compute, with the memory and speed policies
    placed on it."""
    from graphmem.plan import tradeoff

    if plot:
        valid.check_plot(plot, model)
    result = tradeoff(model, batch_size, fmt, tag, function, points)
    if plot:
        from graphmem.report.plot import write_tradeoff_plot

        write_tradeoff_plot(plot, result, f"graphmem plan {Path(model).name}")
    if as_json:
        from graphmem.report.json_out import emit

        emit(result)
        return
    from rich.table import Table

    from graphmem.units import format_bytes

    table = Table(title=f"peak memory against extra compute (original peak "
                        f"{format_bytes(result.original_peak_bytes)})", title_justify="left")
    table.add_column("plan")
    table.add_column("peak", justify="right")
    table.add_column("x original", justify="right")
    table.add_column("extra forward FLOPs", justify="right")
    table.add_column("from")
    for p in result.points + result.policies:
        table.add_row(p.label, format_bytes(p.peak_bytes),
                      f"{p.peak_bytes / max(result.original_peak_bytes, 1):.2f}",
                      f"+{p.extra_flops_share:.0%}", p.how)
    _console().print(table)


def run() -> None:
    """The console entry point: `main`, then leave without the interpreter's teardown.
    Freeing a big graph's millions of small objects one by one at exit costs a tenth of a
    second or more per 100k nodes and changes nothing: the output file is already renamed
    into place, and the process's memory goes back to the system as a whole."""
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            click.echo(str(exc.code), err=True)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a reader gone, or stderr closed on purpose
        pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
