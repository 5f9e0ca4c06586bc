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
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
            """Raise CheckFailed (exit 1) when the estimated peak is above `max_peak`."""
            _gate(self.estimated_peak_bytes, self.max_peak_bytes, "estimated step peak")

    @dataclass
    class RewriteResult(_RewriteResult):
        """What the rewrite did. `rewritten`: the rewritten model's container (a message of
        the input's class for an in-memory model), set when no output path was given.
        `to_json()`: the `--json` document."""

        output: str | None = None
        rewritten: Any = field(default=None, repr=False, compare=False)
        max_peak_bytes: int | None = field(default=None, repr=False, compare=False)

        def to_json(self) -> dict:
            from graphmem.report.json_out import plain
            from graphmem.report.rewrite_report import rewrite_document

            return plain(rewrite_document(self, self.output))

        @property
        def final(self):
            """The estimate of the graph that was written (the original when undone)."""
            return self.before if self.reverted else self.after

        def check(self) -> None:
            """Raise CheckFailed (exit 1) when the written graph's estimated peak is above
            `max_peak`, or above the budget of `policy="budget"`."""
            from graphmem.analysis.towers import gated_peak
            from graphmem.units import format_bytes

            peak = self.final.peak_bytes
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
        """Both models trained side by side. `to_json()`: the `--json` document."""

        exact: bool = field(default=False, repr=False, compare=False)

        def to_json(self) -> dict:
            from graphmem.report.json_out import plain
            from graphmem.report.verify_report import verify_document

            return plain(verify_document(self))

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

def _choice(value, choices: Sequence[str], option: str, allow_none: bool = True):
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"invalid value for {option}: {value!r} is not one of "
                         f"{', '.join(repr(c) for c in choices)}")
    return value


def _int(value, option: str, low: int | None = None, high: int | None = None,
         allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"invalid value for {option}: {value!r} is not an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">={low}" if high is None else f"in the range {low}<=x<={high}"
        raise UsageError(f"invalid value for {option}: {value} is not {bounds}")
    return value


def _float(value, option: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"invalid value for {option}: {value!r} is not a number")
    return float(value)


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


def _strings(value: Patterns, option: str) -> list[str]:
    """A repeatable option: one string or a sequence of them."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (bytes, Mapping)):
        items = list(value)
        if all(isinstance(v, str) for v in items):
            return items
    raise UsageError(f"invalid value for {option}: {value!r} is not a string or a list "
                     "of strings")


def _size(value, option: str) -> int | None:
    """A size option: bytes as an int, or text such as 1.5GiB."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if not isinstance(value, str):
        raise UsageError(f"invalid value for {option}: {value!r} is not a size")
    from graphmem.units import parse_size

    return parse_size(value)


def _output_location(target, what: str) -> str | None:
    if target is None:
        return None
    from graphmem.formats.save import check_output_location

    path = _str(target, what)
    check_output_location(path, what)
    return path


def swap_options(*, swap: bool = False, swap_threshold: str | int = "0",
                 swap_max_tensors: int | None = None, swap_include: Patterns = (),
                 swap_exclude: Patterns = (), swap_start: Patterns = (),
                 swap_in_ahead: str = "1:10", swap_fuse: bool = False,
                 swap_branches: bool = False, swap_branch_threshold: int = 20,
                 device: str | None = None, host_device: str = "/device:CPU:0"
                 ) -> SwapOptions | None:
    """The swap pass's options from the CLI's swap options (None when `swap` is off)."""
    if not _bool(swap, "--swap"):
        return None
    from graphmem.passes.swap import SwapOptions

    ahead = _str(swap_in_ahead, "--swap-in-ahead", allow_none=False)
    lb, sep, ub = ahead.partition(":")
    if not sep or not lb.isdigit() or not ub.isdigit() or int(lb) > int(ub):
        raise UsageError("--swap-in-ahead wants LB:UB with 0 <= LB <= UB, e.g. 1:10")
    return SwapOptions(
        threshold=_size(swap_threshold, "--swap-threshold") or 0,
        max_tensors=_int(swap_max_tensors, "--swap-max-tensors", 1, allow_none=True),
        include=_strings(swap_include, "--swap-include"),
        exclude=_strings(swap_exclude, "--swap-exclude"),
        start=_strings(swap_start, "--swap-start"), ahead=(int(lb), int(ub)),
        fuse=_bool(swap_fuse, "--swap-fuse"), branches=_bool(swap_branches, "--swap-branches"),
        branch_threshold=_int(swap_branch_threshold, "--swap-branch-threshold", 0),
        device=_str(device, "--device"),
        host=_str(host_device, "--host-device", allow_none=False))


# ---------------------------------------------------------------- models

def _is_message(model) -> bool:
    return hasattr(model, "SerializeToString") and hasattr(model, "DESCRIPTOR")


def _load(model: Model, fmt, tag, function) -> LoadedModel:
    """A path read by the format layer, or a message in memory."""
    fmt = _choice(fmt, FORMATS, "--format")
    tag = _str(tag, "--tag")
    function = _str(function, "--function")
    if _is_message(model):
        if fmt is not None or tag is not None:
            raise UsageError("format and tag are for model files; an in-memory model is a "
                             "GraphDef or MetaGraphDef already")
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

def inspect(model: Model, *, format: str | None = None, tag: str | None = None,  # noqa: A002
            function: str | None = None, batch_size: int | None = None,
            backward_scope: Patterns = (), grappler: bool = False, plot: str | None = None,
            max_peak: str | int | None = None, top: int = 10, check: bool = True):
    """Summarize a training graph: regions, saved activations, variables, estimated memory.

    Returns an InspectResult (`to_json()`: `graphmem inspect --json`). With `max_peak`
    (a size such as "1.5GiB", or bytes) and `check`, raises CheckFailed when the estimated
    step peak is above it; with `check=False`, `result.check()` does that later."""
    batch_size = _int(batch_size, "--batch-size", 1, allow_none=True)
    scopes = _strings(backward_scope, "--backward-scope")
    grappler = _bool(grappler, "--grappler")
    top = _int(top, "--top", 0)
    limit = _size(max_peak, "--max-peak")
    plot = _output_location(plot, "--plot")
    from graphmem.analysis.inspect import gather_facts
    from graphmem.graph.workspace import Workspace

    ws = Workspace.open(_load(model, format, tag, function), batch_size=batch_size)
    facts, _ = gather_facts(ws, batch_size, scopes or None, top, grappler,
                            keep_timeline=bool(plot))
    if plot:
        from graphmem.report.plot import Series, write_plot

        write_plot(plot, [Series("estimated", facts.timeline)],
                   f"graphmem inspect {Path(_model_text(model)).name}")
    result = _extend("InspectResult", facts, max_peak_bytes=limit)
    if check:
        result.check()
    return result


def rewrite(model: Model, output: str | os.PathLike | None = None, policy: str | None = None,
            *, format: str | None = None, tag: str | None = None,  # noqa: A002
            function: str | None = None, batch_size: int | None = None,
            backward_scope: Patterns = (), budget: str | float | None = None,
            checkpoints: Patterns = (), grappler: bool = False, plot: str | None = None,
            max_peak: str | int | None = None, early_updates: bool = True,
            recompute_loops: bool = False, loop_bodies: bool | None = None,
            keep_worse: bool = False, check: bool = True, **swap: Any):
    """Rewrite a training graph to need less memory.

    With `output`, the rewritten model is written there (the input's format; for an
    in-memory model, binary unless the name ends in .pbtxt/.txt); without, it is returned
    as `result.rewritten` and nothing is written. `policy` defaults as in the CLI: memory,
    `none` with `swap=True` (and no checkpoints), `budget` with `budget`. Swap options are
    the CLI's (`swap`, `swap_threshold`, `swap_max_tensors`, `swap_include`, ...,
    `device`, `host_device`). Returns a RewriteResult (`to_json()`: `graphmem rewrite
    --json`); with `check`, raises CheckFailed (after writing, as the CLI exits 1) when
    the result is above `max_peak` or the budget."""
    output = _output_location(output, "output")
    plot = _output_location(plot, "--plot")
    limit = _size(max_peak, "--max-peak")
    batch_size = _int(batch_size, "--batch-size", 1, allow_none=True)
    scopes = _strings(backward_scope, "--backward-scope")
    patterns = _strings(checkpoints, "--checkpoints")
    unknown = sorted(set(swap) - _SWAP_KEYS)
    if unknown:
        raise TypeError(f"rewrite() got unexpected keyword arguments: {', '.join(unknown)}")
    swap_opts = swap_options(**swap)
    policy = _choice(policy, POLICIES, "--policy")
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        budget = str(budget)
    budget = _str(budget, "--budget")
    if budget is not None and policy not in (None, "budget"):
        raise UsageError("--budget goes with --policy budget")
    policy = policy or ("budget" if budget is not None else
                        "none" if swap_opts and not patterns else "memory")
    if policy == "budget" and not budget:
        raise UsageError("--policy budget needs --budget SIZE or FRACTION (e.g. 2GiB, 0.5)")
    if budget is not None:
        from graphmem.passes.budget import parse_budget

        parse_budget(budget, 1)  # a malformed budget fails before any work
    options_in = dict(grappler=_bool(grappler, "--grappler"),
                      early_updates=_bool(early_updates, "--early-updates"),
                      recompute_loops=_bool(recompute_loops, "--recompute-loops"),
                      loop_recompute=_bool(loop_bodies, "--loop-bodies", allow_none=True),
                      keep_worse=_bool(keep_worse, "--keep-worse"))
    from graphmem.graph.workspace import Workspace
    from graphmem.rewrite import RewriteOptions, rewrite_workspace

    options = RewriteOptions(policy, patterns, batch_size, scopes or None,
                             keep_timeline=bool(plot), swap=swap_opts, budget=budget,
                             **options_in)
    loaded = _load(model, format, tag, function)
    ws = Workspace.open(loaded, batch_size=batch_size)
    driven = rewrite_workspace(ws, options)
    rewritten = None
    if output is not None:
        _save(ws.model, output, driven.reverted, _is_message(model))
    else:
        container = ws.model.container
        rewritten = type(model).FromString(container.SerializeToString()) \
            if _is_message(model) else container
    if plot:
        from graphmem.report.plot import Series, write_plot

        write_plot(plot, [Series("original", driven.before.timeline),
                          Series(f"rewritten ({policy})", driven.after.timeline)],
                   f"graphmem rewrite {Path(_model_text(model)).name}")
    result = _extend("RewriteResult", driven, output=output, rewritten=rewritten,
                     max_peak_bytes=limit)
    if check:
        result.check()
    return result


_SWAP_KEYS = {"swap", "swap_threshold", "swap_max_tensors", "swap_include", "swap_exclude",
              "swap_start", "swap_in_ahead", "swap_fuse", "swap_branches",
              "swap_branch_threshold", "device", "host_device"}


def plan(model: Model, *, format: str | None = None, tag: str | None = None,  # noqa: A002
         function: str | None = None, batch_size: int | None = None, points: int = 8,
         plot: str | None = None):
    """The trade-off between peak memory and extra compute, with the memory and speed
    policies placed on it. Returns a Tradeoff (`to_json()`: `graphmem plan --json`)."""
    fmt = _choice(format, FORMATS, "--format")
    tag = _str(tag, "--tag")
    function = _str(function, "--function")
    batch_size = _int(batch_size, "--batch-size", 1, allow_none=True)
    points = _int(points, "--points", 2, 64)
    plot = _output_location(plot, "--plot")
    if _is_message(model) and (fmt is not None or tag is not None):
        raise UsageError("format and tag are for model files; an in-memory model is a "
                         "GraphDef or MetaGraphDef already")
    from graphmem.plan import tradeoff

    with _as_path(model) as path:
        curve = tradeoff(path, batch_size, fmt, tag, function, points)
    if plot:
        from graphmem.report.plot import write_tradeoff_plot

        write_tradeoff_plot(plot, curve, f"graphmem plan {Path(_model_text(model)).name}")
    return _extend("Tradeoff", curve)


def verify(original: Model, rewritten: Model, *, format: str | None = None,  # noqa: A002
           tag: str | None = None, steps: int = 5, warmup: int = 0, batch_size: int = 8,
           feed: Patterns | Mapping[str, Any] = (), train_op: str | None = None,
           loss: str | None = None, rtol: float = 1e-5, atol: float = 1e-6,
           threads: int = 1, seed: int = 0, exact: bool = False, check: bool = True):
    """Train `original` and `rewritten` side by side on the same feeds; compare losses,
    variables and measured peak memory (needs TensorFlow).

    `feed`: NAME=FILE.npy strings as on the command line, or a dict of arrays by
    placeholder name. `exact`: zero tolerances and Grappler off. Returns a VerifyResult
    (`to_json()`: `graphmem verify --json`); with `check`, raises CheckFailed when
    training differs."""
    fmt = _choice(format, FORMATS, "--format")
    tag = _str(tag, "--tag")
    steps = _int(steps, "--steps", 1)
    warmup = _int(warmup, "--warmup", 0)
    batch_size = _int(batch_size, "--batch-size", 1)
    threads = _int(threads, "--threads", 1)
    seed = _int(seed, "--seed")
    rtol, atol = _float(rtol, "--rtol"), _float(atol, "--atol")
    exact = _bool(exact, "--exact")
    train_op, loss = _str(train_op, "--train-op"), _str(loss, "--loss")
    if isinstance(feed, Mapping):
        import numpy as np

        feeds = {str(k): np.asarray(v) for k, v in feed.items()}
    else:
        from graphmem.runtime.train_runner import load_feed_files

        feeds = load_feed_files(_strings(feed, "--feed"))
    if (_is_message(original) or _is_message(rewritten)) and (fmt or tag):
        raise UsageError("format and tag are for model files; an in-memory model is a "
                         "GraphDef or MetaGraphDef already")
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify as run_verify

    spec = RunSpec(train_op, loss, None, batch_size, feeds, seed, threads, grappler=not exact)
    if exact:
        rtol = atol = 0.0
    with _as_path(original, "original") as a, _as_path(rewritten, "rewritten") as b:
        ran = run_verify(a, b, spec, steps, rtol, atol, fmt, tag, warmup=warmup)
    ran.original.path, ran.rewritten.path = _model_text(original), _model_text(rewritten)
    result = _extend("VerifyResult", ran, exact=exact)
    if check:
        result.check()
    return result


__all__ = ["FORMATS", "POLICIES", "GraphmemError", "differs_message", "inspect", "plan",
           "rewrite", "swap_options", "verify"]
