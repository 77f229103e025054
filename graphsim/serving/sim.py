"""Request-level serving simulation (issue 27): a request trace through one deployment's engines — continuous
batching with chunked prefill under a token budget, admission by KV capacity, preemption by recompute, a prefix
cache in each replica's HBM and pooled tiers below it (:mod:`.kvcache`) — with every step's time from graphsim's
compiled program (:mod:`.steps`).

The engine (one per replica, as SGLang / vLLM schedule a replica):

- a request is routed on arrival (``prefix``: the replica whose HBM holds the longest prefix of it, ties to the
  least loaded; ``least-loaded``; ``round-robin``) and waits FIFO;
- admission, in arrival order, while the replica runs fewer than ``max_running`` requests and the step's token
  budget lasts: the prompt's blocks are matched (the leading run of its hash ids present in the replica's HBM or
  a tier that keeps the global KV; the hit is min(run x block, prompt - 1) tokens, the rule of
  :meth:`~graphsim.serving.trace.Trace.prefix_hits`), the KV of the whole prompt is reserved in HBM (unreferenced
  cached entries evicted LRU first) or the queue waits; a hit in host memory or on disk is copied first on the
  replica's copy link (graphsim's ``prefix_restore`` rule: the host link, and NVMe then the host link for disk);
- DeepSeek-V4.1: a hit without its SWA state (no tier kept it) replays the last min(hit, W) positions through the
  decoder (encoder bounded replay, W = the policies' replay window), or with ``encoder_replay=off`` recomputes the
  whole prompt; a prefill runs the 20 encoder layers (CED) because graphsim's V4.1 program does;
- each step: every decoding request advances one position (with speculative decoding: verifies 1 + K and gains the
  expected emitted tokens), then prefill chunks fill the rest of the budget in admission order; a prompt's last
  chunk emits its first token; a decode step that cannot grow the KV preempts the newest running request (its KV is
  released; it is readmitted to recompute its prompt and the tokens it emitted);
- a finished request's prompt blocks stay in HBM (LRU) and its KV is written through to the tiers that keep each
  kind: global blocks at the end of its prefill, its SWA state (keyed by its session, else by its last full prompt
  block) at the end;
- disaggregated deployments: prefill replicas hand each request's KV to the least loaded decode replica
  (graphsim.serving.disagg's hand-over), which admits it when its pool has room and swaps instead of recomputing;
- a prediction with an engine pays its host terms and each step's hottest EP rank (:mod:`.steps`).

Runs of pure decode steps between events are evaluated in one vectorized call. Every replica integrates the
requests it holds over its own clock, so Little's law (L = λ·W) checks the simulator's bookkeeping against the
requests' own times (``SimResult.checks``).
"""
from __future__ import annotations

import bisect
import heapq
import math
import numbers
from collections import deque

import attrs
import numpy as np

from ..core.errors import GraphsimError, require
from ..driver.views import view_name
from .kvcache import GiB, HBMPool, Store, TierSpec, design_tiers

ROUTERS = ("prefix", "least-loaded", "round-robin")
#: tokens per step when the engine documents none (vLLM's max_num_batched_tokens and SGLang's
#: --chunked-prefill-size are both 8,192 on large GPUs)
DEFAULT_TOKEN_BUDGET = 8192
WAIT, PREFILL, DECODE, DONE, REJECTED, TRANSFER = range(6)  # a request's phase (a restore: PREFILL not yet ready)
_HIST_EDGES = np.logspace(-6, 2, 1601)  # step-time histogram: 1 µs .. 100 s, 200 bins per decade
_EDGES = _HIST_EDGES.tolist()


@attrs.frozen
class Deployment:
    """What serves the trace: a model on ``replicas`` replicas of ``mapping`` under ``policies`` (with
    ``prefill_replicas`` > 0: the decode pool of a disaggregated deployment), priced in ``view`` (None: SOL) with
    ``profile``; ``engine`` ("auto": the measured view's framework, else none) decides the KV pool's memory rule
    and the limits; ``max_running`` / ``token_budget`` override the engine's limits; ``hbm_kv_gib`` overrides the KV
    pool of one replica (inf: unbounded)."""

    model: object
    hw: object = "gb200"
    mapping: object = None
    policies: object = None
    replicas: int = 1
    view: object = None
    profile: object = None
    engine: object = "auto"
    max_running: int | None = None
    token_budget: int | None = None
    reserve_gib: float | None = None
    hbm_kv_gib: float | None = None
    #: a disaggregated deployment: ``prefill_replicas`` replicas of ``prefill_mapping`` (default ``mapping``) under
    #: ``prefill_policies`` prefill every prompt; ``replicas`` x ``mapping`` decode (0: aggregated)
    prefill_mapping: object = None
    prefill_replicas: int = 0
    prefill_policies: object = None

    def __attrs_post_init__(self):
        from ..core.limits import check_int

        check_int("replicas", self.replicas, 1, 1 << 16)
        check_int("prefill_replicas", self.prefill_replicas, 0, 1 << 16)
        if self.max_running is not None:
            check_int("max_running", self.max_running, 1, 1 << 20)
        if self.token_budget is not None:
            check_int("token_budget", self.token_budget, 1, 1 << 24)
        if self.hbm_kv_gib is not None:
            v = self.hbm_kv_gib
            require(isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0, "hbm_kv_gib",
                    f"must be a number > 0 (inf: unbounded), got {v!r}")


def _sla_bound(inst, attr, v) -> None:
    ok = v is None or (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0)
    require(ok, attr.name, f"must be a finite number of ms > 0 (none: no bound), got {v!r}")


@attrs.frozen
class SLA:
    ttft_ms: float | None = attrs.field(default=None, validator=_sla_bound)
    tpot_ms: float | None = attrs.field(default=None, validator=_sla_bound)


@attrs.define
class SimResult:
    """Per-request records (``requests``: column arrays), the summary (``summary``), occupancy samples over time
    (``timeline``), the step-time histogram and the checks."""

    requests: dict
    summary: dict
    timeline: dict
    checks: dict
    surface_error: dict
    deployment: dict

    def to_json(self) -> dict:
        """The ``serve-sim --json`` body (docs/json.md): the summary, the checks, the step surface's error and the
        occupancy timeline."""
        return {**self.summary, "checks": self.checks, "surface_error": self.surface_error,
                "timeline": {k: [float(x) for x in v] for k, v in self.timeline.items()}}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.requests)


# ---- model facts the simulator needs ---------------------------------------------------------------------------
def kv_terms(model, policies) -> tuple[float, float]:
    """(global bytes per token, SWA bytes per request) of one request's KV, whole model: the cache's growth per
    position and its fixed part (a sliding window's state), from the model's own ``kv_request_bytes``."""
    a, b = 1 << 16, 1 << 17
    ka, kb = model.kv_request_bytes(a, policies), model.kv_request_bytes(b, policies)
    g = (kb - ka) / (b - a)
    return float(g), float(max(ka - g * a, 0.0))


def restore_seconds(host_bytes, disk_bytes, rates: dict) -> np.ndarray:
    """Seconds to copy a prefix hit's bytes per device into HBM as graphsim's ``prefix_restore`` rule prices it: each
    tier's bytes on every link :data:`graphsim.core.rules.RESTORE_LINKS` lists for it (host: C2C / PCIe; disk: NVMe then
    the same link), one copy op whose time is its slowest link's; ``rates``: the descriptor's rates under the
    deployment's profile (``HardwareSpec.rates``)."""
    from ..core.rules import RESTORE_LINKS

    by_tier = {"host": np.asarray(host_bytes, np.float64), "disk": np.asarray(disk_bytes, np.float64)}
    on_link: dict = {}
    for tier, links in RESTORE_LINKS.items():
        for link in links:
            on_link[link] = on_link.get(link, 0.0) + by_tier[tier]
    return np.maximum.reduce([b / rates[link] for link, b in on_link.items()])


# ---- the simulation ---------------------------------------------------------------------------------------------
@attrs.frozen
class _PoolConfig:
    """What the replicas of one pool share: their role (``mixed`` aggregated; ``prefill`` / ``decode`` pools of a
    disaggregated deployment), step times, limits, KV pool and mapping."""

    role: str
    steps: object
    budget: int
    max_running: int
    capacity: float
    per_device: float
    mapping: object
    policies: object


class _Replica:
    __slots__ = ("idx", "cfg", "pool", "waiting", "running", "t", "link", "held", "busy_s")

    def __init__(self, idx, cfg: _PoolConfig):
        self.idx, self.cfg, self.pool = idx, cfg, HBMPool(cfg.capacity)
        self.waiting: deque = deque()
        self.running: list = []
        self.t = 0.0
        self.link = 0.0  # when the copy link is free
        self.held = 0.0  # ∫ requests held dt (Little's law)
        self.busy_s = 0.0

    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def advance(self, t: float) -> None:
        if t > self.t:
            self.held += self.load() * (t - self.t)
            self.t = t


class _Sim:
    def __init__(self, trace, pools, *, too_long, tiers, router, seed, validate, sample_s, progress,
                 kv, window, swa_model, encoder_replay, hw, model, chunked=True, decode_in_budget=True,
                 emit: float = 1.0, rates_profile=None):
        self.hw, self.model = hw, model
        self.rates = hw.rates(rates_profile)  # the copy links at the deployment's profile (restores, swaps)
        self.router, self.progress = router, progress
        self.g, self.s = kv
        self.window = window
        self.swa_model, self.encoder_replay = swa_model, encoder_replay
        self.chunked, self.decode_in_budget = chunked, decode_in_budget
        self.emit = float(emit)  # expected tokens a decode step gives each request (1 without speculation)
        n = len(trace)
        self.n = n
        self.arr = np.asarray(trace.arrival_s, np.float64)
        self.inp = np.asarray(trace.input_len, np.int64)
        self.out = np.asarray(trace.output_len, np.int64)
        self.off = np.asarray(trace.offsets, np.int64)
        self.ids = np.asarray(trace.block_ids, np.int64)
        self.session = np.asarray(trace.session, np.int64)
        self.bt = int(trace.block_tokens)
        # pools: [(config, replicas)]; arrivals enter the first pool (the prefill pool of a disaggregated deployment)
        self.reps = [_Replica(k, cfg) for k, cfg in enumerate(c for c, count in pools for _ in range(count))]
        self.entry = [r for r in self.reps if r.cfg.role != "decode"]
        self.decoders = [r for r in self.reps if r.cfg.role == "decode"]
        self.handovers: list = []  # (delivery time, request, prefill end): KV on its way to the decode pool
        self.handover_s = np.zeros(n)
        self.tiers = [Store(t, float(self.arr[0]) if n else 0.0) for t in tiers]
        self.g_tiers = [t for t in self.tiers if "global" in t.spec.holds]
        self.s_tiers = [t for t in self.tiers if "swa" in t.spec.holds]
        f64 = lambda: np.full(n, np.nan)  # noqa: E731
        i64 = lambda: np.zeros(n, np.int64)  # noqa: E731
        self.phase = np.zeros(n, np.int8)
        self.replica = np.full(n, -1, np.int64)
        self.t_first, self.t_done, self.t_admit = f64(), f64(), f64()
        self.pos, self.target = i64(), i64()
        self.gen = np.zeros(n)  # tokens emitted (expected: a speculative step emits ``emit`` on average)
        self.ready = np.zeros(n)
        self.hit = {k: i64() for k in ("hbm", "host", "disk")}
        self.hit_tokens = i64()
        self.replay = i64()
        self.recomputed = i64()
        self.swa_hit = np.zeros(n, bool)
        self.preempted = i64()
        self.restore_s = np.zeros(n)
        self.priv = np.zeros(n)  # private HBM bytes (generated KV + SWA state)
        self.pending_replay = np.zeros(n, bool)  # the request's next chunk replays its SWA window
        self.keys: dict = {}  # request -> the HBM keys it holds
        self.rr = 0
        self.transit = 0.0  # ∫ requests routed to a replica whose clock was already past their arrival
        self.hist = np.zeros(_HIST_EDGES.size + 1)  # decode tokens per step-time bin (ITL)
        self.step_count = np.zeros(2, np.int64)  # decode-only, mixed
        self.rng = np.random.default_rng(seed)
        self.validate, self.samples, self.sample_seen = validate, [], 0
        self.sample_s = sample_s
        self.timeline = {k: [] for k in ("t_s", "hbm_bytes", "hbm_cached_bytes", "host_bytes", "disk_bytes",
                                         "waiting", "running")}
        self.next_sample = float(self.arr[0]) if n else 0.0
        self.too_long = np.asarray(too_long, bool)
        self.over_budget = np.zeros(n, bool)

    # -- helpers -------------------------------------------------------------------------------------------
    def blocks(self, i) -> np.ndarray:
        return self.ids[self.off[i]:self.off[i + 1]]

    def block_bytes(self, i, j) -> float:
        return self.g * min(self.bt, int(self.inp[i]) - j * self.bt) if j * self.bt < self.inp[i] else self.g * self.bt

    def _tier_of(self, key, now, tiers):
        for t in tiers:
            if t.has(key, now):
                return t
        return None

    def _swa_key(self, i):
        ids = self.blocks(i)
        full = min(int(self.inp[i]) // self.bt, ids.size)
        return ("s", int(ids[full - 1])) if full > 0 else None

    # -- routing -------------------------------------------------------------------------------------------
    def route(self, i: int, now: float):
        if self.too_long[i]:  # beyond the model's context: refused on arrival
            self.phase[i] = REJECTED
            self.t_done[i] = self.arr[i]
            return None
        reps = self.entry
        if len(reps) == 1:
            r = reps[0]
        elif self.router == "round-robin":
            r = reps[self.rr % len(reps)]
            self.rr += 1
        elif self.router == "least-loaded":
            r = min(reps, key=lambda x: (x.load(), x.idx))
        else:
            ids = self.blocks(i)

            def run(x):
                k = 0
                for b in ids:
                    if not x.pool.has(("g", int(b))):
                        break
                    k += 1
                return k
            r = min(reps, key=lambda x: (-run(x), x.load(), x.idx))
        return self._queue(r, i, float(self.arr[i]))

    def _queue(self, r: _Replica, i: int, t: float) -> _Replica:
        """Request ``i`` joins replica ``r``'s queue at time ``t``: an idle replica waits for it; a replica whose
        clock is already past ``t`` sees it at its next step (the gap counts as time in the system)."""
        if r.load() == 0 and r.t < t:
            r.advance(t)
            r.t = t
        elif r.t > t:
            self.transit += r.t - t
        r.waiting.append(i)
        self.replica[i] = r.idx
        return r

    # -- admission ----------------------------------------------------------------------------------------
    def admit(self, r: _Replica, now: float, spare: int) -> bool:
        """Admit waiting requests in order while the replica runs fewer than ``max_running`` and the step's
        token budget has ``spare`` prefill tokens; True when the head waits for KV room."""
        while r.waiting and len(r.running) < r.cfg.max_running and spare > 0:
            i = r.waiting[0]
            ok = self._admit_decoding(r, i, now) if r.cfg.role == "decode" else self._admit_one(r, i, now)
            if ok == "never":  # larger than the whole pool: refused, the queue goes on
                r.waiting.popleft()
                self.phase[i] = REJECTED
                self.t_done[i] = now
                continue
            if ok == "wait":
                return True
            r.waiting.popleft()
            if self.ready[i] <= now:
                spare -= int(self.target[i] - self.pos[i])
        return False

    def _admit_one(self, r: _Replica, i: int, now: float) -> str:
        ids = self.blocks(i)
        inp = int(self.inp[i])
        pool = r.pool
        # the leading run of blocks present somewhere, and where each is read from
        where = []
        for b in ids:
            key = ("g", int(b))
            if pool.has(key):
                where.append(None)
                continue
            t = self._tier_of(key, now, self.g_tiers)
            if t is None:
                break
            where.append(t)
        run = len(where)
        hit = min(run * self.bt, inp - 1) if run else 0
        swa_ok = True
        if self.swa_model and hit > 0:
            key = ("s", int(ids[run - 1]))
            sk = ("S", int(self.session[i])) if self.session[i] >= 0 else None
            swa_ok = pool.has(key) or (sk is not None and pool.has(sk)) or \
                self._tier_of(key, now, self.s_tiers) is not None or \
                (sk is not None and self._tier_of(sk, now, self.s_tiers) is not None)
        replay = 0
        # the hit statistics are the first admission's: a preempted request readmitted finds its own blocks, work
        # recovered, not the trace's prefix reuse (counted again, the hit ratio exceeded the trace's own reuse)
        first = self.preempted[i] == 0
        if hit and not swa_ok:
            if self.encoder_replay:
                replay = min(hit, self.window)
            else:
                if first:
                    self.recomputed[i] = hit
                hit = 0
        gen = int(np.ceil(self.gen[i] - 1e-9))
        target = inp + gen  # a preempted request recomputes the tokens it emitted
        # HBM: every prompt block not already there, the SWA state, the recomputed outputs
        need = sum(self.block_bytes(i, j) for j in range(ids.size) if not pool.has(("g", int(ids[j]))))
        priv = self.s + self.g * gen
        if need + priv > pool.capacity:
            return "never"
        if need + priv > pool.free() + pool.cached or not pool.make_room(need + priv):
            return "wait"
        keys = [("g", int(b)) for b in ids]
        for j, k in enumerate(keys):
            pool.ref(k, self.block_bytes(i, j))
        pool.private += priv
        self.priv[i] = priv
        self.keys[i] = keys
        # where the hit came from (tokens per tier), restore bytes per device
        host_b = disk_b = 0.0
        nb = -(-hit // self.bt) if hit else 0
        for j in range(nb):
            tok = min(self.bt, hit - j * self.bt)
            t = where[j]
            name = "hbm" if t is None else t.spec.name
            if first:
                self.hit[name][i] += tok
            if t is not None:
                t.touch(("g", int(ids[j])), now)
                if name == "host":
                    host_b += tok * self.g
                else:
                    disk_b += tok * self.g
        if self.swa_model and hit and swa_ok:
            self.swa_hit[i] |= first
            key = ("s", int(ids[run - 1]))
            if not pool.has(key):
                sk = ("S", int(self.session[i])) if self.session[i] >= 0 else None
                t = self._tier_of(key, now, self.s_tiers) or (sk and self._tier_of(sk, now, self.s_tiers))
                if t is not None and not (sk is not None and pool.has(sk)):
                    if t.spec.name == "host":
                        host_b += self.s
                    else:
                        disk_b += self.s
        if first:
            self.hit_tokens[i] = hit
        self.replay[i] = replay
        self.pending_replay[i] = replay > 0
        dr = float(restore_seconds(host_b * r.cfg.per_device, disk_b * r.cfg.per_device, self.rates)) \
            if host_b + disk_b > 0 else 0.0
        self.restore_s[i] = dr
        self.ready[i] = now
        if dr > 0:
            r.link = max(r.link, now) + dr
            self.ready[i] = r.link
        self.phase[i] = PREFILL
        self.pos[i] = hit
        self.target[i] = target
        if math.isnan(self.t_admit[i]):
            self.t_admit[i] = now
        r.running.append(i)
        return "ok"

    # -- completion ---------------------------------------------------------------------------------------
    def _release(self, r: _Replica, i: int) -> None:
        for k in self.keys.pop(i, ()):
            r.pool.unref(k)
        r.pool.private -= self.priv[i]
        self.priv[i] = 0.0

    def _prefilled(self, r: _Replica, i: int, now: float) -> None:
        """Write the prompt's global blocks through to the tiers that keep them."""
        if not self.g_tiers:
            return
        ids = self.blocks(i)
        for j, b in enumerate(ids):
            nb = self.block_bytes(i, j)
            for t in self.g_tiers:
                t.put(("g", int(b)), nb, now)

    def _finish(self, r: _Replica, i: int, now: float) -> None:
        self.phase[i] = DONE
        self.t_done[i] = now
        self._release(r, i)
        if self.swa_model and self.s > 0:
            # one SWA state per request, at its end: keyed by its session (the next turn continues from it), else by
            # its last full prompt block (a later prompt that extends this one)
            k = ("S", int(self.session[i])) if self.session[i] >= 0 else self._swa_key(i)
            if k is not None:
                r.pool.put_cached(k, self.s)
                for t in self.s_tiers:
                    t.put(k, self.s, now)

    def _preempt(self, r: _Replica) -> bool:
        """Preempt the newest running request; False when none can be. Aggregated and prefill replicas recompute
        it (its KV is released; readmitted, it recomputes its prompt and the tokens it emitted); a decode replica,
        which runs no prefill, swaps its KV to host memory and back (the copy link, both ways)."""
        if len(r.running) <= 1:
            return False
        i = r.running.pop()
        nbytes = self.priv[i]
        self._release(r, i)
        self.preempted[i] += 1
        if r.cfg.role == "decode":
            self.phase[i] = TRANSFER
            self.ready[i] = float(restore_seconds(nbytes * r.cfg.per_device, 0.0, self.rates))  # the swap-in to come
        else:
            self.phase[i] = WAIT
        r.waiting.appendleft(i)
        return True

    # -- disaggregated pools ------------------------------------------------------------------------------
    def _hand_over(self, r: _Replica, i: int, now: float) -> None:
        """Release the request from its prefill replica (its blocks stay in that replica's prefix cache) and send
        its KV to the decode pool: graphsim.serving.disagg.handover_seconds (streamed layer by layer during the prefill)."""
        from .disagg import Pool, handover_seconds

        self._release(r, i)
        dec = self.decoders[0].cfg
        prefill_s = now - float(self.t_admit[i]) if math.isfinite(self.t_admit[i]) else 0.0
        kv = "global+swa" if self.swa_model else "global"
        ho, _, _ = handover_seconds(self.model, self.hw, Pool(r.cfg.mapping, 1, policies=r.cfg.policies),
                                    Pool(dec.mapping, 1, policies=dec.policies), int(self.inp[i]), prefill_s, kv)
        self.phase[i] = TRANSFER
        self.ready[i] = 0.0
        self.handover_s[i] = ho
        heapq.heappush(self.handovers, (now + ho, i))
        self.transit += ho  # in flight between the pools: in the system, held by no replica

    def _deliver(self, i: int, t: float):
        """The KV arrived: the least loaded decode replica queues the request."""
        return self._queue(min(self.decoders, key=lambda x: (x.load(), x.idx)), i, t)

    def _admit_decoding(self, r: _Replica, i: int, now: float) -> str:
        """A decode replica admits a request whose KV arrived (or was swapped out): its prompt and emitted tokens'
        KV and its SWA state, private to it; a swapped-out request first copies its KV back."""
        need = self.g * float(self.inp[i] + self.gen[i]) + self.s
        if need > r.pool.capacity:
            return "never"
        if need > r.pool.free() + r.pool.cached or not r.pool.make_room(need):
            return "wait"
        r.pool.private += need
        self.priv[i] = need
        self.keys[i] = []
        back = float(self.ready[i])  # swap-in seconds (0 after a hand-over)
        self.ready[i] = now
        if back > 0:
            r.link = max(r.link, now) + back
            self.ready[i] = r.link
        self.phase[i] = DECODE if back == 0 else PREFILL
        self.pos[i] = self.target[i] = 0
        r.running.append(i)
        return "ok"

    # -- one step of a replica ----------------------------------------------------------------------------
    def step(self, r: _Replica, t_next: float) -> None:
        now = r.t
        decodes = [i for i in r.running if self.phase[i] == DECODE]
        queued = sum(int(self.target[i] - self.pos[i]) for i in r.running
                     if self.phase[i] == PREFILL and self.ready[i] <= now)
        spent = len(decodes) if self.decode_in_budget else 0  # SGLang's budget bounds prompt tokens only
        blocked = self.admit(r, now, r.cfg.budget - spent - queued)
        if r.cfg.role == "decode":  # a decode replica admits requests that decode in this very step
            for i in r.running:  # and a request swapped back in decodes once its copy is done
                if self.phase[i] == PREFILL and self.ready[i] <= now:
                    self.phase[i] = DECODE
            decodes = [i for i in r.running if self.phase[i] == DECODE]
            spent = len(decodes) if self.decode_in_budget else 0
        budget = r.cfg.budget - spent
        if budget < 0:
            decodes, budget = decodes[:r.cfg.budget], 0
        st = r.cfg.steps
        chunks = []
        pending = False
        t_ready = math.inf
        for i in r.running:
            if self.phase[i] != PREFILL:
                continue
            if self.ready[i] > now:
                t_ready = min(t_ready, self.ready[i])
                continue
            if budget <= 0:
                pending = True
                break
            k = int(min(self.target[i] - self.pos[i], budget))
            if not self.chunked and k < self.target[i] - self.pos[i]:  # packed whole: waits for a step it fits
                pending = True
                break
            chunks.append((i, k, int(self.pos[i])))
            budget -= k
        t_event = min(t_next, t_ready)
        if not decodes and not chunks:
            r.advance(t_event if math.isfinite(t_event) else now)
            return
        # KV growth of the decodes (preempting the newest request while it does not fit)
        need = self.g * len(decodes)
        while need > 0 and (need > r.pool.free() + r.pool.cached or not r.pool.make_room(need)):
            if not self._preempt(r):
                break
            decodes = [i for i in decodes if self.phase[i] == DECODE]
            chunks = [c for c in chunks if self.phase[c[0]] == PREFILL]
            need = self.g * len(decodes)
            if not decodes and not chunks:
                return
        B = len(decodes)
        ctx = (self.inp[decodes] + self.gen[decodes]).astype(np.float64) if B else np.zeros(0)
        cmean = float(ctx.mean()) if B else 0.0
        if chunks or pending or (r.waiting and len(r.running) < r.cfg.max_running and not blocked):
            m = 1
            if chunks:
                dt = self._step_time(st, cmean, B, chunks)
                self.step_count[1] += 1
            else:
                dt = st.step(B, cmean, 0.0, 0.0)
                self.step_count[0] += 1
            dts = np.array([dt])
        else:
            # a run of pure decode steps up to the next completion, arrival, or KV limit
            left = max(1, int(np.ceil(((self.out[decodes] - self.gen[decodes]) / self.emit).min() - 1e-9)))
            room = r.pool.free() + r.pool.cached
            fit = room / (self.g * B) if self.g > 0 else math.inf  # steps the KV pool can still grow
            kmax = max(1, min(left, int(fit) if math.isfinite(fit) else left))
            # the steps that start before the next event: priced in windows sized by the first step's time (a
            # run ends at the next arrival long before its last request finishes, on a busy trace)
            gap = t_event - now
            dt0 = st.step(B, cmean, 0.0, 0.0)
            k = kmax if not math.isfinite(gap) else min(kmax, max(1, int(gap / max(dt0, 1e-12)) + 2))
            while True:
                if k <= 16:  # a few steps: the per-point path (NumPy's per-call cost would dominate)
                    dts = np.array([st.step(B, cmean + j, 0.0, 0.0) for j in range(k)])
                else:
                    dts = st.decode(np.full(k, float(B)), cmean + np.arange(k, dtype=np.float64))
                m = k
                if math.isfinite(gap):
                    m = 1 + int(np.searchsorted(np.cumsum(dts)[:-1], gap, side="left"))
                if m < k or k >= kmax:
                    break
                k = min(kmax, 2 * k)
            m = max(1, min(m, k))
            dts = dts[:m]
            self.step_count[0] += m
        if B:  # ITL: each step's time / the tokens it gives a request, weighted by the tokens it emits
            if dts.size == 1:
                self.hist[bisect.bisect_left(_EDGES, float(dts[0]) / self.emit)] += B * self.emit
            else:
                np.add.at(self.hist, np.searchsorted(_HIST_EDGES, dts / self.emit), float(B) * self.emit)
        self._sample_step(st, chunks, ctx, decodes, dts.size)
        t_end = now + float(dts.sum())
        r.advance(t_end)
        r.busy_s += float(dts.sum())
        m = dts.size
        # decodes emit m tokens each
        if B:
            self.gen[decodes] += m * self.emit
            grow = self.g * m * self.emit
            self.priv[decodes] += grow
            r.pool.private += grow * B
        handed = []
        for i, k, _ in chunks:
            self.pos[i] += k
            self.pending_replay[i] = False
            if self.pos[i] >= self.target[i]:  # the last chunk emits the next token
                self.phase[i] = DECODE
                if math.isnan(self.t_first[i]):
                    self.t_first[i] = t_end
                self.gen[i] += 1
                self._prefilled(r, i, t_end)
                if r.cfg.role == "prefill" and self.gen[i] < self.out[i] - 1e-9:
                    handed.append(i)
        for i in handed:  # a prefill pool hands the KV to the decode pool
            self._hand_over(r, i, t_end)
        done = [i for i in r.running if self.phase[i] == DECODE and self.gen[i] >= self.out[i] - 1e-9]
        if done or handed:
            for i in done:
                self._finish(r, i, t_end)
            gone = set(done) | set(handed)
            r.running = [i for i in r.running if i not in gone]

    def _sample_step(self, st, chunks, ctx, decodes, m) -> None:
        """Reservoir-sample steps for the surface's error (each of a run of decode steps counts once)."""
        if self.validate <= 0:
            return
        self.sample_seen += 1
        rec = None
        if len(self.samples) < self.validate:
            rec = len(self.samples)
            self.samples.append(None)
        else:
            j = int(self.rng.integers(0, self.sample_seen))
            if j < self.validate:
                rec = j
        if rec is not None:
            ch = [(k, p, int(self.replay[i]) if self.pending_replay[i] else 0) for i, k, p in chunks]
            cmean = float(ctx.mean()) if ctx.size else 0.0
            pred = self._step_time(st, cmean, ctx.size, chunks, host=False) if chunks else \
                st.step(ctx.size, cmean, 0.0, 0.0, host=False)
            self.samples[rec] = (ch, ctx.copy(), pred, st)

    def _step_time(self, st, cmean: float, B: int, chunks, host: bool = True) -> float:
        """A step with prefill chunks: the surface at its coordinates plus each bounded replay's marginal cost."""
        n = np.array([c[1] for c in chunks], np.float64)
        p = np.array([c[2] for c in chunks], np.float64)
        total = float(n.sum())
        dt = st.step(B, cmean, total, float((n * p + n * (n + 1) / 2).sum()), host)
        for i, _, _ in chunks:
            if self.pending_replay[i]:
                dt += st.replay(total, float(self.hit_tokens[i]))
        return dt

    def sample(self, upto: float) -> None:
        while self.sample_s and self.next_sample <= upto:
            t = self.next_sample
            tl = self.timeline
            tl["t_s"].append(t)
            tl["hbm_bytes"].append(sum(r.pool.used + r.pool.private for r in self.reps))
            tl["hbm_cached_bytes"].append(sum(r.pool.cached for r in self.reps))
            for st in self.tiers:
                st._advance(t)
            for name in ("host", "disk"):
                tl[f"{name}_bytes"].append(sum(st.used for st in self.tiers if st.spec.name == name))
            tl["waiting"].append(sum(len(r.waiting) for r in self.reps))
            tl["running"].append(sum(len(r.running) for r in self.reps))
            self.next_sample += self.sample_s

    # -- the loop -----------------------------------------------------------------------------------------
    def run(self) -> None:
        """Step the busy replica with the earliest clock; deliver arrivals and hand-overs due by then first. The
        busy replicas sit in a heap by clock (entries go stale when a replica moves; they are skipped)."""
        n, arr = self.n, self.arr
        nxt = 0
        reps, ho = self.reps, self.handovers
        heap: list = []
        queued: dict = {}  # replica -> the clock of its live heap entry

        def push(r):
            if r.load() and queued.get(r.idx) != r.t:
                queued[r.idx] = r.t
                heapq.heappush(heap, (r.t, r.idx))

        def deliver(t_arr, t_ho):
            nonlocal nxt
            if t_arr <= t_ho:
                r = self.route(nxt, t_arr)
                nxt += 1
            else:
                t, i = heapq.heappop(ho)
                r = self._deliver(i, t)
            if r is not None:
                push(r)

        prefill_clock = self._entry_clock
        while True:
            t_arr = float(arr[nxt]) if nxt < n else math.inf
            t_ho = ho[0][0] if ho else math.inf
            while heap and (not reps[heap[0][1]].load() or queued.get(heap[0][1]) != heap[0][0]):
                _, k = heapq.heappop(heap)  # stale: the replica moved or emptied
                if queued.get(k) is not None and not reps[k].load():
                    queued.pop(k, None)
            if not heap:
                if t_arr == math.inf and t_ho == math.inf:
                    break
                deliver(t_arr, t_ho)
                continue
            r = reps[heap[0][1]]
            if min(t_arr, t_ho) <= r.t:
                deliver(t_arr, t_ho)  # one at a time: the heap orders what each delivery wakes
                if self.progress and nxt % 256 == 0:
                    self.progress(nxt)
                continue
            heapq.heappop(heap)
            queued.pop(r.idx, None)
            before = r.t
            t_next = min(t_arr, t_ho)
            if r.cfg.role == "decode":  # a prefill replica can hand over a request from its own clock on
                t_next = min(t_next, prefill_clock())
            self.step(r, t_next)
            if r.t == before and r.load():
                # no progress possible: the replica waits for the next arrival or hand-over (a full pool with
                # nothing running cannot happen: admit() refuses a head that does not fit an empty pool)
                if math.isfinite(t_next):
                    r.advance(t_next)
                else:
                    raise GraphsimError("serve_sim", f"replica {r.idx} is stuck with {r.load()} requests "
                                                     "(an internal error: please report it)")
            push(r)
            self.sample(heap[0][0] if heap else r.t)
        if self.progress:
            self.progress(nxt)
        end = max(x.t for x in reps)
        for r in reps:
            r.advance(end)

    def _entry_clock(self) -> float:
        """The earliest clock of a busy prefill replica (inf: none)."""
        return min((x.t for x in self.entry if x.load()), default=math.inf)


def _percentiles(v: np.ndarray) -> dict:
    v = v[np.isfinite(v)]
    if not v.size:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p = np.percentile(v, [50, 90, 99])
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]), "mean": float(v.mean())}


def _hist_percentiles(hist: np.ndarray) -> dict:
    tot = hist.sum()
    if tot <= 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    cdf = np.cumsum(hist) / tot
    mid = np.concatenate([[_HIST_EDGES[0]], np.sqrt(_HIST_EDGES[:-1] * _HIST_EDGES[1:]), [_HIST_EDGES[-1]]])
    out = {f"p{q}": float(mid[min(int(np.searchsorted(cdf, q / 100.0)), mid.size - 1)]) * 1e3 for q in (50, 90, 99)}
    # (each value is its histogram bin's centre: 200 bins per decade, within 0.6 % of the step time)
    out["mean"] = float((hist * mid).sum() / tot) * 1e3
    return out


def simulate(trace, deployment: Deployment, *, cache_design: str = "auto", tiers=None, router: str = "prefix",
             sla: SLA = SLA(), classes: tuple = (), seed: int = 0, validate: int = 256, samples: int = 200,
             prices=None, steps=None, progress=None) -> SimResult:
    """Serve ``trace`` (:class:`graphsim.serving.trace.Trace`) on ``deployment``; returns per-request records, latency
    percentiles per class, goodput under ``sla``, throughput per GPU, cache hits and bytes per tier over time, and
    the checks. ``cache_design`` names the tiers below HBM (:data:`graphsim.serving.kvcache.DESIGNS`) unless
    ``tiers`` gives them (``prices``: {tier: price per GiB-hour}); ``classes``: input-length edges splitting the
    requests into classes; ``validate``: steps sampled to state the step surface's error against the exact program;
    ``steps``: a step-time object to use instead of the deployment's programs (tests' closed forms)."""
    from ..hw import load_hw
    from ..core.limits import MAX_CONTEXT
    from ..models import load_model
    from ..driver.pipeline import Policies
    from ..core.plan import ParallelMapping
    from .engines import ENGINES, engine_terms

    require(router in ROUTERS, "router", f"unknown {router!r}; allowed: {', '.join(ROUTERS)}")
    require(len(trace) > 0, "trace", "holds no requests")
    from ..core.limits import MAX_CONTEXT

    def whole(x, lo, hi):
        return isinstance(x, numbers.Integral) and not isinstance(x, bool) and lo <= x <= hi

    require(isinstance(classes, (tuple, list, np.ndarray)), "classes",
            f"must be a tuple of input-length edges, got {classes!r}")
    bad = [x for x in classes if not whole(x, 1, MAX_CONTEXT)]  # before the run: edges are int64 input lengths
    require(not bad, "classes", f"input-length edges are whole numbers in [1, {MAX_CONTEXT:,}], got {bad[0]!r}"
            if bad else "")
    require(whole(seed, 0, 2 ** 63 - 1), "seed", f"must be a whole number >= 0, got {seed!r}")
    require(whole(validate, 0, 1 << 20), "validate", f"must be a whole number of steps >= 0, got {validate!r}")
    require(whole(samples, 0, 1 << 20), "samples", f"must be a whole number of timeline samples in [0, 2^20], got "
            f"{samples!r}")  # (each is a pass over the replicas: 10^9 never ended)
    require(isinstance(sla, SLA), "sla", f"give an SLA record, got {sla!r}")
    require(prices is None or (isinstance(prices, dict) and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in prices.values())), "price",
        f"give {{tier: price per GiB-hour}}, got {prices!r}")
    dep = deployment
    model = load_model(dep.model) if isinstance(dep.model, str) else dep.model
    hw = load_hw(dep.hw) if isinstance(dep.hw, str) else dep.hw
    mapping = dep.mapping or ParallelMapping()
    policies = dep.policies or Policies()
    disagg = dep.prefill_replicas > 0
    p_mapping = (dep.prefill_mapping or mapping) if disagg else None
    p_policies = (dep.prefill_policies or policies) if disagg else None
    for m, what in ((mapping, "mapping"), (p_mapping, "prefill_mapping")):
        require(m is None or m.pp == 1, f"{what}.pp", "serve-sim runs pp = 1 replicas (a pipeline's micro-batch "
                                                      "schedule is not simulated); give pp 1")
    view = dep.view
    if dep.engine == "auto":
        eng = None if view_name(view) == "sol" or not getattr(view, "backend", "") \
            else ENGINES.get(str(view.backend).split("@", 1)[0])
    else:
        eng = engine_terms(dep.engine)
    if eng is not None:
        eng = eng.on(hw.hbm_capacity_bytes)
    # the step terms (host launches, graphs, scheduler time) are a prediction's: SOL pays none
    predicted = dep.profile is not None or view_name(view) != "sol"
    chunked = eng.chunked_prefill if eng is not None else True
    decode_in_budget = eng.decode_in_budget if eng is not None else True

    # speculative decoding (MTP-K, DSpark): each decode step verifies 1 + K positions and gives each request the
    # expected emitted tokens under the policies' acceptance (graphsim.driver.metrics.emitted, the search's rule)
    verify = int(policies.mtp) if policies.mtp else (len(policies.acceptance) if policies.dspark == "on" else 0)
    emit = 1.0
    if verify:
        from ..driver.metrics import emitted

        require(bool(policies.acceptance), "policies.acceptance", "speculative decoding needs a_1..a_K to turn "
                                                                   "verified positions into emitted tokens")
        emit = float(emitted(("decode",), np.array([[1.0 + verify]]), policies)[0, 0])
    g, s = kv_terms(model, policies)
    bd = model.kv_breakdown(1024) if hasattr(model, "kv_breakdown") else None
    swa_model = s > 0 and isinstance(bd, dict) and "swa_bytes" in bd
    limit = model.max_context() if policies.beyond_context == "refuse" and hasattr(model, "max_context") \
        else MAX_CONTEXT
    entry_dp = (p_mapping or mapping).dp
    entry_budget = _budget(dep, eng, entry_dp)
    total = np.asarray(trace.input_len, np.int64) + np.asarray(trace.output_len, np.int64)
    too_long = total > limit  # refused on arrival, as an engine refuses a request beyond its context
    over_budget = np.zeros_like(too_long)
    if not chunked:  # prompts packed whole: one longer than a step's budget never runs
        over_budget = ~too_long & (np.asarray(trace.input_len, np.int64) > entry_budget)
        too_long = too_long | over_budget
    require(not bool(too_long.all()), "trace", f"every request exceeds {model.name}'s context of {limit:,} tokens"
                                               + (f" or the engine's {entry_budget:,}-token step (no chunked prefill)"
                                                  if not chunked else " (--beyond-context runs them as a what-if)"))
    max_ctx = int(min(int(total[~too_long].max()) + 1, limit))
    kw = dict(model=model, hw=hw, dep=dep, eng=eng, serving=eng if predicted else None, view=view, trace=trace,
              max_ctx=max_ctx, swa_model=swa_model, validate=validate, steps=steps, verify=verify)
    if disagg:
        pools = [(_pool_config("prefill", p_mapping, p_policies, **kw), dep.prefill_replicas),
                 (_pool_config("decode", mapping, policies, **kw), dep.replicas)]
    else:
        pools = [(_pool_config("mixed", mapping, policies, **kw), dep.replicas)]
    gpus = sum(c.mapping.gpus * k for c, k in pools)
    design = "custom"
    if tiers is None:
        design = cache_design if cache_design != "auto" else ("three-tier" if swa_model else "host-disk")
        tiers = design_tiers(design, hw.host_mem_bytes * gpus, swa_model)
    tiers = tuple(tiers)
    for name, price in (prices or {}).items():
        require(name in [t.name for t in tiers], "price", f"{name!r} is not a tier of this cache "
                                                          f"({', '.join(t.name for t in tiers) or 'none'})")
        tiers = tuple(attrs.evolve(t, price_gib_hour=float(price)) if t.name == name else t for t in tiers)
    require(all(isinstance(t, TierSpec) for t in tiers), "tiers", "give TierSpec records")
    arr = np.asarray(trace.arrival_s, np.float64)
    span = float(arr[-1] - arr[0]) if len(trace) > 1 else 1.0
    sim = _Sim(trace, pools, too_long=too_long, tiers=tiers, router=router, seed=seed, validate=validate,
               sample_s=max(span, 1e-3) / max(samples, 1) if samples else 0.0, progress=progress,
               kv=(g, s), window=policies.replay_window, swa_model=swa_model,
               encoder_replay=policies.encoder_replay == "on", hw=hw, model=model, chunked=chunked,
               decode_in_budget=decode_in_budget, emit=emit, rates_profile=dep.profile)
    sim.over_budget = over_budget
    sim.run()
    return _result(sim, trace, dep, model, hw, pools, policies, eng, tiers, sla, classes, router, design)


def _budget(dep: Deployment, eng, dp: int) -> int:
    """Tokens one step of a replica schedules: ``--token-budget``, else the engine's per attention-DP rank x dp
    (an engine schedules each rank; the simulator schedules the replica's dp ranks as one, balanced, as the compiled
    program prices them), else :data:`DEFAULT_TOKEN_BUDGET`."""
    if dep.token_budget is not None:
        return int(dep.token_budget)
    if eng is not None and eng.step_tokens is not None:
        return int(eng.budget(dp) * dp)
    return DEFAULT_TOKEN_BUDGET


def _pool_config(role, mapping, policies, *, model, hw, dep, eng, serving, view, trace, max_ctx, swa_model, validate,
                 steps, verify: int = 0) -> _PoolConfig:
    """One pool's replicas: limits, KV pool (HBM left per device by graphsim's memory model under the engine's rule,
    times the devices one request's KV is spread over) and step times (its own compiled programs)."""
    from .fit import DEFAULT_RESERVE_GIB, MemoryModel
    from ..driver.pipeline import Plan, compile_plan
    from .steps import StepTimes

    dp = mapping.dp
    budget = _budget(dep, eng, dp)
    if dep.max_running is not None:
        max_running = int(dep.max_running)
    elif eng is not None and eng.max_running is not None:
        max_running = int(eng.max_running * dp)
    else:
        max_running = 1 << 20
    split = model.kv_split(mapping)
    if dep.hbm_kv_gib is not None:
        capacity = float(dep.hbm_kv_gib) * GiB
    else:
        reserve = DEFAULT_RESERVE_GIB if dep.reserve_gib is None else dep.reserve_gib
        mm = MemoryModel(model, hw, mapping, policies, kind="prefill", reserve_gib=reserve, engine=eng)
        work = float(mm.workspace(1, min(budget, max_ctx))[0])
        fixed = sum(mm.weights.values()) + work
        room = eng.room(hw.hbm_capacity_bytes, mm.reserve, fixed, 0.0) if eng is not None else \
            hw.hbm_capacity_bytes - mm.reserve - fixed
        require(room > 0, "deployment", f"{model.name} on {mapping} leaves no HBM for a KV cache on {hw.name} "
                                        f"({room / GiB:.1f} GiB): use more GPUs per replica")
        capacity = float(room) * split
    if steps is None:
        b_max = int(min(max_running, 1 << 14, len(trace)))
        dec = f"decode:{max_ctx}x{max(b_max, 1)}" + (f"v{verify}" if verify else "")
        prog = compile_plan(model, Plan([f"prefill:{max_ctx}", dec], mapping, policies), hw, dep.profile, view=view)
        exact = compile_plan(model, Plan(["prefill:1024"] * 8 + [dec.replace(f"{max_ctx}x{max(b_max, 1)}", "1024")] * 4,
                                         mapping, policies), hw, dep.profile, view=view) if validate > 0 else None
        hot, moe = None, None
        if serving is not None and serving.moe_routing and mapping.ep > 1 and policies.ep_imbalance == 1.0:
            info = next((op.info for op in prog.graph.ops if op.kind == "moe_experts" and op.info.experts), None)
            if info is not None:  # the engine's routing-statistics term (graphsim.serving.moe), as search prices it
                import attrs as _attrs

                hot = compile_plan(model, Plan([f"prefill:{max_ctx}", dec], mapping,
                                               _attrs.evolve(policies, ep_imbalance=2.0)), hw, dep.profile, view=view)
                moe = (info.top_k, info.experts, mapping.ep, serving.moe_load_ratio, serving.eplb)
        steps = StepTimes(prog, max_batch=b_max, max_context=max_ctx, budget=budget,
                          replay_window=policies.replay_window, swa=swa_model, exact_program=exact, serving=serving,
                          hot_program=hot, moe=moe, verify=verify, role=role)
    return _PoolConfig(role, steps, budget, max_running, capacity, mapping.dp / split, mapping, policies)


def _finite(v):
    """A JSON number, or None for an unbounded (inf) or undefined (nan) value."""
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _result(sim: _Sim, trace, dep, model, hw, pools, policies, eng, tiers, sla, classes, router,
            design) -> SimResult:
    from ..driver.pipeline import policy_text

    main = pools[-1][0]  # the aggregated replicas, or the decode pool
    mapping, budget, max_running, capacity = main.mapping, main.budget, main.max_running, main.capacity
    pre = pools[0][0] if len(pools) > 1 else None
    n = sim.n
    arr = sim.arr
    served = sim.phase == DONE
    ttft = (sim.t_first - arr) * 1e3
    e2e = (sim.t_done - arr) * 1e3
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(sim.out > 1, (sim.t_done - sim.t_first) / np.maximum(sim.out - 1, 1), np.nan) * 1e3
    ttft[~served], e2e[~served], tpot[~served] = np.nan, np.nan, np.nan
    t_end = float(np.nanmax(sim.t_done)) if n else 0.0
    span = max(t_end - float(arr[0]), 1e-12)
    gpus = sum(c.mapping.gpus * k for c, k in pools)
    good = served.copy()
    if sla.ttft_ms is not None:
        good &= ttft <= sla.ttft_ms
    if sla.tpot_ms is not None:
        good &= ~(tpot > sla.tpot_ms)
    edges = tuple(sorted(int(x) for x in classes))
    cls = np.searchsorted(np.asarray(edges, np.int64), sim.inp, side="left") if edges else np.zeros(n, np.int64)
    bounds = [0, *edges, None]
    per_class = []
    for k in range(len(edges) + 1):
        sel = cls == k
        per_class.append({"name": "all" if not edges else (f"input<={edges[0]}" if k == 0 else
                                                             f"input>{edges[-1]}" if k == len(edges) else
                                                             f"{edges[k - 1]}<input<={edges[k]}"),
                          "min_input_tokens": bounds[k] + (1 if k else 0), "max_input_tokens": bounds[k + 1],
                          "requests": int(sel.sum()), "ttft_ms": _percentiles(ttft[sel]),
                          "tpot_ms": _percentiles(tpot[sel]), "e2e_ms": _percentiles(e2e[sel])})
    inp_tot = float(sim.inp.sum())
    hits = {k: float(v.sum()) for k, v in sim.hit.items()}
    req_hits = {k: int((v > 0).sum()) for k, v in sim.hit.items()}
    # Little's law: the replicas' own integral of requests held vs arrival rate x mean time in system
    L = (sum(r.held for r in sim.reps) + sim.transit) / span
    lam = n / span
    W = float(np.nanmean(np.where(served | (sim.phase == REJECTED), sim.t_done - arr, np.nan)))
    little = {"mean_in_system": L, "arrival_rate_x_mean_time": lam * W,
              "relative_error": abs(L - lam * W) / max(lam * W, 1e-300)}
    reuse = float(trace.prefix_hits().sum()) / inp_tot if hasattr(trace, "prefix_hits") else None
    tier_rows = []
    by_name = {st.spec.name: st for st in sim.tiers}
    for name in ("host", "disk"):  # every tier graphsim knows, present or not
        st = by_name.get(name)
        if st is not None:
            st._advance(t_end)
        sp = st.spec if st is not None else None
        tier_rows.append({
            "name": name, "present": st is not None, "holds": list(sp.holds) if sp else [],
            "capacity_gib": _finite(sp.capacity_bytes / GiB) if sp else None,
            "ttl_s": _finite(sp.ttl_s) if sp else None, "price_per_gib_hour": sp.price_gib_hour if sp else 0.0,
            "peak_gib": st.peak / GiB if st else 0.0, "gib_hours": st.byte_s / GiB / 3600.0 if st else 0.0,
            "cost": st.cost() if st else 0.0, "evicted": st.evicted if st else 0, "expired": st.expired if st else 0,
            "hit_tokens": hits[name], "hit_requests": req_hits[name]})
    summary = {
        "deployment": {"model": model.name, "hw": hw.name, "mapping": str(mapping), "replicas": dep.replicas,
                       "gpus": gpus, "policies": policy_text(policies),
                       "view": view_name(dep.view),
                       "profile": getattr(dep.profile, "name", "none") if dep.profile is not None else "none",
                       "engine": getattr(eng, "name", "none") if eng is not None else "none",
                       "token_budget": budget, "max_running": max_running if max_running < (1 << 20) else None,
                       "engine_steps": "priced" if getattr(main.steps, "serving", None) is not None else "none",
                       "mode": "disagg" if pre is not None else "agg",
                       "prefill_mapping": str(pre.mapping) if pre is not None else None,
                       "prefill_replicas": dep.prefill_replicas if pre is not None else 0,
                       "prefill_policies": policy_text(pre.policies) if pre is not None else None,
                       "hbm_pool_gib_per_replica": _finite(capacity / GiB), "router": router,
                       "cache_design": design},
        "requests": {"total": n, "served": int(served.sum()), "rejected": int((sim.phase == REJECTED).sum()),
                     "rejected_beyond_context": int((sim.too_long & ~sim.over_budget).sum()),
                     "rejected_over_step_budget": int(sim.over_budget.sum()),
                     "preempted": int((sim.preempted > 0).sum()),
                     "preemptions": int(sim.preempted.sum())},
        "duration_s": span,
        "latency": {"ttft_ms": _percentiles(ttft), "tpot_ms": _percentiles(tpot), "itl_ms": _hist_percentiles(sim.hist),
                    "e2e_ms": _percentiles(e2e),
                    "handover_ms": _percentiles(np.where(sim.handover_s > 0, sim.handover_s * 1e3, np.nan))},
        "classes": per_class,
        "goodput": {"ttft_ms": sla.ttft_ms, "tpot_ms": sla.tpot_ms, "requests": int(good.sum()),
                    "fraction": float(good.sum()) / max(n, 1), "requests_per_s": float(good.sum()) / span,
                    "output_tokens_per_s_per_gpu": float(sim.out[good].sum()) / span / gpus},
        "throughput": {"output_tokens_per_s_per_gpu": float(sim.out[served].sum()) / span / gpus,
                       "input_tokens_per_s_per_gpu": float(sim.inp[served].sum()) / span / gpus,
                       "requests_per_s": float(served.sum()) / span},
        "queue": {"mean_waiting": float(np.mean(sim.timeline["waiting"])) if sim.timeline["waiting"] else 0.0,
                  "max_waiting": int(max(sim.timeline["waiting"], default=0))},
        "steps": {"decode_only": int(sim.step_count[0]), "mixed": int(sim.step_count[1]),
                  "busy_fraction": float(np.mean([r.busy_s for r in sim.reps])) / span},
        "cache": {"hit_ratio": float(sim.hit_tokens.sum()) / inp_tot if inp_tot else 0.0,
                  "trace_prefix_reuse": reuse, "hit_tokens": hits, "hit_requests": req_hits,
                  "swa_hits": int(sim.swa_hit.sum()), "replays": int((sim.replay > 0).sum()),
                  "replayed_tokens": int(sim.replay.sum()), "recomputed_hit_tokens": int(sim.recomputed.sum()),
                  "hbm_evicted": sum(r.pool.evicted for r in sim.reps),
                  "persistent_gib_hours": sum(t["gib_hours"] for t in tier_rows if t["name"] == "disk"),
                  "tiers": tier_rows},
    }
    checks = {"littles_law": little}
    err = {"steps": 0, "median_rel": None, "p90_abs_rel": None, "max_abs_rel": None,
           "surface_points": int(sum(getattr(c.steps, "points", 0) for c, _ in pools))}
    recs = [x for x in sim.samples if x is not None and getattr(x[3], "exact_program", None) is not None]
    if recs:
        ex, pr = [], []
        for st in {id(x[3]): x[3] for x in recs}.values():  # each pool's steps against its own program
            mine = [x for x in recs if x[3] is st]
            ex.append(st.exact([(c, ctx) for c, ctx, _, _ in mine]))
            pr.append([p for _, _, p, _ in mine])
        ex, pr = np.concatenate(ex), np.concatenate([np.asarray(p, np.float64) for p in pr])
        rel = (pr - ex) / ex
        err.update(steps=len(recs), median_rel=float(np.median(rel)), p90_abs_rel=float(np.percentile(abs(rel), 90)),
                   max_abs_rel=float(np.max(abs(rel))))
    requests = {"arrival_s": arr, "input_len": sim.inp, "output_len": sim.out, "replica": sim.replica,
                "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "hit_tokens": sim.hit_tokens,
                "hit_hbm": sim.hit["hbm"], "hit_host": sim.hit["host"], "hit_disk": sim.hit["disk"],
                "swa_hit": sim.swa_hit, "replayed": sim.replay, "restore_ms": sim.restore_s * 1e3,
                "preempted": sim.preempted, "handover_ms": sim.handover_s * 1e3, "served": served, "good": good}
    return SimResult(requests, summary, {k: np.asarray(v) for k, v in sim.timeline.items()}, checks, err,
                     summary["deployment"])


__all__ = ["Deployment", "SLA", "SimResult", "simulate", "kv_terms", "restore_seconds", "ROUTERS"]
