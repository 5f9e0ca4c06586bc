"""Write a LoadedModel back in its own format, atomically.

A failure at any point leaves no partial output: files go to a temporary name in the target's
directory and are renamed into place; a SavedModel is assembled in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from graphmem import protos
from graphmem.errors import InputError
from graphmem.formats.files import file_kind
from graphmem.formats.load import read_file_bytes
from graphmem.formats.model import Format, LoadedModel

# fingerprint.pb hashes saved_model.pb; a rewritten graph would make it lie, so it is dropped.
_STALE_WHEN_REWRITTEN = {"fingerprint.pb"}


def serialize(model: LoadedModel) -> bytes:
    if model.format.is_text or (model.format == Format.SAVED_MODEL and model.saved_model_text):
        return protos.to_text(model.container).encode("utf-8")
    # deterministic: map fields (a node's attrs) in key order, so the same rewrite writes
    # the same bytes in every process (CI caches, diffs, reproducible builds)
    return model.container.SerializeToString(deterministic=True)


def check_output_location(target: str | Path, what: str = "output") -> None:
    """For the CLI: the directory an output goes into must exist, so a mistyped -o does
    not quietly grow a directory tree (checked before the work: a bad -o fails at once).
    The library functions below create missing parents."""
    parent = Path(target).parent
    if not parent.is_dir():
        state = "is not a directory" if parent.exists() else "does not exist"
        raise InputError(f"cannot write {what} {target}: directory {parent} {state}")


def write_atomic(target: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `target` and rename it over `target`, which
    must be nothing yet or a regular file: renaming over a device node (-o /dev/null as
    root) or a symlink would destroy it. OSErrors (a full disk, a name too long) are
    InputErrors naming the target."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _check_replaceable(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _write_error(target, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are ordinary files
        _check_replaceable(target)  # again: something may have appeared there meanwhile
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _write_error(target, exc) from None
        raise


def _check_replaceable(target: Path) -> None:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"refusing to replace {target}: it is {file_kind(st.st_mode)}, not "
                         "a regular file")


def _write_error(target: Path, exc: OSError) -> InputError:
    return InputError(f"cannot write {target}: {exc.strerror or exc}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_model(model: LoadedModel, out: str | Path, rewritten: bool = True) -> Path:
    return _write(model, Path(out), rewritten, None)


def save_unchanged(model: LoadedModel, out: str | Path) -> Path:
    """Write the model's input itself to `out`, for a rewrite that was undone: the file's
    own bytes (re-serializing the unchanged graph would only cost time and reorder them);
    a SavedModel with its own saved_model.pb, so its fingerprint.pb still matches."""
    source = model.path / _pb_name(model) if model.format == Format.SAVED_MODEL else model.path
    return _write(model, Path(out), False, read_file_bytes(source))


def _write(model: LoadedModel, out: Path, rewritten: bool, data: bytes | None) -> Path:
    """`data`: the bytes of the file (a SavedModel's saved_model.pb) to write; default:
    the model serialized."""
    data = serialize(model) if data is None else data
    if model.format != Format.SAVED_MODEL:
        if out.is_dir():
            raise InputError(f"output {out} is a directory; give a file name")
        write_atomic(out, data)
        return out
    return _save_saved_model(model, out, rewritten, data)


def _pb_name(model: LoadedModel) -> str:
    return "saved_model.pbtxt" if model.saved_model_text else "saved_model.pb"


def _save_saved_model(model: LoadedModel, out: Path, rewritten: bool, pb_data: bytes) -> Path:
    source = model.path
    if os.path.lexists(out) and (out.is_symlink() or not _is_saved_model_dir(out)):
        raise InputError(f"output {out} exists and is not a SavedModel directory")
    if out.resolve() == source.resolve():
        raise InputError("refusing to overwrite the input SavedModel; choose another -o")
    if source.resolve() in out.resolve().parents:
        raise InputError(f"refusing to write {out} inside the input SavedModel; choose "
                         "another -o")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise _write_error(out, exc) from None
    try:
        for entry in source.iterdir():
            if entry.name in ("saved_model.pb", "saved_model.pbtxt"):
                continue
            if rewritten and entry.name in _STALE_WHEN_REWRITTEN:
                continue
            if entry.is_dir():
                shutil.copytree(entry, staging / entry.name)
            else:
                shutil.copy2(entry, staging / entry.name)
        (staging / _pb_name(model)).write_bytes(pb_data)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, (OSError, shutil.Error)):
            raise InputError(f"cannot write {out}: {_copy_reason(exc)}") from None
        raise
    return out


def _copy_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split())[:200]


def _is_saved_model_dir(path: Path) -> bool:
    return path.is_dir() and any((path / n).is_file()
                                 for n in ("saved_model.pb", "saved_model.pbtxt"))
