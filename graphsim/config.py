"""HF-style ``config.json`` reading: by shipped name or by path; flat or nested under ``text_config``."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from .errors import GraphsimError

#: Shipped configs: public names users type -> file in graphsim/configs.
SHIPPED = {
    "deepseek-v3": "deepseek-v3.json",
    "deepseek-v4.1-flash": "deepseek-v4.1-flash.json",
    "deepseek-v4-flash": "deepseek-v4-flash.json",
    "llama-3.1-70b": "llama-3.1-70b.json",
}


def load_config(name_or_path: str | Path | Mapping) -> dict:
    """A config dict from a shipped name (``deepseek-v3``), a path to a JSON file, or a dict."""
    if isinstance(name_or_path, Mapping):
        return dict(name_or_path)
    key = str(name_or_path)
    if key.lower() in SHIPPED:
        text = (resources.files("graphsim") / "configs" / SHIPPED[key.lower()]).read_text()
        src = key
    else:
        p = Path(key)
        if not p.is_file():
            raise GraphsimError("model", f"unknown model {key!r}: not a shipped name ({', '.join(sorted(SHIPPED))}) nor a config.json path")
        text, src = p.read_text(), str(p)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphsimError("model", f"{src}: invalid JSON ({e})") from None


def text_config(cfg: Mapping) -> Mapping:
    """The language-model part of a config (nested ``text_config`` or the config itself)."""
    return cfg.get("text_config", cfg)


def need(cfg: Mapping, key: str, kind: type = int, *, where: str = "config") -> Any:
    """A required field of the right type, or a GraphsimError naming it."""
    if key not in cfg:
        raise GraphsimError(f"{where}.{key}", "missing required field")
    v = cfg[key]
    ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
    if kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not ok:
        raise GraphsimError(f"{where}.{key}", f"must be {kind.__name__}, got {v!r}")
    return v
