"""Model registry: a shipped name or a config.json path -> a Model (picked by ``model_type``)."""
from __future__ import annotations

from pathlib import Path

from ..config import SHIPPED, load_config
from ..errors import GraphsimError
from .base import Model


def load_model(name_or_path: str | Path | dict, **options) -> Model:
    """Load a model by shipped name (``deepseek-v3``, ``deepseek-v4.1-flash``, ``llama-3.1-70b``…) or path."""
    cfg = load_config(name_or_path)
    name = str(name_or_path) if not isinstance(name_or_path, dict) else cfg.get("_name", "custom")
    name = Path(name).stem if name.endswith(".json") else name
    mt = cfg.get("model_type") or cfg.get("text_config", {}).get("model_type")
    if mt in ("llama", "mistral", "qwen2"):
        from .llama import LlamaModel

        return LlamaModel(cfg, name, **options)
    if mt in ("deepseek_v3", "deepseek_v32"):
        from .deepseek_v3 import DeepSeekV3

        return DeepSeekV3(cfg, name, **options)
    if mt in ("deepseek_v41", "deepseek_v41_text"):
        from .deepseek_v41_graph import DeepSeekV41

        return DeepSeekV41(cfg, name, **options)
    if mt in ("deepseek_v4", "deepseek_v4_text"):
        from .deepseek_v4_graph import DeepSeekV4

        return DeepSeekV4(cfg, name, **options)
    raise GraphsimError("model_type", f"unsupported model_type {mt!r}; supported: llama, deepseek_v3, deepseek_v41, deepseek_v4")


def list_models() -> tuple[str, ...]:
    return tuple(sorted(SHIPPED))


__all__ = ["Model", "load_model", "list_models"]
