"""Human-friendly byte sizes, both ways."""

from __future__ import annotations

import math
import re

from graphmem.errors import UsageError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}
MAX_SIZE = 2**63 - 1  # what a 64-bit byte count holds
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'1.5GiB' -> 1610612736; '300MB' -> 300000000; a bare number is bytes."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"cannot read size {text!r}: use a number with an optional unit "
                         "(B, KB, MB, GB, KiB, MiB, GiB), e.g. 1.5GiB or 300MB")
    value = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value >= 2.0**63:
        raise UsageError(f"size {text!r} is too large (at most {MAX_SIZE} bytes)")
    return int(value)


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def format_shape(shape: list[int] | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"
