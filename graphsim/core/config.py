"""HF-style ``config.json`` reading: by shipped name, path or checkpoint directory; flat or nested under
``text_config``; and the one converter from config dicts to typed records: attrs fields declared with
:func:`field` (a kind, a default, the HF key) and read by :func:`structure` — or one at a time by :func:`need` —
with the same type and bound checks and the field path in every error."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import attrs

from .errors import GraphsimError, require

#: Shipped configs: public names users type -> file in graphsim/configs.
SHIPPED = {
    "deepseek-v3": "deepseek-v3.json",
    "deepseek-v4.1-flash": "deepseek-v4.1-flash.json",
    "deepseek-v4-flash": "deepseek-v4-flash.json",
    "llama-3.1-70b": "llama-3.1-70b.json",
}
#: the public Hugging Face repository each shipped config is of (DeepSeek-V4.1-Flash has none: the spec's model)
SHIPPED_IDS = {"deepseek-v3": "deepseek-ai/DeepSeek-V3", "deepseek-v4-flash": "deepseek-ai/DeepSeek-V4-Flash",
               "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct"}
#: package data next to this module (a plain path: importlib.resources costs a few ms of imports per run)
_CONFIGS = Path(__file__).parent.parent / "configs"


def load_config(name_or_path: str | Path | Mapping) -> dict:
    """A config dict from a shipped name (``deepseek-v3``), a path to a JSON file, or a dict."""
    if isinstance(name_or_path, Mapping):
        return dict(name_or_path)
    if not isinstance(name_or_path, (str, Path)):
        raise GraphsimError("model", f"must be a shipped name, a config.json path or a dict, got {type(name_or_path).__name__}")
    key = str(name_or_path)
    short = key if len(key) <= 80 else key[:77] + "..."
    if key.lower() in SHIPPED:
        text = (_CONFIGS / SHIPPED[key.lower()]).read_text(encoding="utf-8")
        src = key
    else:
        p = Path(key)
        try:
            if p.is_dir():  # a checkpoint directory: its config.json
                p = p / "config.json"
            found = p.is_file()
        except (OSError, ValueError):  # a name too long for a path, NUL bytes...
            found = False
        if not found:
            raise GraphsimError("model", f"unknown model {short!r}: not a shipped name ({', '.join(sorted(SHIPPED))}) "
                                "nor a config.json path or checkpoint directory")
        try:
            text, src = p.read_text(encoding="utf-8"), str(p)
        except UnicodeDecodeError:
            raise GraphsimError("model", f"{short}: not UTF-8 text (a config.json is JSON text)") from None
        except OSError as e:
            raise GraphsimError("model", f"{short}: cannot read ({e.strerror})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphsimError("model", f"{src}: invalid JSON ({e})") from None
    if not isinstance(cfg, Mapping):
        raise GraphsimError("model", f"{src}: the top level must be a JSON object, got {type(cfg).__name__}")
    return cfg


def text_config(cfg: Mapping) -> Mapping:
    """The language-model part of a config (nested ``text_config`` or the config itself)."""
    if not isinstance(cfg, Mapping):
        raise GraphsimError("config", f"must be a JSON object, got {type(cfg).__name__}")
    t = cfg.get("text_config", cfg)
    if not isinstance(t, Mapping):
        raise GraphsimError("config.text_config", f"must be an object, got {type(t).__name__}")
    return t


def need(cfg: Mapping, key: str, kind: type = int, *, where: str = "config", lo: int = 1,
         default: Any = None) -> Any:
    """One field through the converter (:func:`parse`): a required field (or ``default`` when absent and not
    None) of the right type and, for integers, in [lo, its bound] (:data:`graphsim.core.limits.CONFIG_BOUNDS`);
    else a GraphsimError naming it."""

    if key not in cfg or cfg[key] is None:
        if default is None:
            raise GraphsimError(f"{where}.{key}", "missing required field")
        return default
    v = cfg[key]
    names = {int: "int", float: "float", str: "str", bool: "bool"}
    if kind in names:
        return parse(v, names[kind], f"{where}.{key}", lo=lo)
    if not isinstance(v, kind):
        raise GraphsimError(f"{where}.{key}", f"must be {kind.__name__}, got {v!r}")
    return v


#: KV-cache dtypes as checkpoints and runtimes name them -> graphsim storage formats.
_KV_DTYPES = {"fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "fp8_e5m2": "fp8", "int8": "int8",
              "nvfp4": "fp4_e2m1_e4m3_16", "fp4": "fp4_e2m1_e4m3_16", "bf16": "bf16", "bfloat16": "bf16",
              "fp16": "fp16", "float16": "fp16", "auto": "bf16"}


def kv_cache_format(cfg: Mapping, default: str = "bf16") -> str:
    """The KV-cache storage format a checkpoint declares: ``quantization_config.kv_cache_quant_algo``
    (ModelOpt, as in ``hf_quant_config.json``), ``quantization_config.kv_cache_scheme`` (compressed-tensors:
    ``{"num_bits": 8, "type": "float"}``) or a top-level ``kv_cache_dtype``; ``default`` when none does."""
    t = text_config(cfg)
    q = t.get("quantization_config") or cfg.get("quantization_config") or {}
    if not isinstance(q, Mapping):
        raise GraphsimError("quantization_config", f"must be an object, got {type(q).__name__}")
    for field, value in (("quantization_config.kv_cache_quant_algo", q.get("kv_cache_quant_algo")),
                         ("kv_cache_dtype", t.get("kv_cache_dtype", cfg.get("kv_cache_dtype")))):
        if value is None:
            continue
        key = str(value).lower()
        if key not in _KV_DTYPES:
            raise GraphsimError(field, f"unknown KV-cache dtype {value!r}; known: {', '.join(sorted(_KV_DTYPES))}")
        return _KV_DTYPES[key]
    scheme = q.get("kv_cache_scheme")
    if scheme:
        if not isinstance(scheme, Mapping) or not isinstance(scheme.get("num_bits"), int):
            raise GraphsimError("quantization_config.kv_cache_scheme", f"expected {{num_bits, type}}, got {scheme!r}")
        bits, kind = scheme["num_bits"], str(scheme.get("type", "float")).lower()
        fmts = {(8, "float"): "fp8", (8, "int"): "int8", (4, "float"): "fp4_e2m1_e4m3_16"}
        if (bits, kind) not in fmts:
            raise GraphsimError("quantization_config.kv_cache_scheme", f"{bits}-bit {kind} KV is not modelled; "
                                f"known: {sorted(fmts)}")
        return fmts[(bits, kind)]
    return default


# ---- the converter ---------------------------------------------------------------------------------------
KINDS = ("int", "float", "str", "bool", "ints", "format")


def field(kind: str, default: Any = attrs.NOTHING, *, hf: str | None = None, lo: int = 1):
    """An attrs field read from a config dict as ``kind`` (key ``hf``, default: the field's name); required
    unless it has a default; integers in [lo, their bound] (:data:`graphsim.core.limits.CONFIG_BOUNDS`)."""
    assert kind in KINDS
    return attrs.field(default=default, metadata={"kind": kind, "hf": hf, "lo": lo})


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse(value, kind: str, where: str, *, lo: int = 1):
    """Check ``value`` against ``kind``; return it normalised (lists become tuples)."""
    from .ir import FORMATS
    from .limits import MAX_LAYERS, check_config_int, check_number

    name = where.rsplit(".", 1)[-1]
    if kind == "int" and _is_int(value):
        return check_config_int(where, name, value, lo)
    if kind == "float" and (_is_int(value) or isinstance(value, float)):
        return check_number(where, value)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "ints" and isinstance(value, (list, tuple)) and all(_is_int(v) for v in value):
        require(len(value) <= MAX_LAYERS + 64, where, f"at most {MAX_LAYERS + 64} entries, got {len(value)}")
        return tuple(check_config_int(f"{where}[{i}]", name, v) for i, v in enumerate(value))
    if kind == "format" and isinstance(value, str):
        require(value in FORMATS, where, f"unknown storage format {value!r}; known: {sorted(FORMATS)}")
        return value
    want = {"ints": "a list of integers", "format": "a storage format name"}.get(kind, f"a {kind}")
    raise GraphsimError(where, f"must be {want}, got {value!r}")


def structure(cls, section: Mapping, where: str = "config.") -> dict:
    """Read every :func:`field` of the attrs class ``cls`` from ``section`` (missing required fields and
    wrong types named by path); returns the keyword arguments for ``cls``."""
    out = {}
    for f in attrs.fields(cls):
        kind = f.metadata.get("kind")
        if kind is None:
            continue
        key = f.metadata.get("hf") or f.name
        if key in section and section[key] is not None:
            out[f.name] = parse(section[key], kind, where + key, lo=f.metadata.get("lo", 1))
        elif f.default is attrs.NOTHING:
            raise GraphsimError(where + key, "missing required field")
    return out
