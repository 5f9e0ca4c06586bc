"""The library API: `inspect`, `rewrite`, `plan` and `verify` as Python functions.

The CLI's commands are this module's functions behind option parsing: each function takes
the command's options as keyword arguments (same names and defaults), checks their values
before any work (a bad value raises `UsageError`, nothing is written), runs the drivers, and
returns the result dataclass the reports already use, extended with `to_json()` (the
command's `--json` document, as a dict) and `check()` (the command's exit-1 conditions:
a `max_peak` gate, an unmet budget, training that differs).

A model is a path in any format the CLI reads, or a GraphDef / MetaGraphDef message in
memory (TensorFlow's classes or graphmem's own). Errors raise `GraphmemError` subclasses
with the CLI's exit code; nothing here exits the process.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from graphmem.errors import CheckFailed, GraphmemError, InputError, UsageError

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from graphmem.formats.model import LoadedModel
    from graphmem.passes.swap import SwapOptions

FORMATS = ("meta", "meta_text", "graphdef", "graphdef_text", "saved_model")
POLICIES = ("memory", "speed", "collection", "names", "budget", "none")
Model = Union[str, os.PathLike, "Message"]
Patterns = str | Sequence[str] | None

# differences below this, with Grappler on, are most likely its fusions (see verify)
ROUNDING = 1e-4


# ---------------------------------------------------------------- results

def _import_results():
    """The result classes extend the drivers' dataclasses; those modules import numpy and
    the analyses, so they are defined on first use (importing graphmem stays cheap)."""
    global InspectResult, RewriteResult, Tradeoff, VerifyResult  # noqa: PLW0603
    if "InspectResult" in _RESULTS:
        return
    from graphmem.analysis.inspect import InspectFacts
    from graphmem.plan import Tradeoff as _Tradeoff
    from graphmem.rewrite import RewriteResult as _RewriteResult
    from graphmem.runtime.verify import VerifyResult as _VerifyResult

    @dataclass
    class InspectResult(InspectFacts):
        """`graphmem inspect`'s facts. `to_json()`: the `--json` document."""

        max_peak_bytes: int | None = field(default=None, repr=False, compare=False)

        def to_json(self) -> dict:
            from graphmem.report.json_out import plain

            doc = {f.name: plain(getattr(self, f.name)) for f in fields(InspectFacts)}
            doc["timeline"] = []  # plots only; the CLI's document leaves it out too
            return doc

        def check(self) -> None:
            """Raise CheckFailed (exit 1) when the estimated peak is above `max_peak` (a
            limit needs sizes: `inspect` asks for the batch size then, so the peak is known)."""
            if self.estimated_peak_bytes is not None:
                _gate(self.estimated_peak_bytes, self.max_peak_bytes, "estimated step peak")

    @dataclass
    class RewriteResult(_RewriteResult):
        """What the rewrite did. `rewritten`: the rewritten model's container (a message of
        the input's class for an in-memory model), set when no output path was given.
        `to_json()`: the `--json` document."""

        output: str | None = None
        plot: str | None = None
        rewritten: Any = field(default=None, repr=False, compare=False)
        max_peak_bytes: int | None = field(default=None, repr=False, compare=False)

        def to_json(self) -> dict:
            from graphmem.report.json_out import plain
            from graphmem.report.rewrite_report import rewrite_document

            return plain(rewrite_document(self, self.output, self.plot))

        @property
        def final(self):
            """The estimate of the graph that was written (the original when undone)."""
            return self.before if self.reverted else self.after

        def check(self) -> None:
            """Raise CheckFailed (exit 1) when the written graph's estimated peak is above
            `max_peak`, or above the budget of `policy="budget"`."""
            from graphmem.analysis.towers import gated_peak
            from graphmem.units import format_bytes

            peak = self.final.estimated_bytes
            gate, what = gated_peak(peak, self.final.peak_by_device)
            _gate(gate, self.max_peak_bytes, f"{what} after the rewrite")
            if self.budget_bytes is not None and peak > self.budget_bytes:
                where = f"it was written to {self.output}" if self.output else \
                    "it is in the result"
                raise CheckFailed(
                    f"--budget not met: the lowest plan found peaks at {format_bytes(peak)}, "
                    f"above the budget {format_bytes(self.budget_bytes)} (by "
                    f"{format_bytes(peak - self.budget_bytes)}); {where} (`graphmem plan` "
                    "shows the lowest peaks reachable)")

    @dataclass
    class Tradeoff(_Tradeoff):
        """`graphmem plan`'s curve. `to_json()`: the `--json` document."""

        def to_json(self) -> dict:
            from graphmem.report.json_out import plain

            return {f.name: plain(getattr(self, f.name)) for f in fields(_Tradeoff)}

        def check(self) -> None:
            """Nothing to check: `plan` has no exit-1 condition."""

    @dataclass
    class VerifyResult(_VerifyResult):
        """Both models trained side by side, at `batch_size` (found from `batch_from`:
        "--batch-size", "--feed", "signature" or "not needed"). `to_json()`: the `--json`
        document."""

        exact: bool = field(default=False, repr=False, compare=False)
        batch_size: int | None = None
        batch_from: str | None = None

        def to_json(self) -> dict:
            from graphmem.report.json_out import plain
            from graphmem.report.verify_report import verify_document

            return plain(verify_document(self, self.batch_size, self.batch_from))

        def check(self) -> None:
            """Raise CheckFailed (exit 1) when training differs beyond the tolerances."""
            if not self.same_training:
                raise CheckFailed(differs_message(self, self.exact))

    for cls in (InspectResult, RewriteResult, Tradeoff, VerifyResult):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
        _RESULTS[cls.__name__] = cls
    globals().update(_RESULTS)


_RESULTS: dict[str, type] = {}


def __getattr__(name: str):
    """The result classes, defined on first access (see `_import_results`)."""
    if name in ("InspectResult", "RewriteResult", "Tradeoff", "VerifyResult"):
        _import_results()
        return _RESULTS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _extend(cls_name: str, base_result, **extra):
    """The driver's result as the API's subclass of it (same field values)."""
    _import_results()
    cls = _RESULTS[cls_name]
    values = {f.name: getattr(base_result, f.name) for f in fields(base_result)}
    return cls(**values, **extra)


def _gate(peak: int, limit: int | None, what: str) -> None:
    if limit is not None and peak > limit:
        from graphmem.units import format_bytes

        raise CheckFailed(f"{what} {format_bytes(peak)} is above the limit "
                          f"{format_bytes(limit)} (by {format_bytes(peak - limit)})")


def differs_message(result, exact: bool) -> str:
    """The one error line of a failed verify. With Grappler on, a correct rewrite can still
    differ by float rounding (Grappler fuses ops only where an intermediate has one reader,
    and a rewrite changes reader counts): say so, and how to compare without it."""
    text = "training differs: " + "; ".join(result.mismatches[:3])
    if not exact and max(result.max_loss_diff, result.max_variable_diff) < ROUNDING:
        text += ("; all differences are below 1e-4, as when Grappler fuses the two graphs "
                 "differently: `--exact` compares them with Grappler off")
    return text


# ---------------------------------------------------------------- option values
# The API takes Python values where the CLI takes text (an int for --batch-size, a list for
# a repeatable option), so it checks their types itself; what a value may be beyond its
# type (bounds, regexes that compile, finite sizes, writable outputs) is the CLI's own
# checks in graphmem/options.py, so both refuse the same values before any work.

def _choice(value, choices: Sequence[str], option: str, allow_none: bool = True):
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"invalid value for {option}: {value!r} is not one of "
                         f"{', '.join(repr(c) for c in choices)}")
    return value


def _int(value, option: str, low: int | None = None, high: int | None = None,
         allow_none: bool = False):
    from graphmem.options import MAX_COUNT

    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"invalid value for {option}: {value!r} is not an integer")
    high = MAX_COUNT if high is None and low is not None else high
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">={low}" if high is None else f"in the range {low}<=x<={high}"
        raise UsageError(f"invalid value for {option}: {value} is not {bounds}")
    return value


def _param(param_type, value, option: str):
    """A value through one of the CLI's click parameter types (graphmem/options.py)."""
    from click import BadParameter

    try:
        return param_type.convert(value, None, None)
    except BadParameter as exc:
        raise UsageError(f"invalid value for {option}: {exc.message}") from None


def _tolerance(value, option: str) -> float:
    from graphmem.options import TOLERANCE

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"invalid value for {option}: {value!r} is not a number")
    return _param(TOLERANCE, value, option)


def _bool(value, option: str, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise UsageError(f"invalid value for {option}: {value!r} is not True or False")
    return value


def _str(value, option: str, allow_none: bool = True):
    if value is None and allow_none:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"invalid value for {option}: {value!r} is not a string")
    return os.fspath(value)


def _strings(value: Patterns, option: str, regex=None) -> list[str]:
    """A repeatable option: one string or a sequence of them; with `regex` (a
    graphmem.options.Regex), each must compile as the CLI demands."""
    items = None
    if value is None:
        items = []
    elif isinstance(value, str):
        items = [value]
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        items = list(value)
        if not all(isinstance(v, str) for v in items):
            items = None
    if items is None:
        raise UsageError(f"invalid value for {option}: {value!r} is not a string or a list "
                         "of strings")
    if regex is not None:
        for item in items:
            _param(regex, item, option)
    return items


def _size(value, option: str) -> int | None:
    """A size option: bytes as an int, or text such as 1.5GiB."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        from graphmem.units import parse_size

        return parse_size(str(value))  # the same upper bound as text
    if not isinstance(value, str):
        raise UsageError(f"invalid value for {option}: {value!r} is not a size")
    from graphmem.units import parse_size

    return parse_size(value)


def _budget(value) -> str | None:
    """--budget: a size or a fraction of the original peak, kept as text (the rewrite
    parses it once the original peak is known)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    from graphmem.options import BUDGET

    return _param(BUDGET, _str(value, "--budget"), "--budget")


def _model_tag(tag, tag_set):
    """`tag_set` (saved_model_cli's name, the CLI's --tag-set) or `tag` (its alias)."""
    tag, tag_set = _str(tag, "--tag"), _str(tag_set, "--tag-set")
    if tag is not None and tag_set is not None and tag != tag_set:
        raise UsageError("--tag-set and --tag are one option: give one of them")
    return tag_set if tag_set is not None else tag


def _model_options(model, fmt, tag, function, batch_size, backward_scope):
    """The options every command has, checked: (format, tag, function, batch size,
    backward scopes)."""
    from graphmem.options import MAX_BATCH_SIZE, REGEX

    fmt = _choice(fmt, FORMATS, "--format")
    function = _str(function, "--function")
    batch_size = _int(batch_size, "--batch-size", 1, MAX_BATCH_SIZE, allow_none=True)
    scopes = _strings(backward_scope, "--backward-scope", REGEX)
    if _is_message(model) and (fmt is not None or tag is not None):
        raise UsageError("format and tag are for model files; an in-memory model is a "
                         "GraphDef or MetaGraphDef already")
    return fmt, tag, function, batch_size, scopes or None


def _model_path(model) -> str | None:
    """The model's path, for the checks that keep outputs off it (None in memory)."""
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else None


def _check_output(target, model, what: str = "output") -> str | None:
    if target is None:
        return None
    from graphmem.options import check_output

    path = _str(target, what)
    check_output(path, what, _model_path(model))
    return path


def _check_plot(target, model, others: tuple = ()) -> str | None:
    if target is None:
        return None
    from graphmem.options import check_plot

    path = _str(target, "--plot")
    check_plot(path, _model_path(model), others)
    return path


def swap_options(*, swap: bool = False, swap_threshold: str | int = "0",
                 swap_max_tensors: int | None = None, swap_include: Patterns = (),
                 swap_exclude: Patterns = (), swap_start: Patterns = (),
                 swap_in_ahead: str = "1:10", swap_fuse: bool = False,
                 swap_branches: bool = False, swap_branch_threshold: int = 20,
                 device: str | None = None, host_device: str = "/device:CPU:0"
                 ) -> SwapOptions | None:
    """The swap pass's options from the CLI's swap options (None when `swap` is off).
    Every value is checked, with `swap` off too, as the CLI checks them."""
    from graphmem.options import REGEX, SCOPE, parse_ahead

    on = _bool(swap, "--swap")
    values = dict(
        threshold=_size(swap_threshold, "--swap-threshold") or 0,
        max_tensors=_int(swap_max_tensors, "--swap-max-tensors", 1, allow_none=True),
        include=_strings(swap_include, "--swap-include", REGEX),
        exclude=_strings(swap_exclude, "--swap-exclude", REGEX),
        start=_strings(swap_start, "--swap-start", SCOPE),
        ahead=parse_ahead(_str(swap_in_ahead, "--swap-in-ahead", allow_none=False)),
        fuse=_bool(swap_fuse, "--swap-fuse"), branches=_bool(swap_branches, "--swap-branches"),
        branch_threshold=_int(swap_branch_threshold, "--swap-branch-threshold", 0),
        device=_str(device, "--device"),
        host=_str(host_device, "--host-device", allow_none=False))
    if not on:
        return None
    from graphmem.passes.swap import SwapOptions

    return SwapOptions(**values)


# ---------------------------------------------------------------- models

def _is_message(model) -> bool:
    return hasattr(model, "SerializeToString") and hasattr(model, "DESCRIPTOR")


def _load(model: Model, fmt, tag, function) -> LoadedModel:
    """A path read by the format layer, or a message in memory (options checked by
    `_model_options`)."""
    if _is_message(model):
        from graphmem.formats.load import load_message

        return load_message(model, function, _describe(model))
    if not isinstance(model, (str, os.PathLike)):
        raise InputError(f"expected a model path, a GraphDef or a MetaGraphDef, got "
                         f"{type(model).__name__}")
    from graphmem.formats import load_model

    return load_model(Path(model), fmt, tag, function)


def _describe(message) -> str:
    return f"<in-memory {message.DESCRIPTOR.name}>"


def _model_text(model: Model) -> str:
    return _describe(model) if _is_message(model) else os.fspath(model)


@contextlib.contextmanager
def _as_path(model: Model, option: str = "model") -> Iterator[str]:
    """A path for drivers that read files (plan, verify): an in-memory message is written
    to a temporary file of its format."""
    if not _is_message(model):
        if not isinstance(model, (str, os.PathLike)):
            raise InputError(f"expected a {option} path, a GraphDef or a MetaGraphDef, got "
                             f"{type(model).__name__}")
        yield os.fspath(model)
        return
    kind = model.DESCRIPTOR.full_name
    suffix = {"tensorflow.GraphDef": ".pb", "tensorflow.MetaGraphDef": ".meta"}.get(kind)
    if suffix is None:
        raise InputError(f"expected a {option} path, a GraphDef or a MetaGraphDef, got {kind}")
    with tempfile.TemporaryDirectory(prefix="graphmem-") as tmp:
        path = Path(tmp) / f"model{suffix}"
        path.write_bytes(model.SerializeToString())
        yield str(path)


def _save(loaded: LoadedModel, output: str, reverted: bool, in_memory: bool) -> None:
    from graphmem.formats import save_model, save_unchanged
    from graphmem.formats.model import Format

    if in_memory:  # the output path's suffix says binary or text
        meta = loaded.format in (Format.META, Format.META_TEXT)
        text = Path(output).suffix.lower() in (".pbtxt", ".txt", ".prototxt")
        loaded.format = (Format.META_TEXT if text else Format.META) if meta else \
            (Format.GRAPHDEF_TEXT if text else Format.GRAPHDEF)
        save_model(loaded, output, rewritten=not reverted)
    elif reverted:  # undone: the output is the input itself
        save_unchanged(loaded, output)
    else:
        save_model(loaded, output)


# ---------------------------------------------------------------- commands
# Each command checks every option before any work (a bad value writes nothing), then
# reads, works and writes, telling `on_stage(text)` each stage as it starts (the CLI's
# progress line; `None`: nothing told). Where sizes depend on a batch dimension nothing
# fixes, a command whose result needs sizes raises UsageError asking for `batch_size`.

Stage = Callable[[str], None] | None


def _stages(on_stage: Stage) -> Callable[[str], None]:
    if on_stage is not None and not callable(on_stage):
        raise UsageError(f"on_stage must be callable, got {type(on_stage).__name__}")
    return on_stage or (lambda text: None)


def inspect(model: Model, *, format: str | None = None,  # noqa: A002
            tag_set: str | None = None, tag: str | None = None, function: str | None = None,
            batch_size: int | None = None, backward_scope: Patterns = (),
            grappler: bool = False, max_peak: str | int | None = None, top: int = 10,
            plot: str | None = None, check: bool = True, on_stage: Stage = None):
    """Summarize a training graph: regions, saved activations, variables, estimated memory.

    Without a batch size where sizes depend on one, it still counts, and leaves sizes
    unknown (`estimated_peak_bytes` None); `plot` and `max_peak` need sizes and raise
    UsageError asking for `batch_size` then. Returns an InspectResult (`to_json()`:
    `graphmem inspect --json`). With `max_peak` (a size such as "1.5GiB", or bytes) and
    `check`, raises CheckFailed when the estimated step peak is above it; with
    `check=False`, `result.check()` does that later."""
    fmt, tag, function, batch_size, scopes = _model_options(
        model, format, _model_tag(tag, tag_set), function, batch_size, backward_scope)
    grappler = _bool(grappler, "--grappler")
    limit = _size(max_peak, "--max-peak")
    top = _int(top, "--top", 0)
    plot = _check_plot(plot, model)
    stage = _stages(on_stage)
    check = _bool(check, "check")
    from graphmem.analysis.inspect import gather_facts
    from graphmem.graph.workspace import Workspace

    stage("reading the model")
    ws = Workspace.open(_load(model, fmt, tag, function), batch_size=batch_size)
    if plot or limit is not None:
        from graphmem.analysis.batch import require_batch_size

        batch_size = require_batch_size(ws, batch_size, backward_scopes=scopes)
    stage("analysing")
    facts, _ = gather_facts(ws, batch_size, scopes, top, grappler, keep_timeline=bool(plot))
    if plot:
        from graphmem.report.plot import Series, write_plot

        stage("drawing the plot")
        write_plot(plot, [Series("estimated", facts.timeline)],
                   f"graphmem inspect {Path(_model_text(model)).name}")
    result = _extend("InspectResult", facts, max_peak_bytes=limit)
    if check:
        result.check()
    return result


def rewrite(model: Model, output: str | os.PathLike | None = None, policy: str | None = None,
            *, format: str | None = None, tag_set: str | None = None,  # noqa: A002
            tag: str | None = None, function: str | None = None,
            batch_size: int | None = None, backward_scope: Patterns = (),
            budget: str | float | None = None, checkpoints: Patterns = (),
            early_updates: bool = True, recompute_loops: bool = False,
            loop_bodies: bool | None = None, keep_worse: bool = False, grappler: bool = False,
            max_peak: str | int | None = None, plot: str | None = None, check: bool = True,
            on_stage: Stage = None, **swap: Any):
    """Rewrite a training graph to need less memory.

    With `output`, the rewritten model is written there (the input's format; for an
    in-memory model, binary unless the name ends in .pbtxt/.txt); without, it is returned
    as `result.rewritten` and nothing is written. `policy` defaults as in the CLI: memory,
    `none` with `swap=True` (and no checkpoints), `budget` with `budget`. Swap options are
    the CLI's (`swap`, `swap_threshold`, `swap_max_tensors`, `swap_include`, ...,
    `device`, `host_device`). Sizes that depend on a batch dimension nothing fixes raise
    UsageError asking for `batch_size`. Returns a RewriteResult (`to_json()`: `graphmem
    rewrite --json`); with `check`, raises CheckFailed (after writing, as the CLI exits 1)
    when the result is above `max_peak` or the budget."""
    from graphmem.options import PATTERN

    unknown = sorted(set(swap) - _SWAP_KEYS)
    if unknown:
        raise TypeError(f"rewrite() got unexpected keyword arguments: {', '.join(unknown)}")
    output = _check_output(output, model)
    plot = _check_plot(plot, model, others=(output,) if output else ())
    fmt, tag, function, batch_size, scopes = _model_options(
        model, format, _model_tag(tag, tag_set), function, batch_size, backward_scope)
    limit = _size(max_peak, "--max-peak")
    patterns = _strings(checkpoints, "--checkpoints", PATTERN)
    swap_opts = swap_options(**swap)
    policy = _choice(policy, POLICIES, "--policy")
    budget = _budget(budget)
    if budget is not None and policy not in (None, "budget"):
        raise UsageError("--budget goes with --policy budget")
    policy = policy or ("budget" if budget is not None else
                        "none" if swap_opts and not patterns else "memory")
    if policy == "budget" and not budget:
        raise UsageError("--policy budget needs --budget SIZE or FRACTION (e.g. 2GiB, 0.5)")
    flags = dict(grappler=_bool(grappler, "--grappler"),
                 early_updates=_bool(early_updates, "--early-updates"),
                 recompute_loops=_bool(recompute_loops, "--recompute-loops"),
                 loop_recompute=_bool(loop_bodies, "--loop-bodies", allow_none=True),
                 keep_worse=_bool(keep_worse, "--keep-worse"))
    stage = _stages(on_stage)
    check = _bool(check, "check")
    from graphmem.analysis.batch import require_batch_size
    from graphmem.graph.workspace import Workspace
    from graphmem.rewrite import RewriteOptions, rewrite_workspace

    stage("reading the model")
    ws = Workspace.open(_load(model, fmt, tag, function), batch_size=batch_size)
    batch_size = require_batch_size(ws, batch_size, backward_scopes=scopes)
    options = RewriteOptions(policy, patterns, batch_size, scopes, keep_timeline=bool(plot),
                             swap=swap_opts, budget=budget, **flags)
    stage("rewriting")
    driven = rewrite_workspace(ws, options)
    rewritten = None
    if output is not None:
        stage("writing the output")
        _save(ws.model, output, driven.reverted, _is_message(model))
    else:
        container = ws.model.container
        rewritten = type(model).FromString(container.SerializeToString()) \
            if _is_message(model) else container
    if plot:
        from graphmem.report.plot import Series, write_plot

        stage("drawing the plot")
        write_plot(plot, [Series("original", driven.before.timeline),
                          Series(f"rewritten ({policy})", driven.after.timeline)],
                   f"graphmem rewrite {Path(_model_text(model)).name}")
    result = _extend("RewriteResult", driven, output=output, plot=plot, rewritten=rewritten,
                     max_peak_bytes=limit)
    if check:
        result.check()
    return result


_SWAP_KEYS = {"swap", "swap_threshold", "swap_max_tensors", "swap_include", "swap_exclude",
              "swap_start", "swap_in_ahead", "swap_fuse", "swap_branches",
              "swap_branch_threshold", "device", "host_device"}


def plan(model: Model, *, format: str | None = None, tag_set: str | None = None,  # noqa: A002
         tag: str | None = None, function: str | None = None, batch_size: int | None = None,
         backward_scope: Patterns = (), points: int = 8, plot: str | None = None,
         check: bool = True, on_stage: Stage = None):
    """The trade-off between peak memory and extra compute, with the memory and speed
    policies placed on it. Sizes that depend on a batch dimension nothing fixes raise
    UsageError asking for `batch_size`. Returns a Tradeoff (`to_json()`: `graphmem plan
    --json`); `plan` has no exit-1 condition, so `check` changes nothing."""
    fmt, tag, function, batch_size, scopes = _model_options(
        model, format, _model_tag(tag, tag_set), function, batch_size, backward_scope)
    points = _int(points, "--points", 2, 64)
    plot = _check_plot(plot, model)
    stage = _stages(on_stage)
    _bool(check, "check")
    from graphmem.plan import tradeoff

    with _as_path(model) as path:
        curve = tradeoff(path, batch_size, fmt, tag, function, points, scopes,
                         on_stage=stage)
    if plot:
        from graphmem.report.plot import write_tradeoff_plot

        stage("drawing the plot")
        write_tradeoff_plot(plot, curve, f"graphmem plan {Path(_model_text(model)).name}")
    return _extend("Tradeoff", curve)


def verify(original: Model, rewritten: Model, *, format: str | None = None,  # noqa: A002
           tag_set: str | None = None, tag: str | None = None, function: str | None = None,
           batch_size: int | None = None, backward_scope: Patterns = (), steps: int = 5,
           warmup: int = 0, feed: Patterns | Mapping[str, Any] = (),
           train_op: str | None = None, loss: str | None = None, threads: int = 1,
           seed: int = 0, rtol: float = 1e-5, atol: float = 1e-6, exact: bool = False,
           check: bool = True, on_stage: Stage = None,
           on_step: Callable[[int, int], None] | None = None):
    """Train `original` and `rewritten` side by side on the same feeds; compare losses,
    variables and measured peak memory (needs TensorFlow).

    `feed`: NAME=FILE.npy strings as on the command line, or a dict of arrays by
    placeholder name. The batch size of the random feeds: `batch_size`, else the leading
    dimension of a fed array, else a SavedModel signature's; UsageError when the graph
    needs one and none is found. `exact`: zero tolerances and Grappler off.
    `on_step(done, total)` is told after each training step. Returns a VerifyResult
    (`to_json()`: `graphmem verify --json`); with `check`, raises CheckFailed when
    training differs."""
    from graphmem.options import MAX_SEED

    fmt, tag, function, batch_size, scopes = _model_options(
        original, format, _model_tag(tag, tag_set), function, batch_size, backward_scope)
    if _is_message(rewritten) and (fmt is not None or tag is not None):
        raise UsageError("format and tag are for model files; an in-memory model is a "
                         "GraphDef or MetaGraphDef already")
    steps = _int(steps, "--steps", 1)
    warmup = _int(warmup, "--warmup", 0)
    threads = _int(threads, "--threads", 1)
    seed = _int(seed, "--seed", 0, MAX_SEED)
    rtol, atol = _tolerance(rtol, "--rtol"), _tolerance(atol, "--atol")
    exact = _bool(exact, "--exact")
    train_op, loss = _str(train_op, "--train-op"), _str(loss, "--loss")
    stage = _stages(on_stage)
    check = _bool(check, "check")
    if on_step is not None and not callable(on_step):
        raise UsageError(f"on_step must be callable, got {type(on_step).__name__}")
    if isinstance(feed, Mapping):
        import numpy as np

        feeds = {str(k): np.asarray(v) for k, v in feed.items()}
    else:
        from graphmem.runtime.train_runner import load_feed_files

        feeds = load_feed_files(_strings(feed, "--feed"))
    from graphmem.analysis.batch import missing_batch_message, resolve_batch_size
    from graphmem.graph.workspace import Workspace
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify as run_verify

    stage("reading the original model")
    batch = resolve_batch_size(Workspace.open(_load(original, fmt, tag, function)),
                               batch_size, feeds)
    if batch.needed:
        raise UsageError(missing_batch_message(batch) + " (random feeds need it)")
    spec = RunSpec(train_op, loss, None, batch.size or 1, feeds, seed, threads,
                   grappler=not exact, backward_scopes=scopes)
    if exact:
        rtol = atol = 0.0
    stage("loading TensorFlow and both graphs")
    with _as_path(original, "original") as a, _as_path(rewritten, "rewritten") as b:
        ran = run_verify(a, b, spec, steps, rtol, atol, fmt, tag, function, warmup=warmup,
                         on_step=on_step)
    ran.original.path, ran.rewritten.path = _model_text(original), _model_text(rewritten)
    result = _extend("VerifyResult", ran, exact=exact, batch_size=batch.size,
                     batch_from=batch.source)
    if check:
        result.check()
    return result


__all__ = ["FORMATS", "POLICIES", "ROUNDING", "GraphmemError", "differs_message", "inspect",
           "plan", "rewrite", "swap_options", "verify"]
