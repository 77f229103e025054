"""DeepSeek-V3/R1: MLA attention (prefill path with up-projected K/V, absorbed decode path over the latent
cache), dense first layers, MoE with a sigmoid router, routed top-k + shared experts, FP8 128x128 weights.
MTP is off (its module is not part of the 671 B trunk)."""
from __future__ import annotations

from typing import Mapping

import attrs

from ..builder import GraphBuilder
from ..config import kv_cache_format, need, text_config
from ..errors import require
from ..limits import MAX_CONTEXT
from ..ir import CommSpec, Cost, Feature, Tensor, fmt
from ..plan import ParallelMapping
from .base import (
    MOE_OUT,
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
class V3Config:
    hidden: int
    layers: int
    dense_layers: int
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int
    inter: int
    moe_inter: int
    experts: int
    shared: int
    top_k: int
    vocab: int
    weight_block: tuple
    max_position: int = MAX_CONTEXT

    def __attrs_post_init__(self):
        require(self.dense_layers <= self.layers, "config.first_k_dense_replace",
                f"must be <= num_hidden_layers ({self.layers}), got {self.dense_layers}")
        require(self.top_k <= self.experts, "config.num_experts_per_tok",
                f"must be <= n_routed_experts ({self.experts}), got {self.top_k}")

    @staticmethod
    def from_dict(cfg: dict) -> "V3Config":
        t = text_config(cfg)
        q = t.get("quantization_config", cfg.get("quantization_config", {})) or {}
        require(isinstance(q, Mapping), "config.quantization_config", f"must be an object, got {type(q).__name__}")
        block = q.get("weight_block_size", (128, 128))
        require(isinstance(block, (list, tuple)) and len(block) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 1 << 16 for x in block),
            "config.quantization_config.weight_block_size", f"must be two positive integers, got {block!r}")
        block = tuple(block)
        return V3Config(
            need(t, "hidden_size"), need(t, "num_hidden_layers"), need(t, "first_k_dense_replace", lo=0),
            need(t, "num_attention_heads"), need(t, "q_lora_rank"), need(t, "kv_lora_rank"),
            need(t, "qk_nope_head_dim"), need(t, "qk_rope_head_dim"), need(t, "v_head_dim"),
            need(t, "intermediate_size"), need(t, "moe_intermediate_size"), need(t, "n_routed_experts"),
            need(t, "n_shared_experts", lo=0), need(t, "num_experts_per_tok"), need(t, "vocab_size"), block,
            need(t, "max_position_embeddings", default=MAX_CONTEXT))

    @property
    def qk_dim(self) -> int:
        return self.nope + self.rope

    @property
    def latent(self) -> int:
        """MLA cache elements per token per layer: compressed KV + the shared RoPE key (512 + 64 = 576)."""
        return self.kv_lora + self.rope


class DeepSeekV3(Model):
    family = "deepseek_v3"

    def __init__(self, cfg: dict, name: str = "deepseek-v3", kv_format: str | None = None):
        self.name = name
        self.cfg = V3Config.from_dict(cfg)
        # the checkpoint's KV cache (quantization_config / kv_cache_dtype), BF16 when it declares none
        self.kv_format = kv_format or kv_cache_format(cfg)
        b = self.cfg.weight_block
        # FP8 e4m3 weights with one fp32 scale per block (V41_FACTS §13: FP8 128x128 blocks).
        self.wfmt = "fp8_b128x128" if tuple(b) == (128, 128) else "fp8"

    # ---- resident inventory -------------------------------------------------------------------------
    def weights(self) -> tuple[Tensor, ...]:
        c, wf = self.cfg, self.wfmt
        out = [Tensor("embed", "weight", "bf16", c.vocab * c.hidden, module="embed", group="embed")]
        for i in range(c.layers):
            p = f"layers.{i}."
            out += [
                Tensor(p + "attn.wq_a", "weight", wf, c.hidden * c.q_lora, module=p + "attn"),
                Tensor(p + "attn.wq_b", "weight", wf, c.q_lora * c.heads * c.qk_dim, module=p + "attn"),
                Tensor(p + "attn.wkv_a", "weight", wf, c.hidden * c.latent, module=p + "attn"),
                Tensor(p + "attn.wkv_b", "weight", wf, c.kv_lora * c.heads * (c.nope + c.v_dim), module=p + "attn"),
                Tensor(p + "attn.wo", "weight", wf, c.heads * c.v_dim * c.hidden, module=p + "attn"),
                Tensor(p + "norms", "weight", "bf16", 2 * c.hidden + c.q_lora + c.kv_lora, module=p + "norms"),
            ]
            if i < c.dense_layers:
                out += [Tensor(p + "mlp.gate_up", "weight", wf, 2 * c.hidden * c.inter, module=p + "mlp"),
                        Tensor(p + "mlp.down", "weight", wf, c.inter * c.hidden, module=p + "mlp")]
            else:
                out += [
                    Tensor(p + "moe.router", "weight", "bf16", c.hidden * c.experts, module=p + "moe"),
                    Tensor(p + "moe.experts", "weight", wf, c.experts * 3 * c.hidden * c.moe_inter, module=p + "moe"),
                    Tensor(p + "moe.shared.gate_up", "weight", wf, c.shared * 2 * c.hidden * c.moe_inter, module=p + "moe"),
                    Tensor(p + "moe.shared.down", "weight", wf, c.shared * c.moe_inter * c.hidden, module=p + "moe"),
                ]
        out += [Tensor("final_norm", "weight", "bf16", c.hidden, module="final_norm", group="embed"),
                Tensor("head", "weight", "bf16", c.hidden * c.vocab, module="head", group="embed")]
        return tuple(out)

    def active_params_per_token(self) -> int:
        """Parameters one token touches: everything but the routed experts it is not sent to (and the
        embedding table, of which it reads one row)."""
        c = self.cfg
        total = sum(t.elems for t in self.weights() if t.name != "embed")
        routed = (c.layers - c.dense_layers) * c.experts * 3 * c.hidden * c.moe_inter
        return total - routed + (c.layers - c.dense_layers) * c.top_k * 3 * c.hidden * c.moe_inter + c.hidden

    def kv_bytes(self, context: int, policies=None) -> float:
        return context * self.cfg.layers * self.cfg.latent * fmt(self.kv_cache_format(policies)).bytes_per_elem

    def validate_mapping(self, m: ParallelMapping) -> None:
        divides("mapping.tp", m.tp, self.cfg.heads, "attention heads")
        divides("mapping.ep", m.ep, self.cfg.experts, "routed experts")

    # ---- graph ------------------------------------------------------------------------------------
    def _build(self, b: GraphBuilder, kinds: tuple, policies=None, **_) -> None:
        c = self.cfg
        kv_fmt = self.kv_cache_format(policies)
        prec = self.attention_precision(policies)
        kvb = c.latent * fmt(kv_fmt).bytes_per_elem
        b.token_set("all")
        b.token_set("pf", prefill="all", decode="none")  # MLA prefill path (K/V up-projected)
        b.token_set("dec", prefill="none", decode="all")  # MLA absorbed path over the latent cache
        b.token_set("last", prefill="one", decode="all")
        tp_dp = ("tp", "dp")
        copies = {}
        if "prefill" in kinds:  # prefix hits copy each layer's latent cache in (whole on every TP rank)
            restore_sets(b)
            for i in range(c.layers):
                with b.layer(i):
                    copies[i] = restore_copy(b, lambda tier: [(tokens(f"cached_{tier}"), kvb)], split=tp_dp,
                                             params={"kv_heads": 1})
        with b.stage("embed"):
            embedding(b, "all", c.hidden, "embed")
        with b.stage("trunk"):
            for i in range(c.layers):
                p = f"layers.{i}."
                with b.layer(i):
                    b.tensor(p + "kv", "kv_cache", kv_fmt, elems_per_token=c.latent, module=p + "attn")
                    copy = copies.get(i)
                    rmsnorm(b, "attn_norm", "all", c.hidden)
                    b.gemm("wq_a", "all", c.hidden, c.q_lora, weight=p + "attn.wq_a", act_in="fp8", split=("dp",))
                    rmsnorm(b, "q_norm", "all", c.q_lora, out_bytes=1.0)
                    b.gemm("wq_b", "all", c.q_lora, c.heads * c.qk_dim, weight=p + "attn.wq_b", act_in="fp8", split=tp_dp)
                    b.gemm("wkv_a", "all", c.hidden, c.latent, weight=p + "attn.wkv_a", act_in="fp8", split=("dp",))
                    rmsnorm(b, "kv_norm", "all", c.kv_lora)
                    b.cache_write("kv_write", "all", p + "kv", kvb, split=("dp",))
                    readers = []
                    if "prefill" in kinds:
                        readers.append(self._mla_prefill(b, p, kvb, prec))
                    if "decode" in kinds:
                        readers.append(self._mla_decode(b, p, kvb, prec))
                    if copy:
                        for r in readers:  # the layer's cache readers wait for its restored prefix
                            b.depends(copy, r, "cache_read")
                    b.gemm("wo", "all", c.heads * c.v_dim, c.hidden, weight=p + "attn.wo", act_in="fp8", split=tp_dp,
                           comm=(all_reduce_tp("all", c.hidden, note="row-parallel wo"),))
                    rmsnorm(b, "mlp_norm", "all", c.hidden)
                    if i < c.dense_layers:
                        swiglu_mlp(b, "mlp.", "all", c.hidden, c.inter, weights=(p + "mlp.gate_up", p + "mlp.down"),
                                   act_in="fp8")
                    else:
                        self._moe(b, p)
        with b.stage("head"):
            lm_head(b, "last", c.hidden, c.vocab, "head")

    def _mla_prefill(self, b: GraphBuilder, p: str, kvb: float, prec: str) -> str:
        """Prefill: up-project every visible latent to per-head K_nope and V (written at the attention's
        operand precision), then causal attention at ``prec``."""
        c = self.cfg
        kv_len = Feature("kv_len", "pf")
        up = c.heads * (c.nope + c.v_dim)
        w = b._tensors[p + "attn.wkv_b"]
        ab = attention_act_bytes(prec)
        cost = (Cost.of(Feature("active", "pf"), bytes_weight=w.nbytes)
                + Cost.of(kv_len, flops_fp8=2.0 * c.kv_lora * up, bytes_kv=kvb, bytes_act=ab * up))
        reader = b.op("wkv_b", "gemm", cost, token_set="pf", precision="fp8", split=("tp", "dp"),
                      reads=(p + "attn.wkv_b", p + "kv"), formula=f"2·{c.kv_lora}·{up} flops per visible position",
                      params={"k": c.kv_lora, "n": up, "kv_heads": 1})  # every TP rank reads the whole latent
        b.attention("attn_prefill", "pf", pairs=Feature("causal_pairs", "pf"),
                    flops_per_pair=2.0 * (c.qk_dim + c.v_dim) * c.heads, heads=c.heads, precision=prec,
                    kv_read=kv_len, kv_bytes_per_entry=ab * (c.heads * (c.nope + c.v_dim) + c.rope),
                    q_bytes_per_token=ab * c.heads * (c.qk_dim + c.v_dim), split=("tp", "dp"))
        return reader

    def _mla_decode(self, b: GraphBuilder, p: str, kvb: float, prec: str) -> str:
        """Decode: absorb W_UK into the query and W_UV into the output; attend over the 576-wide latent."""
        c = self.cfg
        b.gemm("q_absorb", "dec", c.nope, c.kv_lora, weight=p + "attn.wkv_b", copies=c.heads, precision="bf16",
               split=("tp", "dp"))
        reader = b.attention("attn_decode", "dec", pairs=Feature("causal_pairs", "dec"),
                             flops_per_pair=2.0 * (c.latent + c.kv_lora) * c.heads, heads=c.heads, precision=prec,
                             kv_read=Feature("kv_len", "dec"), kv_bytes_per_entry=kvb,
                             q_bytes_per_token=attention_act_bytes(prec) * c.heads * (c.latent + c.kv_lora),
                             split=("tp", "dp"), reads=(p + "kv",),
                             params={"kv_heads": 1})  # one latent: replicated across TP
        b.gemm("o_absorb", "dec", c.kv_lora, c.v_dim, weight=p + "attn.wkv_b", copies=c.heads, precision="bf16",
               split=("tp", "dp"))
        return reader

    def _moe(self, b: GraphBuilder, p: str) -> None:
        c = self.cfg
        b.gemm("router", "all", c.hidden, c.experts, weight=p + "moe.router", act_out="fp32", split=("dp",))
        b.elementwise("topk", "all", c.experts, bytes_in=4.0, bytes_out=0.0, flops_per_elem=2.0, kind="router",
                      split=("dp",), exps=c.experts)  # sigmoid scores: one exp per expert
        t = tokens("all")
        dispatch = CommSpec("all_to_all", "ep", Cost.of(t, bytes_act=c.top_k * c.hidden * 1.0), "before",
                            note="dispatch (FP8)")
        combine = CommSpec("all_to_all", "ep", Cost.of(t, bytes_act=c.top_k * c.hidden * 2.0), "after",
                           note="combine (BF16)")
        reduce = CommSpec("all_reduce", "moe_tp", Cost.of(t, bytes_act=c.hidden * 2.0), "after", note="expert TP",
                          merge=MOE_OUT)
        b.moe_experts("moe.experts", "all", experts=c.experts, top_k=c.top_k, hidden=c.hidden, inter=c.moe_inter,
                      weight=p + "moe.experts", split=("ep",), comm=(dispatch, combine, reduce))
        swiglu_mlp(b, "moe.shared.", "all", c.hidden, c.shared * c.moe_inter,
                   weights=(p + "moe.shared.gate_up", p + "moe.shared.down"), act_in="fp8", merge=MOE_OUT)

