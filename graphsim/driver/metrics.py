"""Per-point metrics as arrays: tokens and throughput, memory per device, for many workload points at once.

The vectorized twin of the single-point summary in :mod:`graphsim.driver.report` (same definitions: TTFT/ITL are
the forward time when the batch has prefill/decode work, throughput counts every processed position,
per-user rate counts decode positions per decode request, memory = resident weights + KV + the largest
activation of one op). ``tests/test_sweep.py`` checks both agree at single points.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

GiB = 2.0**30


def weight_bytes(compiled) -> float:
    """Resident HBM bytes on one device of a compiled plan (:func:`graphsim.driver.memory.device_weights`)."""
    from .memory import device_weights

    return device_weights(compiled).total


class KVTable:
    """One request's KV bytes on one device (:func:`graphsim.driver.memory.kv_per_device`) over arrays: one vectorized call when the model's formula takes arrays (checked
    against scalar calls), else one call per distinct context, memoized (sweep grids repeat contexts)."""

    def __init__(self, model, policies=None, mapping=None):
        from .memory import kv_per_device
        from ..core.plan import ParallelMapping

        self.model = model
        m = mapping or ParallelMapping()
        self._bytes = lambda n: kv_per_device(model, n, m, policies)  # one request's KV on one device
        self._memo: dict[int, float] = {}
        self._vectorized: bool | None = None

    def _scalar(self, n: int) -> float:
        v = self._memo.get(n)
        if v is None:
            v = self._memo[n] = float(self._bytes(n))
        return v

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.float64)
        if tokens.size == 0:
            return np.zeros(tokens.shape)
        if self._vectorized is None:
            self._vectorized = self._try_vectorized(tokens)
        if self._vectorized:
            return np.asarray(self._bytes(tokens), dtype=np.float64).reshape(tokens.shape)
        uniq, inv = np.unique(tokens, return_inverse=True)
        vals = np.array([self._scalar(int(u)) for u in uniq])
        return vals[inv].reshape(tokens.shape)

    def _try_vectorized(self, tokens: np.ndarray) -> bool:
        probe = np.unique(tokens)[:3].astype(np.int64)
        try:
            got = np.asarray(self._bytes(probe.astype(np.float64)), dtype=np.float64)
        except Exception:  # noqa: BLE001 - a scalar-only formula (int checks, min(), floor division on ints)
            return False
        want = np.array([self._scalar(int(n)) for n in probe])
        return got.shape == probe.shape and bool(np.allclose(got, want, rtol=1e-12, atol=0.0))


def kv_bytes_per_device(kv: KVTable, count: np.ndarray, new: np.ndarray, past: np.ndarray, split: int) -> np.ndarray:
    """Σ_groups count · kv_bytes(past + new) / split, per point: (P, G) arrays -> (P,)."""
    return (count * kv(past + new)).sum(axis=1) / split


def emitted(kinds: tuple, new: np.ndarray, policies=None) -> np.ndarray:
    """Tokens each request gets from this step: prefill positions, or for decode with DSpark or MTP the expected
    emitted tokens E[emitted | k = new - 1] under ``policies.acceptance`` (bonus-token convention,
    graphsim.models.dspark) — never the verified positions themselves."""
    new = np.asarray(new, dtype=np.float64)
    if policies is None or (getattr(policies, "dspark", "off") != "on" and not getattr(policies, "mtp", 0)):
        return new
    from ..models.dspark import AcceptanceProfile
    from ..core.errors import GraphsimError

    out = new.copy()
    for g, kind in enumerate(kinds):
        if kind != "decode":
            continue
        k = new[..., g] - 1.0
        if not policies.acceptance:
            if np.any(k > 0):
                raise GraphsimError("policies.acceptance", "verify lengths > 0 (DSpark, MTP) need a_1..a_D to turn verified "
                                    "positions into expected emitted tokens (e.g. --acceptance 0.9,0.8,0.7,0.6,0.5)")
            continue
        table = AcceptanceProfile.constant(policies.acceptance).expected_emitted_table()[0]
        out[..., g] = table[np.clip(k, 0, len(table) - 1).astype(np.int64)]
    return out


def token_metrics(kinds: tuple, count: np.ndarray, new: np.ndarray, forward: np.ndarray, gpus: int,
                  policies=None, power_w: float = 0.0) -> dict:
    """Tokens, TTFT/ITL, throughput and energy per point (``count``/``new`` (P, G); ``forward`` (P,) seconds).
    TTFT/ITL are NaN where the batch has no prefill/decode work (the report's ``None``); ITL is the mean
    time between a decode request's tokens (the step time when it emits one per step).

    Energy is at board power: every GPU drawing its descriptor's ``power_w`` (its TDP, the power limit its
    management holds sustained draw under) for the whole forward — an upper bound on the forward's energy, so
    tokens per joule is a lower bound (an activity model below TDP needs measured idle and per-unit power, which no
    descriptor carries); NaN without a power figure."""
    is_pf = np.array([k == "prefill" for k in kinds])
    work = count * emitted(kinds, new, policies)
    prefill_tokens = work[:, is_pf].sum(axis=1)
    decode_tokens = work[:, ~is_pf].sum(axis=1)
    decode_requests = count[:, ~is_pf].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = forward > 0
        rate = np.where(ok, (prefill_tokens + decode_tokens) / forward, 0.0)
        per_user = np.where(ok & (decode_requests > 0), decode_tokens / decode_requests / forward, 0.0)
        out_rate = np.where(ok, decode_tokens / forward, 0.0)
    return {
        "prefill_tokens": prefill_tokens,
        "decode_tokens": decode_tokens,
        "decode_requests": decode_requests,
        "ttft_s": np.where(prefill_tokens > 0, forward, np.nan),
        "itl_s": np.where(decode_requests > 0, forward * decode_requests / np.maximum(decode_tokens, 1e-300), np.nan),
        "tokens_per_s": rate,
        "tokens_per_s_per_gpu": rate / gpus,
        "output_tokens_per_s_per_gpu": out_rate / gpus,
        "tokens_per_s_per_user": per_user,
        **energy_metrics(prefill_tokens + decode_tokens, decode_tokens, forward, gpus, power_w),
    }


def energy_metrics(tokens, output_tokens, seconds, gpus: int, power_w) -> dict:
    """Joules of ``seconds`` on ``gpus`` GPUs at board power ``power_w`` each (an upper bound), and tokens per
    joule (a lower bound): see :func:`token_metrics`."""
    seconds = np.asarray(seconds, dtype=np.float64)
    p = np.asarray(power_w, dtype=np.float64)
    energy = np.where(p > 0, seconds * gpus * p, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_j = np.where(energy > 0, np.asarray(tokens, np.float64) / energy, np.nan)
        out_j = np.where(energy > 0, np.asarray(output_tokens, np.float64) / energy, np.nan)
    return {"energy_j": energy, "tokens_per_joule": per_j, "output_tokens_per_joule": out_j}


def memory_metrics(weights: float | np.ndarray, kv: np.ndarray, workspace: np.ndarray,
                   capacity: float | np.ndarray, reserve: float | None = None) -> dict:
    """Memory per device in GiB and whether it fits in ``capacity`` bytes (all per point); ``reserve``
    defaults to :data:`graphsim.driver.memory.DEFAULT_RESERVE_GIB`."""
    from .memory import DEFAULT_RESERVE_GIB

    reserve = DEFAULT_RESERVE_GIB * GiB if reserve is None else reserve
    total = weights + kv + workspace + reserve
    n = np.shape(kv)
    return {
        "weights_gib": np.broadcast_to(np.asarray(weights, dtype=np.float64) / GiB, n),
        "kv_gib": kv / GiB,
        "workspace_gib": workspace / GiB,
        "total_gib": total / GiB,
        "capacity_gib": np.broadcast_to(np.asarray(capacity, dtype=np.float64) / GiB, n),
        "headroom_gib": (capacity - total) / GiB,
        "fits": total <= capacity,
    }


def report_columns(report) -> Mapping[str, float]:
    """The same fields from a single-point :class:`~graphsim.driver.report.Report` (for comparisons)."""
    t, m = report.tokens, report.memory
    out = {k: (np.nan if t[k] is None else float(t[k])) for k in (
        "prefill_tokens", "decode_tokens", "decode_requests", "ttft_s", "itl_s", "tokens_per_s",
        "tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user")}
    out.update({"weights_gib": m["weights_total_gib"], "kv_gib": m["kv_gib"], "workspace_gib": m["workspace_gib"],
                "total_gib": m["total_gib"], "capacity_gib": m["capacity_gib"], "headroom_gib": m["headroom_gib"],
                "fits": m["fits"], "forward_s": report.forward_s})
    return out
