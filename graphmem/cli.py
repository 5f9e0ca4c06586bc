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

import rich_click as click
from click import exceptions as click_exceptions

from graphmem import __version__
from graphmem import options as valid  # option value checks
from graphmem.errors import GraphmemError, UsageError

FORMATS = ["meta", "meta_text", "graphdef", "graphdef_text", "saved_model"]
POLICIES = ["memory", "speed", "collection", "names", "budget", "none"]

# Help panels, in the order `--help` shows them: every command's options fall in these
MODEL, POLICY, SWAP, TRAINING, COMPARE, ESTIMATE, OUTPUT = (
    "Model", "Policy", "Swap (host offload)", "Training", "Comparison", "Estimate and CI",
    "Output")
click.rich_click.OPTIONS_PANEL_TITLE = "Options"  # the group's --help and --version
click.rich_click.MAX_WIDTH = 100
# one column for the option and its metavar (`--batch-size N`): more room for the help
click.rich_click.OPTIONS_TABLE_COLUMN_TYPES = ["required", "opt_all_metavar", "help"]


def _console():
    """The console tables are printed on: lines wrap at the terminal's width (80 columns
    when not a terminal), and nothing is highlighted. Imported for tables only: --json
    runs need none."""
    from rich.console import Console

    return Console(highlight=False)


def model_options(fn):
    """Options that say which graph of a model file to read, the same on every command
    (names as TensorFlow's saved_model_cli has them where they mean the same)."""
    opts = [
        click.option("--format", "fmt", type=click.Choice(FORMATS), metavar="FORMAT",
                     panel=MODEL, help="Input format: " + ", ".join(FORMATS) + " (default: "
                     "from the path and contents)."),
        click.option("--tag-set", "--tag", "tag", metavar="TAGS", panel=MODEL,
                     help="SavedModel MetaGraphDef tags, comma separated (as saved_model_cli's "
                          "--tag_set)."),
        click.option("--function", panel=MODEL,
                     help="Work on this function of the graph's library (TF2 train steps live "
                          "there; found when only one holds a backward pass)."),
        click.option("--batch-size", type=valid.BATCH_SIZE, metavar="N", panel=MODEL,
                     help="Size of unknown leading (batch) dimensions. Needed when sizes "
                          "depend on one and neither the model nor a --feed fixes it."),
        click.option("--backward-scope", multiple=True, metavar="REGEX", type=valid.REGEX,
                     panel=MODEL,
                     help="Name scope(s) of the backward pass (default: gradients*/ and "
                          "gradient_tape/). Repeatable."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def estimate_options(fn):
    """Options about the memory estimate, shared by inspect and rewrite."""
    fn = click.option("--max-peak", metavar="SIZE", type=valid.SIZE, panel=ESTIMATE,
                      help="Exit 1 when the estimated step peak is above SIZE (e.g. 1.5GiB, "
                           "300MB): a CI gate.")(fn)
    fn = click.option("--grappler", is_flag=True, panel=ESTIMATE,
                      help="Estimate on the graph as Grappler will run it (fusions, pruning; "
                           "TF1 graphs, needs TensorFlow).")(fn)
    return fn


def plot_option(what: str):
    return click.option("--plot", type=click.Path(), metavar="FILE.svg|FILE.png", panel=OUTPUT,
                        help=what)


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True, panel=OUTPUT,
                        help="Print one JSON document instead of tables (no progress display)."
                        )(fn)


def swap_options(fn):
    """The swap pass's knobs (IBM LMS's, under these names)."""
    def swap(*names, **kw):
        return click.option(*names, panel=SWAP, **kw)

    opts = [
        swap("--swap", is_flag=True,
                     help="Swap saved activations to host memory and back (with a recompute "
                          "policy: swap its checkpoints)."),
        swap("--swap-threshold", metavar="SIZE", default="0", type=valid.SIZE,
                     help="Swap only tensors at least this large (e.g. 4MiB)."),
        swap("--swap-max-tensors", type=valid.COUNT, metavar="N",
                     help="Swap at most N tensors (earliest in the forward pass first)."),
        swap("--swap-include", multiple=True, metavar="REGEX", type=valid.REGEX,
                     help="Only swap tensors whose op name or type matches. Repeatable."),
        swap("--swap-exclude", multiple=True, metavar="REGEX", type=valid.REGEX,
                     help="Never swap tensors whose op name or type matches. Repeatable."),
        swap("--swap-start", multiple=True, metavar="SCOPE", type=valid.SCOPE,
                     help="Start the forward walk at these scopes or op names (default: the "
                          "whole forward pass). Repeatable."),
        swap("--swap-in-ahead", default="1:10", show_default=True, metavar="LB:UB",
                     help="Trigger a swap-in between LB and UB backward ops ahead of its "
                          "reader."),
        swap("--swap-fuse", is_flag=True,
                     help="One swap-in per tensor for all its backward readers."),
        swap("--swap-branches", is_flag=True,
                     help="Also swap for forward readers far from the producer."),
        swap("--swap-branch-threshold", default=20, show_default=True, metavar="N",
             type=valid.NON_NEGATIVE,
                     help="Topological distance that makes a forward reader far."),
        swap("--device", "swap_device", metavar="DEVICE",
                     help="Device whose memory is saved (default: each tensor's own)."),
        swap("--host-device", default="/device:CPU:0", show_default=True,
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


class Progress:
    """What a long command is doing, on one line of stderr that updates in place: shown
    only when stderr is a terminal and the output is not --json, and gone when the
    command ends (so logs and pipelines see nothing extra). The line is redrawn when the
    stage changes, from the calling thread: no refresh thread runs beside the forked
    children of the estimate (a fork copies no thread, and may copy a held lock)."""

    def __init__(self, enabled: bool) -> None:
        self._live = None
        if enabled:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(stderr=True), auto_refresh=False,
                              transient=True)

    def __enter__(self) -> Progress:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()

    def stage(self, text: str) -> None:
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(f"graphmem: {text} ...", style="dim"), refresh=True)

    def step(self, done: int, total: int) -> None:
        self.stage(f"training both graphs: step {done} of {total}")


def _progress(as_json: bool) -> Progress:
    return Progress(not as_json and sys.stderr.isatty())


class _Group(click.RichGroup):
    """Click's own usage errors (a bad option value, a missing argument) as one line
    `graphmem: error: ...` and exit 2, like every other bad input, instead of click's
    three-line usage block."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click_exceptions.NoArgsIsHelpError as exc:  # bare `graphmem`: the help
            exc.show()
            sys.exit(exc.exit_code)
        except click_exceptions.ClickException as exc:
            message = " ".join(exc.format_message().split())
            click.echo(f"graphmem: error: {message}", err=True)
            sys.exit(exc.exit_code)
        except click_exceptions.Abort:
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
@click.rich_config(help_config={"options_panel_title": OUTPUT})  # a command's --help
@click.argument("model", type=click.Path())
@model_options
@estimate_options
@click.option("--top", default=10, show_default=True, metavar="N", panel=OUTPUT,
              type=valid.NON_NEGATIVE,
              help="How many of the largest to list.")
@plot_option("Draw estimated memory over the step.")
@json_option
@handles_errors
def inspect(model, fmt, tag, function, batch_size, backward_scope, grappler, max_peak,
            top, plot, as_json):
    """Summarize a training graph: regions, saved activations, variables, memory.

    Without a batch size where sizes depend on one, it still counts, and marks sizes
    unknown (--plot and --max-peak need sizes, and ask for --batch-size)."""
    from graphmem.analysis.inspect import gather_facts

    limit = _parse_max_peak(max_peak)
    if plot:
        valid.check_plot(plot, model)
    with _progress(as_json) as progress:
        progress.stage("reading the model")
        ws = _open(model, fmt, tag, function, batch_size)
        if plot or limit is not None:
            from graphmem.analysis.batch import require_batch_size

            batch_size = require_batch_size(ws, batch_size,
                                            backward_scopes=list(backward_scope) or None)
        progress.stage("analysing")
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
        if plot:
            _console().print(f"plot written to {plot}")
    if facts.estimated_peak_bytes is not None:
        _gate(facts.estimated_peak_bytes, limit, "estimated step peak")


@main.command()
@click.rich_config(help_config={"options_panel_title": OUTPUT})  # a command's --help
@click.argument("model", type=click.Path())
@model_options
@click.option("--policy", type=click.Choice(POLICIES), metavar="NAME", panel=POLICY,
              help="How checkpoints are chosen: " + ", ".join(POLICIES) + " (default: memory; "
                   "none with --swap; budget with --budget).")
@click.option("--budget", metavar="SIZE|FRACTION", type=valid.BUDGET, panel=POLICY,
              help="With --policy budget: the cheapest plan whose estimated peak fits SIZE "
                   "(2GiB) or FRACTION of the original peak (0.5).")
@click.option("--checkpoints", "patterns", multiple=True, metavar="PATTERN", panel=POLICY,
              type=valid.PATTERN,
              help="Keep tensors whose name contains PATTERN or matches it as a regex "
                   "(implies --policy names). Repeatable.")
@click.option("--early-updates/--no-early-updates", default=True, show_default=True,
              panel=POLICY,
              help="Run each optimizer update as soon as its gradient is ready, so weight "
                   "gradients do not pile up until the end of the backward pass.")
@click.option("--recompute-loops", is_flag=True, panel=POLICY,
              help="Let the policy recompute whole v2 loops (While ops whose functions only "
                   "read state): the loop runs again before its gradient instead of keeping "
                   "its per-step values. Pays on stacked recurrent layers; costs a loop run.")
@click.option("--loop-bodies/--no-loop-bodies", "loop_bodies", default=None, panel=POLICY,
              help="Recompute inside loops: a loop's gradient rebuilds each iteration's values "
                   "from the loop-carried state and step inputs instead of keeping them all. "
                   "Default: on with every recompute policy, off with --policy none.")
@click.option("--keep-worse", is_flag=True, panel=POLICY,
              help="Keep the rewrite even when it raises the estimated peak (by default the "
                   "graph is written unchanged then).")
@swap_options
@estimate_options
@click.option("-o", "--output", required=True, type=click.Path(), panel=OUTPUT,
              help="Where to write the rewritten model (same format as the input).")
@plot_option("Draw estimated memory over the step, original and rewritten.")
@json_option
@handles_errors
def rewrite(model, fmt, tag, function, batch_size, backward_scope, policy, budget, patterns,
            early_updates, recompute_loops, loop_bodies, keep_worse, grappler, max_peak,
            output, plot, as_json, **swap_kw):
    """Rewrite a training graph to need less memory and write it to OUTPUT."""
    from graphmem.rewrite import RewriteOptions, rewrite_file

    # every option is checked before any work: a usage error (exit 2) writes nothing
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
    with _progress(as_json) as progress:
        result = rewrite_file(model, output, options, fmt, tag, function,
                              on_stage=progress.stage)
        if plot:
            from graphmem.report.plot import Series, write_plot

            progress.stage("drawing the plot")
            write_plot(plot, [Series("original", result.before.timeline),
                              Series(f"rewritten ({policy})", result.after.timeline)],
                       f"graphmem rewrite {Path(model).name}")
    if as_json:
        from graphmem.report.json_out import emit
        from graphmem.report.rewrite_report import rewrite_document

        emit(rewrite_document(result, str(output), plot))
    else:
        from graphmem.report.rewrite_report import render_rewrite

        render_rewrite(result, str(output), _console(), plot)
    final = result.before if result.reverted else result.after
    from graphmem.analysis.towers import gated_peak

    peak, what = gated_peak(final.peak_bytes, final.peak_by_device)
    _gate(peak, limit, f"{what} after the rewrite")
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
@click.rich_config(help_config={"options_panel_title": OUTPUT})  # a command's --help
@click.argument("original", type=click.Path())
@click.argument("rewritten", type=click.Path())
@model_options
@click.option("--steps", default=5, show_default=True, type=valid.COUNT, metavar="N",
              panel=TRAINING,
              help="Training steps to run on each graph.")
@click.option("--warmup", default=0, show_default=True, type=valid.NON_NEGATIVE,
              metavar="N", panel=TRAINING,
              help="Steps to train (and compare) before the measured ones. TensorFlow runs "
                   "small ops differently for a training run's first ~90 steps; 120 measures "
                   "the steady state after them.")
@click.option("--feed", "feeds", multiple=True, metavar="NAME=FILE.npy", panel=TRAINING,
              help="Feed a placeholder from a .npy file instead of random data (as "
                   "saved_model_cli's --inputs). Repeatable.")
@click.option("--train-op", panel=TRAINING,
              help="The op one training step runs (default: `train_op` collection, or the "
                   "optimizer's last op).")
@click.option("--loss", panel=TRAINING,
              help="The loss tensor (default: `losses` collection, or found).")
@click.option("--threads", default=1, show_default=True, type=valid.COUNT,
              metavar="N", panel=TRAINING, help="inter_op_parallelism_threads for both sessions.")
@click.option("--seed", default=0, show_default=True, type=valid.SEED, panel=TRAINING,
              help="Seed of the random feeds.")
@click.option("--rtol", default=1e-5, show_default=True, type=valid.TOLERANCE, panel=COMPARE,
              help="Relative tolerance.")
@click.option("--atol", default=1e-6, show_default=True, type=valid.TOLERANCE, panel=COMPARE,
              help="Absolute tolerance.")
@click.option("--exact", is_flag=True, panel=COMPARE,
              help="Demand bit-identical training: zero tolerances, and Grappler off (a "
                   "rewrite can change which ops Grappler fuses or simplifies, which moves "
                   "results by float rounding).")
@json_option
@handles_errors
def verify(original, rewritten, fmt, tag, function, batch_size, backward_scope, steps, warmup,
           feeds, train_op, loss, threads, seed, rtol, atol, exact, as_json):
    """Train ORIGINAL and REWRITTEN side by side; compare losses, variables and peak memory.

    Exits 1 when training differs beyond the tolerances."""
    from graphmem.analysis.batch import resolve_batch_size
    from graphmem.errors import CheckFailed
    from graphmem.runtime.train_runner import RunSpec, load_feed_files
    from graphmem.runtime.verify import verify as run_verify

    feed_values = load_feed_files(list(feeds))
    with _progress(as_json) as progress:
        progress.stage("reading the original model")
        batch = resolve_batch_size(_open(original, fmt, tag, function), batch_size,
                                   feed_values)
        if batch.needed:
            from graphmem.analysis.batch import missing_batch_message

            raise UsageError(missing_batch_message(batch) + " (random feeds need it)")
        spec = RunSpec(train_op, loss, None, batch.size or 1, feed_values, seed, threads,
                       grappler=not exact, backward_scopes=list(backward_scope) or None)
        if exact:
            rtol = atol = 0.0
        progress.stage("loading TensorFlow and both graphs")
        result = run_verify(original, rewritten, spec, steps, rtol, atol, fmt, tag, function,
                            warmup=warmup, on_step=progress.step)
    if as_json:
        from graphmem.report.json_out import emit
        from graphmem.report.verify_report import verify_document

        emit(verify_document(result, batch.size, batch.source))
    else:
        from graphmem.report.verify_report import render_verify

        render_verify(result, _console(), batch.size, batch.source)
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
@click.rich_config(help_config={"options_panel_title": OUTPUT})  # a command's --help
@click.argument("model", type=click.Path())
@model_options
@click.option("--points", default=8, show_default=True, type=click.IntRange(min=2, max=64),
              metavar="N", panel=POLICY,
              help="Budgets between the smallest reachable peak and the original peak.")
@plot_option("Draw peak memory against extra compute: one point per plan.")
@json_option
@handles_errors
def plan(model, fmt, tag, function, batch_size, backward_scope, points, plot, as_json):
    """Trade-off between peak memory and extra compute, with the memory and speed policies
    placed on it."""
    from graphmem.plan import tradeoff

    if plot:
        valid.check_plot(plot, model)
    with _progress(as_json) as progress:
        result = tradeoff(model, batch_size, fmt, tag, function, points,
                          list(backward_scope) or None, on_stage=progress.stage)
        if plot:
            from graphmem.report.plot import write_tradeoff_plot

            progress.stage("drawing the plot")
            write_tradeoff_plot(plot, result, f"graphmem plan {Path(model).name}")
    if as_json:
        from graphmem.report.json_out import emit

        emit(result)
        return
    from graphmem.report.plan_report import render_plan

    render_plan(result, _console(), plot)


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
