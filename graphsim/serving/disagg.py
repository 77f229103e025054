"""Disaggregated serving: a prefill pool and a decode pool, each with its own mapping and GPU count, and the
KV cache moving between them.

For requests of ``isl`` prompt tokens and ``osl`` output tokens:

* prefill pool: a replica runs ``batch`` prompts per forward; capacity = replicas · batch / forward;
* KV transfer: the bytes one request hands over — ``kv="global"`` sends the persistent (global) cache only
  and lets decode rebuild the short-lived part (for DeepSeek-V4.1 the SWA window), ``"global+swa"`` sends
  everything; models without that split (V3's MLA cache) send ``kv_bytes(isl)`` either way. A request's
  cache sits on the tp·cp·pp GPUs of one prefill DP group and lands on tp·pp GPUs of one decode DP group:
  the transfer streams over min(senders, receivers) links (NIC or NVLink) in parallel, and a DP group
  hands over its batch/dp requests one after the other;
* TTFT = prefill forward + that transfer (layer-wise streaming, which would overlap the two, is not
  assumed here; :func:`handover_seconds` streams it, as ``graphsim search`` does); ITL = the decode
  forward at ``batch`` requests and the mean context isl + osl/2;
* system rate = min(prefill capacity, decode capacity) in requests/s; tokens/s per GPU divide it over
  both pools, tokens/s per user = 1 / ITL.

:func:`frontier` keeps the Pareto-optimal points (per-user speed vs per-GPU throughput) of a sweep.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import attrs
import numpy as np

from ..core.errors import GraphsimError, require
from ..driver.pipeline import Plan, Policies, compile_plan
from ..core.plan import ParallelMapping

KV_MODES = ("global", "global+swa")
LINKS = ("scaleout", "nvlink")


@attrs.frozen
class Pool:
    """One pool: ``replicas`` copies of ``mapping`` (GPUs = replicas · mapping.gpus), ``batch`` requests per
    forward per replica (prompts for prefill, concurrent requests for decode)."""

    mapping: ParallelMapping
    batch: int
    replicas: int = 1
    policies: Policies = Policies()

    def __attrs_post_init__(self):
        for f in ("batch", "replicas"):
            v = getattr(self, f)
            require(isinstance(v, int) and v >= 1, f"pool.{f}", f"must be an integer >= 1, got {v!r}")

    @property
    def gpus(self) -> int:
        return self.replicas * self.mapping.gpus


@attrs.frozen
class DisaggResult:
    """One (prefill pool, decode pool) point."""

    prefill: Pool
    decode: Pool
    isl: int
    osl: int
    kv: str
    link: str
    prefill_s: float  #: one prefill forward
    transfer_s: float  #: KV hand-over of the requests of one prefill DP group
    itl_s: float  #: one decode step
    kv_bytes: float  #: per request

    @property
    def ttft_s(self) -> float:
        return self.prefill_s + self.transfer_s

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def prefill_rate(self) -> float:
        """Requests/s the prefill pool can admit."""
        return self.prefill.replicas * self.prefill.batch / self.prefill_s

    @property
    def decode_rate(self) -> float:
        """Requests/s the decode pool can finish."""
        return self.decode.replicas * self.decode.batch / (self.osl * self.itl_s)

    @property
    def rate(self) -> float:
        return min(self.prefill_rate, self.decode_rate)

    @property
    def bottleneck(self) -> str:
        return "prefill" if self.prefill_rate < self.decode_rate else "decode"

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Output tokens/s per GPU of both pools."""
        return self.rate * self.osl / self.gpus

    @property
    def input_tokens_per_s_per_gpu(self) -> float:
        return self.rate * self.isl / self.gpus

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1.0 / self.itl_s

    def to_dict(self) -> dict:
        return {
            "prefill_mapping": str(self.prefill.mapping), "prefill_gpus": self.prefill.gpus,
            "prefill_batch": self.prefill.batch, "decode_mapping": str(self.decode.mapping),
            "decode_gpus": self.decode.gpus, "decode_batch": self.decode.batch, "isl": self.isl, "osl": self.osl,
            "kv": self.kv, "link": self.link, "kv_bytes": self.kv_bytes, "prefill_s": self.prefill_s,
            "transfer_s": self.transfer_s, "ttft_s": self.ttft_s, "itl_s": self.itl_s,
            "prefill_rate": self.prefill_rate, "decode_rate": self.decode_rate, "bottleneck": self.bottleneck,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "input_tokens_per_s_per_gpu": self.input_tokens_per_s_per_gpu,
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
        }


def handover_bytes(model, isl: int, kv: str = "global") -> float:
    """KV bytes one request of ``isl`` tokens hands from prefill to decode."""
    require(kv in KV_MODES, "kv", f"must be one of {KV_MODES}, got {kv!r}")
    d = model.kv_breakdown(int(isl))
    if d is not None:
        # the pending rows of unfinished compression groups travel with the global cache: decode continues them
        extra = d["pending_bytes"] + (d["swa_bytes"] if kv == "global+swa" else 0.0)
        return d["global_bytes"] + extra
    return float(model.kv_bytes(int(isl)))


def transfer_seconds(model, hw, prefill: Pool, decode: Pool, isl: int, kv: str = "global",
                     link: str = "scaleout") -> tuple[float, float]:
    """(seconds to hand over one prefill DP group's batch/dp requests, bytes per request)."""
    require(link in LINKS, "link", f"must be one of {LINKS}, got {link!r}")
    nbytes = handover_bytes(model, isl, kv)
    p, d = prefill.mapping, decode.mapping
    lanes = min(p.tp * p.cp * p.pp, d.tp * d.pp)
    bw, lat = (hw.scaleout_bw, hw.scaleout_latency_s) if link == "scaleout" else (hw.nvlink_bw, hw.nvlink_latency_s)
    per_group = -(-prefill.batch // p.dp)
    return per_group * nbytes / (lanes * bw) + lat, nbytes


def handover_link(hw, prefill: ParallelMapping, decode: ParallelMapping) -> str:
    """``nvlink`` when a prefill replica and a decode replica fit in one NVLink domain together (the fastest
    placement puts each pair there), else ``scaleout``."""
    return "nvlink" if prefill.gpus + decode.gpus <= hw.nvlink_domain else "scaleout"


def handover_seconds(model, hw, prefill: Pool, decode: Pool, isl: int, prefill_s: float, kv: str = "global",
                     link: str | None = None) -> tuple[float, float, str]:
    """(exposed seconds of the KV hand-over after a prefill forward of ``prefill_s``, bytes per request, link).

    The cache is streamed layer by layer while the prefill runs (each of the L layers 1/L of the bytes and of
    the forward): layer l's KV leaves when layer l is done, so the transfer ends at
    max(T_tr/L, T_tr − T_pre·(L−1)/L) after the forward (the last layer's share, or what the overlap cannot
    hide), plus one link latency. ``link`` defaults to :func:`handover_link`."""
    link = link or handover_link(hw, prefill.mapping, decode.mapping)
    total, nbytes = transfer_seconds(model, hw, prefill, decode, isl, kv, link)
    lat = hw.scaleout_latency_s if link == "scaleout" else hw.nvlink_latency_s
    wire, layers = total - lat, max(1, int(model.num_layers()))
    return max(wire / layers, wire - prefill_s * (layers - 1) / layers) + lat, nbytes, link


def _forward_seconds(model, hw, mapping, policies, kind: str, batch: Sequence[int], length: int, profile,
                     view=None) -> np.ndarray:
    """Forward time of one replica for each batch size (one compile, a vectorized evaluation)."""
    from ..lowering.evaluate import evaluate_reference
    from ..core.workload import Workload

    req = f"prefill:{length}x{max(batch)}" if kind == "prefill" else f"decode:{length}x{max(batch)}"
    c = compile_plan(model, Plan([req], mapping, policies), hw, profile, view=view)
    b = np.asarray(batch, dtype=np.float64)[:, None]
    if kind == "prefill":
        wl = Workload(("prefill",), b, np.full_like(b, length), np.zeros_like(b))
    else:
        wl = Workload(("decode",), b, np.ones_like(b), np.full_like(b, length))
    fwd = evaluate_reference(c.program, wl, c.unit_time(), c.overhead, c.view).forward
    if c.fpm is not None:  # the FPM view: whole forwards from the plan's fitted partition
        fwd = c.fpm.scale(wl, fwd).t
        if not np.isfinite(fwd).all():
            raise GraphsimError("fpm", f"the FPM partition {c.fpm.partition.key} has no {kind} forwards")
    return fwd


def disagg(model, hw, prefill: Pool, decode: Pool, *, isl: int, osl: int, kv: str = "global",
           link: str = "scaleout", profile=None, view=None) -> DisaggResult:
    """One disaggregated deployment point (``view``: a measured view, graphsim.views.measured.view.ViewSpec)."""
    return sweep(model, hw, [prefill], [decode], isl=isl, osl=osl, kv=kv, link=link, profile=profile, view=view)[0]


def sweep(model, hw, prefills: Iterable[Pool], decodes: Iterable[Pool], *, isl: int, osl: int,
          kv: str = "global", link: str = "scaleout", profile=None, view=None) -> list[DisaggResult]:
    """Every (prefill pool, decode pool) pair; each distinct mapping is compiled once and evaluated at all
    of its batch sizes in one call."""
    from ..hw import load_hw, load_profile
    from ..models import load_model

    require(isinstance(isl, int) and isl >= 1, "isl", f"must be an integer >= 1, got {isl!r}")
    require(isinstance(osl, int) and osl >= 1, "osl", f"must be an integer >= 1, got {osl!r}")
    model = load_model(model) if isinstance(model, str) else model
    hw = load_hw(hw) if isinstance(hw, str) else hw
    profile = load_profile(profile) if isinstance(profile, str) else profile
    prefills, decodes = list(prefills), list(decodes)
    require(bool(prefills) and bool(decodes), "pools", "give at least one prefill and one decode pool")
    ctx = isl + osl // 2

    def times(pools, kind, length):
        out = {}
        for key in dict.fromkeys((p.mapping, p.policies) for p in pools):
            batches = sorted({p.batch for p in pools if (p.mapping, p.policies) == key})
            for b, t in zip(batches, _forward_seconds(model, hw, key[0], key[1], kind, batches, length, profile,
                                                      view)):
                out[(key, b)] = float(t)
        return out

    tp = times(prefills, "prefill", isl)
    td = times(decodes, "decode", ctx)
    res = []
    for p in prefills:
        for d in decodes:
            tr, nbytes = transfer_seconds(model, hw, p, d, isl, kv, link)
            res.append(DisaggResult(p, d, isl, osl, kv, link, tp[((p.mapping, p.policies), p.batch)], tr,
                                    td[((d.mapping, d.policies), d.batch)], nbytes))
    return res


def frontier(results: Sequence[DisaggResult], x: str = "tokens_per_s_per_user",
             y: str = "tokens_per_s_per_gpu") -> list[DisaggResult]:
    """Pareto-optimal points (no other point is at least as good on both ``x`` and ``y`` and better on
    one), sorted by ``x``."""
    pts = sorted(results, key=lambda r: (-getattr(r, x), -getattr(r, y)))
    out, best_y = [], -np.inf
    for r in pts:
        if getattr(r, y) > best_y:
            out.append(r)
            best_y = getattr(r, y)
    return sorted(out, key=lambda r: getattr(r, x))
