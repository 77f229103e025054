"""The generic decoder: a stack of layers, each a token mixer (softmax attention, Gated DeltaNet or Mamba-2)
and a feed-forward block (dense MLP or MoE), composed from the cost rules of :mod:`graphsim.core.rules`.

A family (:mod:`graphsim.models.families`) turns a Hugging Face config into a :class:`DecoderSpec`; this
module turns the spec into resident weights (each in the format the checkpoint's quantization gives its
Hugging Face module), KV/state capacity and the graph. Nothing here is specific to one model.
"""
from __future__ import annotations

from typing import Union

import attrs

from ..core.builder import GraphBuilder
from ..core.errors import GraphsimError, require
from ..core.ir import Tensor, fmt
from ..core.limits import MAX_CONTEXT
from ..core.plan import ParallelMapping
from ..core.quant import Quantization
from ..core.rules import (
    AttentionShape,
    MoEShape,
    RecurrentShape,
    activation,
    gqa_attention,
    mlp,
    moe,
    recurrent_mixer,
    rmsnorm,
    tokens,
)
from .base import Model, attention_act_bytes, divides, embedding, lm_head, restore_copy, restore_sets


@attrs.frozen
class HFNames:
    """Hugging Face module names of one layer's weights (what quantization configs name)."""

    attn: str = "self_attn"
    qkv: str = "q_proj"
    o: str = "o_proj"
    mlp: str = "mlp"
    up: str = "gate_proj"
    down: str = "down_proj"
    experts: str = "experts"
    router: str = "gate"
    shared: str = "shared_expert"
    mixer: str = "linear_attn"
    mixer_in: str = "in_proj_qkv"
    mixer_out: str = "out_proj"


@attrs.frozen
class LayerSpec:
    """One decoder layer: a token mixer and a feed-forward block (either may be absent: Nemotron-H layers
    are one or the other)."""

    mixer: Union[AttentionShape, RecurrentShape, None]
    ffn: Union[int, MoEShape, None]  #: dense intermediate size, an MoE, or none
    act: str = "silu"
    extra: int = 0  #: small per-layer parameters (biases, sinks, conv, norms beyond the two RMSNorms)


@attrs.frozen
class DecoderSpec:
    family: str
    hidden: int
    vocab: int
    layers: tuple
    tie_embeddings: bool = False
    max_position: int = MAX_CONTEXT
    hf: HFNames = HFNames()
    mtp_layers: int = 0  #: shipped MTP modules (not part of the trunk; reported)
    #: a vision tower the config names but graphsim does not price yet (image requests are refused, saying why)
    vision_note: str = ""
    #: the vision tower graphsim prices (graphsim.models.vision_tower: Qwen/Kimi, Llama 4, Gemma 3/4), or None
    vision: object = None
    #: its image processor (graphsim.core.vision.PROCESSORS): image sizes -> patches and image tokens
    processor: object = None

    def __attrs_post_init__(self):
        require(len(self.layers) > 0, "config.num_hidden_layers", "must be at least 1")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layers)

    def with_redundant(self, n: int) -> "DecoderSpec":
        """The same model with ``n`` redundant expert copies per MoE layer (EP load balancing)."""
        require(bool(self.moes()), "redundant_experts", f"{self.family} has no routed experts")
        layers = tuple(attrs.evolve(l, ffn=attrs.evolve(l.ffn, redundant=n)) if isinstance(l.ffn, MoEShape) else l
                       for l in self.layers)
        return attrs.evolve(self, layers=layers)

    def attention_layers(self):
        return [(i, l.mixer) for i, l in enumerate(self.layers) if isinstance(l.mixer, AttentionShape)]

    def recurrent_layers(self):
        return [(i, l.mixer) for i, l in enumerate(self.layers) if isinstance(l.mixer, RecurrentShape)]

    def moes(self):
        return [(i, l.ffn) for i, l in enumerate(self.layers) if isinstance(l.ffn, MoEShape)]


class Decoder(Model):
    """A model composed from :class:`DecoderSpec` (see the module docstring)."""

    def __init__(self, spec: DecoderSpec, name: str, quant: Quantization = Quantization(),
                 kv_format: str = "bf16"):
        self.name = name
        self.family = spec.family
        self.cfg = spec
        self.quant = quant
        self.kv_format = kv_format

    def vision(self) -> str:
        if self.cfg.vision is not None:
            return ""
        return self.cfg.vision_note or f"{self.name} has no vision tower"

    def image_processor(self):
        return self.cfg.processor

    def reference_graph(self, policies=None):
        """Every stage the model can run: with a vision tower, a prefill with an image too (its weights'
        sharding, param_counts' vision group)."""
        if self.cfg.vision is None:
            return super().reference_graph(policies)
        from ..core.plan import Request

        reqs = (Request("prefill", 64 + 4, image_tokens=4, image_patches=4 * self.cfg.vision.merge ** 2),
                Request("decode", 64))
        return self.build(("prefill", "decode"), policies=policies, requests=reqs)

    # ---- inventory ----------------------------------------------------------------------------------
    def _w(self, i: int, module: str) -> str:
        return self.quant.format_of(f"layers.{i}.{module}")

    def weights(self) -> tuple[Tensor, ...]:
        c, h = self.cfg, self.cfg.hf
        out = [Tensor("embed", "weight", "bf16", c.vocab * c.hidden, module="embed", group="embed")]
        for i, layer in enumerate(c.layers):
            p = f"layers.{i}."
            m = layer.mixer
            if isinstance(m, AttentionShape):
                qkv = c.hidden * (m.heads * m.head_dim * (2 if m.out_gate else 1) + m.kv_heads * (m.head_dim + m.vd))
                out += [Tensor(p + "attn.wqkv", "weight", self._w(i, f"{h.attn}.{h.qkv}"), qkv, module=p + "attn"),
                        Tensor(p + "attn.wo", "weight", self._w(i, f"{h.attn}.{h.o}"), m.heads * m.vd * c.hidden,
                               module=p + "attn")]
            elif isinstance(m, RecurrentShape):
                out += [Tensor(p + "mixer.in_proj", "weight", self._w(i, f"{h.mixer}.{h.mixer_in}"),
                               c.hidden * m.in_proj, module=p + "mixer"),
                        Tensor(p + "mixer.out_proj", "weight", self._w(i, f"{h.mixer}.{h.mixer_out}"),
                               m.inner * c.hidden, module=p + "mixer")]
            f = layer.ffn
            mats, _ = activation(f.act if isinstance(f, MoEShape) else layer.act)
            if isinstance(f, int) and f > 0:
                out += [Tensor(p + "mlp.gate_up", "weight", self._w(i, f"{h.mlp}.{h.up}"), (mats - 1) * c.hidden * f,
                               module=p + "mlp"),
                        Tensor(p + "mlp.down", "weight", self._w(i, f"{h.mlp}.{h.down}"), f * c.hidden, module=p + "mlp")]
            elif isinstance(f, MoEShape):
                w = f.expert_width(c.hidden)
                out += [Tensor(p + "moe.router", "weight", "bf16", c.hidden * f.experts, module=p + "moe"),
                        Tensor(p + "moe.experts", "weight", self._w(i, f"{h.mlp}.{h.experts}"),
                               f.slots * mats * w * f.inter, module=p + "moe")]
                if f.latent:
                    out += [Tensor(p + "moe.latent_down", "weight", self._w(i, f"{h.mlp}.fc1_latent_proj"),
                                   c.hidden * w, module=p + "moe"),
                            Tensor(p + "moe.latent_up", "weight", self._w(i, f"{h.mlp}.fc2_latent_proj"),
                                   w * c.hidden, module=p + "moe")]
                if f.shared_inter:
                    out += [Tensor(p + "moe.shared.gate_up", "weight", self._w(i, f"{h.mlp}.{h.shared}.{h.up}"),
                                   (mats - 1) * c.hidden * f.shared_inter, module=p + "moe"),
                            Tensor(p + "moe.shared.down", "weight", self._w(i, f"{h.mlp}.{h.shared}.{h.down}"),
                                   f.shared_inter * c.hidden, module=p + "moe")]
            norms = c.hidden * ((m is not None) + (f is not None and f != 0)) + layer.extra
            out.append(Tensor(p + "norms", "weight", "bf16", norms, module=p + "norms"))
        out.append(Tensor("final_norm", "weight", "bf16", c.hidden, module="final_norm", group="embed"))
        if not c.tie_embeddings:
            out.append(Tensor("head", "weight", self.quant.format_of("lm_head"), c.hidden * c.vocab, module="head",
                              group="embed"))
        if c.vision is not None:
            out += c.vision.weights()
        return tuple(out)

    # ---- caches -------------------------------------------------------------------------------------
    def _kv_entry_bytes(self, a: AttentionShape, policies=None) -> float:
        return a.kv_elems * fmt(self.kv_cache_format(policies)).bytes_per_elem

    @staticmethod
    def _span(a: AttentionShape, context: int) -> int:
        """Cache positions a layer keeps at ``context``: all, the last W (sliding) or at most one chunk."""
        lim = a.window or a.chunk
        return min(context, lim) if lim else context

    def kv_bytes_by_layer(self, context: int, policies=None) -> dict:
        out = {}
        for i, layer in enumerate(self.cfg.layers):
            m = layer.mixer
            if isinstance(m, AttentionShape):
                out[i] = self._span(m, context) * self._kv_entry_bytes(m, policies)
            elif isinstance(m, RecurrentShape):
                out[i] = m.state_bytes() if context > 0 else 0.0
            else:
                out[i] = 0.0
        return out

    def kv_bytes(self, context: int, policies=None) -> float:
        return float(sum(self.kv_bytes_by_layer(context, policies).values()))

    def kv_split(self, m: ParallelMapping) -> int:
        """TP ranks split the KV heads (replicated beyond them) and the recurrent heads; DP splits requests."""
        kv = [a.kv_heads for _, a in self.cfg.attention_layers()] or [m.tp]
        return m.dp * min(m.tp, min(kv))

    # ---- mappings -----------------------------------------------------------------------------------
    def validate_mapping(self, m: ParallelMapping) -> None:
        for _, a in self.cfg.attention_layers():
            divides("mapping.tp", m.tp, a.heads, "attention heads")
            break
        for _, r in self.cfg.recurrent_layers():
            divides("mapping.tp", m.tp, r.heads, f"{r.kind} heads")
            break
        moes = self.cfg.moes()
        if not moes and m.ep > 1:
            raise GraphsimError("mapping.ep", "a dense model has no experts: ep must be 1")
        if moes:
            f = moes[0][1]
            what = f"routed experts{f' + {f.redundant} redundant' if f.redundant else ''}"
            divides("mapping.ep", m.ep, f.slots, what)

    # ---- graph --------------------------------------------------------------------------------------
    def _build(self, b: GraphBuilder, kinds: tuple, policies=None, requests=(), **_) -> None:
        c, kv_fmt = self.cfg, self.kv_cache_format(policies)
        prec = self.attention_precision(policies)
        if c.vision is not None and any(r.kind == "prefill" and r.image_patches for r in requests or ()):
            c.vision.build(b)  # the vision stage first: the embedding writes its image features
        b.token_set("all")
        b.token_set("last", prefill="one", decode="all")
        copies = {}
        if "prefill" in kinds:  # prefix hits copy each layer's cache (and recurrent state) in
            spans = [a.window or a.chunk for _, a in c.attention_layers() if a.window or a.chunk]
            restore_sets(b, max(spans) if spans else 0)
            for i, layer in enumerate(c.layers):
                m = layer.mixer
                if m is None:
                    continue
                with b.layer(i):
                    if isinstance(m, AttentionShape):
                        kvb = self._kv_entry_bytes(m, policies)
                        kept = "cached_swa" if (m.window or m.chunk) else "cached"
                        copies[i] = restore_copy(b, lambda tier, kvb=kvb, kept=kept: [(tokens(f"{kept}_{tier}"), kvb)],
                                                 split=("tp", "dp"), params={"kv_heads": m.kv_heads})
                    else:
                        from ..core.ir import Feature

                        sb = m.state_bytes()
                        copies[i] = restore_copy(b, lambda tier, sb=sb: [(Feature("requests", f"cached_{tier}"), sb)],
                                                 split=("tp", "dp"), params={"kv_heads": m.heads})
        with b.stage("embed"):
            embedding(b, "all", c.hidden, "embed")
        with b.stage("trunk"):
            for i, layer in enumerate(c.layers):
                p = f"layers.{i}."
                with b.layer(i):
                    m = layer.mixer
                    if isinstance(m, AttentionShape):
                        rmsnorm(b, "attn_norm", "all", c.hidden)
                        cache = b.tensor(p + "kv", "kv_cache", kv_fmt, elems_per_token=m.kv_elems, module=p + "attn")
                        gqa_attention(b, p, "all", c.hidden, m, weights=(p + "attn.wqkv", p + "attn.wo"), cache=cache,
                                      kv_format=kv_fmt, precision=prec, act_bytes=attention_act_bytes(prec),
                                      restore=copies.get(i))
                    elif isinstance(m, RecurrentShape):
                        rmsnorm(b, "mixer_norm", "all", c.hidden)
                        state = b.tensor(p + "state", "state", "fp32", elems=0, module=p + "mixer")
                        recurrent_mixer(b, p, "all", c.hidden, m, weights=(p + "mixer.in_proj", p + "mixer.out_proj"),
                                        state=state)
                        if i in copies:  # the restored state must be resident before the recurrence reads it
                            b.depends(copies[i], f"{p}recurrence", "cache_read")
                    f = layer.ffn
                    if isinstance(f, int) and f > 0:
                        rmsnorm(b, "mlp_norm", "all", c.hidden)
                        mlp(b, "mlp.", "all", c.hidden, f, weights=(p + "mlp.gate_up", p + "mlp.down"), act=layer.act)
                    elif isinstance(f, MoEShape):
                        rmsnorm(b, "mlp_norm", "all", c.hidden)
                        shared = (p + "moe.shared.gate_up", p + "moe.shared.down") if f.shared_inter else None
                        latent = (p + "moe.latent_down", p + "moe.latent_up") if f.latent else None
                        moe(b, p, "all", c.hidden, f, experts=p + "moe.experts", router=p + "moe.router", shared=shared,
                            latent=latent)
        with b.stage("head"):
            lm_head(b, "last", c.hidden, c.vocab, "embed" if c.tie_embeddings else "head")
