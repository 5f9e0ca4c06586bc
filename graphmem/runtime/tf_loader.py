"""The one place that imports TensorFlow, lazily."""

from __future__ import annotations

import contextlib
import os
import sys
from functools import cache
from types import ModuleType

from graphmem.errors import InputError, TensorFlowMissing


@cache
def tensorflow(why: str = "") -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # the BFC allocator keeps the per-device statistics that memory measurements read
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    try:
        with _quiet_stderr():  # TF's C++ start-up banner is noise for our users
            import tensorflow as tf  # noqa: PLC0415 - lazily on purpose
    except ImportError as exc:
        raise TensorFlowMissing(why) from exc
    _quiet_python_logs(tf)
    return tf


def _quiet_python_logs(tf: ModuleType) -> None:
    """TF's Python warnings are noise on our stderr, where a user expects at most one
    `graphmem: error:` line: loading any Keras SavedModel with `tf.saved_model.load`
    warns that its custom gradients "will likely fail if a gradient is requested" (verify
    never asks TF for one)."""
    import logging  # noqa: PLC0415

    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    with contextlib.suppress(ImportError):
        import absl.logging  # noqa: PLC0415

        absl.logging.set_verbosity(absl.logging.ERROR)


@contextlib.contextmanager
def _quiet_stderr():
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def available() -> bool:
    try:
        tensorflow()
    except TensorFlowMissing:
        return False
    return True


@contextlib.contextmanager
def rejects_as_input_error(what: str = "TensorFlow cannot import the graph"):
    """Every exception TensorFlow raises while importing or optimizing a graph we hand it
    is about that graph (an op type it has no kernel for, inputs that do not match the
    op's signature, a bad name or dtype, bytes it cannot decode): bad input, reported as
    one line, whatever its type (ValueError, InvalidArgumentError, UnicodeDecodeError...)."""
    try:
        yield
    except (GeneratorExit, InputError, TensorFlowMissing):
        raise
    except Exception as exc:  # noqa: BLE001 - TF's errors have no common base
        raise InputError(f"{what}: {first_line(exc)}") from None


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message as one line: TF's run over several, with the node's
    definition and a stack; the first non-empty line says what is wrong."""
    text = getattr(exc, "message", None) or str(exc)
    if not isinstance(text, str):
        text = repr(text)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return line if len(line) <= limit else line[: limit - 3] + "..."
