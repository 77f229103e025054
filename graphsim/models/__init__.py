"""Model registry: a shipped name, a ``config.json`` path or a checkpoint directory -> a Model, picked by the
family registry (:mod:`graphsim.models.families`) from ``model_type`` / ``architectures``."""
from __future__ import annotations

from pathlib import Path

from ..core.config import SHIPPED, SHIPPED_IDS, kv_cache_format, load_config
from ..core.errors import GraphsimError, require
from ..core.quant import SCHEMES, from_config, sibling_quant_config
from .base import Model


def load_model(name_or_path: str | Path | dict, *, weights: str | None = None, redundant_experts: int = 0,
               **options) -> Model:
    """Load a model by shipped name (``deepseek-v3``, ``deepseek-v4.1-flash``, ``llama-3.1-70b``…), by a
    ``config.json`` path or a checkpoint directory (with its ``hf_quant_config.json``, if any), or from a dict.

    ``weights`` overrides the checkpoint's weight quantization (a :data:`graphsim.core.quant.SCHEMES` name);
    ``redundant_experts`` adds expert copies for EP load balancing (MoE models)."""
    from .families import resolve

    hf_id = named_id = None
    if isinstance(name_or_path, str) and name_or_path.lower() in SHIPPED:
        hf_id = SHIPPED_IDS.get(name_or_path.lower())  # the public repository of a shipped config
    elif isinstance(name_or_path, str):
        from .hub import is_model_id, resolve as resolve_id

        if is_model_id(name_or_path):  # ORG/NAME: the Hugging Face cache, else the bundled snapshot
            hf_id = named_id = name_or_path
            name_or_path = resolve_id(hf_id)[0]
    cfg = load_config(name_or_path)
    name = str(name_or_path) if not isinstance(name_or_path, dict) else cfg.get("_name", "custom")
    path = Path(name) if not isinstance(name_or_path, dict) and name.lower() not in SHIPPED else None
    if path is not None:
        name = path.name if path.is_dir() else path.stem.removesuffix("_config").removesuffix(".config")
        name = name if name != "config" else path.parent.name
    if named_id is not None:  # reports name the model as the user did
        name = named_id
    sibling = sibling_quant_config(path) if path is not None else None
    if weights is not None:
        require(weights in SCHEMES, "weights", f"unknown weight format {weights!r}; allowed: {', '.join(SCHEMES)}")
    from ..core.limits import check_int

    redundant_experts = check_int("redundant_experts", redundant_experts, 0, 1 << 16)
    mt, kind, fn = resolve(cfg)
    if kind == "class":
        cls = fn()
        extra = {}
        if weights is not None or redundant_experts or sibling:
            what = ("the hf_quant_config.json of a re-quantized checkpoint is" if sibling and weights is None
                    and not redundant_experts else "weight-format overrides and redundant experts are")
            require(cls.QUANT_AWARE, "weights", f"{mt}: {what} not modelled for this family; its weights are "
                    "the formats its own semantics give")
            extra = {"weights": weights, "redundant_experts": redundant_experts, "sibling": sibling}
        vit, proc = _vision_of(cfg, path)
        if vit is not None and cls.VISION_AWARE:
            extra["vision"] = (vit, proc)
        return _with_id(cls(cfg, name, **extra, **options), hf_id)
    from ..core.config import text_config
    from .decoder import Decoder

    quant = from_config(cfg, sibling)
    if weights is not None:
        quant = quant.override(weights)
    spec = fn(text_config(cfg))
    spec = _with_vision(spec, cfg, path)
    if redundant_experts:
        spec = spec.with_redundant(redundant_experts)
    kv = options.pop("kv_format", None) or kv_cache_format(cfg if not sibling else
                                                            {**cfg, "quantization_config": sibling.get("quantization", sibling)})
    require(not options, "model", f"unknown options {sorted(options)}")
    return _with_id(Decoder(spec, name, quant, kv), hf_id)


def _vision_of(cfg: dict, path: Path | None) -> tuple:
    """(vision tower, image processor) graphsim prices for this config (Qwen3-VL, Qwen3.5, Kimi K2.5, Llama 4, Gemma 3,
    Gemma 4), or (None, None); the processor reads ``preprocessor_config.json`` beside the config when there is one,
    its missing keys taking the tower's own sizes (patch, merge), else the family's defaults."""
    if not isinstance(cfg.get("vision_config"), dict):  # every modelled tower is described there
        return None, None
    from ..core.vision import processor_for
    from .vision_tower import tower

    vit = tower(cfg)
    if vit is None:
        return None, None
    pp, source = _sibling_preprocessor(path)
    fixed = vit.preprocessor_defaults()
    if fixed is not None and (pp is None or vit.family not in ("qwen3_vl", "kimi_k25")):
        pp = {**fixed, **(pp or {})}
    proc = processor_for(vit.family, pp, source or "family defaults")
    require(proc.patch_size == vit.patch and proc.merge_size == vit.merge, "preprocessor_config.patch_size",
            f"{source}: patch_size {proc.patch_size} / merge_size {proc.merge_size} disagree with vision_config's "
            f"{vit.patch} / {vit.merge}")
    return vit, proc


def _with_vision(spec, cfg: dict, path: Path | None):
    """The decoder spec with its vision tower and image processor (:func:`_vision_of`), if any."""
    import attrs

    vit, proc = _vision_of(cfg, path)
    if vit is None:
        if isinstance(cfg.get("vision_config"), dict) and not spec.vision_note:  # a layout graphsim does not model
            return attrs.evolve(spec, vision_note=f"the {cfg.get('model_type') or spec.family} vision tower in "
                                "vision_config is not modelled yet (the text model is)")
        return spec
    return attrs.evolve(spec, vision=vit, processor=proc, vision_note="")


def _sibling_preprocessor(path: Path | None) -> tuple[dict | None, str]:
    """(``preprocessor_config.json`` beside a config.json or in a checkpoint directory, its file name) if any."""
    import json

    if path is None:
        return None, ""
    d = path if path.is_dir() else path.parent
    names = ["preprocessor_config.json"]
    if path.name.endswith("_config.json") and path.name != "config.json":  # <org>--<repo>_config.json snapshots
        names.append(path.name.removesuffix("config.json") + "preprocessor_config.json")
    for name in names:
        f = d / name
        if f.is_file():
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError, OSError) as e:
                raise GraphsimError("preprocessor_config", f"{f.name}: cannot read ({e})") from None
            require(isinstance(data, dict), "preprocessor_config", f"{f.name}: the top level must be an object")
            return data, f.name
    return None, ""


def _with_id(model: Model, hf_id: str | None) -> Model:
    """The model, remembering the Hugging Face id it was named by (launch commands carry it; None otherwise)."""
    model.hf_id = hf_id
    return model


def list_models() -> tuple[str, ...]:
    return tuple(sorted(SHIPPED))


__all__ = ["Model", "load_model", "list_models", "GraphsimError"]
