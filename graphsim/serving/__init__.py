"""Serving: what an engine does around the forwards graphsim prices.

- :mod:`.engines` — serving engines' documented terms (memory rule, KV paging, request and token limits per step,
  host cost of a step) a prediction fits batches by and prices steps with;
- :mod:`.moe` — the hottest EP rank's expected routed load under routing statistics;
- :mod:`.trace` — request traces (Mooncake JSONL / CSV / Parquet, or synthetic with agent sessions) the serving
  simulator replays;
- :mod:`.kvcache` — the KV cache hierarchy: each replica's HBM pool and pooled host / disk tiers (cache designs);
- :mod:`.steps` — serving steps' times from a deployment's compiled program (a response surface with its error);
- :mod:`.sim` — :func:`simulate`: a trace through one deployment's engines (``graphsim serve-sim``).
"""
from .engines import ENGINES, MEMORY_MODES, SETTABLE, EngineTerms, engine_terms, prefill_steps
from .kvcache import DESIGNS, TierSpec, design_tiers
from .moe import expected_max_normal, hottest_rank_factor
from .sim import SLA, Deployment, SimResult, simulate
from .trace import Dist, Trace, load_trace, synthetic

__all__ = ["DESIGNS", "Deployment", "Dist", "EngineTerms", "ENGINES", "MEMORY_MODES", "SETTABLE", "SLA", "SimResult",
           "TierSpec", "Trace", "design_tiers", "engine_terms", "expected_max_normal", "hottest_rank_factor",
           "load_trace", "prefill_steps", "simulate", "synthetic"]
