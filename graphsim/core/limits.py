"""Upper bounds on every input that drives graph size, loop counts, memory or arithmetic range.

Each bound sits far above any real model or deployment (the largest shipped or public value is quoted beside
it), so it never refuses a real case; it exists so that no input — a typo, a careless script, a fuzzer — can
allocate or loop without bound, or push a closed form past the range where float64 is exact. Violations are
one-line :class:`~graphsim.core.errors.GraphsimError` naming the field and the bound.
"""
from __future__ import annotations

import math

from .errors import require

#: Tokens of one request's context (prompt + generated). 2^26 = 67,108,864 (real: 10M, Llama 4 Scout). Every
#: prefix-sum feature (Σ_i (i+1) ~ n²/2 < 2^53) is then an exact float64 integer, so differences of them are
#: exact at every admitted length.
MAX_CONTEXT = 1 << 26
#: Requests in one request group. 2^24 = 16,777,216 (real: tens of thousands per replica step).
MAX_REQUESTS = 1 << 24
#: GPUs of one replica (tp·dp·cp·pp) and every parallel degree. 2^20 (real: 10^5 for the largest clusters).
MAX_RANKS = 1 << 20
#: Transformer layers (real: 126, Llama-3.1-405B) — the graph holds a few dozen ops per layer.
MAX_LAYERS = 1024
#: Hidden size, intermediate sizes and other per-token widths (real: 53,248, Llama-3.1-405B's MLP).
MAX_WIDTH = 1 << 20
#: Vocabulary (real: 262,144, Gemma 3).
MAX_VOCAB = 1 << 22
#: Attention / indexer heads (real: 128).
MAX_HEADS = 1 << 12
#: Routed experts (real: 384, Kimi-K2 / DeepSeek-V4.1).
MAX_EXPERTS = 1 << 16
#: Engram N-gram order (real: 4) and hash heads per order (real: 8): the graph has one lookup row per pair.
MAX_NGRAM = 16
MAX_NGRAM_HEADS = 256
#: Any other integer a config may carry (sizes, ids, ranks, ratios).
MAX_CONFIG_INT = (1 << 31) - 1
#: Pipeline micro-batches (each is a copy of a stage's ops in the graph; real: <= 2·pp).
MAX_MICRO_BATCHES = 256
#: Forward steps of one chunked prefill (--chunk): a 1M-token prompt in 256-token chunks is 4,096 steps.
MAX_CHUNK_STEPS = 4096
#: Points of one structural point of a sweep (a vectorized call evaluates them in bounded chunks).
MAX_SWEEP_POINTS = 10**9

#: Upper bounds of HF config integers by field name (everything else: MAX_CONFIG_INT).
CONFIG_BOUNDS = {
    "num_hidden_layers": MAX_LAYERS, "num_layers": MAX_LAYERS, "first_k_dense_replace": MAX_LAYERS,
    "num_nextn_predict_layers": 64, "num_hash_layers": MAX_LAYERS,
    "hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "moe_intermediate_size": MAX_WIDTH,
    "head_dim": MAX_WIDTH, "q_lora_rank": MAX_WIDTH, "kv_lora_rank": MAX_WIDTH, "o_lora_rank": MAX_WIDTH,
    "qk_nope_head_dim": MAX_WIDTH, "qk_rope_head_dim": MAX_WIDTH, "v_head_dim": MAX_WIDTH,
    "index_head_dim": MAX_WIDTH, "engram_head_dim": MAX_WIDTH,
    "vocab_size": MAX_VOCAB,
    "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS, "index_n_heads": MAX_HEADS,
    "o_groups": MAX_HEADS, "hc_mult": 64, "hc_sinkhorn_iters": 1000,
    "n_routed_experts": MAX_EXPERTS, "n_shared_experts": 1024, "num_experts_per_tok": 1024,
    "dspark_n_routed_experts": MAX_EXPERTS, "dspark_num_experts_per_tok": 1024, "dspark_block_size": 1024,
    "engram_max_ngram_size": MAX_NGRAM, "engram_n_heads": MAX_NGRAM_HEADS,
    "max_position_embeddings": MAX_CONTEXT, "sliding_window": MAX_CONTEXT, "index_topk": MAX_CONTEXT,
    "candidate_topk_blocks": MAX_CONTEXT, "candidate_block_size": MAX_CONTEXT,
}


def check_int(field: str, value, lo: int = 0, hi: int = MAX_CONFIG_INT) -> int:
    """An exact integer in [lo, hi] (bools and floats refused), else a GraphsimError naming ``field``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    require(ok, field, f"must be an integer, got {value!r}")
    require(lo <= value <= hi, field, f"must lie in [{lo:,}, {hi:,}], got {value:,}")
    return value


def check_config_int(field: str, name: str, value, lo: int = 0) -> int:
    """A config integer within its field's bound (:data:`CONFIG_BOUNDS`)."""
    return check_int(field, value, lo, CONFIG_BOUNDS.get(name, MAX_CONFIG_INT))


def check_number(field: str, value, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False) -> float:
    """A finite real number in the interval, else a GraphsimError naming ``field``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    require(ok, field, f"must be a number, got {value!r}")
    v = float(value)
    require(math.isfinite(v), field, f"must be finite, got {value!r}")
    ok = (v > lo if lo_open else v >= lo) and v <= hi
    lo_s = f"{'(' if lo_open else '['}{lo:g}"
    require(ok, field, f"must lie in {lo_s}, {hi:g}], got {v:g}")
    return v


#: Runtime reserve per GPU. CUDA context ≈ 0.5–1 GiB; NCCL + DeepEP normal/low-latency buffers ≈ 2–4 GiB;
#: CUDA graphs, cuBLAS/DeepGEMM workspaces and allocator fragmentation ≈ 2–3 GiB. (SGLang's default
#: mem_fraction_static keeps 10–15 % of HBM back for this *and* activations, which are counted separately.)
#: Here (a light module) so the commands' help prints the value (graphsim.driver.memory re-exports it).
DEFAULT_RESERVE_GIB = 8.0
