"""Errors a user can act on.

Every error that reaches the CLI as a GraphmemError is printed as one line on stderr and ends
the process with its exit code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # verify found different training, or a --max-peak gate tripped
EXIT_USAGE = 2  # bad arguments or bad input


class GraphmemError(Exception):
    exit_code = EXIT_USAGE


class InputError(GraphmemError):
    """The model given cannot be read or is not what the command needs."""


class UsageError(GraphmemError):
    """The arguments do not fit together."""


class CheckFailed(GraphmemError):
    exit_code = EXIT_CHECK_FAILED


class TensorFlowMissing(GraphmemError):
    def __init__(self, why: str = "") -> None:
        super().__init__(
            "TensorFlow is needed for this"
            + (f" ({why})" if why else "")
            + " but is not importable; install it, e.g. `pip install graphmem[cpu]`"
            " (tensorflow-cpu) or `pip install graphmem[gpu]`"
        )
