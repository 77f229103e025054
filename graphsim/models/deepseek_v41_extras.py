"""DeepSeek-V4.1-Flash extras: the vision stage (before the trunk) and DSpark draft/verify (after it)."""
from __future__ import annotations


def vision_stage(model, b, kinds, policies, requests) -> None:
    """Add the `vision` stage when a request carries an image (placeholder: no vision ops yet)."""


def dspark_stages(model, b, kinds, policies, requests) -> None:
    """Add DSpark draft/verify ops when policies.dspark == 'on' (placeholder: none yet)."""
