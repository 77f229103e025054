"""The KV cache hierarchy of a serving simulation (issue 27): each replica's HBM pool (the engine's paged KV
pool: running requests' KV plus a prefix cache of finished requests' blocks, LRU over unreferenced entries) and
pooled tiers below it (host memory pooled across machines, local disk), each with a capacity, a TTL since last
use, the kinds of KV it keeps and a price per GiB-hour.

Two kinds of KV (:data:`KINDS`): ``global`` — the per-token cache (every model's whole cache; DeepSeek-V4.1's
compressed global KV), kept per prompt block of the trace (hash ids); ``swa`` — a request's sliding-window state
(a fixed number of bytes, the last W positions of every SWA layer), kept per prefix end. A model without an SWA
cache has only ``global``. Which tier keeps which kind is the cache *design* (:data:`DESIGNS`): the talk notes'
three-tier V4.1 design keeps the SWA state in a host-memory pool that lives for minutes and the global KV on disk
for 72 h; V4's design kept both on disk.

Entries are keys (``("g", block_id)``, ``("s", prefix_key)``) with their bytes; a tier's LRU order is its
last-use order, so TTL expiry pops from the same end as capacity eviction. Bytes held are integrated over time
(GiB-hours, the cost) and sampled for the occupancy plot.
"""
from __future__ import annotations

import math
import numbers
from collections import OrderedDict

import attrs

from ..core.errors import GraphsimError, require

KINDS = ("global", "swa")
GiB = float(1 << 30)


def _number(field: str):
    """A converter: a real number (a string or a bool is refused with one line naming ``field``)."""
    def conv(v) -> float:
        require(isinstance(v, numbers.Real) and not isinstance(v, bool), field, f"must be a number, got {v!r}")
        return float(v)
    return conv


def _cap(v) -> float:
    v = _number("tier.capacity_gib")(v)
    require(v >= 0 and not math.isnan(v), "tier.capacity_gib", f"must be >= 0 (inf: unbounded), got {v!r}")
    return v


def _kinds(v) -> tuple:
    return (v,) if isinstance(v, str) else tuple(v) if isinstance(v, (tuple, list)) else (v,)


@attrs.frozen
class TierSpec:
    """One pooled tier below HBM. ``capacity_bytes``/``ttl_s`` inf: unbounded; ``holds``: the KV kinds it keeps;
    ``price_gib_hour``: what a GiB held for an hour costs (the cost column)."""

    name: str
    capacity_bytes: float = attrs.field(default=math.inf, converter=_cap)
    ttl_s: float = attrs.field(default=math.inf, converter=_number("tier.ttl_s"))
    holds: tuple = attrs.field(default=KINDS, converter=_kinds)
    price_gib_hour: float = attrs.field(default=0.0, converter=_number("tier.price"))

    def __attrs_post_init__(self):
        require(self.name in ("host", "disk"), "tier", f"a tier is host or disk, got {self.name!r}")
        require(self.ttl_s > 0 and not math.isnan(self.ttl_s), f"tier.{self.name}.ttl_s",
                f"must be > 0 seconds (inf: no expiry), got {self.ttl_s!r}")
        bad = [k for k in self.holds if k not in KINDS]
        require(not bad, f"tier.{self.name}.holds", f"unknown KV kind {bad[:1]}; allowed: {', '.join(KINDS)}")
        require(math.isfinite(self.price_gib_hour) and self.price_gib_hour >= 0, f"tier.{self.name}.price",
                f"must be a finite number >= 0, got {self.price_gib_hour!r}")

    @staticmethod
    def parse(text: str, host_bytes: float) -> "TierSpec":
        """``NAME[:key=value,...]`` with keys ``capacity_gib`` (or ``fraction`` of the pooled host memory,
        host only), ``ttl_s``, ``holds`` (``global+swa``), ``price`` (per GiB-hour)."""
        require(isinstance(host_bytes, numbers.Real) and not isinstance(host_bytes, bool), "tier.host_bytes",
                f"must be a number of bytes, got {host_bytes!r}")
        name, _, rest = str(text).partition(":")
        name = name.strip()
        require(name in ("host", "disk"), "tier", f"{text!r}: a tier is host or disk, e.g. host:fraction=0.1,ttl_s=300")
        kw: dict = {}
        for item in filter(None, (x.strip() for x in rest.split(","))):
            k, sep, v = item.partition("=")
            k = k.strip()
            require(bool(sep), f"tier.{name}", f"{item!r}: expected KEY=VALUE (capacity_gib, fraction, ttl_s, holds, "
                                               "price)")
            try:
                if k == "holds":
                    kw["holds"] = tuple(x for x in v.replace("+", " ").split() if x)
                elif k == "capacity_gib":
                    kw["capacity_bytes"] = float(v) * GiB
                elif k == "fraction":
                    require(name == "host", "tier.disk.fraction", "fraction is of the pooled host memory (host only)")
                    f = float(v)
                    require(0 <= f <= 1, "tier.host.fraction", f"must be in [0, 1], got {v!r}")
                    kw["capacity_bytes"] = f * host_bytes
                elif k == "ttl_s":
                    kw["ttl_s"] = float(v)
                elif k == "price":
                    kw["price_gib_hour"] = float(v)
                else:
                    raise GraphsimError(f"tier.{name}", f"unknown key {k!r}; allowed: capacity_gib, fraction, ttl_s, "
                                                        "holds, price")
            except ValueError:
                raise GraphsimError(f"tier.{name}.{k}", f"{v!r} is not a number") from None
        return TierSpec(name, **kw)


#: cache designs: the tiers below HBM (name, host-memory fraction or None for unbounded, TTL s, kinds kept).
#: "three-tier": the talk notes (seed 003): 10 % of every machine's DRAM pooled for the SWA state, alive for "a few
#: minutes" (300 s here, a parameter), the global KV on disk for 72 h. "swa-on-disk": DeepSeek-V4's design, both
#: kinds on disk for 72 h. "host-disk": the whole cache in the host pool and on disk (LMCache / Mooncake store
#: style, the default for a model without an SWA cache). "hbm": only each replica's own HBM prefix cache.
DESIGNS = {
    "three-tier": (("host", 0.10, 300.0, ("swa",)), ("disk", None, 72 * 3600.0, ("global",))),
    "swa-on-disk": (("disk", None, 72 * 3600.0, ("global", "swa")),),
    "host-disk": (("host", 0.10, 300.0, KINDS), ("disk", None, 72 * 3600.0, KINDS)),
    "hbm": (),
}


def design_tiers(design: str, host_bytes: float, has_swa: bool) -> tuple[TierSpec, ...]:
    """The tiers of ``design`` ("auto": three-tier for a model with an SWA cache, else host-disk) given the pooled
    host memory of the deployment's machines."""
    if design == "auto":
        design = "three-tier" if has_swa else "host-disk"
    require(design in DESIGNS, "cache_design", f"unknown {design!r}; allowed: auto, {', '.join(DESIGNS)}")
    out = []
    for name, frac, ttl, holds in DESIGNS[design]:
        holds = tuple(k for k in holds if has_swa or k != "swa")
        if holds:
            out.append(TierSpec(name, math.inf if frac is None else frac * host_bytes, ttl, holds))
    return tuple(out)


class Store:
    """One pooled tier: keys -> bytes in last-use order, bounded by capacity (LRU) and TTL since last use."""

    def __init__(self, spec: TierSpec, t0: float = 0.0):
        self.spec = spec
        self.entries: OrderedDict = OrderedDict()  # key -> [bytes, last use]
        self.used = 0.0
        self.byte_s = 0.0  # ∫ used dt
        self._t = t0
        self.evicted = self.expired = 0
        self.peak = 0.0

    def _advance(self, now: float) -> None:
        if now > self._t:
            self.byte_s += self.used * (now - self._t)
            self._t = now
        ttl = self.spec.ttl_s
        if ttl != math.inf:
            e = self.entries
            while e:
                k, (b, last) = next(iter(e.items()))
                if last + ttl > now:
                    break
                e.popitem(last=False)
                self.used -= b
                self.expired += 1

    def has(self, key, now: float) -> bool:
        self._advance(now)
        return key in self.entries

    def touch(self, key, now: float) -> None:
        ent = self.entries.get(key)
        if ent is not None:
            ent[1] = now
            self.entries.move_to_end(key)

    def put(self, key, nbytes: float, now: float) -> None:
        self._advance(now)
        cap = self.spec.capacity_bytes
        if nbytes > cap:
            return
        ent = self.entries.get(key)
        if ent is not None:
            ent[1] = now
            self.entries.move_to_end(key)
            return
        self.entries[key] = [nbytes, now]
        self.used += nbytes
        while self.used > cap:
            _, (b, _) = self.entries.popitem(last=False)
            self.used -= b
            self.evicted += 1
        self.peak = max(self.peak, self.used)

    def cost(self) -> float:
        return self.byte_s / GiB / 3600.0 * self.spec.price_gib_hour


class HBMPool:
    """One replica's engine KV pool (bytes over all its devices): referenced entries (running requests' prompt
    blocks and SWA state) and an LRU prefix cache of unreferenced ones; ``private`` = running requests' KV that
    no other request can share (generated tokens)."""

    def __init__(self, capacity: float):
        self.capacity = float(capacity)
        self.entries: dict = {}  # key -> [bytes, refs]
        self.lru: OrderedDict = OrderedDict()  # unreferenced keys, oldest first
        self.used = 0.0
        self.private = 0.0
        self.cached = 0.0  # bytes of unreferenced entries (evictable)
        self.evicted = 0

    def free(self) -> float:
        return self.capacity - self.used - self.private

    def has(self, key) -> bool:
        return key in self.entries

    def ref(self, key, nbytes: float) -> None:
        """Hold ``key`` for a running request (added with ``nbytes`` when absent)."""
        ent = self.entries.get(key)
        if ent is None:
            self.entries[key] = [nbytes, 1]
            self.used += nbytes
        else:
            if ent[1] == 0:
                self.lru.pop(key, None)
                self.cached -= ent[0]
            ent[1] += 1

    def unref(self, key) -> None:
        ent = self.entries.get(key)
        if ent is None:
            return
        ent[1] -= 1
        if ent[1] <= 0:
            ent[1] = 0
            self.lru[key] = None
            self.cached += ent[0]

    def put_cached(self, key, nbytes: float) -> None:
        """Keep ``key`` unreferenced (a finished request's SWA state) if it fits after eviction."""
        if key in self.entries:
            if self.entries[key][1] == 0:
                self.lru.move_to_end(key)
            return
        if self.make_room(nbytes):
            self.entries[key] = [nbytes, 0]
            self.lru[key] = None
            self.used += nbytes
            self.cached += nbytes

    def make_room(self, need: float) -> bool:
        """Evict unreferenced entries, oldest first, until ``need`` bytes are free; False if they cannot be."""
        while self.free() < need and self.lru:
            k, _ = self.lru.popitem(last=False)
            b = self.entries.pop(k)[0]
            self.used -= b
            self.cached -= b
            self.evicted += 1
        return self.free() >= need



__all__ = ["KINDS", "DESIGNS", "TierSpec", "Store", "HBMPool", "design_tiers"]
