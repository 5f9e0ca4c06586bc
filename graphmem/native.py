"""The compiled hot loops (graphmem/_native.c), when the install built them.

A few analyses spend most of their time in plain loops over the whole graph: reading the
nodes, edges and attrs (graph/index.py, from the serialized GraphDef instead of one
protobuf access per field), Kahn's topological sort (index.py), the executor's walk of a
step (analysis/schedule.py) and the replay of a step through TF's allocator model
(analysis/bfc.py). `_native` runs those loops in C, with the same inputs and results as
the Python functions, which stay the reference: they run when the extension is missing
(installed without a C compiler) or when GRAPHMEM_PURE_PYTHON=1 is set, and
tests/test_native.py checks that both agree.
"""

from __future__ import annotations

import os
from types import ModuleType

native: ModuleType | None = None
if os.environ.get("GRAPHMEM_PURE_PYTHON", "") in ("", "0"):
    try:
        from graphmem import _native as native
    except ImportError:  # built without a C compiler: the Python loops run
        native = None
