"""The command line: `graphmem inspect`, `graphmem rewrite`, `graphmem plan`, `graphmem verify`.

Commands only parse options, call the library API (graphmem/api.py, which checks the values,
finds the batch size, does the work and writes the outputs) with a progress line when stderr
is a terminal, and hand its result to a report: tables, or the result's `to_json()` for
--json. Errors a user can act on (GraphmemError) become one line on stderr and an exit code.
"""

from __future__ import annotations

import gc
import os
import sys
from functools import wraps

import rich_click as click
from click import exceptions as click_exceptions

from graphmem import __version__, api
from graphmem import options as valid  # option value checks
from graphmem.api import ROUNDING, differs_message  # noqa: F401 (read from here too)
from graphmem.errors import GraphmemError

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
        swap("--device", metavar="DEVICE",
                     help="Device whose memory is saved (default: each tensor's own)."),
        swap("--host-device", default="/device:CPU:0", show_default=True,
                     help="Where swapped tensors wait."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


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
    with _progress(as_json) as progress:
        result = api.inspect(model, format=fmt, tag=tag, function=function,
                             batch_size=batch_size, backward_scope=backward_scope,
                             grappler=grappler, max_peak=max_peak, top=top, plot=plot,
                             check=False, on_stage=progress.stage)
    if as_json:
        from graphmem.report.json_out import emit

        emit(result.to_json())
    else:
        from graphmem.report.inspect_report import render_inspect

        render_inspect(result, _console())
        if plot:
            _console().print(f"plot written to {plot}")
    result.check()


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
    with _progress(as_json) as progress:
        result = api.rewrite(model, output, policy, format=fmt, tag=tag, function=function,
                             batch_size=batch_size, backward_scope=backward_scope,
                             budget=budget, checkpoints=patterns, early_updates=early_updates,
                             recompute_loops=recompute_loops, loop_bodies=loop_bodies,
                             keep_worse=keep_worse, grappler=grappler, max_peak=max_peak,
                             plot=plot, check=False, on_stage=progress.stage, **swap_kw)
    if as_json:
        from graphmem.report.json_out import emit

        emit(result.to_json())
    else:
        from graphmem.report.rewrite_report import render_rewrite

        render_rewrite(result, result.output, _console(), plot)
    result.check()


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
    with _progress(as_json) as progress:
        result = api.verify(original, rewritten, format=fmt, tag=tag, function=function,
                            batch_size=batch_size, backward_scope=backward_scope, steps=steps,
                            warmup=warmup, feed=feeds, train_op=train_op, loss=loss,
                            threads=threads, seed=seed, rtol=rtol, atol=atol, exact=exact,
                            check=False, on_stage=progress.stage, on_step=progress.step)
    if as_json:
        from graphmem.report.json_out import emit

        emit(result.to_json())
    else:
        from graphmem.report.verify_report import render_verify

        render_verify(result, _console(), result.batch_size, result.batch_from)
    result.check()


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
    with _progress(as_json) as progress:
        result = api.plan(model, format=fmt, tag=tag, function=function,
                          batch_size=batch_size, backward_scope=backward_scope, points=points,
                          plot=plot, check=False, on_stage=progress.stage)
    if as_json:
        from graphmem.report.json_out import emit

        emit(result.to_json())
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
