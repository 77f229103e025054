"""Measured operator tables (the OP view's data): graphsim's format, a store, importers and lookups.

See docs/measured.md for the format and the rules that keep partitions apart."""
from .schema import COMMON, FAMILIES, LATENCY
from .store import Backend, Store

__all__ = ["COMMON", "FAMILIES", "LATENCY", "Backend", "Store"]
