"""Checks of the command line's option values, done before any work.

Every bad value becomes one `graphmem: error: ...` line and exit 2 at once, never an
internal error (exit 3) half-way through a run, nor an output left behind: regexes must
compile, sizes and counts must be finite and in range, output paths must be ordinary files
in an existing directory and none of the model's own files. Click parameter types (for
`type=`) and plain functions (for checks that need several values, such as -o against the
model) live here; cli.py only names them.
"""

from __future__ import annotations

import math
import os
import re
import stat
from pathlib import Path

import click

from graphmem.errors import GraphmemError, InputError, UsageError

# Leading (batch) dimensions larger than this are no training batch; TF's own int32 shape
# ops overflow past it. Bounding it keeps every size the estimate computes far from the
# 64-bit limits of the compiled allocator replay.
MAX_BATCH_SIZE = 2**31 - 1
MAX_COUNT = 2**31 - 1  # any other count option (steps, threads, tensors, distances)
MAX_SEED = 2**32 - 1  # numpy's seeds
# Temporary names add `.` before and `.XXXXXXXX.tmp` after an output's name (formats/save.py);
# most file systems allow 255 bytes per name.
MAX_OUTPUT_NAME = 255 - 16
PLOT_SUFFIXES = (".svg", ".png")


class BoundedInt(click.IntRange):
    """An integer option in [min, max], with a message that names the bounds."""

    def __init__(self, low: int, high: int = MAX_COUNT) -> None:
        super().__init__(min=low, max=high)


BATCH_SIZE = BoundedInt(1, MAX_BATCH_SIZE)
COUNT = BoundedInt(1)
NON_NEGATIVE = BoundedInt(0)
SEED = BoundedInt(0, MAX_SEED)


class Regex(click.ParamType):
    """A regular expression that compiles; the value stays the text the user gave.
    `prefix`: what the code that uses it puts in front (--swap-start anchors with ^)."""

    name = "REGEX"

    def __init__(self, prefix: str = "", lenient: bool = False) -> None:
        self.prefix = prefix
        self.lenient = lenient  # re.error is fine: the pattern is then used as a substring

    def convert(self, value, param, ctx):
        why = regex_error(self.prefix + str(value), self.lenient)
        if why is not None:
            self.fail(f"{value!r} is not a valid regular expression: {why}", param, ctx)
        return value


def regex_error(pattern: str, lenient: bool = False) -> str | None:
    """Why `pattern` does not compile (None when it does). Python raises OverflowError
    (huge repeat counts) and RecursionError (deep nesting) besides re.error."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return None if lenient else _one_line(str(exc))
    except (OverflowError, RecursionError, ValueError) as exc:
        return _one_line(str(exc) or type(exc).__name__)
    return None


REGEX = Regex()
SCOPE = Regex(prefix="^")
PATTERN = Regex(lenient=True)


class Size(click.ParamType):
    """A byte size (1.5GiB, 300MB, 4096): validated here, passed on as the text given, which
    the code that uses it parses with units.parse_size."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        from graphmem.units import parse_size

        try:
            parse_size(str(value))
        except GraphmemError as exc:
            self.fail(str(exc), param, ctx)
        return value


SIZE = Size()


class Budget(click.ParamType):
    """--budget: a size, or a fraction of the original peak in (0, 1] (the syntax of
    passes/budget.parse_budget, checked before the model is read)."""

    name = "SIZE|FRACTION"

    def convert(self, value, param, ctx):
        text = str(value)
        try:
            number = float(text)
        except ValueError:
            return SIZE.convert(text, param, ctx)
        if not math.isfinite(number) or not (0 < number <= 1 or (
                number > 1 and number.is_integer() and number < 2**63)):
            self.fail(f"{text!r}: give a size (2GiB, 500MB) or a fraction of the original "
                      "peak in (0, 1]", param, ctx)
        return value


BUDGET = Budget()


class Tolerance(click.ParamType):
    """A finite, non-negative float (verify's --rtol and --atol)."""

    name = "FLOAT"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a finite number >= 0", param, ctx)
        return number


TOLERANCE = Tolerance()


def parse_ahead(text: str) -> tuple[int, int]:
    """--swap-in-ahead LB:UB, ASCII digits only (str.isdigit also takes '²' and '١')."""
    lb, sep, ub = text.partition(":")
    if (not sep or not _ascii_int(lb) or not _ascii_int(ub) or int(lb) > int(ub)
            or int(ub) > MAX_COUNT):
        raise UsageError("--swap-in-ahead wants LB:UB with 0 <= LB <= UB, e.g. 1:10")
    return int(lb), int(ub)


def _ascii_int(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 10


# ---- paths ----------------------------------------------------------------------------

def is_saved_model_path(model: str | Path) -> bool:
    """Whether `model` names a SavedModel (its directory or its saved_model.pb[txt])."""
    path = Path(model)
    return _stat(path, follow=True) is not None and path.is_dir() or path.name in (
        "saved_model.pb", "saved_model.pbtxt")


def model_files(model: str | Path) -> tuple[Path, bool]:
    """The path that holds the model's files (a SavedModel's directory) and whether it is
    a directory, resolved (symlinks followed)."""
    path = Path(model)
    if is_saved_model_path(path):
        directory = path if path.is_dir() else path.parent
        return _resolve(directory), True
    return _resolve(path), False


def check_output(target: str | Path, what: str = "output", model: str | Path | None = None,
                 others: tuple[str | Path, ...] = ()) -> None:
    """An output path the tool may write (atomically: a temporary file renamed over it):
    in an existing directory, with a name short enough for the temporary name, nothing
    there yet or an ordinary file (or, for a SavedModel, a SavedModel directory), and
    neither the model's file, nor inside its SavedModel, nor one of `others` (the other
    outputs). Raises InputError."""
    path = Path(target)
    if not path.name or path.name in (".", ".."):
        raise InputError(f"cannot write {what} {target}: give a file name")
    if len(os.fsencode(path.name)) > MAX_OUTPUT_NAME:
        raise InputError(f"cannot write {what}: the file name is longer than "
                         f"{MAX_OUTPUT_NAME} bytes")
    parent = path.parent
    st = _stat(parent, follow=True)
    if st is None or not stat.S_ISDIR(st.st_mode):
        state = "is not a directory" if st is not None else "does not exist"
        raise InputError(f"cannot write {what} {target}: directory {parent} {state}")
    saved_model_out = model is not None and is_saved_model_path(model) and what == "output"
    st = _stat(path, follow=False)
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise InputError(f"cannot write {what} {target}: it is a symbolic link (give the "
                             "path of a file to replace)")
        if stat.S_ISDIR(st.st_mode):
            if not saved_model_out:
                raise InputError(f"{what} {target} is a directory; give a file name")
            if not any((path / n).is_file() for n in ("saved_model.pb", "saved_model.pbtxt")):
                raise InputError(f"output {target} exists and is not a SavedModel directory")
        elif not stat.S_ISREG(st.st_mode):
            from graphmem.formats.files import file_kind

            raise InputError(f"cannot write {what} {target}: it is {file_kind(st.st_mode)}, not "
                             "a regular file")
        elif saved_model_out:
            raise InputError(f"output {target} exists and is not a SavedModel directory")
    out = _resolve(path)
    if model is not None:
        source, is_dir = model_files(model)
        if out == source:
            raise InputError(f"cannot write {what} {target}: it is the input model; choose "
                             "another path")
        if is_dir and source in out.parents:
            raise InputError(f"cannot write {what} {target}: it is inside the input "
                             "SavedModel; choose a path outside it")
    for other in others:
        if other is not None and out == _resolve(Path(other)):
            raise InputError(f"cannot write {what} {target}: another output goes there")


def check_plot(target: str | Path, model: str | Path | None = None,
               others: tuple[str | Path, ...] = ()) -> None:
    """--plot FILE: a path check_output accepts, with a suffix the plotter writes, and for
    PNG, matplotlib installed (found, not imported: importing it costs a second)."""
    suffix = Path(target).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise UsageError(f"--plot writes .svg or .png files, not {Path(target).name!r}")
    if suffix == ".png" and not _has_module("matplotlib"):
        raise UsageError("PNG plots need matplotlib (pip install matplotlib); or write an .svg")
    check_output(target, "--plot", model, others)


def _has_module(name: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _stat(path: Path, follow: bool) -> os.stat_result | None:
    """os.stat or os.lstat; None when nothing is there (or it cannot be reached: a name
    too long, a loop of symlinks, a component that is a file)."""
    try:
        return os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return None


def _resolve(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return path.absolute()


def _one_line(text: str) -> str:
    return " ".join(text.split())
