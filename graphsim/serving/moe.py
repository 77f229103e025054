"""The hottest EP rank's routed load under routing statistics (issue 25 item 3, MoE load imbalance).

A step routes T tokens, each to ``top_k`` distinct experts of E, and EP rank j holds E/ep of them. Under uniform
routing the assignments rank j receives from one token are hypergeometric (E experts, E/ep on the rank, k drawn):
mean k/ep, variance k·(1/ep)·(1 − 1/ep)·(E − k)/(E − 1); tokens route independently, so rank j's load X_j has
mean μ = T·k/ep and variance σ² = T·k·(1/ep)·(1 − 1/ep)·(E − k)/(E − 1) (normal for large T·k). The ep loads
sum to T·k exactly: they are Y_j − Ȳ of ep independent normals of variance σ²/(1 − 1/ep), whose largest is
expected at μ + z_ep·σ/√(1 − 1/ep), z_ep = E[max of ep standard normals] (ep = 2: μ + σ·√(2/π), exact for
two normals). The step waits for the hottest rank, so its routed work is the mean's

    factor = 1 + z_ep·σ / (μ·√(1 − 1/ep)),

at most what one rank can receive (T·min(k, E/ep)), times a measured ``load_ratio`` (skewed routing: the
hottest rank's mean load over the mean, from an engine's expert-load statistics; 1 = uniform). Redundant
experts with EPLB re-place experts from a window of routing statistics, which removes that static skew (the
ratio becomes 1, the balancer's aim); the per-step noise is fresh every step, so the uniform-routing term stays
(an upper bound where replicas also split a hot expert's tokens each step).
"""
from __future__ import annotations

import functools
import math

import numpy as np


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (n >= 1), by quadrature of n·x·φ(x)·Φ(x)^(n−1)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    return float(np.trapezoid(n * x * phi * cdf ** (n - 1), x))


def hottest_rank_factor(tokens, top_k: int, experts: int, ep: int, load_ratio: float = 1.0,
                        eplb: bool = False) -> np.ndarray:
    """The hottest EP rank's expected routed load over the mean for steps of ``tokens`` tokens (array): see the
    module docstring. 1 where ep = 1 or no token routes."""
    t = np.asarray(tokens, dtype=np.float64)
    if ep <= 1:
        return np.ones_like(t)
    k, e, p = float(top_k), float(experts), 1.0 / ep
    mu = np.maximum(t, 1.0) * k * p
    var = np.maximum(t, 1.0) * k * p * (1.0 - p) * (e - k) / max(e - 1.0, 1.0)
    noise = 1.0 + expected_max_normal(ep) * np.sqrt(var) / (mu * math.sqrt(1.0 - p))
    cap = min(k, e * p) / (k * p)  # one rank receives at most min(k, E/ep) of a token's k assignments
    static = 1.0 if eplb else float(load_ratio)
    return np.where(t > 0, np.minimum(noise, cap) * static, 1.0)


__all__ = ["expected_max_normal", "hottest_rank_factor"]
