"""Memory per device and fit: does a batch at a context fit on one GPU of a mapping, and what is the largest
batch (at a context) or the largest context (at a batch) that does.

Per device (the most loaded pipeline stage):

weights, KV, workspace and the runtime reserve as defined once in :mod:`graphsim.driver.memory` (the report and
the sweep metrics use the same definitions); host-resident Engram tables count against the GPU's share of
host memory.

All searches are exact integer bisections on a monotone memory function (bytes never shrink as batch or
context grows), so the answer is the largest value that fits, not an interpolation.
"""
from __future__ import annotations

import attrs
import numpy as np

from ..core.errors import require
from ..core.ir import COMPONENT_INDEX
from ..core.limits import MAX_CONTEXT, MAX_REQUESTS, check_int, check_number
from ..lowering.features import feature_matrix
from ..driver.memory import DEFAULT_RESERVE_GIB, device_weights, kv_per_device
from ..driver.pipeline import Plan, Policies, compile_plan
from ..core.plan import ParallelMapping

GiB = 2.0**30


@attrs.frozen
class FitResult:
    """Memory of one device for ``batch`` requests (the replica's) at ``context`` tokens each."""

    model: str
    hw: str
    mapping: str
    engram: str
    context: int
    batch: int
    weights: dict  #: bytes per inventory group in HBM (tables only when engram == "hbm")
    tables_bytes: float  #: Engram table bytes of this device, wherever they live
    kv_bytes: float
    workspace_bytes: float
    reserve_bytes: float
    capacity_bytes: float
    host_capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return sum(self.weights.values()) + self.kv_bytes + self.workspace_bytes + self.reserve_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.headroom_bytes >= 0 and self.host_fits

    @property
    def host_bytes(self) -> float:
        """Host memory this device's share of host-resident tables needs."""
        return self.tables_bytes if self.engram == "host" else 0.0

    @property
    def host_fits(self) -> bool:
        return self.host_bytes <= self.host_capacity_bytes

    def verdict(self) -> str:
        if not self.host_fits:
            short = (self.host_bytes - self.host_capacity_bytes) / GiB
            return f"does NOT fit: host tables need {short:.2f} GiB more host memory"
        h = self.headroom_bytes / GiB
        return f"fits ({h:.2f} GiB free)" if h >= 0 else f"does NOT fit by {-h:.2f} GiB"

    def to_dict(self) -> dict:
        d = attrs.asdict(self)
        d.update(total_bytes=self.total_bytes, headroom_bytes=self.headroom_bytes, fits=self.fits,
                 host_bytes=self.host_bytes, verdict=self.verdict())
        return d


class MemoryModel:
    """One compiled decode (or prefill) structure for a mapping; answers memory questions at any batch and
    context without recompiling (weights are fixed, KV and workspace are evaluated per point)."""

    def __init__(self, model, hw, mapping: ParallelMapping, policies: Policies = Policies(), *,
                 kind: str = "decode", reserve_gib: float = DEFAULT_RESERVE_GIB, compiled=None, engine=None):
        check_number("reserve_gib", reserve_gib, 0.0, 1 << 20)
        require(kind in ("decode", "prefill"), "kind", f"must be decode or prefill, got {kind!r}")
        self.kind = kind
        if compiled is not None:  # a caller's program of this structure (one kind, this mapping and policies)
            require(compiled.plan.kinds == (kind,) and compiled.plan.mapping == mapping
                    and compiled.plan.policies == policies, "compiled",
                    f"must be a {kind}-only program of {mapping} under the same policies")
            self.c = compiled
        else:
            # the structure only: memory is evaluated at any (batch, context) below, never at this point
            probe = max(mapping.pp, policies.pp_micro_batches, 1) * mapping.dp
            self.c = compile_plan(model, Plan([f"{kind}:1024x{probe}"], mapping, policies), hw)
        self.model, self.hw, self.mapping, self.policies = self.c.model, self.c.hw, mapping, policies
        self.reserve = reserve_gib * GiB
        #: a serving engine's memory rule and KV paging (graphsim.serving.EngineTerms); None: every byte (SOL)
        self.engine = engine
        self.weights, self.tables = self._weights()

    def _weights(self) -> tuple[dict, float]:
        """HBM-resident bytes by group on the most loaded device, and its Engram table bytes."""
        w = device_weights(self.c)
        return w.hbm, w.tables

    def kv_per_request(self, context: int) -> float:
        """One request's KV bytes on this device: the model's cache split over the devices sharing it (in the
        engine's whole KV pages when an engine is given)."""
        ctx = self.engine.paged(int(context)) if self.engine is not None else int(context)
        return float(kv_per_device(self.model, ctx, self.mapping, self.policies))

    def workspace(self, batch, context, new=1) -> np.ndarray:
        """Largest activation bytes of one op per device at each (batch, context) point (decode: ``new``
        positions per request, 1 + the verified drafts with speculative decoding)."""
        from ..core.workload import Workload

        b = np.atleast_1d(np.asarray(batch, dtype=np.float64))
        ctx = np.broadcast_to(np.atleast_1d(np.asarray(context, dtype=np.float64)), b.shape)
        if self.kind == "decode":
            n = np.broadcast_to(np.atleast_1d(np.asarray(new, dtype=np.float64)), b.shape)
            wl = Workload(("decode",), b[:, None], n[:, None], ctx[:, None])
        else:
            wl = Workload(("prefill",), b[:, None], ctx[:, None], np.zeros_like(b)[:, None])
        return op_workspace(self.c.program, wl)

    def headroom(self, batch, context, workspace) -> np.ndarray:
        """HBM left per device for each batch (requests at ``context`` tokens — one context, or one per batch
        —, ``workspace`` bytes of activations each): :meth:`fit`'s headroom over arrays, a host-table shortfall
        counted as negative."""
        b = np.asarray(batch, dtype=np.float64)
        ctx = np.broadcast_to(np.asarray(context), b.shape)
        per = {int(c): self.kv_per_request(int(c)) for c in np.unique(ctx)}
        kv = np.vectorize(per.__getitem__, otypes=[np.float64])(ctx.astype(np.int64)) if ctx.size else ctx * 0.0
        if self.engine is not None:  # the engine's share of HBM and where its KV pool comes from
            room = self.engine.room(self.hw.hbm_capacity_bytes, self.reserve, sum(self.weights.values()) + workspace,
                                    b * kv)
        else:
            total = sum(self.weights.values()) + b * kv + workspace + self.reserve
            room = self.hw.hbm_capacity_bytes - total
        if self.policies.engram == "host" and self.tables > self.hw.host_mem_bytes:
            room = np.minimum(room, self.hw.host_mem_bytes - self.tables)
        return room

    def fit(self, batch: int, context: int) -> FitResult:
        check_int("batch", batch, 1, MAX_REQUESTS)
        check_int("context", context, 1, MAX_CONTEXT)
        return FitResult(
            self.model.name, self.hw.name, str(self.mapping), self.policies.engram, int(context), int(batch),
            dict(self.weights), self.tables, batch * self.kv_per_request(context),
            float(self.workspace(batch, context)[0]), self.reserve, self.hw.hbm_capacity_bytes, self.hw.host_mem_bytes)

    def _fits(self, batch: int, context: int) -> bool:
        return self.fit(batch, context).fits

    def max_batch(self, context: int) -> int:
        """Largest replica batch (requests at ``context`` tokens) that fits; 0 if not even one does."""
        return _largest(lambda b: self._fits(b, context), MAX_REQUESTS)

    @property
    def context_cap(self) -> int:
        """The model's longest context (``max_position_embeddings``, else graphsim's bound)."""
        return self.model.max_context() if hasattr(self.model, "max_context") else MAX_CONTEXT

    def max_context(self, batch: int = 1) -> int:
        """Largest context at which ``batch`` requests fit, at most :attr:`context_cap`; 0 if none."""
        return _largest(lambda n: self._fits(batch, n), self.context_cap)


def op_workspace(program, workload) -> np.ndarray:
    """The largest activation bytes one op moves per device, at each point of ``workload``."""
    act = program.coef[: len(program.features), :, COMPONENT_INDEX["bytes_act"]]
    feats = feature_matrix(program.features, program.graph.token_set_map, workload.kinds, workload.arrays(), np)
    return (feats @ act).max(axis=1)


def _largest(ok, cap: int) -> int:
    """Largest x in [1, cap] with ok(x), for ok monotone (true then false); 0 if ok(1) is false."""
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and ok(hi):
        lo, hi = hi, hi * 2
    if hi > cap:
        return cap if ok(cap) else _bisect(ok, lo, cap)
    return _bisect(ok, lo, hi)


def _bisect(ok, lo: int, hi: int) -> int:
    """ok(lo) true, ok(hi) false -> the largest true."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def fit(model, hw, mapping: ParallelMapping, *, context: int, batch: int = 1, policies: Policies = Policies(),
        reserve_gib: float = DEFAULT_RESERVE_GIB) -> FitResult:
    """Memory per device for ``batch`` decode requests at ``context`` tokens."""
    return MemoryModel(model, hw, mapping, policies, reserve_gib=reserve_gib).fit(batch, context)
