"""Serving: what an engine does around the forwards graphsim prices.

- :mod:`.engines` — serving engines' documented terms (memory rule, KV paging, request and token limits per step,
  host cost of a step) a prediction fits batches by and prices steps with;
- :mod:`.moe` — the hottest EP rank's expected routed load under routing statistics.
"""
from .engines import ENGINES, MEMORY_MODES, SETTABLE, EngineTerms, engine_terms, prefill_steps
from .moe import expected_max_normal, hottest_rank_factor

__all__ = ["EngineTerms", "ENGINES", "MEMORY_MODES", "SETTABLE", "engine_terms", "prefill_steps",
           "expected_max_normal", "hottest_rank_factor"]
