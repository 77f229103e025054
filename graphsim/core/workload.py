"""Workload arrays: what varies between sweep points once a graph is built.

A graph is built for a *structure*: an ordered tuple of request groups, each of one kind (prefill or
decode). Everything else — how many requests a group holds, how many new tokens each processes, how many
positions are already cached, image tokens and vision patches — is an array of shape (P, G) over P workload
points, so a million what-if points are one array program.
"""
from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from .errors import GraphsimError, require
from .ir import CACHE_TIERS, REQUEST_KINDS

FIELDS = ("count", "new", "past", "image", "patches", "replay", "tier")
#: Where a group's cached prefix is read from (``tier`` holds the index): already in HBM, host memory, disk.
TIERS = CACHE_TIERS
HOST = float(TIERS.index("host"))


def _arr(x) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise GraphsimError("workload", f"arrays must hold numbers, got {str(x)[:60]}") from None
    require(a.ndim <= 2, "workload", f"arrays are (points, groups), got {a.ndim} dimensions")
    return a.reshape(-1, 1) if a.ndim == 1 else np.atleast_2d(a)


@attrs.frozen(eq=False)
class Workload:
    """Per-point, per-group request parameters (all float64 arrays of shape (P, G)).

    ``new``: positions processed this forward (prompt/chunk tokens, or 1 + verify length in decode);
    ``past``: positions already in the cache before it; ``count``: requests in the group;
    ``image``: how many of the ``new`` positions are image tokens; ``patches``: ViT patches per request;
    ``replay``: cached positions recomputed with the new ones (prefix restore with the SWA cache missing);
    ``tier``: where the cached prefix is read from, an index into :data:`TIERS` (default host).
    """

    kinds: tuple = attrs.field(converter=tuple)
    count: np.ndarray = attrs.field(converter=_arr)
    new: np.ndarray = attrs.field(converter=_arr)
    past: np.ndarray = attrs.field(converter=_arr)
    image: np.ndarray = attrs.field(default=None)
    patches: np.ndarray = attrs.field(default=None)
    replay: np.ndarray = attrs.field(default=None)
    tier: np.ndarray = attrs.field(default=None)

    def __attrs_post_init__(self):
        for k in self.kinds:
            require(k in REQUEST_KINDS, "workload.kinds", f"unknown request kind {k!r}; allowed {REQUEST_KINDS}")
        shape = np.broadcast_shapes(self.count.shape, self.new.shape, self.past.shape)
        require(shape[-1] == len(self.kinds), "workload", f"arrays have {shape[-1]} groups, kinds has {len(self.kinds)}")
        for name in ("image", "patches", "replay", "tier"):
            v = getattr(self, name)
            if v is None:
                v = np.full(shape, HOST) if name == "tier" else np.zeros(shape)
            object.__setattr__(self, name, np.broadcast_to(_arr(v), shape).copy())
        for name in ("count", "new", "past"):
            object.__setattr__(self, name, np.broadcast_to(getattr(self, name), shape).copy())
        self.check()

    def check(self) -> np.ndarray:
        """Raise on invalid values (names the field and the first bad point): whole numbers, within the
        bounds of graphsim.core.limits (counts of requests, positions of a context)."""
        from .limits import MAX_CONTEXT, MAX_REQUESTS

        for name in FIELDS:
            a = getattr(self, name)
            hi = MAX_REQUESTS if name == "count" else MAX_CONTEXT
            bad = ~np.isfinite(a) | (a < 0) | (a > hi) | (a != np.floor(a))
            if bad.any():
                p, g = np.argwhere(bad)[0]
                raise GraphsimError(f"workload.{name}", f"must be a whole number in [0, {hi:,}]; point {p}, group {g} "
                                    f"has {a[p, g]!r}")
        bad = self.image > self.new
        if bad.any():
            p, g = np.argwhere(bad)[0]
            raise GraphsimError("workload.image", f"image tokens exceed new tokens at point {p}, group {g}")
        bad = self.replay > self.past
        if bad.any():
            p, g = np.argwhere(bad)[0]
            raise GraphsimError("workload.replay", f"replayed positions exceed cached ones at point {p}, group {g}")
        bad = ~np.isin(self.tier, np.arange(len(TIERS), dtype=np.float64))
        if bad.any():
            p, g = np.argwhere(bad)[0]
            raise GraphsimError("workload.tier", f"must be a tier index {dict(enumerate(TIERS))}; point {p}, group {g} "
                                f"has {self.tier[p, g]!r}")
        return self.count

    @property
    def points(self) -> int:
        return self.count.shape[0]

    def arrays(self) -> dict[str, np.ndarray]:
        return {f: getattr(self, f) for f in FIELDS}

    def point(self, i: int) -> "Workload":
        return Workload(self.kinds, *(getattr(self, f)[i : i + 1] for f in FIELDS))

    @staticmethod
    def stack(workloads: Sequence["Workload"]) -> "Workload":
        kinds = workloads[0].kinds
        for w in workloads:
            require(w.kinds == kinds, "workload.kinds", "stacked workloads must share one group structure")
        return Workload(kinds, *(np.concatenate([getattr(w, f) for w in workloads]) for f in FIELDS))
