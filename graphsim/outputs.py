"""Files graphsim writes: checked before any work (a directory, a missing folder or a wrong suffix is a one-line
error naming the field), written to a uniquely named temporary beside the target and moved into place
atomically (a reader never sees half a file; two writers never share a temporary); a device such as
``/dev/null`` is written directly. Every OS failure (permissions, a full disk) becomes a
:class:`~graphsim.errors.GraphsimError` naming the field."""
from __future__ import annotations

import contextlib
import os
import sys
import uuid
from pathlib import Path
from typing import Iterator, Sequence

from .errors import GraphsimError, require


def _short(p) -> str:
    s = str(p)
    return s if len(s) <= 100 else s[:97] + "..."


def output_path(path, *, field: str = "output", suffixes: Sequence[str] = (), regular: bool = False) -> Path:
    """A writable target: a file name (not a directory) in an existing folder, with one of ``suffixes``;
    ``regular``: it must also be (or become) a regular file — a sweep's resumable Parquet, with its parts and
    lock beside it, cannot stream to a device."""
    require(isinstance(path, (str, Path)) and str(path) != "", field, f"must be a file name, got {path!r}")
    p = Path(path)
    try:
        is_dir = p.is_dir()
        folder_ok = p.parent.is_dir() if str(p.parent) else True
    except (OSError, ValueError) as e:
        raise GraphsimError(field, f"{_short(p)}: not a usable path ({e})") from None
    require(not is_dir, field, f"{_short(p)} is a directory; name a file in it")
    require(folder_ok, field, f"the folder {_short(p.parent)} does not exist")
    if regular:
        require(not _is_device(p), field, f"{_short(p)} is a device, not a file: a sweep writes a Parquet file "
                "(with resumable parts and a lock beside it); name a file")
    if suffixes:
        require(p.suffix.lower() in suffixes or _is_device(p), field,
                f"{_short(p)}: the file type must be one of {', '.join(suffixes)}")
    return p


def _is_device(p: Path) -> bool:
    try:
        return p.exists() and not p.is_file()
    except OSError:
        return False


@contextlib.contextmanager
def atomic_target(path, *, field: str = "output", suffixes: Sequence[str] = ()) -> Iterator[Path]:
    """Yield the path to write (a unique temporary beside ``path`` keeping its suffix, or the device itself);
    on success it replaces ``path`` atomically; on failure it is removed and the error names ``field``."""
    p = output_path(path, field=field, suffixes=suffixes)
    if _is_device(p):
        try:
            yield p
        except OSError as e:
            raise GraphsimError(field, f"cannot write {_short(p)}: {e.strerror or e}") from None
        return
    tmp = p.with_name(f".{p.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{p.suffix}")
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as e:
        raise GraphsimError(field, f"cannot write {_short(p)}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def write_text(path, text: str, *, field: str = "output", suffixes: Sequence[str] = ()) -> str:
    with atomic_target(path, field=field, suffixes=suffixes) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return str(path)


#: the version of every ``--json`` document (docs/json.md): additive changes keep it, renames and removals bump it
SCHEMA_VERSION = 1


def json_document(command: str, body: dict) -> str:
    """A command's ``--json`` result (docs/json.md): one object, ``schema_version`` and ``command`` first, then
    the command's fixed keys."""
    import json

    return json.dumps({"schema_version": SCHEMA_VERSION, "command": command, **body}, indent=2, default=float)


def check_output(output) -> None:
    """``-o FILE`` checked before a command's work (a directory or a missing folder fails at once); none: stdout."""
    if output:
        output_path(output)


def emit(output, text: str, note: str = "") -> None:
    """A command's result: written to ``output`` (atomically; one line says so, with ``note``) or printed."""
    if output:
        write_text(output, text)
        print(f"wrote {output}" + (f" ({note})" if note else ""))
    else:
        sys.stdout.write(text)


@contextlib.contextmanager
def exclusive(path, *, field: str = "output") -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` for the block: a second writer of the same output gets a
    one-line error at once instead of racing the first (POSIX advisory lock; no lock where fcntl is absent)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock = Path(str(path) + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise GraphsimError(field, f"cannot lock {_short(path)}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            raise GraphsimError(field, f"{_short(path)} is being written by another graphsim run ({holder}); "
                                "wait for it, or write elsewhere") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
