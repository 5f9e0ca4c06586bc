"""Run a pure computation in a forked child while the parent process goes on.

Why: the rewrite driver's estimate of the original graph does not depend on the passes, and
on a 100k-node graph it costs as much as a pass. On a machine with a second core a child
process computes it while the parent rewrites. `fork` shares the parent's memory copy on
write, so the child sees the graph exactly as it was at the fork, whatever the parent edits
afterwards, and nothing is copied up front.

Forking is used only where it is safe and worth it: POSIX `fork` available, more than one
CPU usable, TensorFlow not imported (its thread pools do not survive a fork), and a graph big
enough for the saving to beat the fork's own cost. Otherwise the computation runs at once,
in process. A child that fails for any reason (killed, out of memory, an exception) makes
`result()` return None; the caller then computes the value another way.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

MIN_NODES = 20_000  # below this a fork (tens of ms with a big heap) saves nothing


def fork_usable() -> bool:
    if not hasattr(os, "fork") or "tensorflow" in sys.modules:
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return cpus > 1


class Background(Generic[T]):
    """`fn()` computed aside (in a child) or at once; `result()` hands it over."""

    def __init__(self, fn: Callable[[], T], nodes: int, force: bool | None = None) -> None:
        self._pid: int | None = None
        self._fd: int | None = None
        self._value: T | None = None
        use_fork = force if force is not None else (nodes >= MIN_NODES and fork_usable())
        if not use_fork:
            self._value = fn()
            return
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, leave without running the parent's exit code
            os.close(read_fd)
            code = 0
            try:
                data = pickle.dumps(fn(), protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write_fd, "wb") as out:
                    out.write(data)
            except BaseException:  # noqa: BLE001 - any failure is reported as "no result"
                code = 1
            os._exit(code)
        os.close(write_fd)
        self._pid, self._fd = pid, read_fd

    @property
    def forked(self) -> bool:
        return self._pid is not None

    def cancel(self) -> None:
        """Stop the child, if any, and forget it: for a caller that fails before it needs
        the value (a child left writing into a full pipe nobody reads would wait forever)."""
        if self._pid is None:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self._fd)
        os.waitpid(self._pid, 0)
        self._pid = self._fd = None

    def result(self) -> T | None:
        if self._pid is None:
            return self._value
        chunks = []
        with os.fdopen(self._fd, "rb") as pipe:  # read to the end before waiting: a full
            while chunk := pipe.read(1 << 20):  # pipe would block the child forever
                chunks.append(chunk)
        _, status = os.waitpid(self._pid, 0)
        self._pid = None
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            self._value = pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a truncated message is a failed child
            return None
        return self._value
