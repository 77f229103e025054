"""Models named by their Hugging Face id (``deepseek-ai/DeepSeek-V3``), the way engines and configurators take them
(issue 29 item 2).

An id resolves, in order, to:

1. the local Hugging Face cache — ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``,
   else ``~/.cache/huggingface/hub`` (huggingface_hub's documented order): the ``config.json`` (and
   ``hf_quant_config.json``) of the snapshot ``refs/main`` names, else of the newest snapshot holding one;
2. the snapshot bundled with graphsim (``graphsim/configs/hf``, public configs with their NOTICE), directly or
   through ``ALIASES.json`` (a renamed repository, an instruction-tuned sibling with the same architecture).

graphsim makes no network call: an id in neither place fails with one line saying how to fetch it into the cache
(``huggingface-cli download ORG/NAME config.json``) and which ids are bundled.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..core.errors import GraphsimError

BUNDLED = Path(__file__).resolve().parents[1] / "configs" / "hf"
#: ``ORG/NAME``: Hugging Face repository ids (letters, digits, ``-_.``)
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def is_model_id(text) -> bool:
    return isinstance(text, str) and bool(ID.match(text)) and not Path(text).exists()


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _from_cache(model_id: str) -> Path | None:
    repo = hub_cache() / ("models--" + model_id.replace("/", "--"))
    snaps = repo / "snapshots"
    try:
        if not snaps.is_dir():
            return None
        ref = repo / "refs" / "main"
        if ref.is_file():
            p = snaps / ref.read_text(encoding="utf-8").strip() / "config.json"
            if p.is_file():
                return p
        found = [d / "config.json" for d in snaps.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def aliases() -> dict:
    """id -> (bundled id, reason) from ``ALIASES.json``."""
    f = BUNDLED / "ALIASES.json"
    if not f.is_file():
        return {}
    data = json.loads(f.read_text(encoding="utf-8"))
    return {k: (v["to"], v["why"]) for k, v in data.items()}


def bundled_ids() -> tuple[str, ...]:
    """The ids the bundled snapshot answers (files and aliases), sorted."""
    ids = {p.name[: -len("_config.json")].replace("--", "/", 1) for p in BUNDLED.glob("*_config.json")
           if not p.name.endswith("_hf_quant_config.json")}
    return tuple(sorted(ids | set(aliases())))


def _bundled(model_id: str) -> Path | None:
    target = aliases().get(model_id, (model_id, ""))[0]
    p = BUNDLED / (target.replace("/", "--") + "_config.json")
    return p if p.is_file() else None


def resolve(model_id: str) -> tuple[Path, str]:
    """(config.json path, where: ``cache`` or ``bundled``) for a Hugging Face id; a one-line error otherwise."""
    for where, find in (("cache", _from_cache), ("bundled", _bundled)):
        p = find(model_id)
        if p is not None:
            return p, where
    # case-insensitive near matches help a mistyped id
    low = model_id.lower()
    near = [i for i in bundled_ids() if i.lower() == low or i.split("/")[-1].lower() == low.split("/")[-1]]
    hint = f" did you mean {', '.join(near[:3])}?" if near else ""
    raise GraphsimError("model", f"{model_id!r} is not in the Hugging Face cache ({hub_cache()}) nor in graphsim's "
                                 f"bundled snapshot ({len(bundled_ids())} ids: graphsim models --hub);{hint} fetch it "
                                 f"with `huggingface-cli download {model_id} config.json` (graphsim makes no network "
                                 "call)")


__all__ = ["BUNDLED", "is_model_id", "hub_cache", "resolve", "bundled_ids", "aliases"]
