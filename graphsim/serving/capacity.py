"""Capacity planning (issue 29 item 4): the fewest GPUs that carry a request rate and a concurrency under the SLA,
from one search's rows. A deployment's replicas scale its load linearly (each replica serves its own requests), so
a row that meets the SLA with ``replicas`` replicas of a replica size carries ``requests_per_s / replicas`` per
replica; ``ceil(rate / that)`` replicas carry ``rate`` (and the same for concurrency). A disaggregated row scales
both pools together (an upper bound: its pools could be rebalanced at the new size)."""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import require


def gpus_for_load(table, rate: float | None = None, concurrency: int | None = None) -> np.ndarray:
    """Per row of a search table: the GPUs its deployment needs to carry ``rate`` requests/s and ``concurrency``
    requests in flight (NaN for a row that carries nothing)."""
    reps = np.where(table["mode"] == "agg", table["decode_replicas"], 1).astype(np.float64)
    unit = table["gpus"].to_numpy(np.float64) / reps  # one replica (a disagg row: the whole deployment)
    need = np.ones(len(table))
    with np.errstate(divide="ignore", invalid="ignore"):
        if rate is not None:
            per = table["requests_per_s"].to_numpy(np.float64) / reps
            need = np.maximum(need, np.where(per > 0, np.ceil(rate / per - 1e-9), np.nan))
        if concurrency is not None:
            per = table["concurrency"].to_numpy(np.float64) / reps
            need = np.maximum(need, np.where(per > 0, np.ceil(concurrency / per - 1e-9), np.nan))
    return need * unit


def fewest_gpus(result, rate: float | None = None, concurrency: int | None = None) -> dict:
    """The fewest GPUs among the search's deployments that fit and meet its SLA which carry ``rate`` requests/s and
    ``concurrency`` requests at once: the row, its replicas at that size and the GPUs (``None`` when none can)."""
    require(rate is not None or concurrency is not None, "rate", "give a request rate (--rate) or a concurrency "
                                                                  "(--concurrency) to plan for")
    if rate is not None:
        require(isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0, "rate",
                f"must be a number of requests per second > 0, got {rate!r}")
    if concurrency is not None:
        require(isinstance(concurrency, int) and concurrency >= 1, "concurrency",
                f"must be a whole number of requests >= 1, got {concurrency!r}")
    t = result.table
    need = gpus_for_load(t, rate, concurrency)
    ok = (t["fits"] & t["meets_sla"]).to_numpy(bool) & np.isfinite(need)
    out = {"rate_per_s": rate, "concurrency": concurrency, "fewest_gpus": None, "deployment": None,
           "replicas": None, "tokens_per_s_per_gpu": None}
    if not ok.any():
        return out
    i = int(np.flatnonzero(ok)[np.argmin(need[ok])])
    row = t.iloc[i]
    reps = int(row["decode_replicas"]) if row["mode"] == "agg" else 1
    scale = need[i] / (row["gpus"] / reps) if row["mode"] == "agg" else need[i] / row["gpus"]
    out.update(fewest_gpus=int(need[i]), deployment=f"{row['mode']} {row['mapping']} [{row['policies']}]",
               replicas=int(round(scale)),
               tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]))
    return out


__all__ = ["gpus_for_load", "fewest_gpus"]
