"""Weight quantization as a checkpoint declares it: ``quantization_config`` in ``config.json`` and a sibling
``hf_quant_config.json`` (ModelOpt), resolved per weight by its Hugging Face module name.

A :class:`Quantization` answers one question — the storage format of the weight named ``layers.3.mlp.experts``
— from the checkpoint's default scheme, its per-layer overrides (ModelOpt ``quantized_layers``) and its
exclusions (``modules_to_not_convert`` / ``ignore`` / ``exclude_modules``: globs, ``re:`` regexes or module
prefixes), with module names matched whatever prefix the checkpoint puts before ``layers.`` (``model.``,
``model.language_model.``, ``backbone.``, ``language_model.model.``). Only linear layers are quantized:
embeddings, norms and (unless a scheme names it) the output head stay in their checkpoint dtype (BF16).

Schemes (bytes per weight = data bits / 8 + scale bits / 8 / block):

========================  ======================  ===============================================
checkpoint says           graphsim format          per weight
========================  ======================  ===============================================
fp8, weight_block 128²    ``fp8_b128x128``         1 B + one fp32 scale per 128x128 block
fp8 per tensor / channel  ``fp8``                  1 B (per-tensor/row scales are negligible)
NVFP4 (ModelOpt)          ``nvfp4``                0.5 B + one E4M3 scale per 16 (0.5625 B)
MXFP4 (gpt-oss, OCP)      ``mxfp4``                0.5 B + one E8M0 scale per 32 (0.53125 B)
W4A16 int4, group g       ``w4a16_g<g>``           0.5 B + one BF16 scale per g, BF16 activations
W4A16 NVFP4 (ModelOpt)    ``nvfp4_w4a16``          NVFP4 storage, BF16 activations
W4A8 AWQ (ModelOpt)       ``w4a8_g128``            int4 + BF16 scale per 128, FP8 activations
========================  ======================  ===============================================

A scheme's GEMM rate is its format's compute precision (NVFP4 x FP4 activations at the FP4 rate; W4A16
dequantizes to BF16). A chip without that rate runs the next wider one it has (the hardware descriptor's
fallback), which reports list under ``precision_fallbacks``.
"""
from __future__ import annotations

import fnmatch
import functools
import json
import re
from pathlib import Path
from typing import Mapping

import attrs

from .errors import GraphsimError, require

#: ``--weights`` / ``quant_algo`` names -> graphsim storage formats (see the table above).
SCHEMES = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "fp8_block": "fp8_b128x128",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
    "w4a16": "w4a16_g128",
    "w4a16_nvfp4": "nvfp4_w4a16",
}
_MODELOPT = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_PB_WO": "fp8_b128x128", "FP8_BLOCK": "fp8_b128x128",
             "NVFP4": "nvfp4", "MXFP4": "mxfp4", "W4A16_NVFP4": "nvfp4_w4a16", "NVFP4_AWQ": "nvfp4",
             "W4A16_AWQ": "w4a16_g128", "W4A8_AWQ": "w4a8_g128", "INT4_AWQ": "w4a16_g128"}


@attrs.frozen
class Quantization:
    """Per-weight storage formats of a checkpoint (see the module docstring)."""

    default: str = "bf16"  #: format of a quantized linear weight
    source: str = "none"  #: where the scheme was read (for reports)
    exclude: tuple = ()  #: patterns of modules kept in BF16
    layers: tuple = ()  #: ((pattern, format), ...) per-module overrides (ModelOpt MIXED_PRECISION)
    head: bool = False  #: the output head is quantized too (only when a scheme targets it explicitly)

    def format_of(self, module: str, *, linear: bool = True) -> str:
        """The storage format of the weight of ``module`` (a HF module name from ``layers.`` on, e.g.
        ``layers.3.self_attn.q_proj``, or ``lm_head`` / ``embed_tokens``)."""
        if not linear:
            return "bf16"
        names = _names(module)
        if self.layers:
            # the listed module, or a part of it (a checkpoint may list each expert's projections while
            # graphsim holds one tensor for the layer's experts: it takes their format)
            listed, enclosing, wild = _layer_index(self.layers)
            parts = module.split(".")
            for k in range(len(parts), 0, -1):  # the module itself, or a listed module that contains it
                if ".".join(parts[:k]) in listed:
                    return listed[".".join(parts[:k])]
            if module in enclosing:  # graphsim's tensor holds listed modules (each expert's projections)
                return enclosing[module]
            for pat, f in wild:
                if any(_matcher((pat,))(n) for n in names):
                    return f
        if self.layers and self.default == "mixed":
            return "bf16"  # a MIXED_PRECISION checkpoint quantizes only the layers it lists
        if module in ("lm_head", "head") and not self.head:
            return "bf16"
        if self.exclude and any(map(_matcher(self.exclude), names)):
            return "bf16"
        return "bf16" if self.default == "mixed" else self.default

    def override(self, weights: str) -> "Quantization":
        """``--weights``: every linear weight in ``weights`` (a :data:`SCHEMES` name); exclusions kept."""
        require(weights in SCHEMES, "weights", f"unknown weight format {weights!r}; allowed: {', '.join(SCHEMES)}")
        return Quantization(SCHEMES[weights], f"--weights {weights}", self.exclude, (), False)


@functools.lru_cache(maxsize=64)
def _layer_index(layers: tuple) -> tuple[dict, dict, list]:
    """Per-module overrides indexed once (per-expert listings run to thousands): plain module names from
    ``layers.`` on, the modules enclosing them, and the wildcard patterns kept for matching."""
    listed: dict = {}
    enclosing: dict = {}
    wild = []
    for pat, f in layers:
        if any(ch in pat for ch in "*?[") or pat.startswith("re:"):
            wild.append((pat, f))
            continue
        i = pat.find("layers.")
        name = pat[i:] if i >= 0 else pat
        listed.setdefault(name, f)
        parts = name.split(".")
        for k in range(len(parts) - 1, 0, -1):
            enclosing.setdefault(".".join(parts[:k]), f)
    return listed, enclosing, wild


def _names(module: str) -> tuple:
    """The names a checkpoint may give ``module``: bare and under the common prefixes."""
    return (module, "model." + module, "model.language_model." + module, "backbone." + module,
            "language_model.model." + module)


@functools.lru_cache(maxsize=256)
def _matcher(patterns: tuple):
    """``name -> bool``: does any of ``patterns`` match (as :func:`_match` does, one pattern at a time), built once
    per pattern list — a checkpoint may exclude hundreds of modules, asked for every weight of every layer. Plain
    names become a set of themselves and their prefixes' ``.``-children; wildcards one alternation; ``re:`` patterns
    their own expressions."""
    plain, globs, regexes = set(), [], []
    for pat in patterns:
        if pat.startswith("re:"):
            try:
                regexes.append(re.compile(pat[3:]))
            except re.error:
                raise GraphsimError("quantization_config.ignore", f"invalid regular expression {pat[3:]!r}") from None
        elif any(ch in pat for ch in "*?["):
            globs += [fnmatch.translate(pat), fnmatch.translate(pat.rstrip(".*") + ".*")]
        else:
            plain.add(pat)
            stem = pat.rstrip(".*")
            if stem != pat:  # "a.b.*" also matches "a.b.<anything>" (and "a.b" itself is not a match)
                globs.append(fnmatch.translate(stem + ".*"))
    glob = re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None

    def match(name: str) -> bool:
        if name in plain:
            return True
        if plain:  # a plain pattern p matches "p.<anything>"
            i = name.find(".")
            while i >= 0:
                if name[:i] in plain:
                    return True
                i = name.find(".", i + 1)
        if glob is not None and glob.match(name):
            return True
        return any(r.match(name) for r in regexes)
    return match


def _match(name: str, pat: str) -> bool:
    if pat.startswith("re:"):
        try:
            return re.match(pat[3:], name) is not None
        except re.error:
            raise GraphsimError("quantization_config.ignore", f"invalid regular expression {pat[3:]!r}") from None
    return fnmatch.fnmatchcase(name, pat) or fnmatch.fnmatchcase(name, pat.rstrip(".*") + ".*") or name == pat


def _strs(q: Mapping, *keys) -> tuple:
    out = []
    for k in keys:
        v = q.get(k) or ()
        require(isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v), f"quantization_config.{k}",
                f"must be a list of module names, got {v!r}")
        out += v
    return tuple(out)


def _modelopt(q: Mapping, where: str) -> Quantization:
    algo = str(q.get("quant_algo") or "").upper()
    layers = []
    per = q.get("quantized_layers") or {}
    require(isinstance(per, Mapping), f"{where}.quantized_layers", "must be an object of module -> {quant_algo}")
    for mod, spec in per.items():
        a = str((spec or {}).get("quant_algo", "")).upper() if isinstance(spec, Mapping) else ""
        require(a in _MODELOPT, f"{where}.quantized_layers.{mod}", f"unknown quant_algo {a!r}; known: {', '.join(_MODELOPT)}")
        layers.append((mod, _MODELOPT[a]))
    if algo == "MIXED_PRECISION":
        moe = str(q.get("moe_quant_algo") or "").upper()
        default = _MODELOPT.get(moe, "mixed") if not layers else "mixed"
        return Quantization(default, where, _strs(q, "exclude_modules", "ignore"), tuple(layers))
    require(algo in _MODELOPT, f"{where}.quant_algo", f"unknown quant_algo {algo!r}; known: MIXED_PRECISION, "
            + ", ".join(_MODELOPT))
    return Quantization(_MODELOPT[algo], where, _strs(q, "exclude_modules", "ignore"), tuple(layers))


def _compressed_tensors(q: Mapping, where: str) -> Quantization:
    groups = q.get("config_groups") or {}
    require(isinstance(groups, Mapping) and groups, f"{where}.config_groups", "must name at least one group")
    fmts, layers = [], []
    for gname, g in groups.items():
        w = (g or {}).get("weights") if isinstance(g, Mapping) else None
        require(isinstance(w, Mapping), f"{where}.config_groups.{gname}.weights", "must be an object")
        bits, kind = w.get("num_bits"), str(w.get("type", "int")).lower()
        gs = w.get("group_size") or 0
        acts = g.get("input_activations") if isinstance(g.get("input_activations"), Mapping) else {}
        if bits == 8 and kind == "float":
            f = "fp8_b128x128" if w.get("block_structure") == [128, 128] else "fp8"
        elif bits == 4 and kind == "float":
            f = "mxfp4" if gs == 32 or "mxfp4" in str(g.get("format", q.get("format", ""))) else (
                "nvfp4" if acts.get("num_bits") == 4 else "nvfp4_w4a16")
        elif bits == 4 and kind == "int":
            f = f"w4a16_g{gs if gs in (32, 64, 128) else 128}"
        elif bits == 8 and kind == "int":
            f = "int8"
        else:
            raise GraphsimError(f"{where}.config_groups.{gname}.weights", f"{bits}-bit {kind} weights are not "
                                "modelled; known: 8-bit float, 4-bit float (NVFP4/MXFP4), 4-bit int, 8-bit int")
        targets = g.get("targets") or ["Linear"]
        require(isinstance(targets, list) and all(isinstance(x, str) for x in targets),
                f"{where}.config_groups.{gname}.targets", f"must be a list of module names, got {targets!r}")
        if targets == ["Linear"]:
            fmts.append(f)
        else:
            layers += [(t, f) for t in targets if isinstance(t, str)]
    default = fmts[0] if fmts else "mixed"
    return Quantization(default, where, _strs(q, "ignore"), tuple(layers))


def from_config(cfg: Mapping, sibling: Mapping | None = None) -> Quantization:
    """The checkpoint's scheme: ``hf_quant_config.json`` (``sibling``) when present, else the config's
    ``quantization_config`` (also under ``text_config``); BF16 when neither declares one."""
    if sibling:
        q = sibling.get("quantization", sibling)
        require(isinstance(q, Mapping), "hf_quant_config.quantization", "must be an object")
        return _modelopt(q, "hf_quant_config")
    t = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else {}
    q = cfg.get("quantization_config") or t.get("quantization_config")
    if not q:
        return Quantization()
    require(isinstance(q, Mapping), "quantization_config", f"must be an object, got {type(q).__name__}")
    method = str(q.get("quant_method") or "").lower()
    where = "quantization_config"
    producer = q.get("producer") if isinstance(q.get("producer"), Mapping) else {}
    if q.get("quant_algo") and (method in ("", "modelopt") or producer.get("name") == "modelopt"
                                 or str(q.get("quant_algo")).upper() == "MIXED_PRECISION"):
        return _modelopt(q, where)
    if method == "fp8":
        block = q.get("weight_block_size")
        f = "fp8_b128x128" if block in ([128, 128], (128, 128)) else "fp8"
        return Quantization(f, where, _strs(q, "modules_to_not_convert", "ignored_layers", "ignore"))
    if method == "mxfp4":
        return Quantization("mxfp4", where, _strs(q, "modules_to_not_convert", "ignore"))
    if method == "compressed-tensors":
        return _compressed_tensors(q, where)
    if method in ("awq", "gptq"):
        bits, gs = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size", 128))
        require(bits == 4, f"{where}.bits", f"only 4-bit {method} is modelled, got {bits!r}")
        return Quantization(f"w4a16_g{gs if gs in (32, 64, 128) else 128}", where,
                            _strs(q, "modules_to_not_convert"))
    if method == "modelopt":
        return _modelopt(q, where)
    raise GraphsimError(f"{where}.quant_method", f"unknown quant_method {method!r}; known: fp8, mxfp4, modelopt, "
                        "compressed-tensors, awq, gptq")


def sibling_quant_config(path: str | Path) -> dict | None:
    """``hf_quant_config.json`` beside a ``config.json`` (or inside a checkpoint directory), if any."""
    p = Path(path)
    d = p if p.is_dir() else p.parent
    for name in ("hf_quant_config.json", p.name.replace("config.json", "hf_quant_config.json")
                 if p.name.endswith("_config.json") else ""):
        if not name:
            continue
        f = d / name
        if f.is_file() and f != p:
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError, OSError) as e:
                raise GraphsimError("hf_quant_config", f"{f.name}: cannot read ({e})") from None
            require(isinstance(data, Mapping), "hf_quant_config", f"{f.name}: the top level must be an object")
            return data
    return None
