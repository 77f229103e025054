"""Which policy passes a model runs for a plan's policies (decoder/encoder bounded replay, fusion)."""
from __future__ import annotations


def policy_passes(model, policies) -> list:
    """(name, pass) pairs in order; each pass is pure Graph -> Graph."""
    return []
