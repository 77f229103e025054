"""DeepSeek-V4.1-Flash as a graph: CED stages (encoder -> global_kv -> decoder), CSA2 KV/Top-K sharing,
the hierarchical indexer, Engram, unfused mHC, mixed precision (V41_FACTS §2–§8, §12).

Every layer's ops come from its :class:`LayerInfo` (derived from the config, no layer number in code).
Token sets are named by role so that policy passes can rewrite *which tokens* run without touching ops:

* ``q_enc`` / ``q_dkv`` / ``q_dec`` — the query side of encoder layers, of decoder layers up to the last KV
  source, and of the later decoder layers (what decoder bounded replay shortens);
* ``kv`` — positions whose global KV is produced (never the replayed prefix: a restore reads it);
* ``kv_in`` — the Decoder KV source's input positions: ``kv`` plus any replayed prefix;
* ``eng_*`` — the text tokens of a query set (image tokens bypass Engram);
* ``last`` — positions that need logits.
"""
from __future__ import annotations

from ..core.builder import GraphBuilder
from ..core.config import load_config
from ..core.errors import GraphsimError
from ..core.ir import Feature, Tensor
from ..core.plan import ParallelMapping
from . import deepseek_v41 as sem
from ..core.rules import GATED, embedding, gathered_logits
from ..core.rules_v4 import (
    compressor_pool,
    engram_gather,
    engram_lookup,
    entry_write,
    ep_dispatch_combine,
    hierarchical_indexer,
    mhc_coeff,
    swa_sparse_attention,
)
from .base import (BF16, MOE_OUT, Model, all_reduce_tp, attention_precision, divides, restore_copy,  # noqa: F401
                   restore_sets, tokens)

class DeepSeekV41(Model):
    """DeepSeek-V4.1-Flash. ``engram`` residency does not change the graph's work, only where tables live."""

    family = "deepseek_v41"
    POLICY_SUPPORT = {"decoder_replay": ("off", "sglang", "paper"), "fusion": ("unfused", "two-pass", "single-pass"),
                      "dspark": ("off", "on"), "engram": ("hbm", "host")}
    sem = sem  #: the semantics module (entry sizes, inventory); DeepSeek-V4 swaps in its own
    config_class = sem.V41Config
    default_name = "deepseek-v4.1-flash"

    def __init__(self, cfg: dict, name: str | None = None, fp32_gemm: str = "tf32"):
        self.name = name or self.default_name
        self.raw = cfg
        # [reconstructed] fp32-weight GEMMs (mHC `fn`, m>1 compressor) run on TF32 tensor cores; "fp32"
        # charges them at the CUDA-core FP32 peak instead.
        self.fp32_gemm = fp32_gemm
        self.cfg = self.config_class.from_dict(cfg)
        self.layers = self.sem.layer_table(self.cfg)

    # ---- semantics ---------------------------------------------------------------------------------
    def weights(self) -> tuple[Tensor, ...]:
        return self.sem.weight_inventory(self.cfg)

    def kv_capacity(self, context: int, *, dspark: bool = False) -> sem.KVCapacity:
        return sem.kv_capacity(self.cfg, context, dspark=dspark)

    def kv_bytes(self, context: int, policies=None) -> float:
        """The checkpoint's cache layout (V41_FACTS §8) whatever the attention precision: FP4 main KV and
        FP8 SWA are what the model stores."""
        return self.kv_capacity(int(context)).total

    def kv_request_bytes(self, context: int, policies=None) -> float:
        """With DSpark on, the drafter's SWA blocks too."""
        return self.kv_capacity(int(context), dspark=getattr(policies, "dspark", "off") == "on").total

    def kv_breakdown(self, context: int) -> dict:
        """The KV capacity's parts (global entries, main KV, index K, SWA, pending groups) and totals."""
        import attrs

        cap = self.kv_capacity(int(context))
        return {**attrs.asdict(cap), "global_bytes": cap.global_bytes, "total_bytes": cap.total}

    def num_layers(self) -> int:
        return len(self.layers)

    def vision(self) -> str:
        return "" if self.cfg.vision is not None else f"{self.name}'s config has no vision_config"

    def layer_table(self):
        return self.layers

    def kv_owners(self) -> dict:
        return {li.layer: li.kv_owner for li in self.layers if li.kv_owner is not None}

    def draft_ahead(self, policies) -> int:
        """DSpark's draft block follows the context while it runs."""
        return self.cfg.dspark_block_size if getattr(policies, "dspark", "off") == "on" else 0

    def kv_formats(self) -> tuple[str, ...]:
        return (self.cfg.main_kv_format, self.cfg.swa_kv_format)

    def resident_groups(self, policies) -> tuple[str, ...]:
        """Inventory groups this deployment loads: DSpark only when it runs (where Engram *tables* live is
        decided per tensor by ``policies.engram``; their projections are always in HBM)."""
        groups = ("embed", "trunk", "vision", "engram")
        return groups + ("dspark",) if getattr(policies, "dspark", "off") == "on" else groups

    def reference_graph(self, policies=None):
        """Every stage the model can run (vision, draft, commit) under ``policies`` (their sharding options,
        e.g. Engram rows over TP or every rank): how each resident tensor is sharded."""
        import attrs

        from ..core.plan import Policies
        from ..core.plan import Request

        reqs = (Request.parse("prefill:64+img:224x224"), Request.parse("decode:64"))
        pol = attrs.evolve(policies or Policies(), dspark="on", decoder_replay="off")
        return self.build(("prefill", "decode"), policies=pol, requests=reqs)

    def owner_kv_bytes(self, context: int, layer: int) -> float:
        """Global KV one owner layer holds for one request (main + index K + its compressor state buffer)."""
        c, m = self.cfg, self.layers[layer].ratio
        per = self.sem.main_kv_entry_bytes(c) + self.sem.index_k_entry_bytes(c)
        return (context // m) * per + self.sem.compressor_state_bytes(c, m, context)

    def kv_bytes_by_layer(self, context: int, policies=None) -> dict:
        """One request's KV per layer: SWA on every trunk layer, global KV on its owners, DSpark's SWA blocks
        (when it runs) after the trunk. Sums to :meth:`kv_capacity` ``.total``."""
        c = self.cfg
        swa = min(context, c.sliding_window) * self.sem.swa_entry_bytes(c)
        out = {li.layer: swa + (self.owner_kv_bytes(context, li.layer) if li.kv_source else 0.0) for li in self.layers}
        if getattr(policies, "dspark", "off") == "on":
            out[len(self.layers)] = c.n_dspark_blocks * swa
        return out

    def kv_split(self, m: ParallelMapping) -> int:
        """One latent KV head (MQA): the cache is replicated across TP, split across attention-DP."""
        return m.dp

    def validate_mapping(self, m: ParallelMapping) -> None:
        c = self.cfg
        divides("mapping.tp", m.tp, c.num_attention_heads, "attention heads")
        divides("mapping.tp", m.tp, c.o_groups, "output groups (wo_a is block-diagonal per group)")
        divides("mapping.ep", m.ep, c.n_routed_experts, "routed experts")

    def validate_plan(self, plan) -> None:
        """DSpark's drafter has its own experts: EP must divide them too; verify lengths fit the draft block."""
        c = self.cfg
        if plan.policies.dspark == "on":
            if plan.policies.decoder_replay != "off":
                raise GraphsimError("policies.decoder_replay", "decoder bounded replay applies only to extend batches "
                                    "without speculative decoding (SGLang); use decoder_replay='off' with dspark='on'")
            divides("mapping.ep", plan.mapping.ep, c.dspark_n_routed_experts, "DSpark drafter experts")
            for r in plan.requests:
                if r.kind == "decode" and r.new - 1 > c.dspark_block_size:
                    raise GraphsimError("request.new", f"verify length {r.new - 1} exceeds the {c.dspark_block_size}-position draft block")
            acc = plan.policies.acceptance
            if acc and len(acc) != c.dspark_block_size:
                raise GraphsimError("policies.acceptance", f"give {c.dspark_block_size} values a_1..a_D, got {len(acc)}")

    def passes(self, policies) -> list:
        """Policy passes for this model (replay, fusion), applied by compile_plan in order."""
        from ..passes.policies import policy_passes

        return policy_passes(self, policies)

    # ---- graph --------------------------------------------------------------------------------------
    def _build(self, b: GraphBuilder, kinds: tuple, policies=None, requests=(), **_) -> None:
        from . import deepseek_v41_extras as extras

        c = self.cfg
        extras.vision_stage(self, b, kinds, policies, requests)
        for name in ("q_enc", "q_dkv", "q_dec", "kv", "kv_in"):
            b.token_set(name)
        for name in ("q_enc", "q_dkv", "q_dec"):
            b.token_set(f"eng_{name}", prefill="text", decode="all")
        b.token_set("last", prefill="one", decode="all")
        d, n = c.hidden_size, c.hc_mult
        owners_write: dict[int, str] = {}
        topk_op: dict[int, str] = {}
        copies: dict[int, str] = {}
        if "prefill" in kinds:  # prefix hits copy their cached KV in, one copy per layer, issued up front
            restore_sets(b, c.sliding_window)
            copies = {li.layer: self._restore(b, li) for li in self.layers}
        with b.stage("encoder"):
            embedding(b, "embed", "q_enc", d, "embed.weight", streams=n, deps=())
        for li in self.layers:
            ts = self._query_set(li)
            stage = li.stage
            copy = copies.get(li.layer)
            if li.kv_source and li.stage == "decoder":
                with b.stage("global_kv"), b.layer(li.layer):
                    # the Decoder KV source's input: every position that needs its KV *and* every replayed
                    # position its queries need (kv_in = kv, widened by encoder replay)
                    self._mhc_pre(b, li.layer, "hc_attn", "kv_in", norm_weight=f"layers.{li.layer}.attn_norm")
                    owners_write[li.layer] = self._kv_producer(b, li, copy)
                    if copy:  # the compressor continues the restored partial group
                        b.depends(copy, owners_write[li.layer], "cache_read")
            with b.stage(stage), b.layer(li.layer):
                if li.engram:
                    self._engram(b, li.layer, f"eng_{ts}", policies)
                if not (li.kv_source and li.stage == "decoder"):
                    self._mhc_pre(b, li.layer, "hc_attn", ts, norm_weight=f"layers.{li.layer}.attn_norm")
                self._attention_in(b, li, ts)
                if li.kv_source and li.stage == "encoder":
                    owners_write[li.layer] = self._kv_producer(b, li, copy)
                    if copy:
                        b.depends(copy, owners_write[li.layer], "cache_read")
                if li.index_source:
                    topk_op[li.layer] = self._indexer(b, li, ts)
                attn = self._sparse_attention(b, li, ts)
                if copy:  # this layer's cached SWA window (and its own global KV) must be resident
                    b.depends(copy, attn, "cache_read")
                if li.kv_owner is not None:
                    b.depends(owners_write[li.kv_owner], attn, "cache_read")
                if li.topk_producer is not None and li.topk_producer != li.layer:
                    b.depends(topk_op[li.topk_producer], attn, "topk_reuse")
                self._attention_out(b, li.layer, ts)
                self._mhc_post(b, li.layer, "hc_attn", ts)
                self._mhc_pre(b, li.layer, "hc_ffn", ts, norm_weight=f"layers.{li.layer}.ffn_norm")
                self._moe(b, li.layer, ts)
                self._mhc_post(b, li.layer, "hc_ffn", ts)
        with b.stage("head"):
            b.elementwise("hc_final.premix", "last", d, bytes_in=n * BF16, bytes_out=BF16, flops_per_elem=2 * n,
                          kind="mhc", split=("dp",), params={"mhc_elems": (n + 1) * d})
            b.elementwise("final_norm", "last", d, bytes_in=BF16, bytes_out=BF16, flops_per_elem=4, kind="norm",
                          split=("dp",))
            b.gemm("head", "last", d, c.vocab_size, weight="head.weight", act_out="fp32", split=("tp", "dp"),
                   comm=(gathered_logits("last", c.vocab_size),))
        extras.dspark_stages(self, b, kinds, policies, requests)

    def _restore(self, b: GraphBuilder, li: sem.LayerInfo) -> str:
        """Prefix restore of one layer (host-copy stream): its kept last-W SWA entries and, on a KV owner,
        the cached global KV (main + index K per completed group, plus the pending group's compressor
        state), from wherever each hit lives (host or disk; HBM hits copy nothing). Each owner's KV is
        copied once, by its own layer; later readers find it resident."""
        c = self.cfg
        per_entry = self.sem.main_kv_entry_bytes(c) + self.sem.index_k_entry_bytes(c)
        swa = self.sem.swa_entry_bytes(c)
        state = self.sem.compressor_state_row_bytes(c)

        def bytes_of(tier: str) -> list:
            out = [(tokens(f"cached_swa_{tier}"), swa)]
            if li.kv_source:
                done = Feature("new_groups", f"cached_{tier}", (li.ratio,))
                out.append((done, per_entry))
                if c.pooled(li.ratio):  # an unfinished group's pending state: (cached mod m) rows
                    out += [(tokens(f"cached_{tier}"), state), (done, -li.ratio * state)]
            return out

        with b.layer(li.layer):
            return restore_copy(b, bytes_of, params={"owner": li.kv_source})

    def _query_set(self, li: sem.LayerInfo) -> str:
        if li.stage == "encoder":
            return "q_enc"
        return "q_dkv" if li.layer < self.cfg.replay_start_layer else "q_dec"

    # ---- mHC (unfused: coefficients, pre-mix, pre-norm, residual update; V41_FACTS §7) -------------
    def _mhc_pre(self, b: GraphBuilder, layer: int, sub: str, ts: str, *, norm_weight: str) -> None:
        c = self.cfg
        d, n = c.hidden_size, c.hc_mult
        p = f"layers.{layer}.{sub}"
        # coefficients (a GEMM of the n streams) and Sinkhorn on an n×n matrix: the mhc_coeff rule
        mhc_coeff(b, sub, ts, d=d, n=n, rows=c.hc_mix_rows, iters=c.hc_sinkhorn_iters, fn=f"{p}.fn",
                  fp32_gemm=self.fp32_gemm)
        b.elementwise(f"{sub}.premix", ts, d, bytes_in=n * BF16, bytes_out=BF16, flops_per_elem=2 * n, kind="mhc",
                      split=("dp",), params={"mhc_elems": (n + 1) * d, "role": "premix"})
        # the sub-layer's input RMSNorm, writing FP8 for the GEMMs that follow
        b.elementwise(f"{sub}.prenorm", ts, d, bytes_in=BF16, bytes_out=1.0, flops_per_elem=4, kind="mhc",
                      split=("dp",), reads=(norm_weight,), params={"mhc_elems": 2 * d, "role": "prenorm"})

    def _mhc_post(self, b: GraphBuilder, layer: int, sub: str, ts: str) -> None:
        d, n = self.cfg.hidden_size, self.cfg.hc_mult
        b.elementwise(f"{sub}.residual", ts, n * d, bytes_in=BF16 + BF16 / n, bytes_out=BF16,
                      flops_per_elem=2 * n + 2, kind="mhc", split=("dp",),
                      params={"mhc_elems": (2 * n + 1) * d, "role": "residual"})

    # ---- Engram (V41_FACTS §6) ------------------------------------------------------------------------
    def _engram(self, b: GraphBuilder, layer: int, ts: str, policies=None) -> None:
        """Hash, row lookup, projection, gate (V41_FACTS §6). Rows are sharded over the TP group (each rank
        gathers the rows it holds for every token, then a TP all-reduce) or, with ``engram_shard="world"``,
        over every rank of the stage (TP x EP: 1/world of the table per rank; each rank fetches its tokens'
        rows from their owners in an all-to-all and its TP group all-gathers them). The projection runs
        replicated, or column-split over TP (``engram_proj="tp"``) with an all-gather of its output."""
        c = self.cfg
        d, n = c.hidden_size, c.hc_mult
        p = f"layers.{layer}.engram"
        shard = getattr(policies, "engram_shard", "tp")
        engram_lookup(b, ts, c=c, sem=self.sem, table=f"{p}.table", shard=shard)
        column = getattr(policies, "engram_proj", "replicated") == "tp"
        gather = engram_gather(ts, c.engram_proj_out)
        b.gemm("engram.proj", ts, c.engram_lookup_dim, c.engram_proj_out, weight=f"{p}.wkv", act_in="fp8",
               split=("tp", "dp") if column else ("dp",), comm=(gather,) if column else (), kind="engram")
        b.elementwise("engram.gate", ts, n * d, bytes_in=BF16 + BF16 * (n + 1) / n, bytes_out=BF16,
                      flops_per_elem=8, kind="engram", split=("dp",), reads=(f"{p}.gate_norm",),
                      exps=n)  # one sigmoid gate per stream copy

    # ---- attention ------------------------------------------------------------------------------------
    def _q_path(self, b: GraphBuilder, p: str, ts: str) -> None:
        """wq_a -> RMSNorm -> FP8 quantization (fusable) -> wq_b: the low-rank query of module ``p``."""
        c = self.cfg
        b.gemm("attn.wq_a", ts, c.hidden_size, c.q_lora_rank, weight=f"{p}.wq_a", act_in="fp8", split=("dp",))
        b.elementwise("attn.q_norm", ts, c.q_lora_rank, bytes_in=BF16, bytes_out=BF16, flops_per_elem=4, kind="norm",
                      split=("dp",), reads=(f"{p}.q_norm",))
        b.elementwise("attn.q_quant", ts, c.q_lora_rank, bytes_in=BF16, bytes_out=1.0 + 1 / 32, flops_per_elem=2,
                      kind="quant", split=("dp",))
        b.gemm("attn.wq_b", ts, c.q_lora_rank, c.q_dim, weight=f"{p}.wq_b", act_in="fp8", split=("tp", "dp"))

    def _attention_in(self, b: GraphBuilder, li: sem.LayerInfo, ts: str) -> None:
        c = self.cfg
        p = f"layers.{li.layer}.attn"
        self._q_path(b, p, ts)
        b.gemm("attn.wkv", ts, c.hidden_size, c.kv_dim, weight=f"{p}.wkv", act_in="fp8", split=("dp",))
        b.elementwise("attn.kv_norm", ts, c.kv_dim, bytes_in=BF16, bytes_out=BF16, flops_per_elem=4, kind="norm",
                      split=("dp",), reads=(f"{p}.kv_norm",))
        rope = c.qk_rope_head_dim * (c.num_attention_heads + 1)
        b.elementwise("attn.rope", ts, rope, bytes_in=BF16, bytes_out=BF16, flops_per_elem=4, kind="elementwise",
                      split=("tp", "dp"))
        swa = b.tensor(f"layers.{li.layer}.swa", "swa_cache", getattr(c, "swa_kv_format", "fp8"), elems_per_token=c.kv_dim,
                       module=p)
        b.cache_write("attn.swa_write", ts, swa, self.sem.swa_entry_bytes(c), split=("dp",))

    def _kv_producer(self, b: GraphBuilder, li: sem.LayerInfo, copy: str | None = None) -> str:
        """Compressor -> main-KV quantize/write (FP4) -> index-K projection/write (MXFP4) on a KV owner. ``copy``:
        the layer's prefix restore, which the pooling waits for (it continues the restored partial group)."""
        c = self.cfg
        m, L = li.ratio, li.layer
        p = f"layers.{L}.attn"
        if c.pooled(m):
            for w in ("wkv", "wgate"):
                b.gemm(f"compressor.{w}", "kv", c.hidden_size, c.head_dim, weight=f"{p}.compressor.{w}", act_in="bf16",
                       act_out="fp32", precision=self.fp32_gemm, split=("dp",), kind="compressor")
            state = self.sem.compressor_state_row_bytes(c)
            entries = compressor_pool(b, "compressor.pool", m=m, width=c.head_dim, state=state,
                                      formula=f"softmax-gated pooling of groups of {m}; partial-group state "
                                              f"{state:g} B per request")
            if copy:  # the pool reads the restored pending rows of the partial group
                b.depends(copy, b.last, "cache_read")
        else:
            b.gemm("compressor.wkv", "kv", c.hidden_size, c.head_dim, weight=f"{p}.compressor.wkv", act_in="bf16",
                   split=("dp",), kind="compressor")
            entries = Feature("new_groups", "kv", (m,))
        kv = b.tensor(f"layers.{L}.kv", "kv_cache", c.main_kv_format, elems_per_token=c.kv_dim, module=p)
        in_bytes = 4.0 if c.pooled(m) else BF16
        main = self.sem.main_kv_entry_bytes(c)
        entry_write(b, "kv.quant_write", "cache_write", entries, in_bytes=in_bytes, width=c.kv_dim, entry_bytes=main,
                    cache=kv, formula=f"{main:g} B per emitted entry (E2M1 + E4M3/16)")
        idx = b.tensor(f"layers.{L}.index_k", "index_cache", c.index_k_format, elems_per_token=c.index_head_dim, module=p)
        ik = self.sem.index_k_entry_bytes(c)
        return entry_write(b, "indexer.k_write", "indexer", entries, in_bytes=in_bytes, width=c.kv_dim, entry_bytes=ik,
                           cache=idx, weight=f"{p}.indexer.wk", flops_bf16=2.0 * c.head_dim * c.index_head_dim,
                           params={"k": c.head_dim, "n": c.index_head_dim},
                           formula=f"wk {c.head_dim}->{c.index_head_dim} + norm per emitted entry, MXFP4 {ik:g} B/entry")

    def _indexer(self, b: GraphBuilder, li: sem.LayerInfo, ts: str) -> str:
        """Index queries, scoring (full visible range, or the candidate pool in Decoder Reindex layers),
        block max + candidate selection on the candidate source, Top-K selection. Replicated across TP."""
        owner = self.layers[li.kv_owner]
        return hierarchical_indexer(b, ts, c=self.cfg, sem=self.sem, layer=li.layer, owner=owner.layer, m=owner.ratio,
                                    candidate_limited=getattr(li, "candidate_limited", False),
                                    candidate_source=getattr(li, "candidate_source", False))

    def _sparse_attention(self, b: GraphBuilder, li: sem.LayerInfo, ts: str) -> str:
        """<= W SWA slots + <= min(K, visible/m) selected compressed entries per query; FP4 main KV is
        dequantized on read (bf16 compute), read once per consumer layer."""
        reads = [f"layers.{li.layer}.swa"]
        m = 0
        if li.kv_owner is not None:
            m = self.layers[li.kv_owner].ratio
            reads += [f"layers.{li.kv_owner}.kv", f"layers.{li.topk_producer}.topk"]
        return swa_sparse_attention(b, ts, c=self.cfg, sem=self.sem, layer=li.layer, prec=attention_precision(b),
                                    owner=li.kv_owner, m=m, main_entry_bytes=self.sem.main_kv_entry_bytes(self.cfg),
                                    reads=tuple(reads),
                                    params={"kv_owner": li.kv_owner, "topk_producer": li.topk_producer})

    def _attention_out(self, b: GraphBuilder, layer: int, ts: str) -> None:
        c = self.cfg
        p = f"layers.{layer}.attn"
        g = c.o_groups
        b.gemm("attn.wo_a", ts, c.q_dim // g, c.o_lora_rank, copies=g, weight=f"{p}.wo_a", split=("tp", "dp"))
        b.gemm("attn.wo_b", ts, g * c.o_lora_rank, c.hidden_size, weight=f"{p}.wo_b", act_in="fp8", split=("tp", "dp"),
               comm=(all_reduce_tp(ts, c.hidden_size, note="row-parallel wo_b"),))

    def _route(self, b: GraphBuilder, layer: int, ts: str) -> None:
        """Score (sqrt-softplus + correction bias) and pick top-k experts per token."""
        c = self.cfg
        b.elementwise("ffn.route", ts, c.n_routed_experts, bytes_in=4.0, bytes_out=0.0, flops_per_elem=6.0,
                      kind="router", split=("dp",), reads=(f"layers.{layer}.ffn.gate.bias",),
                      exps=c.n_routed_experts)  # softplus = log(1 + exp): one exp per expert

    def _moe(self, b: GraphBuilder, layer: int, ts: str) -> None:
        c = self.cfg
        p = f"layers.{layer}.ffn"
        d, f = c.hidden_size, c.moe_intermediate_size
        x = b.last  # the block's input: the router and the shared expert both read it
        b.gemm("ffn.router", ts, d, c.n_routed_experts, weight=f"{p}.gate.weight", act_out="fp32", split=("dp",),
               kind="router")
        self._route(b, layer, ts)
        comm = ep_dispatch_combine(ts, d=d, top_k=c.num_experts_per_tok)
        b.moe_experts("ffn.experts", ts, experts=c.n_routed_experts, top_k=c.num_experts_per_tok, hidden=d, inter=f,
                      weight=tuple(f"{p}.experts.{w}" for w in ("w1", "w3", "w2")), split=("ep",), comm=comm)
        routed = b.last
        s = f"{p}.shared_experts"
        fs = c.n_shared_experts * f
        # beside the routed path (it needs none of the dispatch/combine), summed with its output
        b.gemm("ffn.shared.w1", ts, d, fs, weight=f"{s}.w1", act_in="fp8", split=("tp", "dp"),
               deps=(x,) if x else None)
        b.gemm("ffn.shared.w3", ts, d, fs, weight=f"{s}.w3", act_in="fp8", split=("tp", "dp"))
        b.elementwise("ffn.shared.swiglu", ts, fs, bytes_in=2 * BF16, bytes_out=1.0 + 1 / 32, flops_per_elem=4,
                      kind="activation", split=("tp", "dp"), exps=fs, params={"role": GATED})
        b.gemm("ffn.shared.w2", ts, fs, d, weight=f"{s}.w2", act_in="fp8", split=("tp", "dp"),
               comm=(all_reduce_tp(ts, d, note="row-parallel shared expert", merge=MOE_OUT),))
        b.join(routed)


def load(name_or_path="deepseek-v4.1-flash") -> DeepSeekV41:
    return DeepSeekV41(load_config(name_or_path))
