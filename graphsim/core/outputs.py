"""Files graphsim writes: checked before any work (a directory, a device such as ``/dev/null`` or ``/dev/full``,
an unusable path or a wrong suffix is a one-line error naming the field; a missing folder is created),
written to a uniquely named temporary beside the target and moved into place atomically (a reader never
sees half a file; two writers never share a temporary), under an exclusive lock when asked
(:func:`locked_output`: a second writer of the same output fails at once). Every OS failure (permissions,
a full disk) becomes a :class:`~graphsim.core.errors.GraphsimError` naming the field. Names taken from inputs (a hardware name, a
partition key) become path components only through :func:`safe_name`."""
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


def safe_name(name, field: str) -> str:
    """``name`` (from an input file: a hardware name, a family, a version) as one path component, or a
    one-line error naming ``field``: no separators, no ``..``/``.``, nothing absolute, no NUL or control
    characters, not hidden, at most 128 characters."""
    require(isinstance(name, str) and name != "", field, f"must be a non-empty name, got {name!r}")
    text = name if len(name) <= 40 else name[:37] + "..."
    require(len(name) <= 128, field, f"{text!r} is too long for a folder name (at most 128 characters)")
    require(all(c.isprintable() for c in name), field, f"{text!r} holds control characters (NUL, newline...)")
    require("/" not in name and "\\" not in name and not os.path.isabs(name), field,
            f"{text!r} holds a path separator; a name here becomes one folder name")
    require(name not in (".", "..") and not name.startswith("."), field,
            f"{text!r} is not usable as a folder name (it starts with a dot)")
    return name


def output_path(path, *, field: str = "output", suffixes: Sequence[str] = (), regular: bool = True,
                folder: bool = False) -> Path:
    """A writable target, checked before any work: a file name (``folder``: a folder name) that is not a
    device, with one of ``suffixes``; its missing parent folders are created. (``regular`` is kept for
    callers written when devices were allowed: a device is always refused now.)"""
    require(isinstance(path, (str, Path)) and str(path) != "", field, f"must be a file name, got {path!r}")
    p = Path(path)
    try:
        is_dir, exists = p.is_dir(), p.exists()
    except (OSError, ValueError) as e:
        raise GraphsimError(field, f"{_short(p)}: not a usable path ({e})") from None
    require(not _is_device(p), field, f"{_short(p)} is a device, not a file; name a file to write")
    if folder:
        require(is_dir or not exists, field, f"{_short(p)} exists and is not a folder")
    else:
        require(not is_dir, field, f"{_short(p)} is a directory; name a file in it")
    if suffixes and not folder:
        require(p.suffix.lower() in suffixes, field, f"{_short(p)}: the file type must be one of {', '.join(suffixes)}")
    _make_folder(p if folder else p.parent, field)
    return p


def _make_folder(d: Path, field: str) -> None:
    if str(d) in ("", "."):
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise GraphsimError(field, f"{_short(d)} exists and is not a folder") from None
    except (OSError, ValueError) as e:
        raise GraphsimError(field, f"cannot create the folder {_short(d)}: {getattr(e, 'strerror', None) or e}") from None


def _is_device(p: Path) -> bool:
    try:
        return p.exists() and not p.is_file() and not p.is_dir()
    except OSError:
        return False


@contextlib.contextmanager
def atomic_target(path, *, field: str = "output", suffixes: Sequence[str] = ()) -> Iterator[Path]:
    """Yield the path to write (a unique temporary beside ``path`` keeping its suffix); on success it
    replaces ``path`` atomically; on failure it is removed and the error names ``field``."""
    p = output_path(path, field=field, suffixes=suffixes)
    tmp = p.with_name(f".{p.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{p.suffix}")
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as e:
        raise GraphsimError(field, f"cannot write {_short(p)}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def locked_output(path, *, field: str = "output", suffixes: Sequence[str] = (), folder: bool = False) -> Iterator[Path]:
    """The one way to write a command's output: checked (:func:`output_path`), held under an exclusive
    lock for the block (a second run writing the same output fails with one line), OS errors as one line.
    Yields the checked path; write files with :func:`atomic_target` / :func:`write_text` inside::

        with locked_output(a.output, suffixes=(".parquet",)) as out:
            write_text(out, text)
    """
    p = output_path(path, field=field, suffixes=suffixes, folder=folder)
    with exclusive(p, field=field):
        yield p


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
    except ValueError as e:  # NUL in the name
        raise GraphsimError(field, f"cannot lock {_short(path)}: {e}") from None
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
