"""JSON output: dataclasses and tuples made plain, one document on stdout."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        items = sorted(value) if isinstance(value, set) else value
        return [plain(v) for v in items]
    return value


def emit(document: Any) -> None:
    json.dump(plain(document), sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")
