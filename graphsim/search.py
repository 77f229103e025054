"""Find the best deployment: an SLA-constrained search over aggregated and disaggregated serving, parallel
mappings, batch sizes and the model's policies, with the Pareto front of tokens/s per GPU against tokens/s
per user.

The serving model (docs/search.md says the same, with the launch-flag table):

* **traffic**: request classes (ISL, OSL, weight); one class from ``isl``/``osl``. Decode runs at the
  token-weighted mean context Σw·osl·(isl + osl/2) / Σw·osl; memory must hold every request of a batch at its
  full length (the weighted mean of isl + osl — one class: isl + osl);
* **aggregated** (``agg``): ``gpus // n`` replicas of an ``n``-GPU mapping, each running ``B`` requests. A
  new prompt is prefilled whole in one step *together with* the running decodes (mixed batches: vLLM's
  chunked prefill, SGLang's mixed chunks), so prefill and decode share each weight read — the fastest
  schedule, as a SOL must assume. Per step every request gets E tokens (1, or the expected emitted tokens of
  speculative decoding), so f = B·E/(ōsl·dp) of the steps carry one prompt per DP group:
  step = (1 − f)·T_dec(B) + f·T_mix(B, dp prompts) (f > 1: steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts),
  TPOT = step / E, TTFT = T_mix (no queueing), output tokens/s per GPU = B / TPOT / n;
* **disaggregated** (``disagg``): ``x`` prefill replicas (``p`` prompts per forward) and ``y`` decode
  replicas (``B`` requests) with x·n_p + y·n_d ≤ the GPUs (as :mod:`graphsim.disagg`): TTFT = T_pre(p) + the
  KV hand-over, TPOT = T_dec(B)/E, system rate = min(x·p/T_pre, y·B·E/(ōsl·T_dec)) requests/s, tokens/s per
  GPU over the GPUs used. For each pair of pools and batch, the replica counts near rate balance (and the
  most decode replicas that fit) are tried and the best tokens/s per GPU kept (fewest GPUs on a tie: TTFT and
  TPOT do not depend on the counts);
* every forward time is graphsim's (the view and profile the search runs under), evaluated for all batch
  sizes of a (kind, mapping, policies) program in one vectorized call; each program is compiled once.

The policy space is searched in two stages: every mapping under the base policies (the first value of each
policy axis), then, for the mappings of the best deployments, every single-axis variant plus the
combination of the best value of each axis (``exhaustive=True``: the whole product). Speculative decoding
(MTP, DSpark) enters only with an acceptance profile: its throughput is E[emitted tokens] / step time, never
a fixed rate.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import time
from pathlib import Path
from typing import Callable, Mapping

import attrs
import numpy as np

from .errors import GraphsimError, require
from .limits import MAX_CONTEXT, MAX_RANKS, MAX_REQUESTS, check_int, check_number
from .pipeline import Plan, Policies, compile_plan
from .plan import ParallelMapping

GiB = 2.0**30
MODES = ("agg", "disagg")
#: decode requests per attention-DP rank (a replica's batch is this times dp)
DEFAULT_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
                   640, 768, 896, 1024)
#: prompts per attention-DP rank in one prefill forward of a disaggregated prefill pool
DEFAULT_PREFILL_BATCHES = (1, 2, 4, 8)
#: policy axes searched by default, when the model supports more than one value (base value first)
POLICY_AXES = ("fusion", "overlap", "decoder_replay", "engram")
#: fields that change only prefill token sets (a decode program ignores them, so decode shares one compile)
PREFILL_ONLY = ("decoder_replay",)
#: why a deployment lost, in the order they are listed: a policy variant of a ranked mapping, feasible but
#: slower than the last ranked one, then the SLA bound it misses at every batch that fits, then memory
REASONS = ("variant", "throughput", "tpot", "min_user_speed", "ttft", "memory")
ROW_KEYS = ("mode", "mapping", "policies", "gpus", "prefill_mapping", "prefill_replicas", "prefill_batch",
            "prefill_gpus", "decode_mapping", "decode_replicas", "decode_batch", "decode_gpus", "verify",
            "ttft_ms", "tpot_ms", "tokens_per_s_per_user", "tokens_per_s_per_gpu", "output_tokens_per_s",
            "memory_headroom_gib", "fits", "meets_sla", "pareto")


# ---- inputs -------------------------------------------------------------------------------------------------
@attrs.frozen
class Traffic:
    """Request classes: prompt tokens ``isl``, output tokens ``osl`` and a relative ``weight`` each."""

    isl: tuple = attrs.field(converter=tuple)
    osl: tuple = attrs.field(converter=tuple)
    weight: tuple = attrs.field(converter=tuple)

    def __attrs_post_init__(self):
        require(len(self.isl) > 0 and len(self.isl) == len(self.osl) == len(self.weight), "traffic",
                "give one or more classes, each with isl, osl and weight")
        for f in ("isl", "osl"):
            for v in getattr(self, f):
                check_int(f"traffic.{f}", v, 1, MAX_CONTEXT)
        for w in self.weight:
            require(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0,
                    "traffic.weight", f"must be a positive number, got {w!r}")

    @staticmethod
    def of(isl: int, osl: int) -> "Traffic":
        return Traffic((isl,), (osl,), (1.0,))

    @staticmethod
    def load(path: str | Path) -> "Traffic":
        """A request-length distribution: CSV, JSON (a list of objects) or Parquet with columns ``isl``,
        ``osl`` and optionally ``weight`` (or ``count``); equal (isl, osl) rows are merged."""
        p = Path(path)
        require(p.is_file(), "lengths", f"{path} is not a file")
        try:
            if p.suffix == ".json":
                rows = json.loads(p.read_text())
                require(isinstance(rows, list), "lengths", "a JSON file holds a list of {isl, osl, weight}")
            else:
                import pandas as pd

                df = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
                rows = df.to_dict("records")
        except GraphsimError:
            raise
        except Exception as e:  # noqa: BLE001 - any parse failure is the file's
            raise GraphsimError("lengths", f"cannot read {p.name}: {' '.join(str(e).split())[:120]}") from None
        merged: dict = {}
        for i, r in enumerate(rows):
            require(isinstance(r, Mapping) and "isl" in r and "osl" in r, "lengths",
                    f"row {i} needs isl and osl columns")
            w = r.get("weight", r.get("count", 1.0))
            vals = (r["isl"], r["osl"], w)
            require(not any(isinstance(v, bool) for v in vals), "lengths", f"row {i}: true/false is not a number")
            try:
                key, w = (int(r["isl"]), int(r["osl"])), float(w)
                whole = all(float(r[k]) == int(r[k]) for k in ("isl", "osl"))
            except (TypeError, ValueError, OverflowError):
                raise GraphsimError("lengths", f"row {i}: isl/osl must be integers, weight a number") from None
            require(whole, "lengths", f"row {i}: isl/osl must be whole token counts, got {r['isl']!r}, {r['osl']!r}")
            merged[key] = merged.get(key, 0.0) + w
        require(bool(merged), "lengths", f"{p.name} has no rows")
        keys = sorted(merged)
        return Traffic([k[0] for k in keys], [k[1] for k in keys], [merged[k] for k in keys])

    @property
    def w(self) -> np.ndarray:
        w = np.asarray(self.weight, dtype=np.float64)
        w = w / w.max()  # first to the largest: a sum of huge weights would overflow
        return w / w.sum()

    @property
    def mean_osl(self) -> float:
        return float(self.w @ np.asarray(self.osl, dtype=np.float64))

    @property
    def decode_context(self) -> int:
        """Token-weighted mean context of a decode step."""
        i, o = np.asarray(self.isl, dtype=np.float64), np.asarray(self.osl, dtype=np.float64)
        # one class: isl + osl // 2, the context graphsim.disagg decodes at
        return max(1, int(float((self.w * o) @ (i + np.floor(o / 2.0))) / float(self.w @ o)))

    @property
    def fit_context(self) -> int:
        """Context each request of a batch is held at for the memory check: its full length, weighted."""
        i, o = np.asarray(self.isl, dtype=np.float64), np.asarray(self.osl, dtype=np.float64)
        return int(math.ceil(float(self.w @ (i + o))))

    def to_dict(self) -> dict:
        return {"classes": [{"isl": int(i), "osl": int(o), "weight": float(w)}
                            for i, o, w in zip(self.isl, self.osl, self.w)],
                "mean_osl": self.mean_osl, "decode_context": self.decode_context,
                "fit_context": self.fit_context}


@attrs.frozen
class SLA:
    """Bounds a deployment must meet (None: unbounded). TTFT holds for every request class."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    min_tokens_per_s_per_user: float | None = None

    def __attrs_post_init__(self):
        for f in ("ttft_ms", "tpot_ms", "min_tokens_per_s_per_user"):
            v = getattr(self, f)
            require(v is None or (isinstance(v, (int, float)) and math.isfinite(v) and v > 0), f"sla.{f}",
                    f"must be a positive number, got {v!r}")

    def to_dict(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen
class Space:
    """What is searched. ``tp``/``dp``/``ep``: allowed degrees (None: every degree the model and GPU count
    accept; TP·CP groups stay inside one NVLink domain); ``pp``/``cp`` default to 1 (pipeline decode is priced
    as a fill–drain forward, and CP is prefill-only: opt in). ``batches``: decode requests per DP rank;
    ``prefill_batches``: prompts per DP rank in a disaggregated prefill forward. ``policies``: (field, values)
    pairs replacing or adding to the default axes (:data:`POLICY_AXES` with the values the model supports;
    one value holds a field fixed). ``acceptance``: a_1..a_K to search
    speculative decoding (MTP-K, or DSpark with K = its block). ``refine``: how many of the best deployments'
    mappings get the policy stage."""

    modes: tuple = MODES
    tp: tuple | None = None
    dp: tuple | None = None
    ep: tuple | None = None
    pp: tuple = (1,)
    cp: tuple = (1,)
    batches: tuple = DEFAULT_BATCHES
    prefill_batches: tuple = DEFAULT_PREFILL_BATCHES
    policies: tuple | None = None  #: ((field, (values...)), ...)
    acceptance: tuple = ()
    refine: int = 4
    exhaustive: bool = False
    max_replica_gpus: int | None = None

    def __attrs_post_init__(self):
        require(bool(self.modes) and all(m in MODES for m in self.modes), "modes",
                f"each one of {', '.join(MODES)}, got {self.modes!r}")
        for f in ("tp", "dp", "ep", "pp", "cp", "batches", "prefill_batches"):
            v = getattr(self, f)
            if v is None:
                continue
            require(isinstance(v, tuple) and len(v) > 0, f, "give at least one value")
            cap = MAX_REQUESTS if "batch" in f else MAX_RANKS
            for x in v:
                check_int(f, x, 1, cap)
        check_int("refine", self.refine, 0, 1000)
        if self.max_replica_gpus is not None:
            check_int("max_replica_gpus", self.max_replica_gpus, 1, MAX_RANKS)
        for a in self.acceptance:
            require(isinstance(a, float) and 0.0 <= a <= 1.0, "acceptance", f"each a_i in [0, 1], got {a!r}")
        if self.policies is not None:
            fields = set(attrs.fields_dict(Policies))
            for field, values in self.policies:
                require(field in fields and field not in ("acceptance", "mtp", "dspark"), "policy",
                        f"{field!r} is not a searchable policy field (speculation is searched with --acceptance)")
                require(len(values) > 0, f"policy.{field}", "give at least one value")


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
    def from_json(d: dict, mapping, policies) -> "Group | None":
        """The group a cache file holds, or None when it is not one of this version's (recompute it)."""
        try:
            arr = {k: np.asarray(d[k], dtype=np.float64) for k in Group.ARRAYS}
            ok = isinstance(d["kind"], str) and isinstance(d["error"], str) and \
                len({len(v) for k, v in arr.items() if k != "forward_s"} | {len(arr["forward_s"])}) == 1
        except (KeyError, TypeError, ValueError):
            return None
        return Group(d["kind"], mapping, policies, error=d["error"], **arr) if ok else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mappings(model, hw, gpus: int, space: Space, kind: str) -> list[ParallelMapping]:
    """Every mapping the model accepts for ``kind`` within the space's degrees, of a replica size that divides
    ``gpus`` or is a power of two below it; TP·CP groups inside one NVLink domain (``hw.nvlink_domain``)."""
    out = []
    cap = min(gpus, space.max_replica_gpus or gpus)
    cps = space.cp if kind == "prefill" else (1,)
    sizes = sorted({n for n in _divisors(gpus) if n <= cap} | {1 << k for k in range(cap.bit_length()) if 1 << k <= cap})
    for n in sizes:
        for tp in _divisors(n):
            if space.tp is not None and tp not in space.tp:
                continue
            for cp in cps:
                if (n // tp) % cp or tp * cp > hw.nvlink_domain:
                    continue
                for pp in space.pp:
                    if (n // tp // cp) % pp:
                        continue
                    dp = n // tp // cp // pp
                    if space.dp is not None and dp not in space.dp:
                        continue
                    for ep in _divisors(tp * dp * cp):
                        if space.ep is not None and ep not in space.ep:
                            continue
                        m = ParallelMapping(tp=tp, dp=dp, ep=ep, pp=pp, cp=cp)
                        try:
                            model.validate_mapping(m)
                        except GraphsimError:
                            continue
                        out.append(m)
    return out


def policy_axes(model, space: Space) -> list[tuple[str, tuple]]:
    """(field, values) per searched policy axis, base value first; the speculative axis as ("spec", ...)."""
    from .pipeline import BASE_SUPPORT

    support = {**BASE_SUPPORT, **model.POLICY_SUPPORT, "overlap": ("none", "two-batch")}
    axes = {f: support[f] for f in POLICY_AXES if len(support.get(f, ())) > 1}
    for f, vals in space.policies or ():  # a given axis replaces the default one (one value: held fixed)
        allowed = support.get(f)
        if allowed is not None:
            bad = [v for v in vals if v not in allowed]
            require(not bad, f"policy.{f}", f"{model.name} supports {f} in {allowed}, got {bad[0]!r}" if bad else "")
        axes[f] = tuple(vals)
    axes = list(axes.items())
    spec = ["off"]
    if space.acceptance:
        k = len(space.acceptance)
        if "on" in support.get("dspark", ()):
            d = getattr(getattr(model, "cfg", None), "dspark_block_size", k)
            require(k == d, "acceptance", f"{model.name}'s DSpark drafts {d} positions: give {d} values a_1..a_{d}")
            spec.append("dspark")
        spec += [f"mtp{j}" for j in range(1, min(k, model.max_mtp()) + 1)]  # every depth: a shallower may win
    if len(spec) > 1:
        axes.append(("spec", tuple(spec)))
    return axes


def policies_of(choice: Mapping, acceptance: tuple) -> Policies:
    """The Policies a point of the policy space names (``spec``: off, dspark or mtpK)."""
    kw = {k: v for k, v in choice.items() if k != "spec"}
    spec = choice.get("spec", "off")
    if spec == "dspark":
        kw.update(dspark="on", acceptance=acceptance)
    elif spec.startswith("mtp"):
        k = int(spec[3:])
        kw.update(mtp=k, acceptance=tuple(acceptance[:k]))
    return Policies(**kw)


@functools.lru_cache(maxsize=4096)
def policy_text(p: Policies) -> str:
    """The policies that differ from the defaults, e.g. ``fusion=single-pass,overlap=two-batch``."""
    base = Policies()
    out = []
    for f in attrs.fields(Policies):
        v = getattr(p, f.name)
        if v != getattr(base, f.name) and f.name != "acceptance":
            out.append(f"{f.name}={v}")
    return ",".join(out) or "default"


# ---- the search --------------------------------------------------------------------------------------------------
@attrs.frozen(eq=False)
class SearchResult:
    model: str
    hw: str
    gpus: int
    traffic: Traffic
    sla: SLA
    view: str
    profile: str
    table: object  #: pandas DataFrame, one row per (deployment, batch)
    best: list  #: top-N rows (dicts), one per deployment
    pareto: list  #: Pareto rows (dicts)
    rejected: list  #: deployments that lost, with the reason
    reasons: dict  #: reason -> deployments
    skipped: list  #: programs that could not be built: {"what", "error"}
    space: dict
    stats: dict

    def to_json(self) -> dict:
        from .outputs import SCHEMA_VERSION

        return {"schema_version": SCHEMA_VERSION, "command": "search", "model": self.model, "hw": self.hw, "gpus": self.gpus,
                "traffic": self.traffic.to_dict(), "sla": self.sla.to_dict(), "view": self.view,
                "profile": self.profile, "space": self.space, "best": self.best, "pareto": self.pareto,
                "rejected": self.rejected, "reasons": self.reasons, "skipped": self.skipped, "stats": self.stats}


class _Cache:
    """Evaluated groups on disk (``<dir>/<key>.json``), so an interrupted search resumes."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str):
        if self.folder is None:
            return None
        p = self.folder / f"{key}.json"
        try:
            return json.loads(p.read_text()) if p.is_file() else None
        except (OSError, ValueError):
            return None  # a torn file: recompute

    def put(self, key: str, d: dict) -> None:
        if self.folder is None:
            return
        from .outputs import write_text

        write_text(self.folder / f"{key}.json", json.dumps(d))


class _Search:
    def __init__(self, model, hw, gpus, traffic, sla, space, profile, view, reserve_gib, cache=None, progress=None,
                 jobs: int = 1):
        self.model, self.hw, self.gpus, self.traffic, self.sla, self.space = model, hw, gpus, traffic, sla, space
        self.profile, self.view, self.reserve_gib = profile, view, reserve_gib
        self.cache, self.progress, self.jobs = cache or _Cache(None), progress, jobs
        self.args = (model, hw, gpus, traffic, sla, space, profile, view, reserve_gib)  # what a worker rebuilds
        self.groups: dict = {}
        self.skipped: list = []
        self.compiled = self.cached = 0
        # everything a cached program depends on: the model's whole state (config, weight formats, redundant
        # experts), the descriptor, profile, view, traffic and the grids
        from . import __version__

        state = {k: repr(v) for k, v in sorted(model.__getstate__().items())}
        self.identity = hashlib.sha256(json.dumps(
            [__version__, Group.ARRAYS, state, attrs.asdict(hw), profile and attrs.asdict(profile),
             view and attrs.asdict(view), traffic.to_dict(), reserve_gib, space.batches, space.prefill_batches,
             space.acceptance], default=str, sort_keys=True).encode()).hexdigest()

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
        d = self.cache.get(self._digest(key))
        return Group.from_json(d, key[1], key[2]) if isinstance(d, dict) else None

    def _digest(self, key) -> str:
        kind, mapping, policies = key
        return hashlib.sha256(f"{self.identity}|{kind}|{mapping}|{policies!r}".encode()).hexdigest()[:24]

    def _store(self, key, g: Group, computed: bool) -> Group:
        if computed:
            self.compiled += 1
            self.cache.put(self._digest(key), g.to_json())
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
        if self.jobs <= 1 or len(by_map) < 2:
            return
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = mp.get_context("spawn")  # JAX is not fork-safe once initialised
        with ProcessPoolExecutor(min(self.jobs, len(by_map)), mp_context=ctx, initializer=_worker_init,
                                 initargs=(self.args,)) as ex:
            tasks = [ex.submit(_worker_run, sorted(ks, key=lambda k: k[0] == "mixed")) for ks in by_map.values()]
            for fut in as_completed(tasks):
                for key, d in fut.result():
                    if key not in self.groups:
                        self._store(key, Group.from_json(d, key[1], key[2]), computed=True)

    def _evaluate(self, kind, mapping, policies) -> Group:
        from .fit import MemoryModel
        from .metrics import emitted
        from .workload import Workload

        t = self.traffic
        spec = policies.dspark == "on" or policies.mtp > 0
        kmax = (len(policies.acceptance) if policies.dspark == "on" else policies.mtp) if spec else 0
        dp = mapping.dp
        if kind == "mixed":
            return self._mixed(mapping, policies, kmax)
        if kind == "decode":
            per_rank = [b for b in self.space.batches if policies.overlap == "none" or b >= 2]
            require(bool(per_rank), "batches", "two-batch overlap needs >= 2 requests per DP rank")
            batch = np.array([b * dp for b in per_rank], dtype=np.float64)
            if mapping.pp > 1:
                batch = batch[batch >= max(mapping.pp, policies.pp_micro_batches)]
                require(batch.size > 0, "batches", "pipeline decode needs a batch of at least pp requests")
            verify = np.arange(1, kmax + 1, dtype=np.float64) if policies.dspark == "on" else \
                np.array([float(kmax)])
            batch, verify = (a.ravel() for a in np.meshgrid(batch, verify, indexing="ij"))
            # one request structure for every mapping, so the model's build cache serves them all
            req = f"decode:{t.decode_context}x{max(self.space.batches) * self.gpus}" + (f"v{kmax}" if kmax else "")
            c = compile_plan(self.model, Plan([req], mapping, policies), self.hw, self.profile, view=self.view)
            new = 1.0 + verify
            wl = Workload(("decode",), batch[:, None], new[:, None], np.full((batch.size, 1), t.decode_context))
            fwd = np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64)
            em = emitted(("decode",), new[:, None], policies)[:, 0]
            mm = MemoryModel(self.model, self.hw, mapping, policies, kind="decode", reserve_gib=self.reserve_gib,
                             compiled=c)
            ctx = t.fit_context
            work = mm.workspace(batch, ctx, new)
        else:
            per_rank = [p for p in sorted(set(self.space.prefill_batches) | {1})
                        if policies.overlap == "none" or p >= 2]
            require(bool(per_rank), "prefill_batches", "two-batch overlap needs >= 2 prompts per DP rank")
            batch = np.array([p * dp for p in per_rank], dtype=np.float64)
            verify = np.zeros_like(batch)
            isl = np.asarray(t.isl, dtype=np.float64)
            req = f"prefill:{int(isl.max())}x{max(self.space.prefill_batches) * self.gpus}"
            c = compile_plan(self.model, Plan([req], mapping, policies), self.hw, self.profile, view=self.view)
            bb, ii = np.meshgrid(batch, isl, indexing="ij")  # (R, classes)
            wl = Workload(("prefill",), bb.reshape(-1, 1), ii.reshape(-1, 1), np.zeros((bb.size, 1)))
            fwd = np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64).reshape(bb.shape)
            em = np.ones_like(batch)
            mm = MemoryModel(self.model, self.hw, mapping, policies, kind="prefill", reserve_gib=self.reserve_gib,
                             compiled=c)
            ctx = int(isl.max())
            work = mm.workspace(batch, ctx)
        require(bool(np.all(np.isfinite(fwd))), "view", f"no {kind} time for {mapping} under this view")
        headroom = mm.headroom(batch, ctx, work)
        return Group(kind, mapping, policies, batch, verify, fwd, em, headroom, np.asarray(work, np.float64),
                     np.zeros_like(batch))

    def _mixed(self, mapping, policies, kmax: int) -> Group:
        """Aggregated steps that prefill prompts together with the running decode batch. A replica admits
        f = B·E/(OSL·dp) prompts per DP group and step on average, so its steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts
        (whole prompts, one per DP group at a time). At every (batch, verify) row of the decode program: the
        forward of the B decodes with each of those prompt counts, per traffic class — ``forward_s`` is
        (rows, 2 × classes), the ⌊f⌋ block first; ``prompts`` holds f."""
        from .workload import Workload

        t = self.traffic
        dec = self.group("decode", mapping, policies)
        require(not dec.error, "decode", dec.error)
        dp = mapping.dp
        f = dec.batch * dec.emitted / (t.mean_osl * dp)
        lo, hi = dp * np.floor(f), dp * np.maximum(1.0, np.ceil(f))
        isl = np.asarray(t.isl, dtype=np.float64)
        reqs = [f"prefill:{int(isl.max())}x{max(self.space.batches) * self.gpus}",
                f"decode:{t.decode_context}x{max(self.space.batches) * self.gpus}" + (f"v{kmax}" if kmax else "")]
        c = compile_plan(self.model, Plan(reqs, mapping, policies), self.hw, self.profile, view=self.view)
        R, C = dec.batch.size, isl.size

        def each(a):  # (R,) -> (R·2·C,): row-major over rows, then {lo, hi}, then classes
            return np.repeat(np.asarray(a, dtype=np.float64), 2 * C)

        count = np.stack([np.stack([lo, hi], axis=1).repeat(C, axis=1).ravel(), each(dec.batch)], axis=1)
        new = np.stack([np.tile(isl, 2 * R), each(1.0 + dec.verify)], axis=1)
        past = np.stack([np.zeros(2 * R * C), np.full(2 * R * C, float(t.decode_context))], axis=1)
        wl = Workload(("prefill", "decode"), count, new, past)
        fwd = np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64).reshape(R, 2 * C)
        require(bool(np.all(np.isfinite(fwd))), "view", f"no mixed-step time for {mapping} under this view")
        # memory: the decode batch's KV and weights as the decode program has them, the largest op's
        # activations of the heaviest step (the prompts' activations dwarf one decode token's)
        from .fit import op_workspace

        work = op_workspace(c.program, wl).reshape(R, 2 * C).max(axis=1)
        headroom = dec.headroom_bytes + dec.workspace_bytes - np.maximum(dec.workspace_bytes, work)
        return Group("mixed", mapping, policies, dec.batch, dec.verify, fwd, dec.emitted, headroom, work, f)

    # -- deployments -----------------------------------------------------------------------------------------
    def agg_rows(self, mapping, policies) -> list[dict]:
        dec = self.group("decode", mapping, policies)
        if dec.error:
            return []
        t = self.traffic
        replicas = self.gpus // mapping.gpus
        if not (dec.headroom_bytes >= 0).any():
            # fits at no batch: no mixed program is built; its rows carry the decode step as a lower bound of
            # TPOT and TTFT, only to say by how much memory falls short
            return [self._row("agg", policies, mapping, replicas, mapping.dp, mapping, replicas, int(dec.batch[r]),
                              int(dec.verify[r]), dec.forward_s[r], dec.forward_s[r] / dec.emitted[r],
                              replicas * dec.batch[r] * dec.emitted[r] / dec.forward_s[r], replicas * mapping.gpus,
                              dec.headroom_bytes[r]) for r in range(dec.batch.size)]
        mix = self.group("mixed", mapping, policies)
        if mix.error:
            return []
        e, f, C = dec.emitted, mix.prompts, len(t.isl)
        # steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts, in the proportions that average f (⌊f⌋ = 0: a decode-only step)
        t_lo = np.where(np.floor(f) == 0, dec.forward_s, mix.forward_s[:, :C] @ t.w)
        t_hi = mix.forward_s[:, C:] @ t.w
        phi = f - np.floor(f)
        tpot = ((1.0 - phi) * t_lo + phi * t_hi) / e
        ttft = mix.forward_s[:, C:].max(axis=1)  # the longest class, prefilled in a step with the decodes
        prompts = mapping.dp * np.maximum(1.0, np.ceil(f))
        rows = []
        for r in range(dec.batch.size):
            rows.append(self._row("agg", policies, mapping, replicas, int(prompts[r]), mapping, replicas,
                                  int(dec.batch[r]), int(dec.verify[r]), ttft[r], tpot[r],
                                  replicas * dec.batch[r] / tpot[r], replicas * mapping.gpus,
                                  mix.headroom_bytes[r]))
        return rows

    def disagg_rows(self, pre_groups: list, dec_groups: list) -> list[dict]:
        from .disagg import Pool, transfer_seconds

        t = self.traffic
        budget = self.sla.ttft_ms / 1e3 if self.sla.ttft_ms else math.inf
        cands = []  # prefill candidates: (group, row, ttft without transfer, requests/s per replica)
        for g in pre_groups:
            for r in range(g.batch.size):
                if g.headroom_bytes[r] < 0:
                    continue
                tp = float(g.forward_s[r].max())
                if tp > budget:
                    continue
                cands.append((g, r, tp, g.batch[r] / float(t.w @ g.forward_s[r])))
        cands = _pareto_min_max(cands, lambda c: c[2], lambda c: c[3] / c[0].mapping.gpus)
        rows = []
        kv_cache: dict = {}
        for d in dec_groups:
            rate_d = d.batch * d.emitted / (t.mean_osl * d.forward_s)  # requests/s per decode replica
            tpot = d.forward_s / d.emitted
            for g, r, tp, rate_p in cands:
                if (g.policies.dspark, g.policies.mtp) != (d.policies.dspark, d.policies.mtp):
                    continue  # both pools run the same drafter (it keeps state from the prompt)
                n_p, n_d = g.mapping.gpus, d.mapping.gpus
                key = (g.mapping, d.mapping, int(g.batch[r]))
                if key not in kv_cache:
                    kv_cache[key] = transfer_seconds(self.model, self.hw, Pool(g.mapping, int(g.batch[r])),
                                                     Pool(d.mapping, 1), int(max(t.isl)))[0]
                ttft = tp + kv_cache[key]
                xs = np.arange(1, (self.gpus - n_d) // n_p + 1, dtype=np.float64)
                if xs.size == 0:
                    continue
                ymax = np.floor((self.gpus - xs * n_p) / n_d)
                for j in range(d.batch.size):
                    if d.headroom_bytes[j] < 0 and j:  # the smallest batch stays: "memory" is reported
                        continue
                    # replica counts near rate balance and the most decode replicas that fit; TTFT and TPOT do not
                    # depend on them, so one row per pool pair and batch: the best tokens/s per GPU, fewest GPUs
                    yb = xs * rate_p / rate_d[j]
                    ys = np.clip(np.stack([np.floor(yb), np.ceil(yb), ymax]), 1.0, ymax)
                    xx = np.broadcast_to(xs, ys.shape)
                    used = xx * n_p + ys * n_d
                    per_gpu = np.minimum(xx * rate_p, ys * rate_d[j]) / used
                    i = np.lexsort((used.ravel(), -per_gpu.ravel()))[0]
                    x, y = int(xx.ravel()[i]), int(ys.ravel()[i])
                    rows.append(self._row(
                        "disagg", d.policies, g.mapping, x, int(g.batch[r]), d.mapping, y, int(d.batch[j]),
                        int(d.verify[j]), ttft, tpot[j], per_gpu.ravel()[i] * used.ravel()[i] * t.mean_osl,
                        int(used.ravel()[i]), min(g.headroom_bytes[r], d.headroom_bytes[j]),
                        prefill_policies=g.policies))
        return rows

    def _row(self, mode, policies, pmap, prep, pbatch, dmap, drep, dbatch, verify, ttft_s, tpot_s, out_tps, gpus,
             headroom, prefill_policies=None) -> dict:
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
                "ttft_ms": float(ttft_s) * 1e3, "tpot_ms": float(tpot_s) * 1e3,
                "tokens_per_s_per_user": 1.0 / float(tpot_s), "tokens_per_s_per_gpu": float(out_tps) / gpus,
                "output_tokens_per_s": float(out_tps), "memory_headroom_gib": float(headroom) / GiB,
                "fits": bool(headroom >= 0), "_policies": policies, "_prefill_policies": prefill_policies or policies,
                "_pmap": pmap, "_dmap": dmap}


def _key(kind: str, mapping: ParallelMapping, policies: Policies) -> tuple:
    """A program's key: a decode program ignores the prefill-only policies (one compile serves them all)."""
    if kind == "decode":
        policies = attrs.evolve(policies, **{f: getattr(Policies(), f) for f in PREFILL_ONLY})
    return (kind, mapping, policies)


_WORKER: list = []  # a worker process's _Search


def _worker_init(args) -> None:
    _WORKER[:] = [_Search(*args)]


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


def _pareto_min_max(items: list, lo: Callable, hi: Callable) -> list:
    """Items no other item beats on both: lower ``lo`` and higher ``hi``."""
    out, best = [], -math.inf
    for it in sorted(items, key=lambda c: (lo(c), -hi(c))):
        if hi(it) > best:
            out.append(it)
            best = hi(it)
    return out


def _meets(row: dict, sla: SLA) -> dict:
    """Which SLA bounds a row misses (memory first)."""
    return {"memory": not row["fits"],
            "ttft": sla.ttft_ms is not None and row["ttft_ms"] > sla.ttft_ms * (1 + 1e-12),
            "tpot": sla.tpot_ms is not None and row["tpot_ms"] > sla.tpot_ms * (1 + 1e-12),
            "min_user_speed": sla.min_tokens_per_s_per_user is not None
            and row["tokens_per_s_per_user"] < sla.min_tokens_per_s_per_user * (1 - 1e-12)}


def pareto_flags(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point is at least as good on both x and y (higher is better) and better on one."""
    order = np.lexsort((-y, -x))
    flags = np.zeros(x.size, dtype=bool)
    best, at = -np.inf, None
    for i in order:
        if y[i] > best or (y[i] == best and x[i] == at):  # an identical point is as non-dominated as its twin
            flags[i] = True
            best, at = y[i], x[i]
    return flags


def search(model, hw, *, gpus: int, traffic: Traffic, sla: SLA = SLA(), space: Space = Space(), top: int = 5,
           profile=None, view=None, reserve_gib: float | None = None, cache_dir: str | Path | None = None,
           progress: Callable[[int], None] | None = None, jobs: int = 1) -> SearchResult:
    """Search deployments of ``model`` on ``gpus`` GPUs of ``hw`` for ``traffic`` under ``sla``; the best
    ``top`` deployments (by output tokens/s per GPU among those meeting the SLA), the Pareto front and why the
    others lost. ``cache_dir`` keeps every evaluated program (a rerun resumes from it). ``progress(n)`` is called
    as programs are evaluated; if it has ``expect(n)``, that is called first with how many more are planned.
    ``jobs`` > 1 evaluates programs on that many spawned worker processes (the same results; a script using it
    needs the ``if __name__ == "__main__":`` guard, as for any spawned process)."""
    import pandas as pd

    from .fit import DEFAULT_RESERVE_GIB
    from .hw import load_hw, load_profile
    from .models import load_model

    t0 = time.perf_counter()
    check_int("gpus", gpus, 1, MAX_RANKS)
    check_int("top", top, 1, 10_000)
    require(isinstance(traffic, Traffic), "traffic", "a graphsim.search.Traffic")
    model = load_model(model) if isinstance(model, str) else model
    hw = load_hw(hw) if isinstance(hw, str) else hw
    profile = load_profile(profile) if isinstance(profile, str) else profile
    reserve = DEFAULT_RESERVE_GIB if reserve_gib is None else reserve_gib
    check_number("reserve_gib", reserve, 0.0, 1 << 20)
    check_int("jobs", jobs, 1, 1024)
    s = _Search(model, hw, gpus, traffic, sla, space, profile, view, reserve,
                _Cache(Path(cache_dir) if cache_dir else None), progress, jobs)
    axes = policy_axes(model, space)
    base = {f: v[0] for f, v in axes}
    dec_maps = mappings(model, hw, gpus, space, "decode")
    pre_maps = mappings(model, hw, gpus, space, "prefill") if "disagg" in space.modes else []
    require(bool(dec_maps), "gpus", f"no mapping of {model.name} fits the space on {gpus} GPUs "
            "(check --tp/--dp/--ep/--pp and the model's head/expert counts)")
    choices = [base]
    rows = _assemble(s, dec_maps, pre_maps, [base], space)  # stage 1: every mapping, base policies
    if space.refine and len(axes):
        maps = _leaders(rows, sla, space.refine)
        variants = _variants(axes, base, space.exhaustive)
        extra = _assemble(s, [m for m in dec_maps if m in maps["decode"]], [m for m in pre_maps if m in maps["prefill"]],
                          variants, space)
        # the best value of each axis together (for each leading mapping set)
        combo = _combine(extra + rows, axes, base, sla)
        if combo not in variants and combo != base:
            variants.append(combo)
            extra += _assemble(s, [m for m in dec_maps if m in maps["decode"]],
                               [m for m in pre_maps if m in maps["prefill"]], [combo], space)
        rows += extra
        choices += variants
    if not rows:
        why = "; ".join(sorted({x["error"] for x in s.skipped}))[:300] or (
            "disaggregated serving needs a prefill and a decode pool: a decode mapping smaller than --gpus and a "
            "prefill mapping in what is left" if space.modes == ("disagg",) else "no mapping fits the space")
        raise GraphsimError("search", f"no deployment could be evaluated: {why}")
    df = pd.DataFrame(rows)
    miss = [_meets(r, sla) for r in rows]
    df["meets_sla"] = [not any(m.values()) for m in miss]
    df["why"] = [next((k for k, v in m.items() if v), "") for m in miss]
    ok_front = df["fits"] & ~np.array([m["ttft"] for m in miss], dtype=bool)
    flags = np.zeros(len(df), dtype=bool)
    if ok_front.any():
        idx = np.flatnonzero(ok_front.to_numpy())
        flags[idx] = pareto_flags(df["tokens_per_s_per_user"].to_numpy()[idx],
                                  df["tokens_per_s_per_gpu"].to_numpy()[idx])
    df["pareto"] = flags
    df["deployment"] = df["mode"] + " " + df["mapping"] + " [" + df["policies"] + "]"
    best, rejected, reasons = _rank(df, top)
    public = [k for k in ROW_KEYS] + ["why"]
    table = df[public].copy()
    for k, v in (("model", model.name), ("hw", hw.name), ("view", (view.name if view is not None else "sol")),
                 ("profile", profile.name if profile else "sol")):
        table[k] = v
    pareto = [_public(r) for r in df[df["pareto"]].sort_values("tokens_per_s_per_user").to_dict("records")]
    best_rows = []
    for i, r in enumerate(best):
        d = _public(r)
        d["rank"] = i + 1
        pol = attrs.asdict(r["_policies"])
        pol["algorithms"] = [{"collective": c, "algorithm": a} for c, a in pol["algorithms"]]
        pol["acceptance"] = list(pol["acceptance"])
        d["policy_values"] = pol  # every policy field, as estimate's identity.policies (docs/json.md)
        d["speculative"] = _spec_text(r["_policies"])
        d["launch"] = launch_flags(model, r)
        best_rows.append(d)
    space_d = {"modes": list(space.modes), "decode_mappings": len(dec_maps), "prefill_mappings": len(pre_maps),
               "batches_per_dp_rank": list(space.batches), "prefill_batches_per_dp_rank": list(space.prefill_batches),
               "policy_axes": [{"field": f, "values": list(v)} for f, v in axes], "policy_points": len(choices),
               "refine": space.refine, "exhaustive": space.exhaustive, "acceptance": list(space.acceptance),
               "nvlink_domain": hw.nvlink_domain}
    stats = {"programs_compiled": s.compiled, "programs_cached": s.cached, "rows": len(df),
             "rows_meeting_sla": int(df["meets_sla"].sum()), "pareto_points": int(df["pareto"].sum()),
             "wall_s": time.perf_counter() - t0}
    return SearchResult(model.name, hw.name, gpus, traffic, sla, (view.name if view is not None else "sol"),
                        profile.name if profile else "sol", table, best_rows, pareto, rejected, reasons,
                        sorted(s.skipped, key=lambda x: (x["what"], x["error"])),
                        space_d, stats)


def _planned(s: _Search, dec_maps, pre_maps, variants, space: Space) -> list:
    """The programs :func:`_assemble` will need that are not evaluated yet, in order (a replica that fits at no
    batch skips its mixed program, so this is an upper bound)."""
    keys: dict = {}
    for choice in variants:
        pol = policies_of(choice, space.acceptance)
        if "agg" in space.modes:
            for m in dec_maps:
                if m.gpus <= s.gpus:
                    keys.update(dict.fromkeys([_key("decode", m, pol), _key("mixed", m, pol)]))
        if "disagg" in space.modes and pre_maps:
            keys.update(dict.fromkeys(_key("prefill", m, pol) for m in pre_maps))
            keys.update(dict.fromkeys(_key("decode", m, pol) for m in dec_maps if m.gpus < s.gpus))
    return [k for k in keys if k not in s.groups]


def _assemble(s: _Search, dec_maps, pre_maps, variants, space: Space) -> list[dict]:
    planned = _planned(s, dec_maps, pre_maps, variants, space)
    if s.progress is not None and hasattr(s.progress, "expect"):
        s.progress.expect(len(planned))
    if s.jobs > 1:
        s.prefetch(planned)
    rows = []
    for choice in variants:
        pol = policies_of(choice, space.acceptance)
        if "agg" in space.modes:
            for m in dec_maps:
                if m.gpus <= s.gpus:  # gpus // n replicas; tokens/s per GPU over the GPUs used, as for disagg
                    rows += s.agg_rows(m, pol)
        if "disagg" in space.modes and pre_maps:
            pre = [g for g in (s.group("prefill", m, pol) for m in pre_maps) if not g.error]
            dec = [g for g in (s.group("decode", m, pol) for m in dec_maps if m.gpus < s.gpus) if not g.error]
            rows += s.disagg_rows(pre, dec)
    return rows


def _leaders(rows: list[dict], sla: SLA, k: int) -> dict:
    """Mappings of the ``k`` best deployments (meeting the SLA first, then the rest by throughput)."""
    scored = sorted(rows, key=lambda r: (any(_meets(r, sla).values()), -r["tokens_per_s_per_gpu"]))
    seen, out = set(), {"decode": set(), "prefill": set()}
    for r in scored:
        dep = (r["mode"], r["mapping"])
        if dep in seen:
            continue
        seen.add(dep)
        out["decode"].add(r["_dmap"])  # an aggregated replica's decode and mixed programs
        if r["mode"] == "disagg":
            out["prefill"].add(r["_pmap"])
        if len(seen) >= k:
            break
    return out


def _variants(axes, base: dict, exhaustive: bool) -> list[dict]:
    if exhaustive:
        out = [dict(zip([f for f, _ in axes], vals)) for vals in itertools.product(*[v for _, v in axes])]
        return [c for c in out if c != base]
    out = []
    for f, vals in axes:
        for v in vals[1:]:
            out.append({**base, f: v})
    return out


def _combine(rows: list[dict], axes, base: dict, sla: SLA) -> dict:
    """Per axis, the value whose best deployment meeting the SLA (else best overall) has the most tokens/s
    per GPU among single-axis variants of the base."""
    combo = dict(base)
    for f, vals in axes:
        best_v, best_s = vals[0], -math.inf
        for r in rows:
            pol = r["_policies"]
            v = _axis_value(pol, f)
            others = all(_axis_value(pol, g) == base[g] for g, _ in axes if g != f and g not in PREFILL_ONLY)
            if not others:
                continue
            score = r["tokens_per_s_per_gpu"] - (1e12 if any(_meets(r, sla).values()) else 0.0)
            if score > best_s:
                best_v, best_s = v, score
        combo[f] = best_v
    return combo


def _axis_value(p: Policies, f: str):
    if f == "spec":
        return "dspark" if p.dspark == "on" else (f"mtp{p.mtp}" if p.mtp else "off")
    return getattr(p, f)


def _spec_text(p: Policies) -> str:
    if p.dspark == "on":
        return "dspark acceptance " + ",".join(f"{a:g}" for a in p.acceptance)
    if p.mtp:
        return f"mtp{p.mtp} acceptance " + ",".join(f"{a:g}" for a in p.acceptance)
    return "off"


def _rank(df, top: int):
    """Top deployments (best batch each), and the reason each other deployment lost."""
    # ties: the shorter TTFT, then TPOT, then fewer GPUs (a stable sort keeps the table order after that)
    order = df.assign(_neg=-df["tokens_per_s_per_gpu"]).sort_values(
        ["_neg", "ttft_ms", "tpot_ms", "gpus"], kind="mergesort").drop(columns="_neg")
    ok = order[order["meets_sla"]]
    # one row per pool mapping(s) (its best policies, batch and replica counts): policy variants of a ranked
    # mapping are listed as lost
    pools = ["mode", "prefill_mapping", "decode_mapping"]
    best_idx = ok.drop_duplicates(pools).head(top)
    best = best_idx.to_dict("records")
    best_names = set(best_idx["deployment"])
    cutoff = best[-1]["tokens_per_s_per_gpu"] if best else None
    rank_of = {tuple(b[k] for k in pools): i + 1 for i, b in enumerate(best)}
    rejected, reasons = [], {k: 0 for k in REASONS}
    for name, g in order.groupby("deployment", sort=False):
        if name in best_names:
            continue
        if g["meets_sla"].any():
            g = g[g["meets_sla"]]
            r = g.iloc[0]
            k = rank_of.get(tuple(r[c] for c in pools))
            if k is not None:
                reason = "variant"
                detail = (f"{r['tokens_per_s_per_gpu']:.1f} tok/s/GPU at best, below the policies ranked #{k} "
                          f"on this mapping ({best[k - 1]['tokens_per_s_per_gpu']:.1f})")
            else:
                reason = "throughput"
                detail = f"{r['tokens_per_s_per_gpu']:.1f} tok/s/GPU at best, below #{len(best)}'s {cutoff:.1f}"
        else:
            fits = g[g["fits"]]
            timely = fits[fits["why"] != "ttft"]  # fits and meets TTFT: it misses TPOT or the user speed
            if fits.empty:
                reason, r = "memory", g.iloc[0]
                detail = f"does not fit at any batch ({-g['memory_headroom_gib'].max():.1f} GiB short at the smallest)"
            elif timely.empty:
                reason, r = "ttft", fits.iloc[0]
                detail = f"TTFT {fits['ttft_ms'].min():.0f} ms at best"
            else:
                r = timely.iloc[0]
                reason = r["why"]
                if reason == "tpot":
                    detail = f"TPOT {timely['tpot_ms'].min():.1f} ms at best (meeting TTFT)"
                else:
                    detail = f"{timely['tokens_per_s_per_user'].max():.1f} tok/s/user at best (meeting TTFT)"
        reasons[reason] += 1
        rejected.append({"deployment": name, "mode": r["mode"], "mapping": r["mapping"], "policies": r["policies"],
                         "reason": reason, "detail": detail,
                         "best_tokens_per_s_per_gpu": float(g["tokens_per_s_per_gpu"].max())})
    rejected.sort(key=lambda r: (REASONS.index(r["reason"]), -r["best_tokens_per_s_per_gpu"]))
    return best, rejected, reasons


def _public(r: dict) -> dict:
    out = {}
    for k in ROW_KEYS:
        v = r.get(k)
        out[k] = v.item() if hasattr(v, "item") else v
    return out


# ---- launch flags ---------------------------------------------------------------------------------------------------
#: graphsim policy -> the serving flag that turns it on (None: no documented flag; see docs/search.md)
SGLANG_POLICY_FLAGS = {("overlap", "two-batch"): "--enable-two-batch-overlap",
                       ("attention_precision", "fp8"): "--kv-cache-dtype fp8_e4m3"}
VLLM_POLICY_FLAGS = {("overlap", "two-batch"): "--enable-dbo", ("attention_precision", "fp8"): "--kv-cache-dtype fp8"}


def launch_flags(model, row: dict) -> dict:
    """Equivalent SGLang and vLLM launch commands for a deployment row (one per pool), with notes for what
    neither engine exposes as a flag. The mapping follows docs/search.md; no flag is invented."""
    pools = [("decode" if row["mode"] == "disagg" else "server", row["_dmap"], row["decode_batch"],
              row["_policies"])]
    if row["mode"] == "disagg":
        pools.insert(0, ("prefill", row["_pmap"], row["prefill_batch"], row["_prefill_policies"]))
    ckpt = model.name
    out = {"sglang": [], "vllm": [], "notes": []}
    notes = {f"{ckpt}: give the checkpoint's path or Hugging Face id"}
    for role, m, batch, pol in pools:
        sg = ["python -m sglang.launch_server", f"--model-path {ckpt}", f"--tp-size {m.tp * m.dp}"]
        if m.dp > 1:
            sg += [f"--dp-size {m.dp}", "--enable-dp-attention"]
        if m.ep > 1:
            sg.append(f"--ep-size {m.ep}")
        if m.pp > 1:
            sg.append(f"--pp-size {m.pp}")
        sg.append(f"--max-running-requests {batch}")
        vl = ["vllm serve", ckpt, f"--tensor-parallel-size {m.tp}"]
        if m.dp > 1:
            vl.append(f"--data-parallel-size {m.dp}")
        if m.pp > 1:
            vl.append(f"--pipeline-parallel-size {m.pp}")
        if m.ep > 1:
            if m.ep == m.tp * m.dp:
                vl.append("--enable-expert-parallel")
            else:
                notes.add(f"vLLM sets EP = TP x DP with --enable-expert-parallel: ep={m.ep} of {m.tp * m.dp} ranks "
                          "has no vLLM flag (the MoE side runs TP-within-EP)")
        vl.append(f"--max-num-seqs {max(1, batch // m.dp)}")
        if m.cp > 1:
            notes.add(f"cp={m.cp} (context-parallel prefill) has no flag in either engine's documented CLI")
        for (f, v), flag in SGLANG_POLICY_FLAGS.items():
            if getattr(pol, f) == v:
                sg.append(flag)
        for (f, v), flag in VLLM_POLICY_FLAGS.items():
            if getattr(pol, f) == v:
                vl.append(flag)
        if pol.mtp:
            k = pol.mtp
            sg += ["--speculative-algorithm EAGLE", f"--speculative-num-steps {k}", "--speculative-eagle-topk 1",
                   f"--speculative-num-draft-tokens {k + 1}"]
            vl.append(f"--speculative-config '{{\"method\": \"mtp\", \"num_speculative_tokens\": {k}}}'")
        if pol.dspark == "on":
            notes.add("DSpark drafting has no upstream SGLang/vLLM flag yet: the commands run without it")
        for f, what in (("fusion", "mHC fusion"), ("decoder_replay", "decoder bounded replay"),
                        ("engram", "Engram table residency")):
            if getattr(pol, f) != getattr(Policies(), f):
                notes.add(f"{what} ({f}={getattr(pol, f)}) is an engine implementation choice with no documented "
                          "flag")
        if role in ("prefill", "decode"):
            sg.append(f"--disaggregation-mode {role}")
            vl.append("--kv-transfer-config '{\"kv_connector\": \"NixlConnector\", \"kv_role\": \"kv_both\"}'")
        reps = row["prefill_replicas"] if role == "prefill" else row["decode_replicas"]
        tag = f"# {role}: {reps} replica(s) of {m.gpus} GPU(s)"
        out["sglang"].append(tag + "\n" + " ".join(sg))
        out["vllm"].append(tag + "\n" + " ".join(vl))
    out["notes"] = sorted(notes)
    return out


__all__ = ["SLA", "Space", "Traffic", "SearchResult", "search", "mappings", "launch_flags", "pareto_flags"]
