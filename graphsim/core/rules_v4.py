"""Cost rules of the DeepSeek-V4 family's own mechanisms (V41_FACTS §2–§9, §12–§13): mHC coefficients,
Engram lookups, the CSA/HCA compressors and KV writers, the hierarchical indexer, SWA + sparse attention, EP
dispatch/combine with FP8 scales, hash routing and the DSpark commit. Registered in :data:`graphsim.core.rules.RULES`
like the generic rules; the V4/V4.1 model files compose them and write no cost terms of their own.

Each rule takes the model's config ``c`` (and, where entry sizes differ between V4 and V4.1, its semantics
module ``sem``) so V4-Flash and V4.1-Flash share them.
"""
from __future__ import annotations

from .builder import GraphBuilder
from .ir import Cost, CommSpec, Feature, fmt
from .rules import MOE_OUT, rule, tokens

BF16 = 2.0


@rule("mhc_coeff", "fn projection 2·(n·d)·rows FP32-GEMM FLOPs + n·d·2 B per token, fn read once; Sinkhorn "
      "iters·4·n² FLOPs and n² + 2n exps per token")
def mhc_coeff(b: GraphBuilder, sub: str, ts: str, *, d: int, n: int, rows: int, iters: int, fn: str,
              fp32_gemm: str) -> None:
    """mHC coefficients: the fn [(2+n)n, n·d] projection of the n streams (a GEMM), then Sinkhorn on an n×n
    matrix; the (2+n)n outputs stay on chip (not charged as traffic)."""
    w = b._tensors[fn]
    k = n * d
    b.op(f"{sub}.coeff", "mhc", Cost.of(Feature("active", ts), bytes_weight=w.nbytes)
         + Cost.of(tokens(ts), **{f"flops_{fp32_gemm}": 2.0 * k * rows, "bytes_act": n * d * BF16}),
         token_set=ts, precision=fp32_gemm, split=("dp",), reads=(fn,),
         params={"k": k, "n": rows, "mhc_elems": n * d, "role": "coeff"},
         formula=f"2·{k}·{rows} flops per token; fn read once")
    # exp of the n×n mixing logits, sigmoid of the n pre and n post weights, then row/column scaling
    b.op(f"{sub}.sinkhorn", "mhc", Cost.of(tokens(ts), flops_fp32=iters * 4 * n * n, exps=n * n + 2 * n),
         token_set=ts, precision="fp32", split=("dp",),
         params={"mhc_elems": 0, "sinkhorn_iters": iters, "role": "sinkhorn"},
         formula=f"Sinkhorn x{iters} on {n}x{n}: {iters * 4 * n * n} flops, {n * n + 2 * n} exps per token")


@rule("engram_lookup", "8 FLOPs per hashed row; rows x (head_dim FP8 + scales) B read per token from the table, "
      "gathered over TP (all-reduce) or fetched from their owners (all-to-all + TP all-gather)")
def engram_lookup(b: GraphBuilder, ts: str, *, c, sem, table: str, shard: str) -> None:
    rows = c.engram_lookup_rows
    t = tokens(ts)
    b.op("engram.hash", "engram", Cost.of(t, flops_fp32=8.0 * rows, bytes_act=4.0 * c.engram_max_ngram_size + 8.0 * rows),
         token_set=ts, split=("dp",), formula=f"{rows} n-gram hashes per token")
    payload = sem.engram_lookup_bytes_per_token(c)
    gathered = c.engram_lookup_dim * BF16
    if shard == "world":
        comm = (CommSpec("all_to_all", "world", Cost.of(t, bytes_act=payload), "after",
                         note="rows fetched from the ranks that own them"),
                CommSpec("all_gather", "tp", Cost.of(t, bytes_act=payload), "after",
                         note="the TP group's rows gathered on every rank"))
        split = ("world",)
    else:
        comm = (CommSpec("all_reduce", "tp", Cost.of(t, bytes_act=gathered), note="table rows sharded across TP"),)
        split = ("tp", "dp")
    b.op("engram.lookup", "engram", Cost.of(t, bytes_weight=payload, bytes_act=gathered),
         token_set=ts, split=split, reads=(table,), comm=comm,
         params={"rows": rows, "payload_bytes": payload, "shard": shard},
         formula=f"{rows} rows x {c.engram_head_dim} FP8 + scales = {payload:g} B per token")


def engram_gather(ts: str, out: int) -> CommSpec:
    """A column-split Engram projection's output all-gathered over TP."""
    return CommSpec("all_gather", "tp", Cost.of(tokens(ts), bytes_act=out * BF16), "after",
                    note="column-split projection gathered")


@rule("compressor_pool", "gated pooling: 4·c·w FLOPs, 2·4·c·w B and c·w exps per position (c = 2 overlapping "
      "planes for CSA, 1 otherwise), 4·w B per emitted entry, + the partial group's state read and written per request")
def compressor_pool(b: GraphBuilder, name: str, *, m: int, width: int, planes: int = 1, state: float = 0.0,
                    formula: str = "") -> Feature:
    """The softmax-gated pooling of each group of ``m`` positions (per channel: one exp per position and
    channel and plane); returns the emitted-entries feature."""
    entries = Feature("new_groups", "kv", (m,))
    cost = (Cost.of(tokens("kv"), flops_fp32=4.0 * planes * width, bytes_act=2 * 4.0 * planes * width,
                    exps=planes * width)
            + Cost.of(entries, bytes_act=4.0 * width))
    if state:
        cost += Cost.of(Feature("requests", "kv"), bytes_act=2 * state)
    b.op(name, "compressor", cost, token_set="kv", split=("dp",), precision="fp32",
         formula=formula or f"softmax-gated pooling of groups of {m}")
    return entries


@rule("entry_write", "per emitted entry: the compressed vector read (in_bytes·width) and its cache entry written")
def entry_write(b: GraphBuilder, name: str, kind: str, entries: Feature, *, in_bytes: float, width: int,
                entry_bytes: float, cache: str, weight: str | None = None, flops_bf16: float = 0.0,
                params: dict | None = None, formula: str = "") -> str:
    """Write one cache entry per emitted compression group (KV quantize/write, index-K projection/write)."""
    cost = Cost.of(entries, bytes_act=in_bytes * width, bytes_kv=entry_bytes)
    reads = ()
    if weight is not None:  # a projection applied per entry (V4.1's index-K wk): its weight read once
        w = b._tensors[weight]
        cost = Cost.of(Feature("active", "kv"), bytes_weight=w.nbytes) + cost
        reads = (weight,)
    if flops_bf16:
        cost += Cost.of(entries, flops_bf16=flops_bf16)
    return b.op(name, kind, cost, token_set="kv", split=("dp",), reads=reads, writes=(cache,), params=params,
                formula=formula or f"{entry_bytes:g} B per emitted entry")


@rule("hierarchical_indexer", "2·H·D + 3·H FLOPs per scored compressed entry (the whole visible range, or the "
      "candidate pool) at the index-K format's rate, index K read once per request; block max + candidate "
      "gather on the candidate source; Top-K over the scored entries")
def hierarchical_indexer(b: GraphBuilder, ts: str, *, c, sem, layer: int, owner: int, m: int,
                         candidate_limited: bool, candidate_source: bool) -> str:
    p = f"layers.{layer}.attn.indexer"
    H, D = c.index_n_heads, c.index_head_dim
    pool = getattr(c, "candidate_topk_blocks", 0) * getattr(c, "candidate_block_size", 0)
    b.gemm("indexer.wq_b", ts, c.q_lora_rank, H * D, weight=f"{p}.wq_b", act_in="fp8", split=("dp",), kind="indexer")
    b.gemm("indexer.weights_proj", ts, c.hidden_size, H, weight=f"{p}.weights_proj", act_in="bf16",
           act_out="fp32", split=("dp",), kind="indexer")
    per_pair = 2.0 * H * D + 3.0 * H  # q·k per head, relu, weight, sum: no exponential (ReLU scoring)
    # index Q and K are stored in the index-K format (MXFP4 in V4.1): the scoring GEMM runs at that
    # format's tensor rate (FP4 where the chip has one; the descriptor falls back to FP8 on Hopper)
    prec = fmt(c.index_k_format).compute
    if candidate_limited:
        pairs = Feature("topk_pairs", ts, (m, pool))
        reads = Feature("sparse_read", ts, (m, pool))
        extra = Cost.of(pairs, bytes_act=4.0)  # candidate positions read
        what = f"candidate pool <= {pool}"
    else:
        pairs = Feature("compressed_pairs", ts, (m,))
        reads = Feature("compressed", ts, (m,))
        extra = Cost()
        what = "whole visible compressed range"
    reads_idx = (f"layers.{owner}.index_k",)
    if candidate_limited:  # the pool the Decoder's first Full layer selected
        reads_idx += (f"layers.{c.candidate_source_layer_id}.candidates",)
    score = b.op("indexer.score", "indexer",
                 Cost.of(pairs, **{f"flops_{prec}": per_pair}) + Cost.of(reads, bytes_kv=sem.index_k_entry_bytes(c))
                 + Cost.of(tokens(ts), bytes_act=fmt(c.index_k_format).nbytes(H * D) + H * 4.0) + extra,
                 token_set=ts, precision=prec, split=("dp",), reads=reads_idx,
                 formula=f"{per_pair:g} {prec} flops per scored entry over the {what}; ReLU scores, no exps")
    if candidate_limited:
        b.depends(f"layers.{c.candidate_source_layer_id}.indexer.candidates", score, "candidates")
    if candidate_source:
        blocks = c.candidate_topk_blocks
        b.op("indexer.block_max", "indexer", Cost.of(pairs, flops_fp32=1.0, bytes_act=4.0 / c.candidate_block_size),
             token_set=ts, split=("dp",), formula=f"max score per block of {c.candidate_block_size}")
        cand = b.tensor(f"layers.{layer}.candidates", "workspace", "int8", elems_per_token=4 * pool,
                        module=f"layers.{layer}.attn.indexer")
        b.op("indexer.candidates", "indexer",
             Cost.of(Feature("topk_pairs", ts, (m, pool)), bytes_act=4.0)
             # selection scans every block max (ceil: the newest partial block is always kept)
             + Cost.of(Feature("compressed_pairs", ts, (m * c.candidate_block_size,)), flops_fp32=2.0, bytes_act=4.0)
             + Cost.of(tokens(ts), flops_fp32=2.0, bytes_act=4.0),
             token_set=ts, split=("dp",), writes=(cand,),
             formula=f"keep <= {blocks} blocks (newest always), gather <= {pool} candidate positions")
    sel = b.tensor(f"layers.{layer}.topk", "workspace", "int8", elems_per_token=4 * c.index_topk,
                   module=f"layers.{layer}.attn.indexer")
    return b.op("indexer.topk", "topk", Cost.of(Feature("topk_pairs", ts, (m, c.index_topk)), bytes_act=4.0)
                + Cost.of(pairs, flops_fp32=2.0),
                token_set=ts, split=("dp",), writes=(sel,),
                formula=f"Top-{c.index_topk} of the scored entries; indices written for this KV group")


@rule("swa_sparse_attention", "2·H·2D FLOPs and H exps per (query, key) pair over <= W SWA slots plus "
      "<= min(K, visible/m) selected (CSA) or every (HCA) compressed entry; + H sink exps per query; SWA and "
      "selected entries read once per request")
def swa_sparse_attention(b: GraphBuilder, ts: str, *, c, sem, layer: int, prec: str, owner: int | None = None,
                         m: int = 0, dense_compressed: bool = False, main_entry_bytes: float = 0.0,
                         reads: tuple = (), params: dict | None = None, formula: str = "") -> str:
    W, K = c.sliding_window, c.index_topk
    H, D = c.num_attention_heads, c.head_dim
    per_pair = 2.0 * H * 2 * D  # QK and PV over the one shared latent, all heads
    math = {f"flops_{prec}": per_pair, "exps": float(H)}  # one exponential per score
    cost = (Cost.of(Feature("window_pairs", ts, (W,)), **math)
            + Cost.of(Feature("window_read", ts, (W,)), bytes_kv=sem.swa_entry_bytes(c)))
    if dense_compressed:  # HCA: every compressed entry
        cost += (Cost.of(Feature("compressed_pairs", ts, (m,)), **math)
                 + Cost.of(Feature("compressed", ts, (m,)), bytes_kv=main_entry_bytes))
    cost += Cost.of(tokens(ts), bytes_act=2 * H * D * BF16, exps=float(H))  # + each head's sink logit
    if owner is not None and not dense_compressed:
        cost += Cost.of(Feature("topk_pairs", ts, (m, K)), **{**math, "bytes_act": 4.0})
        cost += Cost.of(Feature("sparse_read", ts, (m, K)), bytes_kv=main_entry_bytes)
    return b.op("attn.sparse", "attention", cost, token_set=ts, precision=prec, split=("tp", "dp"),
                reads=reads, params={"kv_heads": c.num_key_value_heads, "heads": H, "precision": prec, "attn": "sparse",
                        "head_dim": D, "window": W, **(params or {})},
                formula=formula or f"{per_pair:g} {prec} flops and {H} exps per (query, key) pair, + {H} sink exps "
                f"per query; <= {W} SWA + <= min({K}, visible/m) selected")


@rule("ep_dispatch_combine", "dispatch k·d·(1 + 1/32) B per token (FP8 + ue8m0 scales per 32), combine k·d·2 B "
      "(BF16), the expert-TP all-reduce d·2 B")
def ep_dispatch_combine(ts: str, *, d: int, top_k: int) -> tuple:
    t = tokens(ts)
    return (CommSpec("all_to_all", "ep", Cost.of(t, bytes_act=top_k * d * (1.0 + 1 / 32)), "before",
                     note="dispatch (FP8 + scales)", phase="dispatch", payload_format="fp8_e8m0_32"),
            CommSpec("all_to_all", "ep", Cost.of(t, bytes_act=top_k * d * BF16), "after", note="combine (BF16)",
                     phase="combine", payload_format="bf16"),
            CommSpec("all_reduce", "moe_tp", Cost.of(t, bytes_act=d * BF16), "after", note="expert TP", merge=MOE_OUT))


@rule("hash_route", "hash routing: k expert ids (4 B each) looked up per token, 2·E FLOPs")
def hash_route(b: GraphBuilder, ts: str, *, experts: int, top_k: int, table: str) -> None:
    b.op("ffn.route", "router", Cost.of(tokens(ts), bytes_weight=4.0 * top_k, flops_fp32=2.0 * experts),
         token_set=ts, split=("dp",), reads=(table,), formula="hash routing: expert ids looked up by token id (tid2eid)")


@rule("dspark_commit", "per verified position 2·L·swa B (staged SWA entries into the ring); per request "
      "2·owners·state B (partial compression groups restored/advanced)")
def dspark_commit_caches(b: GraphBuilder, ts: str, *, layers: int, swa_bytes: float, owners: int,
                         state_bytes: float) -> None:
    b.op("commit.swa", "cache_write", Cost.of(tokens(ts), bytes_kv=2 * layers * swa_bytes), token_set=ts,
         split=("dp",), params={"layers": layers, "entry_bytes": swa_bytes},
         formula=f"copy staged SWA entries into the ring: 2·{layers}·{swa_bytes:g} B per verified position")
    b.op("commit.compressor_state", "cache_write", Cost.of(Feature("requests", ts), bytes_kv=2 * owners * state_bytes),
         token_set=ts, split=("dp",), params={"owners": owners, "state_bytes": state_bytes},
         formula=f"restore/advance the partial group of {owners} pooled owners: 2·{state_bytes:g} B each per request")


__all__ = ["mhc_coeff", "engram_lookup", "engram_gather", "compressor_pool", "entry_write", "hierarchical_indexer",
           "swa_sparse_attention", "ep_dispatch_combine", "hash_route", "dspark_commit_caches"]
