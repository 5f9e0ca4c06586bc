"""graphmem: rewrite TensorFlow training graphs so that training needs less memory.

As a library (docs/python-api.md):

    import graphmem
    facts = graphmem.inspect("model.meta", batch_size=64)
    result = graphmem.rewrite("model.meta", "small.meta", policy="memory", batch_size=64)
    curve = graphmem.plan("model.meta", batch_size=64)
    check = graphmem.verify("model.meta", "small.meta", batch_size=64, exact=True)
    step = graphmem.function(train_step, x, y, policy="memory")   # a live tf.function

Everything is imported on first use: `import graphmem` loads neither TensorFlow nor the
analyses nor rich, so the CLI and scripts that only need a version start fast.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from graphmem.errors import CheckFailed, GraphmemError, InputError, UsageError

__version__ = "0.1.0"

# name -> module that defines it, imported when the name is first read
_LAZY = {
    "inspect": "graphmem.api", "verify": "graphmem.api",
    "InspectResult": "graphmem.api", "RewriteResult": "graphmem.api",
    "Tradeoff": "graphmem.api", "VerifyResult": "graphmem.api",
    "function": "graphmem.live", "RewrittenFunction": "graphmem.live",
    "SignatureMismatch": "graphmem.live",
}
# `rewrite` and `plan` are API functions and, as before, driver modules of the same name
# (graphmem/rewrite.py, graphmem/plan.py): see _Command
_COMMANDS = ("rewrite", "plan")


class _Command:
    """`graphmem.rewrite` / `graphmem.plan`: calling it runs the API function of that name;
    reading any other attribute reads the driver module of that name, so
    `graphmem.rewrite.RewriteOptions`, `import graphmem.rewrite as rw` and monkeypatching
    the module keep working."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _api(self):
        return getattr(importlib.import_module("graphmem.api"), self._name)

    def _module(self) -> types.ModuleType:
        return importlib.import_module(f"graphmem.{self._name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._api()(*args, **kwargs)

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return self._api().__doc__

    @property
    def __wrapped__(self):  # inspect.signature and help() show the API function's
        return self._api()

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        # the driver module's: tools that read an object's own attributes there (pytest's
        # monkeypatch, from 9.2, to restore them) see the module's, not an empty proxy's
        # (undoing a patch would otherwise delete the module's attribute)
        return self._module().__dict__

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._module(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self._module(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._module(), attr)

    def __repr__(self) -> str:
        return f"<graphmem.{self._name}: the API function and the driver module>"


class _Package(types.ModuleType):
    """The package keeps its `rewrite` and `plan` commands when the import system binds the
    submodules of those names on it (`from graphmem.rewrite import ...` does)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _COMMANDS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


rewrite = _Command("rewrite")
plan = _Command("plan")
sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name == "keras":
        return importlib.import_module("graphmem.keras")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphmem' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"keras"})


__all__ = ["CheckFailed", "GraphmemError", "InputError", "InspectResult", "RewriteResult",
           "RewrittenFunction", "SignatureMismatch", "Tradeoff", "UsageError",
           "VerifyResult", "__version__", "function", "inspect", "plan", "rewrite", "verify"]
