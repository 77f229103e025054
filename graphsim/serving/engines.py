"""Serving engines' documented behaviour (issue 25 item 3): how much of a GPU's HBM an engine lets its KV cache
take and in what granularity it pages it, how many requests and tokens one step of an engine instance schedules,
and what a step costs the host (kernel launches, CUDA graph replays, the scheduler). A prediction for an engine
fits the batches that engine admits and prices its steps as the engine runs them; the SOL bound keeps every byte
and pays no host time (no engine terms).

Each figure is the engine's documented default, with its source; a default computed at launch from the machine
by a documented rule (SGLang's chunked-prefill size and CUDA-graph batch by GPU memory) is a tier of
:attr:`EngineTerms.tiers`; one with no public figure (SGLang's ``--mem-fraction-static``, every engine's host
cost per kernel launch) is no term rather than a guess — ``--engine-set FIELD=VALUE`` sets it.
"""
from __future__ import annotations

import math

import attrs
import numpy as np

from ..core.errors import require

#: how an engine sizes its memory: "total" — a fraction of the GPU's HBM for weights, activations and the KV
#: pool together (vLLM ``gpu_memory_utilization``); "free" — the KV pool is a fraction of what weights and
#: activations leave (TensorRT-LLM ``free_gpu_memory_fraction``); "all" — no documented fixed fraction
MEMORY_MODES = ("total", "free", "all")


#: fields ``--engine-set FIELD=VALUE`` may set: (kind, lowest, highest); "int?": a whole number or ``none`` (no
#: term), "us": microseconds (stored in seconds), "bool": true/false
SETTABLE = {"memory_fraction": ("float", 0.01, 1.0), "kv_block_tokens": ("int", 1, 1 << 20),
            "max_running": ("int?", 1, 1 << 24), "step_tokens": ("int?", 1, 1 << 30),
            "chunked_prefill": ("bool", 0, 1), "graph_max_batch": ("int", 0, 1 << 24),
            "launch_us": ("us", 0.0, 1e4), "graph_launch_us": ("us", 0.0, 1e4), "step_overhead_us": ("us", 0.0, 1e6),
            "moe_routing": ("bool", 0, 1), "moe_load_ratio": ("float", 1.0, 1024.0), "eplb": ("bool", 0, 1)}


@attrs.frozen
class EngineTerms:
    """One engine's documented terms. An *instance* is what one scheduler runs: one attention-DP rank (vLLM runs
    an engine core per DP rank and ``--max-num-seqs`` is per rank; TensorRT-LLM's attention DP schedules per rank;
    SGLang runs a scheduler per DP rank), so limits hold per DP rank."""

    name: str
    memory: str = attrs.field(validator=attrs.validators.in_(MEMORY_MODES))
    memory_fraction: float = 1.0
    kv_block_tokens: int = 1  #: KV pages are this many token positions; a request holds whole pages
    sources: tuple = ()  #: (field, source) pairs
    #: most requests an instance runs at once (None: no cap)
    max_running: int | None = None
    #: most tokens one step of an instance schedules, prompt chunks and decode tokens together (None: no budget)
    step_tokens: int | None = None
    #: a prompt over the budget runs in chunks of the budget (else prompts are packed whole, and one longer than the
    #: budget is not run)
    chunked_prefill: bool = True
    #: decode-only steps of at most this many requests per instance replay a CUDA graph (0: none)
    graph_max_batch: int = 0
    launch_s: float = 0.0  #: host time per kernel launch outside a graph (0: no term)
    graph_launch_s: float = 0.0  #: host time per CUDA graph replay (0: no term)
    step_overhead_s: float = 0.0  #: host scheduler time per step the GPU waits for (0: hidden or no term)
    #: (field, ((below_bytes, value), ..., (None, value))): defaults an engine computes at launch from the GPU's
    #: memory by a documented rule (:meth:`on`)
    tiers: tuple = ()
    #: the token budget is the replica's, split over its attention-DP ranks (SGLang with DP attention)
    step_tokens_split_dp: bool = False
    #: decode tokens count against the budget (vLLM, TensorRT-LLM); else it bounds prompt tokens only (SGLang)
    decode_in_budget: bool = True
    #: a decode step's hottest EP rank carries the routing statistics' expected load (graphsim.serving.moe)
    moe_routing: bool = True
    #: measured hottest-rank mean load over the mean (skewed routing; 1: uniform, no term)
    moe_load_ratio: float = 1.0
    #: the engine rebalances experts from routing statistics (EPLB): the measured skew goes, the per-step noise stays
    eplb: bool = False

    def budget(self, dp: int) -> float:
        """Tokens one step of one instance (attention-DP rank) schedules (inf: no budget)."""
        if self.step_tokens is None:
            return math.inf
        return float(max(1, self.step_tokens // dp) if self.step_tokens_split_dp else self.step_tokens)

    def on(self, hbm_bytes: float) -> "EngineTerms":
        """The terms on a GPU of ``hbm_bytes``: each tiered default at its tier."""
        ch = {}
        for field, steps in self.tiers:
            ch[field] = next(v for below, v in steps if below is None or hbm_bytes < below)
        return attrs.evolve(self, tiers=(), **ch) if ch else self

    def with_settings(self, settings) -> "EngineTerms":
        """These terms with ``FIELD=VALUE`` strings (or (field, value) pairs) applied; one-line errors name the
        field and what is allowed."""
        ch = {}
        for item in settings:
            field, _, raw = item.partition("=") if isinstance(item, str) else (item[0], "=", str(item[1]))
            field, raw = field.strip(), raw.strip()
            require(field in SETTABLE, "engine_set", f"unknown engine term {field!r}; allowed: {', '.join(SETTABLE)}")
            kind, lo, hi = SETTABLE[field]
            what = {"float": f"a number in [{lo}, {hi}]", "int": f"a whole number in [{lo}, {hi}]",
                    "int?": f"a whole number in [{lo}, {hi}] or none", "bool": "true or false",
                    "us": f"microseconds in [{lo:g}, {hi:g}]"}[kind]
            if kind == "bool":
                require(raw.lower() in ("true", "false", "1", "0", "on", "off"), f"engine_set.{field}",
                        f"{what}, got {raw!r}")
                ch[field] = raw.lower() in ("true", "1", "on")
                continue
            if kind == "int?" and raw.lower() == "none":
                ch[field] = None
                continue
            try:
                v = float(raw)
            except ValueError:
                v = math.nan
            ok = math.isfinite(v) and lo <= v <= hi and (kind in ("float", "us") or v == int(v))
            require(ok, f"engine_set.{field}", f"{what}, got {raw!r}")
            if kind == "us":
                ch[field[:-3] + "_s"] = v * 1e-6
            else:
                ch[field] = float(v) if kind == "float" else int(v)
        set_fields = {k[:-2] + "_us" if k.endswith("_s") else k for k in ch}
        srcs = tuple((f, s) for f, s in self.sources if f not in set_fields) + tuple(
            (f, "set by --engine-set") for f in sorted(set_fields))
        return attrs.evolve(self, sources=srcs, **ch) if ch else self

    def graphed(self, requests) -> np.ndarray:
        """Whether a decode-only step of ``requests`` per instance replays a CUDA graph."""
        return np.asarray(requests, dtype=np.float64) <= self.graph_max_batch

    def step_time(self, gpu, kernels, graphed=False) -> np.ndarray:
        """A step's time as the engine runs it: the GPU's time or the host's launches, whichever is longer (a
        graph replay is one launch; otherwise ``kernels`` launches), plus the exposed scheduler time."""
        host = np.where(graphed, self.graph_launch_s, np.asarray(kernels, dtype=np.float64) * self.launch_s)
        return np.maximum(np.asarray(gpu, dtype=np.float64), host) + self.step_overhead_s

    def to_dict(self) -> dict:
        """Every term in force (JSON ``space.engine_terms``)."""
        return {"memory": self.memory, "memory_fraction": self.memory_fraction,
                "kv_block_tokens": self.kv_block_tokens, "max_running": self.max_running,
                "step_tokens": self.step_tokens,
                "step_tokens_split_dp": self.step_tokens_split_dp,
                "decode_in_budget": self.decode_in_budget, "chunked_prefill": self.chunked_prefill,
                "graph_max_batch": self.graph_max_batch, "launch_us": self.launch_s * 1e6,
                "graph_launch_us": self.graph_launch_s * 1e6, "step_overhead_us": self.step_overhead_s * 1e6,
                "moe_routing": self.moe_routing, "moe_load_ratio": self.moe_load_ratio, "eplb": self.eplb,
                "sources": [{"field": f, "source": src} for f, src in self.sources]}

    def paged(self, context):
        """Token positions a request of ``context`` positions holds in whole KV pages."""
        b = self.kv_block_tokens
        return context if b <= 1 else math.ceil(context / b) * b

    def room(self, capacity: float, reserve: float, fixed: float, kv):
        """HBM left per device once ``fixed`` bytes (weights + activations) and ``kv`` bytes of KV are placed
        under the engine's memory rule (negative: does not fit). ``reserve``: what the runtime keeps outside
        the engine (CUDA context, NCCL buffers)."""
        usable = capacity - reserve
        if self.memory == "total":
            return min(usable, self.memory_fraction * capacity) - fixed - kv
        if self.memory == "free":
            return self.memory_fraction * (usable - fixed) - kv
        return usable - fixed - kv


GIB = 2.0**30
#: no public figure for the host side of a step: each engine's note (the term stays 0 until --engine-set sets it)
_ROUTING = ("moe_routing", "derived, not an engine figure: the hottest EP rank's expected load under uniform "
            "top-k routing (graphsim.serving.moe); moe_load_ratio (a measured skew) has no public default: 1")
_LAUNCH = ("launch_us", "no engine documents its host time per kernel launch or per graph replay (it depends on "
           "the CPU, driver and kernel arguments): no term; measure it (nsys) and set --engine-set launch_us=, "
           "graph_launch_us=")

ENGINES = {
    "vllm": EngineTerms(
        "vllm", "total", 0.92, 16,
        (("memory_fraction", "vLLM CacheConfig.gpu_memory_utilization default 0.92 (docs.vllm.ai, "
                             "vllm/config/cache.py; 0.9 before): the fraction of GPU memory the instance uses "
                             "for weights, activations and the KV cache"),
         ("kv_block_tokens", "vLLM CacheConfig.DEFAULT_BLOCK_SIZE = 16 tokens per KV block"),
         ("max_running", "vLLM --max-num-seqs: EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py) sets 1024 "
                         "for `vllm serve` on a GPU of >= 70 GiB (H100 and up, not A100), 256 below; per DP rank "
                         "(each DP rank runs its own engine core)"),
         ("step_tokens", "vLLM --max-num-batched-tokens: EngineArgs.get_batch_defaults sets 8192 for `vllm serve` "
                         "on a GPU of >= 70 GiB, 2048 below; per engine core"),
         ("chunked_prefill", "vLLM SchedulerConfig.enable_chunked_prefill: always on in the V1 engine (a prompt "
                             "over the budget is split; decodes are scheduled first)"),
         ("graph_max_batch", "vLLM VllmConfig._set_cudagraph_sizes: max_cudagraph_capture_size = min(2 x "
                             "max_num_seqs x (1 + speculative tokens), 512, max_num_batched_tokens) = 512; decode "
                             "batches up to it replay a full graph (cudagraph_mode FULL_AND_PIECEWISE); vLLM counts "
                             "it in tokens, graphsim in requests (equal without speculation)"),
         _LAUNCH,
         ("step_overhead_us", "no public figure of vLLM's per-step scheduler time (--async-scheduling overlaps it "
                              "with the GPU): no term"),
         _ROUTING, ("eplb", "vLLM ParallelConfig.enable_eplb default False (--enable-eplb)")),
        max_running=1024, step_tokens=8192, chunked_prefill=True, graph_max_batch=512,
        tiers=(("max_running", ((70 * GIB, 256), (None, 1024))), ("step_tokens", ((70 * GIB, 2048), (None, 8192))))),
    "trtllm": EngineTerms(
        "trtllm", "free", 0.9, 32,
        (("memory_fraction", "TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction default 0.9: the KV cache takes "
                             "90 % of the GPU memory left free after the model is loaded (nvidia.github.io/"
                             "TensorRT-LLM, 'How to Change KV Cache Behavior')"),
         ("kv_block_tokens", "TensorRT-LLM KvCacheConfig.tokens_per_block default 32"),
         ("max_running", "TensorRT-LLM BaseLlmArgs.max_batch_size default 2048 (tensorrt_llm/llmapi/llm_args.py; "
                         "'Tuning Max Batch Size and Max Num Tokens'); per rank under attention DP"),
         ("step_tokens", "TensorRT-LLM BaseLlmArgs.max_num_tokens default 8192: the scheduler's token budget per "
                         "iteration"),
         ("chunked_prefill", "TensorRT-LLM TorchLlmArgs.enable_chunked_prefill default False: prompts are packed "
                             "whole within max_num_tokens"),
         ("graph_max_batch", "TensorRT-LLM TorchLlmArgs.cuda_graph_config default CudaGraphConfig(): max_batch_size "
                             "128 when no batch sizes are given; graphs replay decode-only batches"),
         _LAUNCH,
         ("step_overhead_us", "TensorRT-LLM's PyTorch backend overlap scheduler (on unless "
                              "disable_overlap_scheduler) prepares step n+1 while step n runs: hidden"),
         _ROUTING, ("eplb", "TensorRT-LLM MoeConfig.load_balancer default None (no online expert load balancer)")),
        max_running=2048, step_tokens=8192, chunked_prefill=False, graph_max_batch=128),
    "sglang": EngineTerms(
        "sglang", "all", 1.0, 1,
        (("memory_fraction", "SGLang --mem-fraction-static is computed at launch from the GPU's memory and the "
                             "parallel layout (no fixed documented default): not derated"),
         ("kv_block_tokens", "SGLang --page-size default 1 (token-granular KV pool)"),
         ("max_running", "SGLang --max-running-requests is computed at launch from the KV pool size (no fixed "
                         "documented default): no cap"),
         ("step_tokens", "SGLang --chunked-prefill-size: ServerArgs (python/sglang/srt/server_args.py) sets 2048 "
                         "below 35 GiB of GPU memory, 8192 below 160 GiB (H100, H200), 16384 at or above (B200, "
                         "GB200); with --enable-dp-attention it is divided by the DP size (per rank); it bounds "
                         "a prefill batch's tokens, decode batches are bounded by --max-running-requests"),
         ("chunked_prefill", "SGLang chunks a prompt over --chunked-prefill-size (on unless set to -1)"),
         ("graph_max_batch", "SGLang --cuda-graph-max-bs: ServerArgs sets 512 at or above 160 GiB of GPU memory and "
                             "256 below (512 there at tp >= 4 in newer releases); decode batches up to it replay a "
                             "graph"),
         _LAUNCH,
         ("step_overhead_us", "SGLang's overlap scheduler (default on; --disable-overlap-schedule) runs the CPU "
                              "scheduling of the next batch while the GPU runs this one: hidden"),
         _ROUTING, ("eplb", "SGLang --enable-eplb default off (ServerArgs.enable_eplb = False)")),
        max_running=None, step_tokens=16384, chunked_prefill=True, graph_max_batch=512, step_tokens_split_dp=True,
        decode_in_budget=False,
        tiers=(("step_tokens", ((35 * GIB, 2048), (160 * GIB, 8192), (None, 16384))),
               ("graph_max_batch", ((160 * GIB, 256), (None, 512))))),
}


def prefill_steps(prompts: int, length: int, budget: float, chunked: bool) -> list[tuple] | None:
    """The steps one instance runs to prefill ``prompts`` prompts of ``length`` tokens within ``budget`` tokens a
    step, first come first served: each step is three pieces ``(count, new, past)`` — the rest of a prompt begun
    in an earlier step (``past`` its done tokens), whole prompts, the head of the next prompt (a piece of count 0
    is empty). ``chunked``: the token stream is cut every ``budget`` tokens (vLLM, SGLang); otherwise prompts are
    packed whole, ⌊budget/length⌋ a step (TensorRT-LLM without chunked prefill), and a prompt longer than the
    budget is not run (None)."""
    p, n = int(prompts), int(length)
    if p * n <= budget:
        return [((0, n, 0), (p, n, 0), (0, n, 0))]
    if not chunked:
        if n > budget:
            return None
        k = int(budget // n)
        return [((0, n, 0), (min(k, p - i), n, 0), (0, n, 0)) for i in range(0, p, k)]
    b, total, out = int(budget), p * n, []
    for s in range(0, total, b):
        e = min(s + b, total)
        a, last = s // n, (e - 1) // n
        off, end = s - a * n, e - last * n
        if a == last:
            out.append(((1, e - s, off), (0, n, 0), (0, n, 0)))
        else:
            out.append(((1, n - off, off), (last - a - 1, n, 0), (1, end, 0)))
    return out


def kernels(c) -> int:
    """Kernels one step of compiled program ``c`` launches per device: its compute and communication ops on the
    representative device (after fusion; a pipeline stage's device launches its own)."""
    return sum(1 for op in c.graph.ops if op.device == 0 and op.stream in ("compute", "comm"))


def engine_terms(name: str | None) -> EngineTerms | None:
    """The documented terms of engine ``name`` (None / "none": no engine, the SOL memory model)."""
    if name is None or name == "none":
        return None
    require(name in ENGINES, "engine", f"unknown engine {name!r}; allowed: none, {', '.join(ENGINES)}")
    return ENGINES[name]


__all__ = ["EngineTerms", "ENGINES", "MEMORY_MODES", "SETTABLE", "engine_terms", "prefill_steps", "kernels"]
