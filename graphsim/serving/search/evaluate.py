"""Evaluation: every (kind, mapping, policies) program compiled once and evaluated for all batch sizes in one
vectorized call (:class:`Group`), the aggregated and disaggregated rows (their step arithmetic in
:mod:`.schedules`), memory fit, and the workers (local processes or Ray) that evaluate groups in parallel."""
from __future__ import annotations

import hashlib
import json
import math
import os

import attrs
import numpy as np

from ...core.errors import GraphsimError, require
from ...core.plan import ParallelMapping, Plan, Policies
from ...core.workload import Workload
from ...driver.pipeline import CompileCache, compile_plan, policy_text
from ...driver.views import view_name
from ..engines import kernels
from .cache import _Cache, _view_digests
from .space import GiB, MAX_PREFILL_PER_RANK, MIXED_BLOCKS, PREFILL_ONLY, canonical
from .schedules import _largest_between, _largest_fit, _pareto_min_max, _sum_steps, agg_schedules


# ---- evaluated programs ----------------------------------------------------------------------------------------
@attrs.frozen(eq=False)
class Group:
    """One (kind, mapping, policies) program evaluated at every batch (and verify length) of the search.

    decode rows: ``batch`` requests of the replica, ``verify`` draft positions; prefill rows: ``batch``
    prompts per forward, one column of ``forward_s`` per traffic class."""

    kind: str
    mapping: ParallelMapping
    policies: Policies
    batch: np.ndarray
    verify: np.ndarray
    forward_s: np.ndarray  #: decode (R,); prefill (R, classes)
    emitted: np.ndarray  #: tokens a request gets per decode step (R,); ones for prefill
    headroom_bytes: np.ndarray  #: HBM left per device (R,) (host-table shortfall counted as negative)
    workspace_bytes: np.ndarray  #: the largest op's activations per device (R,), part of the headroom
    prompts: np.ndarray  #: mixed rows: prompts admitted per DP group and step, f (R,); zeros otherwise
    error: str = ""

    ARRAYS = ("batch", "verify", "forward_s", "emitted", "headroom_bytes", "workspace_bytes", "prompts")

    def to_json(self) -> dict:
        return {"kind": self.kind, "error": self.error,
                **{k: np.asarray(getattr(self, k)).tolist() for k in self.ARRAYS}}

    @staticmethod
    def from_json(d: dict, mapping, policies, kind: str | None = None, width: int | None = None,
                  unrun: bool = False) -> "Group | None":
        """The group a cache file holds, or None when it is not one this search could have evaluated (recompute
        it): of ``kind``, arrays of one row per batch (``forward_s`` (R,) for decode, (R, ``width``) otherwise),
        finite times > 0, whole batches >= 1 and verify lengths >= 0, 1 <= emitted <= 1 + verify,
        0 <= prompts <= batch·emitted, workspace >= 0. A checksum vouches for a file's bytes, not its sense:
        an entry edited and resealed (NaN, a negative batch, a 1-D mixed program) was trusted and crashed the
        search or ranked negative throughputs."""
        try:
            arr = {k: np.asarray(d[k], dtype=np.float64) for k in Group.ARRAYS}
            ok = isinstance(d["kind"], str) and isinstance(d["error"], str) and (kind is None or d["kind"] == kind) \
                and len({len(v) for k, v in arr.items() if k != "forward_s"} | {len(arr["forward_s"])}) == 1 and \
                all(np.isfinite(v).all() for k, v in arr.items() if k != "forward_s") and \
                _times(arr["forward_s"], d["kind"] != "decode" and unrun)
            ok = ok and (bool(d["error"]) or _sane_rows(arr, d["kind"], width))
        except (KeyError, TypeError, ValueError):
            return None
        return Group(d["kind"], mapping, policies, error=d["error"], **arr) if ok else None


def _times(f: np.ndarray, unrun: bool = False) -> bool:
    """Forward times: > 0 and finite, or — with ``unrun``: a prefill or mixed group of a search whose engine step
    terms are in force — NaN where that engine does not run the step (a prompt over its token budget). A decode
    row an engine does not run is not offered at all, and the SOL search runs every step."""
    finite = np.isfinite(f) & (f > 0)
    return bool((np.isnan(f) | finite).all() if unrun else finite.all())


def _sane_rows(a: dict, kind: str, width: int | None) -> bool:
    """What every evaluated group's arrays satisfy (see :meth:`Group.from_json`)."""
    b, v, e, f = a["batch"], a["verify"], a["emitted"], a["forward_s"]
    rows = b.size
    shaped = rows >= 1 and all(x.ndim == 1 for k, x in a.items() if k != "forward_s") and (
        f.shape == (rows,) if kind == "decode" else f.ndim == 2 and f.shape[0] == rows and width in (None, f.shape[1]))
    whole = all(bool(((x == np.floor(x)) & (x < 2.0**53)).all()) for x in (b, v))
    return shaped and whole and bool((b >= 1).all() and (v >= 0).all() and (e >= 1).all() and
                                     (e <= (1.0 + v) * (1 + 1e-9)).all() and (a["prompts"] >= 0).all() and
                                     (a["prompts"] <= b * e * (1 + 1e-9)).all() and (a["workspace_bytes"] >= 0).all())


class _Search:
    def __init__(self, model, hw, gpus, traffic, sla, space, profile, view, reserve_gib, cache=None, progress=None,
                 jobs: int = 1, engine=None, executor: str = "local", address: str | None = None):
        self.model, self.hw, self.gpus, self.traffic, self.sla, self.space = model, hw, gpus, traffic, sla, space
        self.profile, self.view, self.reserve_gib, self.engine = profile, view, reserve_gib, engine
        #: the engine's step terms (limits, chunked prompts, host time): a prediction's only — the SOL view and the
        #: SOL twin keep the engine's memory rule and pay no step terms
        predicted = profile is not None or view_name(view) != "sol"
        self.serving = engine if predicted else None
        self.cache, self.progress, self.jobs = cache or _Cache(None), progress, jobs
        self.executor, self.address = executor, address
        self.args = (model, hw, gpus, traffic, sla, space, profile, view, reserve_gib, engine)  # what a worker rebuilds
        self.groups: dict = {}
        self.skipped: list = []
        self.history: list = []  # every work set _assemble was given, in order (the SOL twin replays them)
        # pools of the search (set by search()), rows assembled so far: aggregated (mapping, policies), pools by
        # time axes, disaggregated pairs
        self.agg_maps, self.dd_maps, self.pp_maps = [], [], []
        self.assembled, self.pools, self.paired = set(), {}, set()
        self.compiled = self.cached = 0
        #: graphs (and SOL-class programs) shared by this search's plans and its SOL twin's (same plans, no view)
        self.compiles = CompileCache()
        self.twin, self.twin_rows = None, []  # the SOL twin and its rows (graphsim.serving.search.rank.start_twin)
        self.bind_view = _opened(view)
        # everything a cached program depends on: the model's whole state (config, weight formats, redundant
        # experts), the descriptor, profile, view, traffic and the grids
        from ...core.version import __version__

        state = {k: repr(v) for k, v in sorted(model.__getstate__().items())}
        self.identity = hashlib.sha256(json.dumps(
            [__version__, "search-2", Group.ARRAYS, MIXED_BLOCKS, state, attrs.asdict(hw),
             profile and attrs.asdict(profile),
             view and attrs.asdict(view), traffic.to_dict(), reserve_gib, space.batches, space.prefill_batches,
             space.acceptance, _view_digests(view), engine and attrs.asdict(engine)], default=str,
            sort_keys=True).encode()).hexdigest()

    # -- one program ---------------------------------------------------------------------------------------
    def group(self, kind: str, mapping: ParallelMapping, policies: Policies) -> Group:
        key = _key(kind, mapping, policies)
        if key in self.groups:
            return self.groups[key]
        g = self._cached(key)
        if g is not None:
            return self._store(key, g, computed=False)
        try:
            g = self._evaluate(*key)
        except GraphsimError as e:
            g = _failed(*key, str(e))
        return self._store(key, g, computed=True)

    def _cached(self, key) -> Group | None:
        d = self.cache.get(self._digest(key), self.identity)
        width = None if key[0] == "decode" else (len(MIXED_BLOCKS) if key[0] == "mixed" else 1) * len(self.traffic.isl)
        return Group.from_json(d, key[1], key[2], key[0], width, unrun=self.serving is not None) \
            if isinstance(d, dict) else None

    def _digest(self, key) -> str:
        kind, mapping, policies = key
        return hashlib.sha256(f"{self.identity}|{kind}|{mapping}|{policies!r}".encode()).hexdigest()[:24]

    def _store(self, key, g: Group, computed: bool) -> Group:
        if computed:
            self.compiled += 1
            self.cache.put(self._digest(key), g.to_json(), self.identity)
        else:
            self.cached += 1
        if g.error:
            self.skipped.append({"what": f"{key[0]} {key[1]} {policy_text(key[2])}", "error": g.error})
        self.groups[key] = g
        if self.progress:
            self.progress(1)
        return g

    def prefetch(self, keys: list) -> None:
        """Evaluate the programs of ``keys`` that are neither evaluated nor cached on ``jobs`` spawned worker
        processes, one mapping per task (a mixed program needs its decode program); each worker keeps its
        model's build cache across tasks. The programs, and so the rows, are the same as evaluated here."""
        by_map: dict = {}
        for key in keys:
            if key in self.groups:
                continue
            g = self._cached(key)
            if g is not None:
                self._store(key, g, computed=False)
            else:
                by_map.setdefault(key[1], []).append(key)
        if self.executor == "ray" and by_map:
            return self._prefetch_ray(by_map)
        if self.jobs <= 1 or len(by_map) < 2:
            return
        import multiprocessing as mp
        import os
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from ...sweep.workers import pool_initializer

        ctx = mp.get_context("spawn")  # JAX is not fork-safe once initialised
        # every worker dies with this process (SIGKILL of the search leaves no orphan; issue 26)
        with ProcessPoolExecutor(min(self.jobs, len(by_map)), mp_context=ctx, initializer=pool_initializer,
                                 initargs=(os.getpid(), _worker_init, self.args)) as ex:
            tasks = [ex.submit(_worker_run, sorted(ks, key=lambda k: k[0] == "mixed")) for ks in by_map.values()]
            for fut in as_completed(tasks):
                for key, d in fut.result():
                    if key not in self.groups:
                        self._store(key, Group.from_json(d, key[1], key[2], unrun=self.serving is not None),
                                    computed=True)

    def _prefetch_ray(self, by_map: dict) -> None:
        """:meth:`prefetch` on a Ray cluster (``executor="ray"``, ``address``; default a local instance): one task per
        mapping, each worker building its search once (the same programs, so the same rows, as here)."""
        from ...sweep.executors import ray_init

        ray = ray_init(self.address)
        task = ray.remote(_ray_run)
        args = ray.put(self.args)
        refs = [task.remote(args, sorted(ks, key=lambda k: k[0] == "mixed")) for ks in by_map.values()]
        for got in ray.get(refs):
            for key, d in got:
                if key not in self.groups:
                    self._store(key, Group.from_json(d, key[1], key[2], unrun=self.serving is not None),
                                computed=True)

    def _evaluate(self, kind, mapping, policies) -> Group:
        from ..fit import MemoryModel
        from ...driver.metrics import emitted
        from ...core.workload import Workload

        t = self.traffic
        spec = policies.dspark == "on" or policies.mtp > 0
        kmax = (len(policies.acceptance) if policies.dspark == "on" else policies.mtp) if spec else 0
        dp = mapping.dp
        if kind == "mixed":
            return self._mixed(mapping, policies, kmax)
        if kind == "decode":
            per_rank = [b for b in self.space.batches if policies.overlap == "none" or b >= 2]
            require(bool(per_rank), "batches", "two-batch overlap needs >= 2 requests per DP rank")
            # one request structure for every mapping, so the model's build cache serves them all
            req = f"decode:{t.decode_context}x{max(self.space.batches) * self.gpus}" + (f"v{kmax}" if kmax else "")
            c = compile_plan(self.model, Plan([req], mapping, policies), self.hw, self.profile, view=self.bind_view,
                             cache=self.compiles)
            mm = MemoryModel(self.model, self.hw, mapping, policies, kind="decode", reserve_gib=self.reserve_gib,
                             compiled=c, engine=self.engine)

            def room(b):  # requests per DP rank -> HBM left at the steady-state occupancy (widest verify)
                b = np.asarray(b, dtype=np.float64)
                ctx = t.memory_context(b)
                return mm.headroom(b * dp, ctx, mm.workspace(b * dp, ctx, 1.0 + kmax))

            per_rank = sorted(set(per_rank) | set(_largest_between(room, per_rank)))
            sv = self.serving
            if sv is not None:  # requests and tokens per step of one engine instance (one DP rank)
                cap, budget = sv.max_running or math.inf, sv.budget(dp)
                per_rank = [b for b in per_rank if b <= cap and (b * (1 + kmax) <= budget or not sv.decode_in_budget)]
                require(bool(per_rank), "engine", f"no decode batch per DP rank within {sv.name}'s limits "
                        f"(max_running={sv.max_running}, {budget:g} tokens a step)")
            batch = np.array([b * dp for b in per_rank], dtype=np.float64)
            if mapping.pp > 1:
                batch = batch[batch >= max(mapping.pp, policies.pp_micro_batches)]
                require(batch.size > 0, "batches", "pipeline decode needs a batch of at least pp requests")
            verify = np.arange(1, kmax + 1, dtype=np.float64) if policies.dspark == "on" else \
                np.array([float(kmax)])
            batch, verify = (a.ravel() for a in np.meshgrid(batch, verify, indexing="ij"))
            new = 1.0 + verify
            wl = Workload(("decode",), batch[:, None], new[:, None], np.full((batch.size, 1), t.decode_context))
            fwd = np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64)
            if self.serving is not None:  # a decode-only step: a CUDA graph replay up to the engine's graph batch
                fwd = self._routed(c, req, mapping, policies, wl, fwd, batch * new)
                fwd = self.serving.step_time(fwd, kernels(c), self.serving.graphed(batch / dp))
            em = emitted(("decode",), new[:, None], policies)[:, 0]
            ctx = t.memory_context(batch / dp)
            work = mm.workspace(batch, ctx, new)
        else:
            isl = np.asarray(t.isl, dtype=np.float64)
            req = f"prefill:{int(isl.max())}x{max(self.space.prefill_batches) * self.gpus}"
            c = compile_plan(self.model, Plan([req], mapping, policies), self.hw, self.profile, view=self.bind_view,
                             cache=self.compiles)
            mm = MemoryModel(self.model, self.hw, mapping, policies, kind="prefill", reserve_gib=self.reserve_gib,
                             compiled=c, engine=self.engine)
            ctx = int(isl.max())

            def room(p):  # prompts per DP rank -> HBM left
                b = np.asarray(p, dtype=np.float64) * dp
                return mm.headroom(b, ctx, mm.workspace(b, ctx))

            # the grid, then powers of two up to the most prompts that fit and that most itself
            top = _largest_fit(room, MAX_PREFILL_PER_RANK)
            per_rank = set(self.space.prefill_batches) | {1} | {1 << k for k in range(top.bit_length())} | {top}
            per_rank = sorted(p for p in per_rank if p >= 1 and (policies.overlap == "none" or p >= 2))
            require(bool(per_rank), "prefill_batches", "two-batch overlap needs >= 2 prompts per DP rank")
            batch = np.array([p * dp for p in per_rank], dtype=np.float64)
            verify = np.zeros_like(batch)
            bb, ii = np.meshgrid(batch, isl, indexing="ij")  # (R, classes)
            wl = Workload(("prefill",), bb.reshape(-1, 1), ii.reshape(-1, 1), np.zeros((bb.size, 1)))
            fwd = np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64).reshape(bb.shape)
            require(bool(np.all(np.isfinite(fwd))), "view", f"no {kind} time for {mapping} under this view")
            if self.serving is not None:
                fwd = self._engine_prefill(c, req, mapping, policies, per_rank, isl, fwd)
            em = np.ones_like(batch)
            work = mm.workspace(batch, ctx)
        require(bool(np.all(np.isfinite(fwd) | np.isnan(fwd))), "view", f"no {kind} time for {mapping} under this view")
        headroom = mm.headroom(batch, ctx, work)
        return Group(kind, mapping, policies, batch, verify, fwd, em, headroom, np.asarray(work, np.float64),
                     np.zeros_like(batch))

    def _routed(self, c, req, mapping, policies, wl, fwd, tokens) -> np.ndarray:
        """Decode forwards with the hottest EP rank at the routing statistics' expected load
        (:func:`graphsim.serving.moe.hottest_rank_factor` for each step's routed ``tokens``): the program priced at
        ``ep_imbalance`` 1 and 2 (its expert work and dispatch bytes scale with the hot rank's tokens), the
        difference scaled by factor − 1. Untouched where the term is off, on one EP rank, without routed experts
        or when the policies fix ``ep_imbalance`` themselves."""
        from .. import hottest_rank_factor

        sv = self.serving
        moe = next((op.info for op in c.graph.ops if op.kind == "moe_experts" and op.info.experts), None)
        if not sv.moe_routing or mapping.ep <= 1 or moe is None or policies.ep_imbalance != 1.0:
            return fwd
        factor = hottest_rank_factor(tokens, moe.top_k, moe.experts, mapping.ep, sv.moe_load_ratio, sv.eplb)
        c2 = compile_plan(self.model, Plan([req], mapping, attrs.evolve(policies, ep_imbalance=2.0)), self.hw,
                          self.profile, view=self.bind_view)  # the prediction's own (the twin pays no step terms)
        hot = np.asarray(c2.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64)
        return fwd + (factor - 1.0) * (hot - fwd)

    def _engine_prefill(self, c, req, mapping, policies, per_rank, isl, whole) -> np.ndarray:
        """Prefill forwards (rows of ``per_rank`` prompts per DP rank, one column per class) as the engine runs
        them: within its token budget one step (``whole``), else the steps of :func:`prefill_steps` — chunks with
        ``past`` = the prompt's earlier chunks, or whole prompts packed — each a forward of a three-group program
        (the rest of a begun prompt, whole prompts, the next prompt's head), summed; NaN where the engine does not
        run it. Every step pays the engine's host terms."""
        from .. import prefill_steps

        sv, dp = self.serving, mapping.dp
        k = kernels(c)
        out = np.asarray(sv.step_time(whole, k), dtype=np.float64)
        plan = {}
        for r, p in enumerate(per_rank):
            for j, n in enumerate(isl):
                steps = prefill_steps(p, int(n), sv.budget(dp), sv.chunked_prefill)
                if steps is None:
                    out[r, j] = np.nan
                elif len(steps) > 1:
                    plan[(r, j)] = steps
        if plan:
            c3 = compile_plan(self.model, Plan([req] * 3, mapping, policies), self.hw, self.profile,
                              view=self.bind_view)  # the prediction's own
            out = _sum_steps(out, plan, c3, ("prefill",) * 3, dp, sv, k)
        return out

    def _mixed(self, mapping, policies, kmax: int) -> Group:
        """Aggregated steps that prefill prompts together with the running decode batch. A replica admits
        f = B·E/(OSL·dp) prompts per DP group and step on average, so its steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts
        (whole prompts, one per DP group at a time). At every (batch, verify) row of the decode program, per
        traffic class: the forward of the B decodes with each of those prompt counts, then — the same program
        without the decodes — a prefill-only step of the dp·⌈f⌉ prompts and one prompt alone. ``forward_s``
        is (rows, 4 × classes) in the blocks :data:`MIXED_BLOCKS`; ``prompts`` holds f."""
        from ...core.workload import Workload

        t = self.traffic
        dec = self.group("decode", mapping, policies)
        require(not dec.error, "decode", dec.error)
        dp = mapping.dp
        f = dec.batch * dec.emitted / (t.mean_osl * dp)
        lo, hi = dp * np.floor(f), dp * np.maximum(1.0, np.ceil(f))
        isl = np.asarray(t.isl, dtype=np.float64)
        reqs = [f"prefill:{int(isl.max())}x{max(self.space.batches) * self.gpus}",
                f"decode:{t.decode_context}x{max(self.space.batches) * self.gpus}" + (f"v{kmax}" if kmax else "")]
        c = compile_plan(self.model, Plan(reqs, mapping, policies), self.hw, self.profile, view=self.bind_view,
                         cache=self.compiles)
        R, C, K = dec.batch.size, isl.size, len(MIXED_BLOCKS)

        def each(a):  # (R,) -> (R·K·C,): row-major over rows, then blocks, then classes
            return np.repeat(np.asarray(a, dtype=np.float64), K * C)

        prompts = np.stack([lo, hi, hi, np.ones(R)], axis=1).repeat(C, axis=1).ravel()
        decodes = each(dec.batch) * np.tile(np.repeat([1.0, 1.0, 0.0, 0.0], C), R)
        count = np.stack([prompts, decodes], axis=1)
        new = np.stack([np.tile(isl, K * R), each(1.0 + dec.verify)], axis=1)
        past = np.stack([np.zeros(K * R * C), np.full(K * R * C, float(t.decode_context))], axis=1)
        wl = Workload(("prefill", "decode"), count, new, past)
        fwd = np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64).reshape(R, K * C)
        require(bool(np.all(np.isfinite(fwd))), "view", f"no mixed-step time for {mapping} under this view")
        if self.serving is not None:
            fwd = self._engine_mixed(c, fwd, prompts.reshape(R, K * C), decodes.reshape(R, K * C),
                                     each(1.0 + dec.verify).reshape(R, K * C), np.tile(isl, K), dp)
        # memory: the decode batch's KV and weights as the decode program has them, the largest op's
        # activations of the heaviest step (the prompts' activations dwarf one decode token's)
        from ..fit import op_workspace

        work = op_workspace(c.program, wl).reshape(R, K * C).max(axis=1)
        headroom = dec.headroom_bytes + dec.workspace_bytes - np.maximum(dec.workspace_bytes, work)
        return Group("mixed", mapping, policies, dec.batch, dec.verify, fwd, dec.emitted, headroom, work, f)

    def _engine_mixed(self, c, fwd, prompts, decodes, new, isl, dp) -> np.ndarray:
        """Mixed-program steps (``(R, blocks x classes)``) as the engine runs them: within its token budget per DP
        rank (prompt tokens + decode tokens) one step; over it, a lone prompt or one prompt per DP rank with the
        decodes paused runs as chunks (or packed whole prompts) of the budget, each a step; a step that carries
        decodes or more than one prompt per rank over the budget is not offered (NaN: the engine would split it
        across steps, a schedule graphsim does not price yet). Every step pays the engine's host terms (eager
        launches: no graph holds a prefill)."""
        from .. import prefill_steps

        sv, k, budget = self.serving, kernels(c), self.serving.budget(dp)
        out = np.asarray(sv.step_time(fwd, k), dtype=np.float64)
        per_rank = np.where(prompts == 1, 1.0, prompts / dp)  # a lone prompt runs on one rank
        L = np.broadcast_to(isl, prompts.shape)
        tokens = per_rank * L + (decodes / dp * new if sv.decode_in_budget else 0.0)
        plan = {}
        for r, j in zip(*np.nonzero(tokens > budget)):
            steps = None
            if decodes[r, j] == 0 and per_rank[r, j] == 1:  # one prompt per rank alone: its chunks
                steps = prefill_steps(1, int(L[r, j]), budget, sv.chunked_prefill)
            if steps is None:
                out[r, j] = np.nan
            else:  # the prompt's piece on every rank that runs one; the decode group empty
                plan[(r, j)] = [((prompts[r, j], st[0][1], st[0][2]), (0.0, 1.0, 0.0)) for st in steps]
        if plan:
            out = _sum_steps(out, plan, c, ("prefill", "decode"), 1, sv, k)
        return out

    # -- deployments -----------------------------------------------------------------------------------------
    def agg_rows(self, mapping, policies) -> list[dict]:
        dec = self.group("decode", mapping, policies)
        if dec.error:
            return []
        t = self.traffic
        policies = canonical(policies, mapping)
        replicas = self.gpus // mapping.gpus
        if not (dec.headroom_bytes >= 0).any():
            # fits at no batch: no mixed program is built; its rows carry the decode step as a lower bound of
            # TPOT and TTFT, only to say by how much memory falls short
            return [self._row("agg", policies, mapping, replicas, mapping.dp, mapping, replicas, int(dec.batch[r]),
                              int(dec.verify[r]), dec.forward_s[r], dec.forward_s[r] / dec.emitted[r],
                              replicas * dec.batch[r] * dec.emitted[r] / dec.forward_s[r], replicas * mapping.gpus,
                              dec.headroom_bytes[r], "mixed", dec.forward_s[r] / dec.emitted[r])
                    for r in range(dec.batch.size)]
        mix = self.group("mixed", mapping, policies)
        if mix.error:
            return []
        rows = []
        for step, pb, ttft, tpot, p99 in agg_schedules(mix, dec.forward_s, t.w, mapping.dp):
            for r in range(dec.batch.size):
                if not np.isfinite(tpot[r]):
                    continue
                rows.append(self._row("agg", policies, mapping, replicas, int(pb[r]), mapping, replicas,
                                      int(dec.batch[r]), int(dec.verify[r]), ttft[r], tpot[r],
                                      replicas * dec.batch[r] / tpot[r], replicas * mapping.gpus,
                                      mix.headroom_bytes[r], step, p99[r]))
        return rows

    def disagg_rows(self, pre_groups: list, dec_groups: list) -> list[dict]:
        from ..disagg import Pool, handover_seconds

        t = self.traffic
        cands = []  # prefill candidates: (group, row, ttft without transfer, requests/s per replica)
        for g in pre_groups:
            for r in range(g.batch.size):
                if g.headroom_bytes[r] < 0 or g.batch[r] % g.mapping.dp or np.isnan(g.forward_s[r]).any():
                    continue  # does not fit, or its engine does not run the prefill
                tp = float(g.forward_s[r].max())
                cands.append((g, r, tp, g.batch[r] / float(t.w @ g.forward_s[r])))
        cands = _pareto_min_max(cands, lambda c: c[2], lambda c: c[3] / c[0].mapping.gpus)
        rows = []
        kv_cache: dict = {}
        mean_osl = t.mean_osl
        for d in dec_groups:
            rate_d = d.batch * d.emitted / (mean_osl * d.forward_s)  # requests/s per decode replica
            tpot = d.forward_s / d.emitted
            dpol = canonical(d.policies, d.mapping)
            for g, r, tp, rate_p in cands:
                if (g.policies.dspark, g.policies.mtp) != (d.policies.dspark, d.policies.mtp):
                    continue  # both pools run the same drafter (it keeps state from the prompt)
                gpol = canonical(g.policies, g.mapping)
                pair = (g.mapping, g.policies, int(g.batch[r]), d.mapping, d.policies)
                if pair in self.paired:
                    continue
                self.paired.add(pair)
                n_p, n_d = g.mapping.gpus, d.mapping.gpus
                key = (g.mapping, d.mapping, int(g.batch[r]), tp)
                if key not in kv_cache:
                    kv_cache[key] = handover_seconds(self.model, self.hw, Pool(g.mapping, int(g.batch[r])),
                                                     Pool(d.mapping, 1), int(max(t.isl)), tp)[0]
                ttft = tp + kv_cache[key]
                xs = np.arange(1, (self.gpus - n_d) // n_p + 1, dtype=np.float64)
                if xs.size == 0:
                    continue
                ymax = np.floor((self.gpus - xs * n_p) / n_d)[:, None]
                # replica counts near rate balance and the most decode replicas that fit; TTFT and TPOT do not
                # depend on them, so one row per pool pair and batch: the best tokens/s per GPU, fewest GPUs
                yb = xs[:, None] * rate_p / rate_d[None, :]  # (x, batch)
                ys = np.clip(np.stack([np.floor(yb), np.ceil(yb), np.broadcast_to(ymax, yb.shape)]), 1.0, ymax)
                xx = np.broadcast_to(xs[:, None], ys.shape)
                used = (xx * n_p + ys * n_d).reshape(-1, yb.shape[1])
                per_gpu = (np.minimum(xx * rate_p, ys * rate_d[None, :]) / (xx * n_p + ys * n_d)).reshape(used.shape)
                top = per_gpu == per_gpu.max(axis=0)
                pick = np.argmin(np.where(top, used, np.inf), axis=0)
                xs_, ys_ = xx.reshape(used.shape), ys.reshape(used.shape)
                for j in range(d.batch.size):
                    if d.headroom_bytes[j] < 0 and j:  # the smallest batch stays: "memory" is reported
                        continue
                    i = pick[j]
                    rows.append(self._row(
                        "disagg", dpol, g.mapping, int(xs_[i, j]), int(g.batch[r]), d.mapping, int(ys_[i, j]),
                        int(d.batch[j]), int(d.verify[j]), ttft, tpot[j], per_gpu[i, j] * used[i, j] * mean_osl,
                        int(used[i, j]), min(g.headroom_bytes[r], d.headroom_bytes[j]), "disagg", tpot[j],
                        prefill_policies=gpol))
        return rows

    def _row(self, mode, policies, pmap, prep, pbatch, dmap, drep, dbatch, verify, ttft_s, tpot_s, out_tps, gpus,
             headroom, ttft_step, tpot_p99_s, prefill_policies=None) -> dict:
        ptxt = policy_text(policies)
        if prefill_policies is not None and policy_text(prefill_policies) != ptxt:
            ptxt = f"prefill:{policy_text(prefill_policies)} decode:{ptxt}"
        mapping = str(dmap) + (f" x{drep}" if drep > 1 else "") if mode == "agg" else \
            f"P {pmap} x{prep} + D {dmap} x{drep}"
        return {"mode": mode, "mapping": mapping, "policies": ptxt, "gpus": int(gpus),
                "prefill_mapping": str(pmap), "prefill_replicas": int(prep), "prefill_batch": int(pbatch),
                "prefill_gpus": int(pmap.gpus * prep) if mode == "disagg" else int(gpus),
                "decode_mapping": str(dmap), "decode_replicas": int(drep), "decode_batch": int(dbatch),
                "decode_gpus": int(dmap.gpus * drep) if mode == "disagg" else int(gpus), "verify": int(verify),
                "ttft_ms": float(ttft_s) * 1e3, "ttft_step": ttft_step, "tpot_ms": float(tpot_s) * 1e3,
                "tpot_p99_ms": float(tpot_p99_s) * 1e3,
                "tokens_per_s_per_user": 1.0 / float(tpot_s), "tokens_per_s_per_gpu": float(out_tps) / gpus,
                "output_tokens_per_s": float(out_tps), "memory_headroom_gib": float(headroom) / GiB,
                # the request rate the deployment sustains (its output rate over the mean output length), the
                # requests in flight at once (decode slots of every replica), and output tokens per joule at board
                # power (every GPU at its TDP: a lower bound; graphsim.driver.metrics.energy_metrics)
                "requests_per_s": float(out_tps) / self.traffic.mean_osl,
                "concurrency": int(dbatch) * int(drep),
                "output_tokens_per_joule": float(out_tps) / (gpus * self.hw.power_w) if self.hw.power_w > 0
                else float("nan"),
                "fits": bool(headroom >= 0), "_policies": policies, "_prefill_policies": prefill_policies or policies,
                "_pmap": pmap, "_dmap": dmap}


def _opened(view):
    """The view its programs bind: a measured view's tables opened once, so every program of the search binds
    one snapshot of the folder (the one its identity digests were taken of), not a fresh look per program."""
    from ...views.measured.view import ViewSpec

    if isinstance(view, ViewSpec) and view.name in ("op", "hybrid") and isinstance(view.measured, (str, os.PathLike)):
        return attrs.evolve(view, measured=view.store())
    return view


def _key(kind: str, mapping: ParallelMapping, policies: Policies) -> tuple:
    """A program's key: a decode program ignores the prefill-only policies (one compile serves them all), and
    no program keeps a field that changes nothing on its mapping (:func:`canonical`)."""
    policies = canonical(policies, mapping)
    if kind == "decode":
        policies = attrs.evolve(policies, **{f: getattr(Policies(), f) for f in PREFILL_ONLY})
    return (kind, mapping, policies)


_WORKER: list = []  # a worker process's _Search


def _worker_init(args) -> None:
    _WORKER[:] = [_Search(*args[:9], engine=args[9])]


def _ray_run(args, keys: list) -> list:
    """A Ray task: this worker's search — kept across tasks of the same search (its identity digest), so the
    model's build cache serves them all — then :func:`_worker_run`."""
    fresh = _Search(*args[:9], engine=args[9])
    if not _WORKER or _WORKER[0].identity != fresh.identity:
        _WORKER[:] = [fresh]
    return _worker_run(keys)


def _worker_run(keys: list) -> list:
    """Evaluate ``keys`` (one mapping's programs, decode first) in a worker; a replica that fits at no batch
    gets no mixed program, as :meth:`_Search.agg_rows` decides here."""
    s, out = _WORKER[0], []
    for key in keys:
        if key[0] == "mixed":
            dec = s.group(*_key("decode", key[1], key[2]))
            if dec.error or not (dec.headroom_bytes >= 0).any():
                continue
        g = s.group(*key)
        out.append((key, g.to_json()))
    return out


def _failed(kind, mapping, policies, error) -> Group:
    z = np.zeros(0)
    return Group(kind, mapping, policies, z, z, z, z, z, z, z, error=" ".join(error.split()))

