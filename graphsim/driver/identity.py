"""Content identity: the digests of what shaped a result, so a cached result is reused only while every input
it was computed from is byte-for-byte (or, for a model, semantically) the same — never by name alone.

* :func:`input_digest` — one digest per input (model config with its quantization sidecar, hardware and
  profile TOML, a folder of measured tables, an FPM model file, graphsim's version); each is the SHA-256 of
  what the loader reads, so editing a file in place changes it. An input that cannot be read digests to
  ``missing:<what>`` (the result it shapes is an error row, recomputed once the file appears).
* :func:`part_checksum` / :func:`seal` / :func:`verify` — a cached part's checksum in a sidecar
  ``<part>.sum`` beside it, with the digests it was computed from: a part whose bytes or inputs changed is
  not trusted (:func:`verify` says why) and is recomputed.

Sweeps use these for their resumable parts (graphsim/sweep); search and serve-sim caches can call the same
three functions.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Mapping

from ..core.errors import GraphsimError

#: length of a digest in identity columns (hex characters of SHA-256)
DIGEST_CHARS = 16
_CHUNK = 1 << 20


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def file_digest(path) -> str:
    """SHA-256 of a file's bytes (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()[:DIGEST_CHARS]


def model_digest(model) -> str:
    """A model's config and quantization sidecar (``hf_quant_config.json`` beside it), as the loader reads
    them (canonical JSON, so whitespace does not count, values do). ``model``: a shipped name, a config
    path, a checkpoint folder, a dict, or a sweep's ModelRef (its load options count too)."""
    from ..core.config import SHIPPED, load_config
    from ..core.errors import GraphsimError
    from ..core.quant import sibling_quant_config

    opts = ""
    if hasattr(model, "name") and hasattr(model, "redundant_experts"):  # a sweep's ModelRef
        opts, model = f"{model.weights}|{model.redundant_experts}", model.name
    try:
        cfg = load_config(model)
        sibling = None
        if not isinstance(model, Mapping) and str(model).lower() not in SHIPPED:
            sibling = sibling_quant_config(Path(str(model)))
    except (GraphsimError, OSError, ValueError) as e:
        return "missing:" + _sha(str(e).encode())
    return _sha(json.dumps([cfg, sibling, opts], sort_keys=True, default=str).encode())


def toml_digest(name_or_path, kind: str = "hw") -> str:
    """A hardware (``kind="hw"``) or profile (``"profile"``) descriptor: the TOML text the loader reads."""
    from ..hw.descriptor import _DATA, _resolve, list_hw, list_profiles

    if kind == "profile" and str(name_or_path).upper() == "SOL":
        return "sol"
    folder, known = (_DATA, list_hw()) if kind == "hw" else (_DATA / "profiles", list_profiles())
    try:
        text, _ = _resolve(name_or_path, folder, kind, known)
    except Exception as e:  # noqa: BLE001 - GraphsimError for a missing file: the point's error row
        return "missing:" + _sha(str(e).encode())
    return _sha(text.encode("utf-8"))


def fpm_digest(path) -> str:
    try:
        return file_digest(path)
    except OSError as e:
        return "missing:" + _sha(str(e.strerror or e).encode())


def input_digest(*, model=None, hw=None, profile=None, fpm=None) -> dict:
    """The digests of the inputs given (None: not an input of this result), plus graphsim's version.
    Keys: ``model``, ``hw``, ``profile``, ``fpm``, ``graphsim`` (a folder of measured tables:
    :func:`graphsim.views.measured.schema.measured_digest`, which knows the tables' layout)."""
    from ..core.version import __version__

    out = {}
    if model is not None:
        out["model"] = model_digest(model)
    if hw is not None:
        out["hw"] = toml_digest(hw, "hw")
    if profile is not None:
        out["profile"] = toml_digest(profile, "profile")
    if fpm:
        out["fpm"] = fpm_digest(fpm)
    out["graphsim"] = str(__version__)
    return out


def combined(digests: Mapping) -> str:
    """One digest of several (order-independent)."""
    return _sha(json.dumps(dict(digests), sort_keys=True).encode())


# ---- cached parts ------------------------------------------------------------------------------------

def part_checksum(path) -> str:
    """The full SHA-256 of a cached part's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _sidecar(path) -> Path:
    """``<part>.sum`` beside the part (JSON: checksum and input digests)."""
    p = Path(path)
    return p.with_name(p.name + ".sum")


def seal(path, digests: Mapping, *, field: str = "output") -> None:
    """Record ``path``'s checksum and the ``digests`` it was computed from in its sidecar (atomically); a
    sidecar that cannot be written (its name taken by a folder, a full disk) is one line naming ``field``."""
    side = _sidecar(path)
    body = json.dumps({"sha256": part_checksum(path), "inputs": dict(digests)}, sort_keys=True)
    tmp = side.with_name(f".{side.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(body)
        os.replace(tmp, side)
    except OSError as e:
        raise GraphsimError(field, f"cannot write the checksum {side.parent.name}/{side.name}: "
                                   f"{e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def verify(path, digests: Mapping) -> str | None:
    """None when the part at ``path`` may be reused: its sidecar exists, its bytes match the checksum and
    it was computed from exactly ``digests``. Otherwise why not (one line)."""
    p = Path(path)
    if not p.is_file():
        return "not computed yet"
    try:
        meta = json.loads(_sidecar(p).read_text())
        want, inputs = meta["sha256"], meta["inputs"]
        assert isinstance(want, str) and isinstance(inputs, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return "no valid checksum (written by an older graphsim, or interrupted)"
    try:
        got = part_checksum(p)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if got != want:
        return "its bytes changed since it was written (damaged or edited)"
    changed = sorted(k for k in set(inputs) | set(digests) if inputs.get(k) != digests.get(k))
    if changed:
        names = {"model": "the model config", "hw": "the hardware file", "profile": "the profile file",
                 "measured": "the measured tables", "fpm": "the FPM model", "graphsim": "graphsim's version"}
        return ", ".join(names.get(k, k) for k in changed) + " changed"
    return None


def discard(path, *, field: str = "output") -> None:
    """Remove a part and its sidecar (a part that is not trusted); one that cannot be removed (a folder in its
    place) is one line naming ``field``."""
    for f in (Path(path), _sidecar(path)):
        try:
            f.unlink(missing_ok=True)
        except OSError as e:
            raise GraphsimError(field, f"cannot remove the untrusted {f.parent.name}/{f.name}: "
                                       f"{e.strerror or e}") from None


__all__ = ["input_digest", "file_digest", "model_digest", "toml_digest", "fpm_digest",
           "combined", "part_checksum", "seal", "verify", "discard"]
