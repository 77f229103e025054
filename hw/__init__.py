"""Hardware descriptors (data files + one attrs class) and optional efficiency profiles."""
from .descriptor import (
    FALLBACK,
    PRECISIONS,
    REQUIRED_PRECISIONS,
    SOL,
    EfficiencyProfile,
    HardwareSpec,
    list_hw,
    list_profiles,
    load_hw,
    load_profile,
)

__all__ = [
    "FALLBACK",
    "PRECISIONS",
    "REQUIRED_PRECISIONS",
    "SOL",
    "EfficiencyProfile",
    "HardwareSpec",
    "list_hw",
    "list_profiles",
    "load_hw",
    "load_profile",
]
