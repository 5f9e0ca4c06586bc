"""What kind of file a path is, asked before reading or replacing it.

Reading a named pipe blocks until a writer comes; replacing a device node (as root, -o
/dev/null) or a symlink destroys what was there. Inputs and outputs are checked with
lstat/stat first, and every OSError becomes an InputError naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from graphmem.errors import InputError


def file_kind(mode: int) -> str:
    """What a file that is not a regular file or a directory is, in words."""
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def stat_input(path: Path) -> os.stat_result:
    """os.stat of an input (symlinks followed); InputError when it is missing, cannot be
    reached, or is neither a regular file nor a directory."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise InputError(f"{_short(path)} is a symbolic link to nothing") from None
        raise InputError(f"no such file or directory: {_short(path)}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {_short(path)}: {_reason(exc)}") from None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise InputError(f"cannot read {_short(path)}: it is {file_kind(st.st_mode)}, not a "
                         "regular file")
    return st


def check_tree(directory: Path) -> None:
    """Every entry under `directory` (a SavedModel's, which gets copied) is a regular file
    or a directory, symlinks followed: a pipe would block the copy, a dangling symlink or a
    loop of them would fail it half-way (a symlink to a directory above it, copied, would
    copy itself until the name is too long)."""
    stack: list[tuple[Path, frozenset]] = [(directory, frozenset())]
    while stack:
        here, above = stack.pop()
        try:
            st = os.stat(here)
            if (st.st_dev, st.st_ino) in above:
                raise InputError(f"cannot read {_short(here)}: a symbolic link to a directory "
                                 "that holds it (a loop)")
            above = above | {(st.st_dev, st.st_ino)}
            entries = [Path(e.path) for e in os.scandir(here)]
        except OSError as exc:
            raise InputError(f"cannot read {_short(here)}: {_reason(exc)}") from None
        for path in entries:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise InputError(f"cannot read {_short(path)}: a symbolic link to "
                                 "nothing") from None
            except OSError as exc:
                raise InputError(f"cannot read {_short(path)}: {_reason(exc)}") from None
            if stat.S_ISDIR(st.st_mode):
                stack.append((path, above))
            elif not stat.S_ISREG(st.st_mode):
                raise InputError(f"cannot read {_short(path)}: it is "
                                 f"{file_kind(st.st_mode)}, not a regular file")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split()) or type(exc).__name__


def _short(path: Path, limit: int = 120) -> str:
    """A path for an error line: a 4000-byte name is cut in the middle."""
    text = str(path)
    return text if len(text) <= limit else text[: limit // 2] + "..." + text[-limit // 2:]
