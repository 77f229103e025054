"""Serving: what an engine does around the forwards graphsim prices.

- :mod:`.engines` — serving engines' documented terms (memory rule, KV paging) a prediction fits batches by.
- :mod:`.trace` — request traces (Mooncake JSONL / CSV / Parquet, or synthetic with agent sessions) the serving
  simulator replays.
"""
from .engines import ENGINES, MEMORY_MODES, EngineTerms, engine_terms
from .trace import Dist, Trace, load_trace, synthetic

__all__ = ["Dist", "EngineTerms", "ENGINES", "MEMORY_MODES", "Trace", "engine_terms", "load_trace", "synthetic"]
