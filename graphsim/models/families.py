"""Model families: a Hugging Face ``config.json`` (by ``model_type``) -> a model composed from cost rules.

Each family is one short function from the config's fields to a :class:`~graphsim.models.decoder.DecoderSpec`
(layers of :class:`~graphsim.core.rules.AttentionShape` / :class:`~graphsim.core.rules.RecurrentShape` mixers and
dense / :class:`~graphsim.core.rules.MoEShape` feed-forward blocks), registered with :func:`family`. Fields are
read through :func:`graphsim.core.config.need` (type, bounds, the field path in every error). DeepSeek's MLA
families and V4/V4.1 have their own model classes and register here too, so the registry is the one list
of what graphsim accepts.
"""
from __future__ import annotations

from typing import Callable, Mapping

from ..core.config import need, text_config
from ..core.errors import GraphsimError, require
from ..core.limits import MAX_CONTEXT
from ..core.rules import AttentionShape, MoEShape, RecurrentShape
from .decoder import DecoderSpec, HFNames, LayerSpec

#: model_type -> (builder kind, function). Kind "decoder": fn(text config) -> DecoderSpec; kind "class":
#: fn() -> the Model class taking (cfg, name, **options).
FAMILIES: dict[str, tuple[str, Callable]] = {}
#: model_types seen in public checkpoints that graphsim does not model yet, with the missing mechanism.
UNSUPPORTED = {
    "kimi_linear": "Kimi Delta Attention (KDA) with MLA layers",
    "kimi_k3": "Kimi Delta Attention (KDA) with MLA layers",
    "nemotron-nas": "per-layer heterogeneous blocks (DeciLM block_configs: skipped attention / variable FFN)",
    "gemma4": "Gemma 4's per-type attention (global layers with their own head dim and shared K=V; the MoE "
              "variants also run a dense MLP beside the MoE block)",
    "gemma4_text": "Gemma 4's per-type attention (global layers with their own head dim and shared K=V; the MoE "
                   "variants also run a dense MLP beside the MoE block)",
    "minimax_m3": "MiniMax-M3's block-sparse attention (sparse_attention_config: index heads scoring 128-token blocks)",
    "minimax_m3_vl": "MiniMax-M3's block-sparse attention (sparse_attention_config: index heads scoring 128-token "
                     "blocks) and its vision tower",
    "mimo_v2_flash": "MiMo-V2-Flash's per-type attention (sliding-window layers with their own heads, head dims and "
                     "sink biases)",
}


def family(*model_types: str, kind: str = "decoder"):
    def deco(fn):
        for mt in model_types:
            FAMILIES[mt] = (kind, fn)
        return fn

    return deco


def accepted() -> str:
    return ", ".join(sorted(FAMILIES))


def resolve(cfg: Mapping) -> tuple[str, str, Callable]:
    """(model_type, kind, fn) for a config: its ``model_type``, then its text config's, then its
    ``architectures``; an unknown type names what is accepted (and, where known, the missing mechanism)."""
    t = text_config(cfg)
    cands = [cfg.get("model_type"), t.get("model_type")]
    for mt in cands:
        if isinstance(mt, str) and mt in FAMILIES:
            return (mt, *FAMILIES[mt])
    arch = cfg.get("architectures") or t.get("architectures") or []
    for a in arch if isinstance(arch, list) else []:
        mt = _ARCH.get(a) if isinstance(a, str) else None
        if mt:
            return (mt, *FAMILIES[mt])
    shown = next((m for m in cands if m), None)
    if isinstance(shown, str) and shown in UNSUPPORTED:
        raise GraphsimError("model_type", f"{shown!r} needs {UNSUPPORTED[shown]}, which graphsim does not model yet; "
                            f"accepted: {accepted()}")
    raise GraphsimError("model_type", f"unsupported model_type {shown!r}; accepted: {accepted()}")


_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
         "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral",
         "DeepseekV3ForCausalLM": "deepseek_v3"}


# ---- shared readers ------------------------------------------------------------------------------------
def _model_type(t: Mapping) -> str:
    mt = t.get("model_type")
    return mt if isinstance(mt, str) else ""


def _str(t: Mapping, key: str, default: str) -> str:
    v = t.get(key, default)
    if v is None:
        return default
    require(isinstance(v, str), f"config.{key}", f"must be a string, got {v!r}")
    return v


def _act(t: Mapping, key: str = "hidden_act", default: str = "silu") -> str:
    from ..core.rules import ACTIVATIONS

    v = _str(t, key, default)
    require(v in ACTIVATIONS, f"config.{key}", f"unknown activation {v!r}; known: {', '.join(ACTIVATIONS)}")
    return v


def _ints(t: Mapping, key: str, n: int | None = None) -> list:
    v = t.get(key) or []
    ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    require(ok and (n is None or len(v) == n), f"config.{key}",
            f"must be a list of {'' if n is None else f'{n} '}integers, got {str(v)[:80]}")
    return v


def _common(t: Mapping) -> dict:
    return {"hidden": need(t, "hidden_size"), "vocab": need(t, "vocab_size"),
            "tie_embeddings": bool(t.get("tie_word_embeddings", False)),
            "max_position": need(t, "max_position_embeddings", default=MAX_CONTEXT)}


def _attention(t: Mapping, **kw) -> AttentionShape:
    heads = need(t, "num_attention_heads")
    kv = need(t, "num_key_value_heads", default=heads)
    require(heads % kv == 0, "config.num_key_value_heads", f"must divide num_attention_heads ({heads}), got {kv}")
    hd = need(t, "head_dim", default=max(need(t, "hidden_size") // heads, 1))
    return AttentionShape(heads, kv, hd, **kw)


def _layer_types(t: Mapping, n: int) -> list:
    lt = t.get("layer_types")
    if lt is None:
        return ["full_attention"] * n
    require(isinstance(lt, list) and len(lt) == n and all(isinstance(x, str) for x in lt), "config.layer_types",
            f"must list one type per layer ({n}), got {str(lt)[:80]}")
    return lt


def _bias(t: Mapping, a: AttentionShape) -> int:
    """q/k/v (and, for gpt-oss, o) projection biases."""
    return (a.heads * a.head_dim + 2 * a.kv_heads * a.head_dim) if t.get("attention_bias") or t.get("qkv_bias") else 0


def _moe(t: Mapping, *, experts: str, inter: str, shared: int = 0, act: str = "silu") -> MoEShape:
    e = need(t, experts)
    k = need(t, "num_experts_per_tok")
    require(k <= e, "config.num_experts_per_tok", f"must be <= {experts} ({e}), got {k}")
    return MoEShape(e, k, need(t, inter), shared, act, scoring=_str(t, "scoring_func", "softmax"))


# ---- dense and MoE GQA families --------------------------------------------------------------------------
@family("llama", "mistral", "qwen2", "mimo", "qwen3", "qwen3_vl_text", "qwen3_vl")
def dense(t: Mapping) -> DecoderSpec:
    """Dense GQA + gated MLP. Mistral: one sliding window on every layer; Qwen3: per-head QK norm; Qwen2:
    q/k/v biases."""
    n = need(t, "num_hidden_layers")
    mt = _model_type(t)
    window = need(t, "sliding_window", default=0, lo=0) if (mt == "mistral" or t.get("use_sliding_window") is True) else 0
    a = _attention(t, window=window, qk_norm=mt.startswith("qwen3"))
    layer = LayerSpec(a, need(t, "intermediate_size"), _act(t),
                      extra=_bias(t, a) + (2 * a.head_dim if a.qk_norm else 0))
    return DecoderSpec(mt or "llama", layers=(layer,) * n, vision_note=_vl_note(t), **_common(t))


def _vl_note(t: Mapping) -> str:
    """Why a Qwen3-VL text config prices no images: the tower is read from the full config's ``vision_config``
    (graphsim.models.vision_tower), which a text config alone does not carry."""
    if _model_type(t).startswith("qwen3_vl"):
        return "this Qwen3-VL config carries no vision_config, so graphsim loads its text model only"
    return ""


@family("qwen3_moe", "qwen2_moe", "qwen3_vl_moe_text", "qwen3_vl_moe")
def qwen_moe(t: Mapping) -> DecoderSpec:
    """Qwen MoE: routed experts every ``decoder_sparse_step`` layers except ``mlp_only_layers``; Qwen2-MoE's
    shared expert; Qwen3's QK norm."""
    n = need(t, "num_hidden_layers")
    mt = _model_type(t)
    a = _attention(t, qk_norm=mt.startswith("qwen3"))
    f = _moe(t, experts="num_experts", inter="moe_intermediate_size",
             shared=need(t, "shared_expert_intermediate_size", default=0, lo=0))
    step = need(t, "decoder_sparse_step", default=1)
    dense_only = set(_ints(t, "mlp_only_layers"))
    extra = _bias(t, a) + (2 * a.head_dim if a.qk_norm else 0)
    layers = tuple(LayerSpec(a, f if (i not in dense_only and (i + 1) % step == 0) else need(t, "intermediate_size"),
                             extra=extra) for i in range(n))
    return DecoderSpec(mt, layers=layers, vision_note=_vl_note(t), **_common(t))


@family("mixtral", "minimax_m2")
def mixtral(t: Mapping) -> DecoderSpec:
    """Top-k softmax MoE on every layer (``block_sparse_moe``); MiniMax-M2 adds QK norm and sigmoid routing."""
    n = need(t, "num_hidden_layers")
    mt = _model_type(t)
    window = need(t, "sliding_window", default=0, lo=0) if mt == "mixtral" else 0
    a = _attention(t, window=window, qk_norm=bool(t.get("use_qk_norm")))
    f = _moe(t, experts="num_local_experts", inter="intermediate_size",
             shared=need(t, "shared_intermediate_size", default=0, lo=0))
    extra = (a.heads + a.kv_heads) * a.head_dim if a.qk_norm else 0  # MiniMax-M2: per-layer QK norm weights
    hf = HFNames(mlp="block_sparse_moe")
    return DecoderSpec(mt, layers=(LayerSpec(a, f, extra=extra),) * n, hf=hf,
                       mtp_layers=need(t, "num_mtp_modules", default=0, lo=0), **_common(t))


@family("gpt_oss")
def gpt_oss(t: Mapping) -> DecoderSpec:
    """gpt-oss: alternating sliding-window (128) and full attention, a learned sink per head, biases on
    every projection, MXFP4 experts with a clamped SwiGLU."""
    n = need(t, "num_hidden_layers")
    w = need(t, "sliding_window")
    f = _moe(t, experts="num_local_experts", inter="intermediate_size", act="swigluoai")
    layers = []
    for lt in _layer_types(t, n):
        a = _attention(t, window=w if lt == "sliding_attention" else 0, sinks=True)
        # q/k/v/o biases, the sinks, router bias and the experts' biases (gate_up 2i + down h per expert)
        o_bias = need(t, "hidden_size") if t.get("attention_bias") else 0
        extra = _bias(t, a) + o_bias + a.heads + f.experts * (1 + 2 * f.inter + need(t, "hidden_size"))
        layers.append(LayerSpec(a, f, "swigluoai", extra=extra))
    return DecoderSpec("gpt_oss", layers=tuple(layers), hf=HFNames(router="router"), **_common(t))


@family("step3p7")
def step3p7(t: Mapping) -> DecoderSpec:
    """Step-3.7-Flash: full and sliding-window GQA layers (``layer_types``), dense first layers, then MoE with a
    shared expert (``share_expert_dim``)."""
    n = need(t, "num_hidden_layers")
    w = need(t, "sliding_window")
    dense_n = need(t, "first_k_dense_replace", default=0, lo=0)
    f = MoEShape(need(t, "num_experts"), need(t, "num_experts_per_tok"), need(t, "moe_intermediate_size"),
                 need(t, "share_expert_dim", default=0, lo=0) * need(t, "n_shared_experts", default=1, lo=0),
                 scoring=_str(t, "scoring_func", "softmax"))
    require(f.top_k <= f.experts, "config.num_experts_per_tok", f"must be <= num_experts ({f.experts})")
    layers = []
    for i, lt in enumerate(_layer_types(t, n)):
        a = _attention(t, window=w if lt == "sliding_attention" else 0)
        layers.append(LayerSpec(a, need(t, "intermediate_size") if i < dense_n else f,
                                extra=f.experts if i >= dense_n else 0))  # router bias
    return DecoderSpec("step3p7", layers=tuple(layers), mtp_layers=need(t, "num_nextn_predict_layers", default=0, lo=0),
                       **_common(t))


@family("llama4_text", "llama4")
def llama4(t: Mapping) -> DecoderSpec:
    """Llama 4: chunked local attention (``attention_chunk_size``) with RoPE and QK norm on three layers of
    four, global NoPE attention on the fourth (``no_rope_layers``); MoE (top-1 + a shared expert) every
    ``interleave_moe_layer_step`` layers, a dense MLP (``intermediate_size_mlp``) elsewhere."""
    n = need(t, "num_hidden_layers")
    chunk = need(t, "attention_chunk_size", default=0, lo=0)
    rope = _ints(t, "no_rope_layers", n) if t.get("no_rope_layers") else [0 if (i + 1) % 4 == 0 else 1 for i in range(n)]
    step = need(t, "interleave_moe_layer_step", default=1)
    f = _moe(t, experts="num_local_experts", inter="intermediate_size", shared=need(t, "intermediate_size"))
    layers = []
    for i in range(n):
        local = bool(rope[i])
        a = _attention(t, chunk=chunk if local else 0, qk_norm=local and bool(t.get("use_qk_norm")))
        ffn = f if (i + 1) % step == 0 else need(t, "intermediate_size_mlp")
        layers.append(LayerSpec(a, ffn))
    return DecoderSpec("llama4", layers=tuple(layers), hf=HFNames(experts="experts", router="router",
                                                                  shared="shared_expert"), **_common(t))


@family("gemma2", "gemma3_text", "gemma3")
def gemma(t: Mapping) -> DecoderSpec:
    """Gemma 2/3: GeGLU MLP, tied embeddings, sliding-window layers with a full layer every
    ``sliding_window_pattern`` (Gemma 3: QK norm, 5 local : 1 global), two extra norms per layer."""
    n = need(t, "num_hidden_layers")
    mt = _model_type(t)
    w = need(t, "sliding_window")
    pattern = need(t, "sliding_window_pattern", default=6 if mt.startswith("gemma3") else 2)
    types = t.get("layer_types") or ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                     for i in range(n)]
    types = _layer_types({"layer_types": types}, n)
    h = need(t, "hidden_size")
    layers = []
    for lt in types:
        a = _attention(t, window=w if lt == "sliding_attention" else 0, qk_norm=mt.startswith("gemma3"))
        layers.append(LayerSpec(a, need(t, "intermediate_size"), "gelu_pytorch_tanh",
                                extra=2 * h + (2 * a.head_dim if a.qk_norm else 0)))
    common = _common({**GEMMA3_TEXT_DEFAULTS, **t} if mt.startswith("gemma3") else t)
    common["tie_embeddings"] = bool(t.get("tie_word_embeddings", True))
    return DecoderSpec(mt, layers=tuple(layers), **common)


#: transformers' Gemma3TextConfig defaults that published Gemma 3 configs leave out (google/gemma-3-27b-it's
#: text_config names neither)
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "max_position_embeddings": 131_072}


# ---- hybrids: linear attention and state-space layers -----------------------------------------------------
@family("qwen3_next", "qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")
def qwen_hybrid(t: Mapping) -> DecoderSpec:
    """Qwen3-Next / Qwen3.5: Gated DeltaNet linear attention on three layers of four, gated full attention
    (output gate, QK norm) on the fourth; dense or MoE (+ shared expert) feed-forward."""
    n = need(t, "num_hidden_layers")
    interval = need(t, "full_attention_interval", default=4)
    types = t.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                     for i in range(n)]
    types = _layer_types({"layer_types": types}, n)
    a = _attention(t, qk_norm=True, out_gate=bool(t.get("attn_output_gate", True)))
    g = RecurrentShape("gated_delta_net", need(t, "linear_num_value_heads"), need(t, "linear_num_key_heads"),
                       need(t, "linear_key_head_dim"), need(t, "linear_value_head_dim"),
                       need(t, "linear_conv_kernel_dim", default=4))
    moe = bool(t.get("num_experts"))
    ffn = (_moe(t, experts="num_experts", inter="moe_intermediate_size",
                shared=need(t, "shared_expert_intermediate_size", default=0, lo=0)) if moe
           else need(t, "intermediate_size"))
    # GDN extras: conv1d weights, A_log and dt_bias per value head, the gated norm; attention: QK norm;
    # MoE: the shared expert's sigmoid gate (hidden -> 1)
    g_extra = g.conv_dim * g.conv + 2 * g.heads + g.v_dim
    gate = need(t, "hidden_size") if moe and ffn.shared_inter else 0
    layers = tuple(LayerSpec(a, ffn, extra=2 * a.head_dim + gate) if lt == "full_attention"
                   else LayerSpec(g, ffn, extra=g_extra + gate) for lt in types)
    return DecoderSpec(_model_type(t) or "qwen3_next", layers=layers,
                       mtp_layers=need(t, "mtp_num_hidden_layers", default=0, lo=0), **_common(t))


@family("nemotron_h")
def nemotron_h(t: Mapping) -> DecoderSpec:
    """Nemotron-H: one block per layer from ``hybrid_override_pattern`` (or ``layers_block_type``) — ``M``
    Mamba-2, ``*`` attention, ``-`` ReLU² MLP, ``E`` ReLU² MoE with a shared expert; Nemotron 3 Super/Ultra's
    latent MoE (``moe_latent_size``) runs the routed experts in a narrower latent space."""
    blocks = t.get("layers_block_type")
    if blocks is not None:  # newer configs list block names instead of the pattern string
        names = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
        require(isinstance(blocks, list) and all(b in names for b in blocks), "config.layers_block_type",
                f"must list blocks of {sorted(names)}, got {str(blocks)[:80]}")
        pat = "".join(names[b] for b in blocks)
    else:
        pat = t.get("hybrid_override_pattern")
    n = need(t, "num_hidden_layers", default=len(pat) if isinstance(pat, str) and pat else None)
    require(isinstance(pat, str) and len(pat) == n and set(pat) <= set("M*-E"), "config.hybrid_override_pattern",
            f"must be {n} characters of M, *, -, E, got {str(pat)[:80]!r}")
    m = RecurrentShape("mamba2", need(t, "mamba_num_heads"), need(t, "n_groups"), need(t, "ssm_state_size"),
                       need(t, "mamba_head_dim"), need(t, "conv_kernel", default=4))
    a = _attention(t)
    act = "relu2"
    latent = need(t, "moe_latent_size", default=0, lo=0)
    layers = []
    for ch in pat:
        if ch == "M":  # conv1d (+bias), A, D, dt_bias per head, the gated norm
            layers.append(LayerSpec(m, None, act, extra=m.conv_dim * (m.conv + 1) + 3 * m.heads + m.inner))
        elif ch == "*":
            layers.append(LayerSpec(a, None, act))
        elif ch == "-":
            layers.append(LayerSpec(None, need(t, "intermediate_size"), act))
        else:
            f = MoEShape(need(t, "n_routed_experts"), need(t, "num_experts_per_tok"), need(t, "moe_intermediate_size"),
                         need(t, "moe_shared_expert_intermediate_size", default=0, lo=0), act, scoring="sigmoid",
                         latent=latent)
            layers.append(LayerSpec(None, f, act, extra=f.experts))  # router bias
    hf = HFNames(attn="mixer", mlp="mixer", mixer="mixer", mixer_in="in_proj", up="up_proj", shared="shared_experts")
    return DecoderSpec("nemotron_h", layers=tuple(layers), hf=hf, **_common(t))


# ---- families with their own model classes ------------------------------------------------------------------
@family("deepseek_v3", "kimi_k2", "kimi_k25", "deepseek_v32", "glm_moe_dsa", kind="class")
def _deepseek_v3():
    from .deepseek_v3 import DeepSeekV3

    return DeepSeekV3


@family("deepseek_v41", "deepseek_v41_text", kind="class")
def _deepseek_v41():
    from .deepseek_v41_graph import DeepSeekV41

    return DeepSeekV41


@family("deepseek_v4", "deepseek_v4_text", "deepseek_ref", kind="class")
def _deepseek_v4():
    from .deepseek_v4_graph import DeepSeekV4

    return DeepSeekV4
