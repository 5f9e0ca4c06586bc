"""The one place that imports TensorFlow, lazily."""

from __future__ import annotations

import os
from functools import cache
from types import ModuleType

from graphmem.errors import TensorFlowMissing


@cache
def tensorflow(why: str = "") -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # the BFC allocator keeps the per-device statistics that memory measurements read
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    try:
        import tensorflow as tf  # noqa: PLC0415 - lazily on purpose
    except ImportError as exc:
        raise TensorFlowMissing(why) from exc
    return tf


def available() -> bool:
    try:
        tensorflow()
    except TensorFlowMissing:
        return False
    return True
