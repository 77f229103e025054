"""Serving: what an engine does around the forwards graphsim prices.

- :mod:`.engines` — serving engines' documented terms (memory rule, KV paging) a prediction fits batches by.
"""
from .engines import ENGINES, MEMORY_MODES, EngineTerms, engine_terms

__all__ = ["EngineTerms", "ENGINES", "MEMORY_MODES", "engine_terms"]
