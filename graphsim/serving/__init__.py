"""Serving: what an engine does around the forwards graphsim prices.

- :mod:`.engines` — serving engines' documented terms (memory rule, KV paging) a prediction fits batches by.
- :mod:`.trace` — request traces (Mooncake JSONL / CSV / Parquet, or synthetic with agent sessions) the serving
  simulator replays.
- :mod:`.kvcache` — the KV cache hierarchy: each replica's HBM pool and pooled host / disk tiers (cache designs).
- :mod:`.steps` — serving steps' times from a deployment's compiled program (a response surface with its error).
- :mod:`.sim` — :func:`simulate`: a trace through one deployment's engines (``graphsim serve-sim``).
"""
from .engines import ENGINES, MEMORY_MODES, EngineTerms, engine_terms
from .kvcache import DESIGNS, TierSpec, design_tiers
from .sim import SLA, Deployment, SimResult, simulate
from .trace import Dist, Trace, load_trace, synthetic

__all__ = ["DESIGNS", "Deployment", "Dist", "EngineTerms", "ENGINES", "MEMORY_MODES", "SLA", "SimResult", "TierSpec",
           "Trace", "design_tiers", "engine_terms", "load_trace", "simulate", "synthetic"]
