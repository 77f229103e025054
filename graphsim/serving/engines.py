"""Serving engines' documented memory behaviour (issue 25 item 3, the memory part): how much of a GPU's HBM an
engine lets its KV cache take and in what granularity it pages it. A prediction for an engine fits the batches
that engine admits; the SOL bound keeps every byte (no engine terms).

Each figure is the engine's documented default, with its source; an engine whose default is computed at launch
from the machine (SGLang's ``--mem-fraction-static``) is not derated rather than guessed.
"""
from __future__ import annotations

import math

import attrs

from ..errors import require

#: how an engine sizes its memory: "total" — a fraction of the GPU's HBM for weights, activations and the KV
#: pool together (vLLM ``gpu_memory_utilization``); "free" — the KV pool is a fraction of what weights and
#: activations leave (TensorRT-LLM ``free_gpu_memory_fraction``); "all" — no documented fixed fraction
MEMORY_MODES = ("total", "free", "all")


@attrs.frozen
class EngineTerms:
    name: str
    memory: str = attrs.field(validator=attrs.validators.in_(MEMORY_MODES))
    memory_fraction: float = 1.0
    kv_block_tokens: int = 1  #: KV pages are this many token positions; a request holds whole pages
    sources: tuple = ()  #: (field, source) pairs

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


ENGINES = {
    "vllm": EngineTerms(
        "vllm", "total", 0.92, 16,
        (("memory_fraction", "vLLM CacheConfig.gpu_memory_utilization default 0.92 (docs.vllm.ai, "
                             "vllm/config/cache.py; 0.9 before): the fraction of GPU memory the instance uses "
                             "for weights, activations and the KV cache"),
         ("kv_block_tokens", "vLLM CacheConfig.DEFAULT_BLOCK_SIZE = 16 tokens per KV block"))),
    "trtllm": EngineTerms(
        "trtllm", "free", 0.9, 32,
        (("memory_fraction", "TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction default 0.9: the KV cache takes "
                             "90 % of the GPU memory left free after the model is loaded (nvidia.github.io/"
                             "TensorRT-LLM, 'How to Change KV Cache Behavior')"),
         ("kv_block_tokens", "TensorRT-LLM KvCacheConfig.tokens_per_block default 32"))),
    "sglang": EngineTerms(
        "sglang", "all", 1.0, 1,
        (("memory_fraction", "SGLang --mem-fraction-static is computed at launch from the GPU's memory and the "
                             "parallel layout (no fixed documented default): not derated"),
         ("kv_block_tokens", "SGLang --page-size default 1 (token-granular KV pool)"))),
}


def engine_terms(name: str | None) -> EngineTerms | None:
    """The documented terms of engine ``name`` (None / "none": no engine, the SOL memory model)."""
    if name is None or name == "none":
        return None
    require(name in ENGINES, "engine", f"unknown engine {name!r}; allowed: none, {', '.join(ENGINES)}")
    return ENGINES[name]


__all__ = ["EngineTerms", "ENGINES", "MEMORY_MODES", "engine_terms"]
