"""DeepSeek-V4-Flash baseline graph (V41_FACTS §13): every compressed layer owns its KV — CSA (m=4) with
its own overlapping compressor and full-range indexer, HCA (m=128) attending densely to all compressed
entries — no KV/Top-K sharing, no CED split, hash-routed first layers and an mHC head. Reuses the V4.1 op
emitters wherever the two models agree; assumptions live in configs/deepseek-v4-flash.json."""
from __future__ import annotations

from ..core.builder import GraphBuilder
from ..core.ir import Feature
from ..core.rules import embedding, gathered_logits
from ..core.rules_v4 import compressor_pool, entry_write, hash_route, swa_sparse_attention
from . import deepseek_v4 as sem4
from .deepseek_v41_graph import BF16, DeepSeekV41, attention_precision


class DeepSeekV4(DeepSeekV41):
    family = "deepseek_v4"
    sem = sem4
    POLICY_SUPPORT = {"decoder_replay": ("off",), "fusion": ("unfused", "two-pass", "single-pass"),
                      "dspark": ("off",), "engram": ("hbm",)}
    config_class = sem4.V4Config
    default_name = "deepseek-v4-flash"

    def validate_plan(self, plan) -> None:
        """V4 has no DSpark drafter (its policy support says so); nothing more to check."""

    def vision(self) -> str:
        """V4-Flash is text-only (its config has no vision tower; V4.1 added the one V4.1's builder prices)."""
        return f"{self.name} has no vision tower"

    def kv_capacity(self, context: int, **_):
        return sem4.kv_capacity(self.cfg, context)

    def kv_formats(self) -> tuple[str, ...]:
        return (self.cfg.kv_nope_format, self.cfg.kv_rope_format)

    def owner_kv_bytes(self, context: int, layer: int) -> float:
        """A compressed layer's own global cache (every compressed V4 layer owns its KV)."""
        return sem4.owner_kv_bytes(self.cfg, self.layers[layer], context)

    def resident_groups(self, policies) -> tuple[str, ...]:
        return ("embed", "trunk")

    def passes(self, policies) -> list:
        """No CED, so no replay; V4 has mHC too, so the fusion profiles apply."""
        from ..passes.fusion import fuse_mhc, fuse_norm_quant

        if policies.fusion == "unfused":
            return []
        c = self.cfg
        return [(f"fuse_mhc[{policies.fusion}]", fuse_mhc(policies.fusion, n=c.hc_mult, d=c.hidden_size)),
                ("fuse_norm_quant", fuse_norm_quant)]

    def _build(self, b: GraphBuilder, kinds: tuple, **_) -> None:
        c = self.cfg
        d, n = c.hidden_size, c.hc_mult
        b.token_set("q")
        b.token_set("kv")
        b.token_set("last", prefill="one", decode="all")
        with b.stage("trunk"):
            embedding(b, "embed", "q", d, "embed.weight", streams=n, deps=(), formula=f"gather {d} bf16, write {n} streams")
            for li in self.layers:
                with b.layer(li.layer):
                    self._mhc_pre(b, li.layer, "hc_attn", "q", norm_weight=f"layers.{li.layer}.attn_norm")
                    self._attention_in(b, li, "q")
                    if li.ratio:
                        self._kv_producer(b, li)
                    if li.topk_producer is not None:
                        self._indexer(b, li, "q")
                    self._sparse_attention(b, li, "q")
                    self._attention_out(b, li.layer, "q")
                    self._mhc_post(b, li.layer, "hc_attn", "q")
                    self._mhc_pre(b, li.layer, "hc_ffn", "q", norm_weight=f"layers.{li.layer}.ffn_norm")
                    self._moe(b, li.layer, "q")
                    self._mhc_post(b, li.layer, "hc_ffn", "q")
        with b.stage("head"):
            b.gemm("hc_head", "last", n * d, n, weight="hc_head.fn", act_in="bf16", act_out="fp32",
                   precision=self.fp32_gemm, split=("dp",), kind="mhc")
            b.elementwise("hc_head.collapse", "last", d, bytes_in=n * BF16, bytes_out=BF16, flops_per_elem=2 * n,
                          kind="mhc", split=("dp",))
            b.elementwise("final_norm", "last", d, bytes_in=BF16, bytes_out=BF16, flops_per_elem=4, kind="norm",
                          split=("dp",))
            b.gemm("head", "last", d, c.vocab_size, weight="head.weight", act_out="fp32", split=("tp", "dp"),
                   comm=(gathered_logits("last", c.vocab_size),))

    def _compress(self, b: GraphBuilder, prefix: str, li, width: int) -> Feature:
        """Overlapping (CSA, coff=2) or plain (HCA) gated compressor of ``width``; returns emitted entries."""
        c = self.cfg
        m, coff = li.ratio, c.coff(li.ratio)
        for w in ("wkv", "wgate"):
            b.gemm(f"{prefix}.{w}", "kv", c.hidden_size, coff * width, weight=f"layers.{li.layer}.attn.{prefix}.{w}",
                   act_in="bf16", act_out="fp32", split=("dp",), kind="compressor")
        # gate softmax over each window's positions: one exp per plane
        return compressor_pool(b, f"{prefix}.pool", m=m, width=width, planes=coff,
                               formula=f"gated pooling over {'overlapping ' if coff == 2 else ''}windows of {m} "
                                       "(+ absolute position term)")

    def _kv_producer(self, b: GraphBuilder, li) -> str:
        c = self.cfg
        p = f"layers.{li.layer}.attn"
        entries = self._compress(b, "compressor", li, c.head_dim)
        kv = b.tensor(f"layers.{li.layer}.kv", "kv_cache", "fp8", elems_per_token=c.kv_dim, module=p)
        last = entry_write(b, "kv.quant_write", "cache_write", entries, in_bytes=4.0, width=c.kv_dim,
                           entry_bytes=sem4.main_kv_entry_bytes(c), cache=kv,
                           formula=f"{sem4.main_kv_entry_bytes(c):g} B per entry (FP8 + bf16 RoPE + scales)")
        if c.has_indexer(li.ratio):
            ie = self._compress(b, "indexer.compressor", li, c.index_head_dim)
            idx = b.tensor(f"layers.{li.layer}.index_k", "index_cache", "fp8", elems_per_token=c.index_head_dim, module=p)
            last = entry_write(b, "indexer.k_write", "indexer", ie, in_bytes=4.0, width=c.index_head_dim,
                               entry_bytes=sem4.index_k_entry_bytes(c), cache=idx,
                               formula=f"{sem4.index_k_entry_bytes(c):g} B per index-K entry")
        return last

    def _sparse_attention(self, b: GraphBuilder, li, ts: str) -> str:
        if li.attn != "hca":
            return super()._sparse_attention(b, li, ts)
        c = self.cfg
        W, H, D = c.sliding_window, c.num_attention_heads, c.head_dim
        prec = attention_precision(b)
        return swa_sparse_attention(b, ts, c=c, sem=sem4, layer=li.layer, prec=prec, m=li.ratio, dense_compressed=True,
                                    main_entry_bytes=sem4.main_kv_entry_bytes(c),
                                    reads=(f"layers.{li.layer}.swa", f"layers.{li.layer}.kv"),
                                    formula=f"HCA: <= {W} SWA + every compressed entry (m={li.ratio}), "
                                            f"{2.0 * H * 2 * D:g} {prec} flops and {H} exps per pair, + {H} sink exps "
                                            "per query")

    def _route(self, b: GraphBuilder, layer: int, ts: str) -> None:
        li = self.layers[layer]
        if not li.hash_routed:
            return super()._route(b, layer, ts)
        c = self.cfg
        hash_route(b, ts, experts=c.n_routed_experts, top_k=c.num_experts_per_tok,
                   table=f"layers.{layer}.ffn.gate.tid2eid")
