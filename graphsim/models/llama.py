"""Dense Llama-style decoder (GQA attention, SwiGLU MLP), e.g. Llama-3.1-70B."""
from __future__ import annotations

import attrs

from ..builder import GraphBuilder
from ..config import kv_cache_format, need, text_config
from ..errors import GraphsimError, require
from ..limits import MAX_CONTEXT
from ..ir import Feature, Tensor, fmt
from ..plan import ParallelMapping
from .base import (
    Model,
    all_reduce_tp,
    attention_act_bytes,
    divides,
    embedding,
    lm_head,
    restore_copy,
    restore_sets,
    rmsnorm,
    swiglu_mlp,
    tokens,
)


@attrs.frozen
class LlamaConfig:
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool = False
    max_position: int = MAX_CONTEXT

    @staticmethod
    def from_dict(cfg: dict) -> "LlamaConfig":
        t = text_config(cfg)
        heads = need(t, "num_attention_heads")
        hidden = need(t, "hidden_size")
        head_dim = need(t, "head_dim", default=max(hidden // heads, 1))
        kv_heads = need(t, "num_key_value_heads", default=heads)
        require(heads % kv_heads == 0, "config.num_key_value_heads",
                f"must divide num_attention_heads ({heads}), got {kv_heads}")
        return LlamaConfig(hidden, need(t, "intermediate_size"), need(t, "num_hidden_layers"), heads,
                           kv_heads, head_dim, need(t, "vocab_size"), bool(t.get("tie_word_embeddings", False)),
                           need(t, "max_position_embeddings", default=MAX_CONTEXT))


class LlamaModel(Model):
    """GQA attention + SwiGLU; weights in ``weight_format`` (bf16 by default), KV cache in ``kv_format``
    (the checkpoint's, see :func:`graphsim.config.kv_cache_format`, unless given)."""

    family = "llama"

    def __init__(self, cfg: dict, name: str = "llama", weight_format: str = "bf16", kv_format: str | None = None):
        self.name = name
        self.cfg = LlamaConfig.from_dict(cfg)
        self.weight_format = weight_format
        self.kv_format = kv_format or kv_cache_format(cfg)

    def weights(self) -> tuple[Tensor, ...]:
        c, wf = self.cfg, self.weight_format
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        out = [Tensor("embed", "weight", "bf16", c.vocab * c.hidden, module="embed", group="embed")]
        for i in range(c.layers):
            p = f"layers.{i}."
            out += [
                Tensor(p + "attn.wqkv", "weight", wf, c.hidden * (q + 2 * kv), module=p + "attn"),
                Tensor(p + "attn.wo", "weight", wf, q * c.hidden, module=p + "attn"),
                Tensor(p + "mlp.gate_up", "weight", wf, 2 * c.hidden * c.inter, module=p + "mlp"),
                Tensor(p + "mlp.down", "weight", wf, c.inter * c.hidden, module=p + "mlp"),
                Tensor(p + "norms", "weight", "bf16", 2 * c.hidden, module=p + "norms"),
            ]
        out.append(Tensor("final_norm", "weight", "bf16", c.hidden, module="final_norm", group="embed"))
        if not c.tie_embeddings:
            out.append(Tensor("head", "weight", "bf16", c.hidden * c.vocab, module="head", group="embed"))
        return tuple(out)

    def kv_bytes(self, context: int, policies=None) -> float:
        c = self.cfg
        return context * c.layers * 2 * c.kv_heads * c.head_dim * fmt(self.kv_cache_format(policies)).bytes_per_elem

    def kv_split(self, m: ParallelMapping) -> int:
        """GQA: TP ranks split the KV heads (replicated once tp exceeds them); DP splits requests."""
        return m.dp * min(m.tp, self.cfg.kv_heads)

    def validate_mapping(self, m: ParallelMapping) -> None:
        divides("mapping.tp", m.tp, self.cfg.heads, "attention heads")
        if m.ep > 1:
            raise GraphsimError("mapping.ep", "a dense model has no experts: ep must be 1")

    def _build(self, b: GraphBuilder, kinds: tuple, policies=None, **_) -> None:
        c = self.cfg
        q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
        b.token_set("all")
        b.token_set("last", prefill="one", decode="all")
        kv_fmt = self.kv_cache_format(policies)
        prec = self.attention_precision(policies)
        kvb = 2 * kv * fmt(kv_fmt).bytes_per_elem
        copies = {}
        if "prefill" in kinds:  # prefix hits copy each layer's KV in (TP ranks hold their KV heads)
            restore_sets(b)
            for i in range(c.layers):
                with b.layer(i):
                    copies[i] = restore_copy(b, lambda tier: [(tokens(f"cached_{tier}"), kvb)], split=("tp", "dp"),
                                             params={"kv_heads": c.kv_heads})
        with b.stage("embed"):
            embedding(b, "all", c.hidden, "embed")
        with b.stage("trunk"):
            for i in range(c.layers):
                with b.layer(i):
                    p = f"layers.{i}."
                    b.tensor(p + "kv", "kv_cache", kv_fmt, elems_per_token=2 * kv, module=p + "attn")
                    copy = copies.get(i)
                    rmsnorm(b, "attn_norm", "all", c.hidden)
                    b.gemm("wqkv", "all", c.hidden, q + 2 * kv, weight=p + "attn.wqkv", split=("tp", "dp"))
                    b.cache_write("kv_write", "all", p + "kv", kvb, split=("tp", "dp"))
                    attn = b.attention("attn", "all", pairs=Feature("causal_pairs", "all"),
                                flops_per_pair=4.0 * c.head_dim * c.heads, heads=c.heads,
                                kv_read=Feature("kv_len", "all"), kv_bytes_per_entry=kvb,
                                q_bytes_per_token=2 * q * attention_act_bytes(prec), precision=prec,
                                split=("tp", "dp"), reads=(p + "kv",),
                                params={"kv_heads": c.kv_heads})
                    if copy:
                        b.depends(copy, attn, "cache_read")
                    b.gemm("wo", "all", q, c.hidden, weight=p + "attn.wo", split=("tp", "dp"),
                           comm=(all_reduce_tp("all", c.hidden, note="row-parallel wo"),))
                    rmsnorm(b, "mlp_norm", "all", c.hidden)
                    swiglu_mlp(b, "mlp.", "all", c.hidden, c.inter, weights=(p + "mlp.gate_up", p + "mlp.down"))
        with b.stage("head"):
            lm_head(b, "last", c.hidden, c.vocab, "embed" if c.tie_embeddings else "head")
