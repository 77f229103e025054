"""Find the best deployment: an SLA-constrained search over aggregated and disaggregated serving, parallel
mappings, batch sizes and the model's policies, with the Pareto front of tokens/s per GPU against tokens/s
per user.

The serving model (docs/search.md says the same, with the launch-flag table):

* **traffic**: request classes (ISL, OSL, weight); one class from ``isl``/``osl``. Decode runs at the
  token-weighted mean context Σw·osl·(isl + osl/2) / Σw·osl; memory holds the steady-state occupancy: a
  slot's position is uniform over [isl, isl + osl], so the n requests of a DP rank are held at
  mean + kv_margin·σ/√n each (:meth:`Traffic.memory_context`);
* **aggregated** (``agg``): ``gpus // n`` replicas of an ``n``-GPU mapping, each running ``B`` requests. A
  new prompt is prefilled whole in one step *together with* the running decodes (mixed batches: vLLM's
  chunked prefill, SGLang's mixed chunks), so prefill and decode share each weight read — the fastest
  schedule, as a SOL must assume. Per step every request gets E tokens (1, or the expected emitted tokens of
  speculative decoding), so f = B·E/(ōsl·dp) of the steps carry one prompt per DP group:
  step = (1 − f)·T_dec(B) + f·T_mix(B, dp prompts) (f > 1: steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts),
  TPOT = step / E, TTFT = T_mix (no queueing), output tokens/s per GPU = B / TPOT / n; a prefill-only step
  and a lone prompt are the other TTFT steps, each a row with the TPOT its schedule reaches
  (:func:`agg_schedules`), and TPOT p99 is the spike when more than 1 % of the steps prefill;
* **disaggregated** (``disagg``): ``x`` prefill replicas (``p`` prompts per forward) and ``y`` decode
  replicas (``B`` requests) with x·n_p + y·n_d ≤ the GPUs (as :mod:`graphsim.serving.disagg`): TTFT = T_pre(p) + the
  KV hand-over (streamed layer by layer, over NVLink inside a domain), TPOT = T_dec(B)/E, system rate =
  min(x·p/T_pre, y·B·E/(ōsl·T_dec)) requests/s, tokens/s per
  GPU over the GPUs used. For each pair of pools and batch, the replica counts near rate balance (and the
  most decode replicas that fit) are tried and the best tokens/s per GPU kept (fewest GPUs on a tie: TTFT and
  TPOT do not depend on the counts);
* every forward time is graphsim's (the view and profile the search runs under), evaluated for all batch
  sizes of a (kind, mapping, policies) program in one vectorized call; each program is compiled once.

The policy space is searched in two stages, neither of which looks at the SLA (it only ranks): every mapping
under the base policies (the first value of each policy axis) — where memory decides, with the residency and
sharding values that may rescue it, so memory is checked after them —, then, for the pools of the best
deployments along the front, every single-axis variant of their policies on the front plus every combination
of the values that reach it (``exhaustive=True``: the whole product). Speculative decoding
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

from ..core.errors import GraphsimError, require
from ..core.limits import MAX_CONTEXT, MAX_RANKS, MAX_REQUESTS, check_int, check_number
from ..driver.pipeline import Plan, Policies, compile_plan, policy_text  # noqa: F401  (policy_text: re-exported)
from ..driver.views import view_name
from .engines import kernels  # noqa: F401  (re-exported: a step's kernels, the engines' host terms)
from ..core.plan import ParallelMapping
from .launch import SGLANG_POLICY_FLAGS, VLLM_POLICY_FLAGS, launch_flags  # noqa: F401 (re-exported)
from ..core.workload import Workload

GiB = 2.0**30
MODES = ("agg", "disagg")
#: most prompts per DP rank a prefill forward is tried at (the grid runs up to what fits, at most this)
MAX_PREFILL_PER_RANK = 256
#: column blocks of a mixed program's forward times: steps with the decodes and dp·⌊f⌋ or dp·⌈f⌉ prompts,
#: a prefill-only step of dp·⌈f⌉ prompts, one prompt alone
MIXED_BLOCKS = ("mixed_lo", "mixed", "prefill", "lone")
#: the step each row's TTFT is (and the schedule its TPOT and throughput assume): an aggregated replica
#: prefills in the mixed step, in a prefill-only step that pauses the decodes, or one prompt at a time;
#: a disaggregated deployment in its prefill pool
TTFT_STEPS = ("mixed", "prefill", "lone", "disagg")
#: the TPOT statistics a row reports and the SLA can bound
TPOT_STATS = ("mean", "p99")
#: default memory margin: standard deviations of a batch's summed steady-state context (Traffic.memory_context)
DEFAULT_KV_MARGIN = 3.0
#: decode requests per attention-DP rank (a replica's batch is this times dp)
DEFAULT_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
                   640, 768, 896, 1024)
#: prompts per attention-DP rank in one prefill forward of a disaggregated prefill pool
DEFAULT_PREFILL_BATCHES = (1, 2, 4, 8)
#: policy axes searched by default, when the model supports more than one value (base value first)
POLICY_AXES = ("fusion", "overlap", "decoder_replay", "engram", "engram_shard", "engram_proj", "sp")
#: residency and sharding axes: they change what a device holds, so memory is checked after them (a mapping
#: that fits under none of their values is pruned, never one that fits under another). attention_precision
#: narrows the KV cache, a quality choice: it is an axis only when ``--policy`` gives it
MEMORY_AXES = ("engram", "engram_shard", "engram_proj", "sp", "attention_precision")
#: the value of each memory axis that holds the least per device (tables in host memory, rows over every
#: rank, the projection split over TP, activations split over TP)
MEMORY_SAVERS = {"engram": "host", "engram_shard": "world", "engram_proj": "tp", "sp": "on"}
#: fields that change only prefill token sets (a decode program ignores them, so decode shares one compile)
PREFILL_ONLY = ("decoder_replay",)
#: why a deployment lost, in the order they are listed: a policy variant of a ranked mapping, feasible but
#: slower than the last ranked one, then the SLA bound it misses at every batch that fits, then memory
REASONS = ("variant", "throughput", "tpot", "min_user_speed", "ttft", "memory")
ROW_KEYS = ("mode", "mapping", "policies", "gpus", "prefill_mapping", "prefill_replicas", "prefill_batch",
            "prefill_gpus", "decode_mapping", "decode_replicas", "decode_batch", "decode_gpus", "verify",
            "ttft_ms", "tpot_ms", "tokens_per_s_per_user", "tokens_per_s_per_gpu", "output_tokens_per_s",
            "memory_headroom_gib", "fits", "meets_sla", "pareto", "ttft_step", "tpot_p99_ms", "bound",
            "sol_ttft_ms", "sol_tpot_ms", "sol_tokens_per_s_per_user", "sol_tokens_per_s_per_gpu",
            "requests_per_s", "concurrency", "output_tokens_per_joule")
#: a row's SOL twin: the same deployment, batch and TTFT step priced at the speed of light (the bound beside a
#: prediction; equal to the row's own figures in the SOL view)
SOL_COLUMNS = {"ttft_ms": "sol_ttft_ms", "tpot_ms": "sol_tpot_ms", "tokens_per_s_per_user": "sol_tokens_per_s_per_user",
               "tokens_per_s_per_gpu": "sol_tokens_per_s_per_gpu"}
TWIN_KEYS = ("mode", "mapping", "policies", "prefill_batch", "decode_batch", "verify", "ttft_step")


# ---- inputs -------------------------------------------------------------------------------------------------
@attrs.frozen
class Traffic:
    """Request classes: prompt tokens ``isl``, output tokens ``osl`` and a relative ``weight`` each."""

    isl: tuple = attrs.field(converter=tuple)
    osl: tuple = attrs.field(converter=tuple)
    weight: tuple = attrs.field(converter=tuple)
    #: standard deviations of the batch's summed context added to its mean in the memory check (see
    #: :meth:`memory_context`)
    kv_margin: float = DEFAULT_KV_MARGIN

    def __attrs_post_init__(self):
        check_number("kv_margin", self.kv_margin, 0.0, 1000.0)
        require(len(self.isl) > 0 and len(self.isl) == len(self.osl) == len(self.weight), "traffic",
                "give one or more classes, each with isl, osl and weight")
        for f in ("isl", "osl"):
            for v in getattr(self, f):
                check_int(f"traffic.{f}", v, 1, MAX_CONTEXT)
        for w in self.weight:
            require(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0,
                    "traffic.weight", f"must be a positive number, got {w!r}")

    @staticmethod
    def of(isl: int, osl: int, kv_margin: float = DEFAULT_KV_MARGIN) -> "Traffic":
        return Traffic((isl,), (osl,), (1.0,), kv_margin)

    @staticmethod
    def load(path: str | Path, kv_margin: float = DEFAULT_KV_MARGIN) -> "Traffic":
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
        return Traffic([k[0] for k in keys], [k[1] for k in keys], [merged[k] for k in keys], kv_margin)

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
        # one class: isl + osl // 2, the context graphsim.serving.disagg decodes at
        return max(1, int(float((self.w * o) @ (i + np.floor(o / 2.0))) / float(self.w @ o)))

    def _slot(self) -> tuple[float, float]:
        """Mean and standard deviation of the context one decode slot holds in the steady state: a slot holds
        a request of class c with probability ∝ w·osl (a request holds its slot for osl steps) at a position
        uniform in [isl, isl + osl] (mean isl + osl/2, variance osl²/12)."""
        i, o = np.asarray(self.isl, dtype=np.float64), np.asarray(self.osl, dtype=np.float64)
        pi = self.w * o / float(self.w @ o)
        mean = float(pi @ (i + o / 2.0))
        var = float(pi @ (o * o / 12.0 + (i + o / 2.0) ** 2)) - mean * mean
        return mean, math.sqrt(max(var, 0.0))

    @property
    def fit_context(self) -> int:
        """The steady-state mean context a decode slot holds (memory holds it plus :meth:`memory_context`'s
        margin)."""
        return int(math.ceil(self._slot()[0]))

    @property
    def context_std(self) -> float:
        """Standard deviation of one slot's context (one class: osl/√12)."""
        return self._slot()[1]

    def memory_context(self, requests) -> np.ndarray:
        """Context per request the memory check holds when ``requests`` decode slots share a device's KV
        (the requests of one attention-DP rank): the steady-state mean plus ``kv_margin`` standard
        deviations of their sum spread over them, mean + z·σ/√n (the slots' positions are independent; by
        the central limit theorem the summed KV exceeds this with probability ≈ 0.13 % at z = 3), at most
        the longest request's full length isl + osl; whole tokens, rounded up."""
        mean, std = self._slot()
        n = np.maximum(np.asarray(requests, dtype=np.float64), 1.0)
        full = max(i + o for i, o in zip(self.isl, self.osl))
        return np.minimum(np.ceil(mean + self.kv_margin * std / np.sqrt(n) - 1e-9), full).astype(np.int64)

    def to_dict(self) -> dict:
        return {"classes": [{"isl": int(i), "osl": int(o), "weight": float(w)}
                            for i, o, w in zip(self.isl, self.osl, self.w)],
                "mean_osl": self.mean_osl, "decode_context": self.decode_context,
                "fit_context": self.fit_context, "context_std": self.context_std, "kv_margin": self.kv_margin}


@attrs.frozen
class SLA:
    """Bounds a deployment must meet (None: unbounded). TTFT holds for every request class."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    min_tokens_per_s_per_user: float | None = None
    #: which TPOT the bound holds: the steady-state ``mean`` or the ``p99`` over the step mix
    tpot_stat: str = "mean"

    def __attrs_post_init__(self):
        for f in ("ttft_ms", "tpot_ms", "min_tokens_per_s_per_user"):
            v = getattr(self, f)
            require(v is None or (isinstance(v, (int, float)) and math.isfinite(v) and v > 0), f"sla.{f}",
                    f"must be a positive number, got {v!r}")
        require(self.tpot_stat in TPOT_STATS, "sla.tpot_stat",
                f"one of {', '.join(TPOT_STATS)}, got {self.tpot_stat!r}")

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
    speculative decoding (MTP-K, or DSpark with K = its block). ``refine``: how many of the best deployments
    along the front get the policy stage (``exhaustive`` with ``refine`` at least the deployments: the whole
    space)."""

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
    from ..driver.pipeline import BASE_SUPPORT

    support = {**BASE_SUPPORT, **model.POLICY_SUPPORT, "overlap": ("none", "two-batch"), "sp": ("off", "on")}
    if "host" in support.get("engram", ()):  # the model has Engram tables: where they live and how they split
        support.update(engram_shard=("tp", "world"), engram_proj=("replicated", "tp"))
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


def canonical(p: Policies, mapping: ParallelMapping) -> Policies:
    """``p`` with the fields that change nothing on ``mapping`` at their defaults, so equal programs share one
    key: sequence parallelism and a TP-split Engram projection need tp > 1, world-sharded Engram rows need
    more ranks than the TP group."""
    ch = {}
    if mapping.tp == 1:
        ch.update(sp="off", engram_proj="replicated")
    if mapping.dp * mapping.cp == 1:
        ch["engram_shard"] = "tp"
    ch = {k: v for k, v in ch.items() if getattr(p, k) != v}
    return attrs.evolve(p, **ch) if ch else p


def _saver(model, field: str, values: tuple):
    """The value of memory axis ``field`` (among ``values``) that holds the least per device."""
    if field == "attention_precision":
        from ..core.ir import fmt

        return min(values, key=lambda v: fmt(model.kv_cache_format(Policies(attention_precision=v))).bytes_per_elem)
    return MEMORY_SAVERS[field] if MEMORY_SAVERS.get(field) in values else values[0]


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
        from ..core.outputs import SCHEMA_VERSION

        return {"schema_version": SCHEMA_VERSION, "command": "search", "model": self.model, "hw": self.hw, "gpus": self.gpus,
                "traffic": self.traffic.to_dict(), "sla": self.sla.to_dict(), "view": self.view,
                "profile": self.profile, "space": self.space, "best": self.best, "pareto": self.pareto,
                "rejected": self.rejected, "reasons": self.reasons, "skipped": self.skipped, "stats": self.stats}


def _view_digests(view) -> dict:
    """The content of the files a measured or FPM view reads (the view itself names only their paths): an
    edited table or model file changes every cached program's identity."""
    from ..driver.identity import fpm_digest
    from ..views.measured.schema import measured_digest

    if view_name(view) == "sol" or view.measured is None:
        return {}
    src = getattr(view.measured, "root", view.measured)  # a folder, a file or an open Store
    if view.name == "fpm":
        return {"fpm": fpm_digest(src)}
    return {"measured": measured_digest(src)}


class _Cache:
    """Evaluated groups on disk (``<dir>/<key>.json``), so an interrupted search resumes."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, identity: str):
        """The entry ``key`` when its checksum holds and it was computed from ``identity``; a damaged,
        edited or foreign entry is removed (recomputed), never trusted."""
        if self.folder is None:
            return None
        from ..driver.identity import discard, verify

        p = self.folder / f"{key}.json"
        if not p.is_file():
            return None
        if verify(p, {"search": identity}) is not None:
            discard(p)
            return None
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None  # a torn file: recompute

    def put(self, key: str, d: dict, identity: str) -> None:
        if self.folder is None:
            return
        from ..driver.identity import seal
        from ..core.outputs import write_text

        p = self.folder / f"{key}.json"
        write_text(p, json.dumps(d))
        seal(p, {"search": identity})


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
        # everything a cached program depends on: the model's whole state (config, weight formats, redundant
        # experts), the descriptor, profile, view, traffic and the grids
        from ..core.version import __version__

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

        from ..sweep.workers import pool_initializer

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
        from ..sweep.executors import ray_init

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
        from .fit import MemoryModel
        from ..driver.metrics import emitted
        from ..core.workload import Workload

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
            c = compile_plan(self.model, Plan([req], mapping, policies), self.hw, self.profile, view=self.view)
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
            c = compile_plan(self.model, Plan([req], mapping, policies), self.hw, self.profile, view=self.view)
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
        from . import hottest_rank_factor

        sv = self.serving
        moe = next((op.info for op in c.graph.ops if op.kind == "moe_experts" and op.info.experts), None)
        if not sv.moe_routing or mapping.ep <= 1 or moe is None or policies.ep_imbalance != 1.0:
            return fwd
        factor = hottest_rank_factor(tokens, moe.top_k, moe.experts, mapping.ep, sv.moe_load_ratio, sv.eplb)
        c2 = compile_plan(self.model, Plan([req], mapping, attrs.evolve(policies, ep_imbalance=2.0)), self.hw,
                          self.profile, view=self.view)
        hot = np.asarray(c2.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64)
        return fwd + (factor - 1.0) * (hot - fwd)

    def _engine_prefill(self, c, req, mapping, policies, per_rank, isl, whole) -> np.ndarray:
        """Prefill forwards (rows of ``per_rank`` prompts per DP rank, one column per class) as the engine runs
        them: within its token budget one step (``whole``), else the steps of :func:`prefill_steps` — chunks with
        ``past`` = the prompt's earlier chunks, or whole prompts packed — each a forward of a three-group program
        (the rest of a begun prompt, whole prompts, the next prompt's head), summed; NaN where the engine does not
        run it. Every step pays the engine's host terms."""
        from . import prefill_steps

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
            c3 = compile_plan(self.model, Plan([req] * 3, mapping, policies), self.hw, self.profile, view=self.view)
            out = _sum_steps(out, plan, c3, ("prefill",) * 3, dp, sv, k)
        return out

    def _mixed(self, mapping, policies, kmax: int) -> Group:
        """Aggregated steps that prefill prompts together with the running decode batch. A replica admits
        f = B·E/(OSL·dp) prompts per DP group and step on average, so its steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts
        (whole prompts, one per DP group at a time). At every (batch, verify) row of the decode program, per
        traffic class: the forward of the B decodes with each of those prompt counts, then — the same program
        without the decodes — a prefill-only step of the dp·⌈f⌉ prompts and one prompt alone. ``forward_s``
        is (rows, 4 × classes) in the blocks :data:`MIXED_BLOCKS`; ``prompts`` holds f."""
        from ..core.workload import Workload

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
        from .fit import op_workspace

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
        from . import prefill_steps

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
        from .disagg import Pool, handover_seconds

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


def agg_schedules(mix: Group, t_dec: np.ndarray, w: np.ndarray, dp: int):
    """(step, prompts per step, TTFT, mean TPOT, p99 TPOT) per way an aggregated replica prefills, each an
    array over the mixed group's rows (NaN where a schedule does not apply). Every step gives each request E
    tokens; f = B·E/(OSL·dp) prompts per DP group and step; a step's prompts are of one class (weights ``w``):

    * ``mixed``: dp·⌊f⌋ (share 1 − φ, φ = f − ⌊f⌋) or dp·⌈f⌉ (share φ) prompts ride with the decodes;
      TTFT = the ⌈f⌉ step;
    * ``prefill``: a prefill-only step of dp·n prompts (n = max(1, ⌈f⌉)) before a share f/n of the decode
      steps (the decodes wait); TTFT = that step;
    * ``lone``: each prompt in a step of its own (g = f·dp of them per decode step, ⌊g⌋ or ⌈g⌉); TTFT = one
      prompt's forward — graphsim spreads a DP-split op's work over the DP groups, so this is a lower bound of
      the one group that runs it (exact at dp = 1; omitted there when it equals ``prefill``).

    TPOT p99 is the 99th percentile of the step times a token waits (a step with prompts is a spike)."""
    C = w.size
    blk = {name: mix.forward_s[:, i * C:(i + 1) * C] for i, name in enumerate(MIXED_BLOCKS)}
    e, f = mix.emitted, mix.prompts
    td = np.asarray(t_dec, dtype=np.float64)[:, None]
    fl = np.floor(f)
    phi = (f - fl)[:, None]
    t_lo = np.where((fl == 0)[:, None], td, blk["mixed_lo"])
    n = np.maximum(1.0, np.ceil(f))
    q = (f / n)[:, None]
    g = f * dp
    gl = np.floor(g)[:, None]
    phg = g[:, None] - gl
    lone = blk["lone"]
    out = []
    for step, pb, ttft, vals, probs in (
            ("mixed", dp * n, blk["mixed"].max(axis=1), [t_lo, blk["mixed"]], [(1 - phi) * w, phi * w]),
            ("prefill", dp * n, blk["prefill"].max(axis=1), [td + np.zeros_like(lone), td + blk["prefill"]],
             [(1 - q) * w, q * w]),
            ("lone", np.ones_like(f), lone.max(axis=1), [td + gl * lone, td + (gl + 1) * lone],
             [(1 - phg) * w, phg * w])):
        v, p = np.concatenate(vals, axis=1), np.concatenate(probs, axis=1)
        mean, p99 = (v * p).sum(axis=1) / e, _quantile(v, p, 0.99) / e
        if step == "lone":
            same = (dp == 1) & (n == 1)
            mean, p99 = np.where(same, np.nan, mean), np.where(same, np.nan, p99)
        out.append((step, pb, ttft, mean, p99))
    return out


def _sum_steps(out: np.ndarray, plan: dict, c, kinds: tuple, scale: float, sv, k: int) -> np.ndarray:
    """``out`` with each ``plan`` entry ((row, column) -> steps, each a tuple of (count, new, past) per group of
    ``kinds``; counts times ``scale``) replaced by the sum of its steps' forwards on ``c``, each a step as engine
    ``sv`` runs it (``k`` kernels, eager)."""
    pieces = np.array([st for steps in plan.values() for st in steps], dtype=np.float64)  # (S, groups, 3)
    wl = Workload(kinds, pieces[:, :, 0] * scale, pieces[:, :, 1], pieces[:, :, 2])
    t = sv.step_time(np.asarray(c.evaluate(wl, outputs=("forward",))["forward"], dtype=np.float64), k)
    out = out.copy()
    at = 0
    for key, steps in plan.items():
        out[key] = float(t[at:at + len(steps)].sum())
        at += len(steps)
    return out


def _quantile(v: np.ndarray, p: np.ndarray, q: float) -> np.ndarray:
    """Per row, the smallest value of a discrete distribution (values ``v``, probabilities ``p``, both (R, K))
    whose cumulative probability reaches ``q``."""
    order = np.argsort(v, axis=1, kind="stable")
    vs, cs = np.take_along_axis(v, order, axis=1), np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
    idx = np.minimum((cs < q * cs[:, -1:] * (1 - 1e-12)).sum(axis=1), v.shape[1] - 1)
    return vs[np.arange(v.shape[0]), idx]


def _largest_between(room: Callable, grid: list) -> list:
    """The most requests per DP rank between the largest value of ``grid`` that fits (``room`` >= 0) and the
    next, which does not: [] when every value or none fits. ``room`` is monotone (memory grows with the
    batch) and vectorized; the bracket is evaluated whole."""
    grid = sorted(grid)
    ok = np.asarray(room(grid)) >= 0
    if ok.all() or not ok[0]:
        return []
    i = int(np.flatnonzero(~ok)[0])
    inner = np.arange(grid[i - 1] + 1, grid[i])
    if inner.size == 0:
        return []
    fit = inner[np.asarray(room(inner)) >= 0]
    return [int(fit[-1])] if fit.size else []


def _largest_fit(room: Callable, cap: int) -> int:
    """The largest count in [1, cap] with ``room`` >= 0 (monotone, vectorized); 0 if not even 1 fits."""
    pow2 = [1 << k for k in range(cap.bit_length()) if 1 << k <= cap]
    ok = np.asarray(room(pow2)) >= 0
    if not ok[0]:
        return 0
    if ok.all():
        last = pow2[-1]
        inner = np.arange(last + 1, cap + 1)
    else:
        i = int(np.flatnonzero(~ok)[0])
        last, inner = pow2[i - 1], np.arange(pow2[i - 1] + 1, pow2[i])
    fit = inner[np.asarray(room(inner)) >= 0] if inner.size else inner
    return int(fit[-1]) if fit.size else last


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


def _pareto_min_max(items: list, lo: Callable, hi: Callable) -> list:
    """Items no other item beats on both: lower ``lo`` and higher ``hi``."""
    out, best = [], -math.inf
    for it in sorted(items, key=lambda c: (lo(c), -hi(c))):
        if hi(it) > best:
            out.append(it)
            best = hi(it)
    return out


def _misses(df, sla: SLA) -> dict:
    """:func:`_meets` for every row of a DataFrame: bound -> bool array."""
    n = len(df)
    return {k: np.broadcast_to(np.asarray(v, dtype=bool), (n,)) for k, v in _meets(df, sla).items()}


def _meets(row, sla: SLA) -> dict:
    """Which SLA bounds a row misses (memory first); ``row`` a dict or a DataFrame (then each is a column)."""
    return {"memory": ~np.asarray(row["fits"], dtype=bool),
            "ttft": sla.ttft_ms is not None and row["ttft_ms"] > sla.ttft_ms * (1 + 1e-12),
            "tpot": sla.tpot_ms is not None
            and row["tpot_p99_ms" if sla.tpot_stat == "p99" else "tpot_ms"] > sla.tpot_ms * (1 + 1e-12),
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
           progress: Callable[[int], None] | None = None, jobs: int = 1, engine: str | None = "auto",
           engine_set: tuple = (), executor: str = "local", address: str | None = None) -> SearchResult:
    """Search deployments of ``model`` on ``gpus`` GPUs of ``hw`` for ``traffic`` under ``sla``; the best
    ``top`` deployments (by output tokens/s per GPU among those meeting the SLA), the Pareto front and why the
    others lost. ``cache_dir`` keeps every evaluated program (a rerun resumes from it). ``progress(n)`` is called
    as programs are evaluated; if it has ``expect(n)``, that is called first with how many more are planned.
    ``jobs`` > 1 evaluates programs on that many spawned worker processes (the same results; a script using it
    needs the ``if __name__ == "__main__":`` guard, as for any spawned process).

    What is evaluated never depends on the SLA (it only ranks): a bound added to the SLA never hides a row
    that meets it. ``engine`` ("auto", "none", "sglang", "vllm", "trtllm"): whose documented memory rule and KV
    paging decide which batches fit (graphsim.serving); "auto" is the measured view's backend framework, none in
    the SOL view (a bound keeps every byte). A *prediction* (a measured view or a profile) also runs each step
    as its engine does (:mod:`graphsim.serving.engines`): decode batches within its requests and tokens per DP rank,
    prompts over its token budget in chunks (each a forward with the earlier chunks as ``past``; TTFT their sum),
    and a step's host time (kernel launches or a CUDA graph replay, the exposed scheduler); the SOL view and the
    SOL twin never pay those. ``engine_set``: ``FIELD=VALUE`` strings overriding the engine's documented terms.
    ``executor``: "local" (``jobs`` processes on this machine) or "ray" (a Ray cluster at ``address``, default a
    local instance): the same programs, so the same rows."""
    import pandas as pd

    from .fit import DEFAULT_RESERVE_GIB
    from ..hw import load_hw, load_profile
    from ..models import load_model

    t0 = time.perf_counter()
    check_int("gpus", gpus, 1, MAX_RANKS)
    check_int("top", top, 1, 10_000)
    require(isinstance(traffic, Traffic), "traffic", "a graphsim.serving.search.Traffic")
    model = load_model(model) if isinstance(model, str) else model
    hw = load_hw(hw) if isinstance(hw, str) else hw
    profile = load_profile(profile) if isinstance(profile, str) else profile
    reserve = DEFAULT_RESERVE_GIB if reserve_gib is None else reserve_gib
    check_number("reserve_gib", reserve, 0.0, 1 << 20)
    check_int("jobs", jobs, 1, 1024)
    require(executor in ("local", "ray"), "executor", f"must be local or ray, got {executor!r}")
    terms = _engine(engine, view)
    require(not engine_set or terms is not None, "engine_set", "sets an engine's terms: choose an engine (--engine "
            "sglang|vllm|trtllm, or a measured view whose backend has one)")
    if terms is not None:  # the GPU's tier of each default computed at launch, then the user's settings
        terms = terms.on(hw.hbm_capacity_bytes).with_settings(engine_set)
    s = _Search(model, hw, gpus, traffic, sla, space, profile, view, reserve,
                _Cache(Path(cache_dir) if cache_dir else None), progress, jobs, terms, executor, address)
    axes = policy_axes(model, space)
    base = {f: v[0] for f, v in axes}
    dec_maps = mappings(model, hw, gpus, space, "decode")
    pre_maps = mappings(model, hw, gpus, space, "prefill") if "disagg" in space.modes else []
    require(bool(dec_maps), "gpus", f"no mapping of {model.name} fits the space on {gpus} GPUs "
            "(check --tp/--dp/--ep/--pp and the model's head/expert counts)")
    s.agg_maps = [m for m in dec_maps if m.gpus <= gpus] if "agg" in space.modes else []
    s.dd_maps = [m for m in dec_maps if m.gpus < gpus] if pre_maps else []
    s.pp_maps = pre_maps if s.dd_maps else []
    # stage 1: every mapping under the base policies; where memory decides, the residency values that may
    # rescue it (memory is checked after them)
    work = {("dec", m): [base] for m in dict.fromkeys(s.agg_maps + s.dd_maps)}
    work.update({("pre", m): [base] for m in s.pp_maps})
    rows = _assemble(s, work)
    rescue = {k: c for k, c in ((k, _rescue(s, k, base, axes)) for k in work) if c}
    rows += _assemble(s, rescue)
    choices = {_ckey(base)} | {_ckey(c) for cs in rescue.values() for c in cs}
    # stage 2: the mappings of the best deployments along the front, every single-axis variant of their
    # policies (or every combination), then every combination of the values that reach the front
    if space.refine and len(axes):
        leaders = _leaders(rows, space.refine, axes)
        stage2 = {k: _variants(axes, starts, space.exhaustive) for k, starts in leaders.items()}
        extra = _assemble(s, stage2)
        lead = [r for r in rows + extra if _lead_key(r) & set(leaders)]
        starts = [c for cs in leaders.values() for c in cs]
        combos = _combos(lead, axes, starts, {c for cs in stage2.values() for c in map(_ckey, cs)} | choices)
        extra += _assemble(s, {k: combos for k in leaders})
        rows += extra
        choices |= {_ckey(c) for cs in stage2.values() for c in cs} | {_ckey(c) for c in combos}
    if not rows:
        why = "; ".join(sorted({x["error"] for x in s.skipped}))[:300] or (
            "disaggregated serving needs a prefill and a decode pool: a decode mapping smaller than --gpus and a "
            "prefill mapping in what is left" if space.modes == ("disagg",) else "no mapping fits the space")
        if s.serving is not None and not s.skipped:
            sv = s.serving
            why = (f"{sv.name} runs no step of this traffic within its limits (step_tokens={sv.step_tokens}, "
                   f"chunked_prefill={str(sv.chunked_prefill).lower()}, max_running={sv.max_running}; the longest "
                   f"prompt has {max(traffic.isl)} tokens): --engine-set changes them")
        raise GraphsimError("search", f"no deployment could be evaluated: {why}")
    df = pd.DataFrame(rows)
    df["deployment"] = df["mode"] + " " + df["mapping"] + " [" + df["policies"] + "]"
    df = df.drop_duplicates(["deployment", "prefill_batch", "decode_batch", "verify", "ttft_step"]) \
        .reset_index(drop=True)
    df = _with_sol(df, s, view, profile)
    miss = _misses(df, sla)
    df["meets_sla"] = ~np.any([miss[k] for k in miss], axis=0)
    why = np.full(len(df), "", dtype=object)
    for k in reversed(list(miss)):  # the first bound missed, memory first
        why = np.where(miss[k], k, why)
    df["why"] = why
    ok_front = df["fits"] & ~np.asarray(miss["ttft"], dtype=bool)
    flags = np.zeros(len(df), dtype=bool)
    if ok_front.any():
        idx = np.flatnonzero(ok_front.to_numpy())
        flags[idx] = pareto_flags(df["tokens_per_s_per_user"].to_numpy()[idx],
                                  df["tokens_per_s_per_gpu"].to_numpy()[idx])
    df["pareto"] = flags
    df["bound"] = "lower" if view is None and profile is None else "estimate"
    best, rejected, reasons = _rank(df, top, "tpot_p99_ms" if sla.tpot_stat == "p99" else "tpot_ms")
    public = [k for k in ROW_KEYS] + ["why"]
    table = df[public].copy()
    for k, v in (("model", model.name), ("hw", hw.name), ("view", view_name(view)),
                 ("profile", profile.name if profile else "sol")):
        table[k] = v
    pairs = _pairs(df)
    pareto = [_public(r, pairs) for r in df[df["pareto"]].sort_values("tokens_per_s_per_user").to_dict("records")]
    best_rows = []
    for i, r in enumerate(best):
        d = _public(r, pairs)
        d["rank"] = i + 1
        pol = attrs.asdict(r["_policies"])
        pol["algorithms"] = [{"collective": c, "algorithm": a} for c, a in pol["algorithms"]]
        pol["acceptance"] = list(pol["acceptance"])
        d["policy_values"] = pol  # every policy field, as estimate's identity.policies (docs/json.md)
        d["speculative"] = _spec_text(r["_policies"])
        d["launch"] = launch_flags(model, r, traffic=traffic, terms=terms, hbm_bytes=hw.hbm_capacity_bytes)
        best_rows.append(d)
    space_d = {"modes": list(space.modes), "decode_mappings": len(dec_maps), "prefill_mappings": len(pre_maps),
               "batches_per_dp_rank": list(space.batches), "prefill_batches_per_dp_rank": list(space.prefill_batches),
               "policy_axes": [{"field": f, "values": list(v)} for f, v in axes],
               "memory_axes": [f for f, _ in axes if f in MEMORY_AXES], "policy_points": len(choices),
               "refine": space.refine, "exhaustive": space.exhaustive, "acceptance": list(space.acceptance),
               "nvlink_domain": hw.nvlink_domain, "engine": terms.name if terms else "none",
               "engine_terms": terms.to_dict() if terms else None,
               "engine_steps": "priced" if s.serving is not None else ("memory only" if terms else "none")}
    stats = {"programs_compiled": s.compiled, "programs_cached": s.cached, "rows": len(df),
             "sol_programs_compiled": s.twin_compiled,
             "rows_meeting_sla": int(df["meets_sla"].sum()), "pareto_points": int(df["pareto"].sum()),
             "wall_s": time.perf_counter() - t0}
    return SearchResult(model.name, hw.name, gpus, traffic, sla, view_name(view),
                        profile.name if profile else "sol", table, best_rows, pareto, rejected, reasons,
                        sorted(s.skipped, key=lambda x: (x["what"], x["error"])),
                        space_d, stats)


def _engine(engine, view):
    """The engine terms a search fits batches by: "auto" = the measured view's backend framework when graphsim
    knows its documented terms, none under SOL."""
    from . import ENGINES, engine_terms

    if engine == "auto":
        if view_name(view) == "sol" or not getattr(view, "backend", ""):
            return None
        fw = str(view.backend).split("@", 1)[0]
        return ENGINES.get(fw)
    return engine_terms(engine)


def _with_sol(df, s: _Search, view, profile):
    """``df`` with each row's SOL twin (:data:`SOL_COLUMNS`): in the SOL view its own figures; with a measured
    view or a profile, the same work sets replayed through a speed-of-light search of the same space (the same
    programs, compiled without the view), joined on :data:`TWIN_KEYS`. A disaggregated row whose SOL rate
    balance pairs its pools in other numbers has no twin (NaN)."""
    import pandas as pd

    s.twin_compiled = 0
    if view is None and profile is None:
        for k, c in SOL_COLUMNS.items():
            df[c] = df[k]
        return df
    # the same batches as the prediction (the engine's memory rule decides which fit), at SOL times
    twin = _Search(s.model, s.hw, s.gpus, s.traffic, s.sla, s.space, None, None, s.reserve_gib, None, None, s.jobs,
                   s.engine)
    twin.agg_maps, twin.dd_maps, twin.pp_maps = s.agg_maps, s.dd_maps, s.pp_maps
    rows = [r for work in s.history for r in _assemble(twin, work)]
    s.twin_compiled = twin.compiled
    s.skipped += [x for x in twin.skipped if x not in s.skipped]
    if not rows:
        for c in SOL_COLUMNS.values():
            df[c] = np.nan
        return df
    sol = pd.DataFrame(rows)[list(TWIN_KEYS) + list(SOL_COLUMNS)].rename(columns=SOL_COLUMNS)
    sol = sol.drop_duplicates(list(TWIN_KEYS))
    return df.merge(sol, on=list(TWIN_KEYS), how="left")


def _ckey(choice: dict) -> tuple:
    return tuple(sorted(choice.items()))


def _planned(s: _Search, work: dict) -> list:
    """The programs :func:`_assemble` will need that are not evaluated yet, in order (a replica that fits at no
    batch skips its mixed program, so this is an upper bound)."""
    keys: dict = {}
    for (role, m), cs in work.items():
        for choice in cs:
            pol = policies_of(choice, s.space.acceptance)
            if role == "dec" and m in s.agg_maps:
                keys.update(dict.fromkeys([_key("decode", m, pol), _key("mixed", m, pol)]))
            if role == "dec" and m in s.dd_maps:
                keys.update(dict.fromkeys([_key("decode", m, pol)]))
            if role == "pre":
                keys.update(dict.fromkeys([_key("prefill", m, pol)]))
    return [k for k in keys if k not in s.groups]


def _assemble(s: _Search, work: dict) -> list[dict]:
    """Rows of the (role, mapping) -> policy choices in ``work``: aggregated replicas of each decode mapping,
    and disaggregated pairs of every prefill and decode pool evaluated under one choice so far (each pair
    once)."""
    s.history.append(work)
    planned = _planned(s, work)
    if s.progress is not None and hasattr(s.progress, "expect"):
        s.progress.expect(len(planned))
    if s.jobs > 1:
        s.prefetch(planned)
    rows, touched = [], set()
    for (role, m), cs in work.items():
        for choice in cs:
            pol = policies_of(choice, s.space.acceptance)
            if role == "dec" and m in s.agg_maps and (m, canonical(pol, m)) not in s.assembled:
                s.assembled.add((m, canonical(pol, m)))
                rows += s.agg_rows(m, pol)  # gpus // n replicas; tokens/s per GPU over the GPUs used
            if m in (s.pp_maps if role == "pre" else s.dd_maps):
                # pools pair when their time axes agree (each pool keeps its own residency values)
                tk = _ckey({f: v for f, v in choice.items() if f not in MEMORY_AXES})
                s.pools.setdefault(tk, {"pre": {}, "dec": {}})[role][(m, canonical(pol, m))] = pol
                touched.add(tk)
    for tk in touched:
        pools = s.pools[tk]
        pre = [g for g in (s.group("prefill", m, p) for (m, _), p in pools["pre"].items()) if not g.error]
        dec = [g for g in (s.group("decode", m, p) for (m, _), p in pools["dec"].items()) if not g.error]
        rows += s.disagg_rows(pre, dec)
    return rows


def _rescue(s: _Search, key: tuple, base: dict, axes) -> list[dict]:
    """Residency values tried for one pool where memory decides (some batch of the grid does not fit under
    the base values): every memory axis at its saver value together — the least a device can hold. If that
    fits no more, no residency value rescues anything; else it joins the pool's policy points (the policy
    stage tries each memory axis back at its other values from there)."""
    mem = [(f, v) for f, v in axes if f in MEMORY_AXES]
    if not mem:
        return []
    role, m = key
    kind = "prefill" if role == "pre" else "decode"
    g0 = s.group(kind, m, policies_of(base, s.space.acceptance))
    if g0.error:
        return []
    grid = np.isin(g0.batch / m.dp, s.space.prefill_batches if kind == "prefill" else s.space.batches)
    if kind == "prefill" and (g0.headroom_bytes[grid] >= 0).any() or (g0.headroom_bytes[grid] >= 0).all():
        return []
    saver = {**base, **{f: _saver(s.model, f, v) for f, v in mem}}
    pol0, pols = policies_of(base, s.space.acceptance), policies_of(saver, s.space.acceptance)
    if canonical(pols, m) == canonical(pol0, m):
        return []
    gs = s.group(kind, m, pols)
    if gs.error or _most_fitting(gs) <= _most_fitting(g0):
        return []
    return [saver]


def _most_fitting(g: Group) -> float:
    fit = g.batch[g.headroom_bytes >= 0]
    return float(fit.max()) if fit.size else 0.0


def _lead_key(r: dict) -> set:
    return {("dec", r["_dmap"])} | ({("pre", r["_pmap"])} if r["mode"] == "disagg" else set())


def _choice_of(r: dict, axes) -> dict:
    """A row's point of the policy space (a disaggregated row's prefill-only fields from its prefill pool)."""
    out = {}
    for f, _ in axes:
        p = r["_prefill_policies"] if f in PREFILL_ONLY else r["_policies"]
        out[f] = _axis_value(p, f)
    return out


def _front(rows: list[dict]) -> list[dict]:
    ok = [r for r in rows if r["fits"]]
    if not ok:
        return []
    flags = pareto_flags(np.array([r["tokens_per_s_per_user"] for r in ok]),
                         np.array([r["tokens_per_s_per_gpu"] for r in ok]))
    return [r for r, f in zip(ok, flags) if f]


def _leaders(rows: list[dict], k: int, axes) -> dict:
    """Pools of the ``k`` best deployments along the front of tokens/s per GPU against per user (from the
    fastest per GPU down; then the fastest rows off it), each with the policy point of its fastest row there —
    chosen without the SLA, so a bound added to it never changes what is explored."""
    seen, out = set(), {}

    def take(r):  # a pool's start: the policy point of its fastest row per GPU on the front
        for key in _lead_key(r):
            out.setdefault(key, [_choice_of(r, axes)])

    for r in sorted(_front(rows), key=lambda r: -r["tokens_per_s_per_gpu"]):
        dep = (r["mode"], r["mapping"])
        if dep in seen or len(seen) < k:
            seen.add(dep)
            take(r)
    for r in sorted((r for r in rows if r["fits"]), key=lambda r: -r["tokens_per_s_per_gpu"]):
        if len(seen) >= k:
            break
        dep = (r["mode"], r["mapping"])
        if dep not in seen:
            seen.add(dep)
            take(r)
    return out


def _variants(axes, starts: list, exhaustive: bool) -> list[dict]:
    if exhaustive:
        return [dict(zip([f for f, _ in axes], vals)) for vals in itertools.product(*[v for _, v in axes])]
    out = []
    for start in starts:
        for f, vals in axes:
            for v in vals:
                c = {**start, f: v}
                if v != start[f] and c not in out:
                    out.append(c)
    return out


def _combos(rows: list[dict], axes, starts: list, done: set, cap: int = 8) -> list[dict]:
    """Combinations of each axis's winning values, less those evaluated: at most ``cap``, the most promising
    first (the product of each value's gain: its best tokens/s per GPU over the start's along that axis). An
    axis's winning values are those that put a row on the front (tokens/s per GPU against per user) among the
    rows of a start and its variants along that axis alone."""
    fields = [f for f, _ in axes]
    groups: dict = {}  # (axis, the other axes' values) -> rows
    for r in rows:
        c = _choice_of(r, axes)
        for f in fields:
            groups.setdefault((f, tuple(c[g] for g in fields if g != f)), []).append((r, c[f]))
    wins = {f: {} for f in fields}  # axis -> winning value -> its best tokens/s per GPU over the start's
    for start in starts:
        for f in fields:
            sub = groups.get((f, tuple(start[g] for g in fields if g != f)), [])
            on = {id(r) for r in _front([r for r, _ in sub])}
            ref = max((r["tokens_per_s_per_gpu"] for r, v in sub if v == start[f] and r["fits"]), default=0.0)
            for r, v in sub:
                if id(r) in on:
                    gain = r["tokens_per_s_per_gpu"] / ref if ref > 0 else 1.0
                    wins[f][v] = max(wins[f].get(v, 0.0), gain)
    if not all(wins.values()):
        return []
    # the most promising first: the product of each value's gain
    scored = sorted(itertools.product(*[list(wins[f].items()) for f in fields]),
                    key=lambda vs: -math.prod(g for _, g in vs))
    out = []
    for combo in scored:
        c = dict(zip(fields, [v for v, _ in combo]))
        if _ckey(c) not in done:
            out.append(c)
        if len(out) >= cap:
            break
    return out


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


def _rank(df, top: int, tpot_col: str = "tpot_ms"):
    """Top deployments (best batch each), and the reason each other deployment lost (``tpot_col``: the TPOT
    the SLA bounds)."""
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
                    detail = f"TPOT {timely[tpot_col].min():.1f} ms at best (meeting TTFT)"
                else:
                    detail = f"{timely['tokens_per_s_per_user'].max():.1f} tok/s/user at best (meeting TTFT)"
        reasons[reason] += 1
        rejected.append({"deployment": name, "mode": r["mode"], "mapping": r["mapping"], "policies": r["policies"],
                         "reason": reason, "detail": detail,
                         "best_tokens_per_s_per_gpu": float(g["tokens_per_s_per_gpu"].max())})
    rejected.sort(key=lambda r: (REASONS.index(r["reason"]), -r["best_tokens_per_s_per_gpu"]))
    return best, rejected, reasons


def _public(r: dict, pairs: dict | None = None) -> dict:
    out = {}
    for k in ROW_KEYS:
        v = r.get(k)
        out[k] = v.item() if hasattr(v, "item") else v
    if pairs is not None:
        out["jointly_achievable"] = pairs.get(_pair_key(r), [])
    return out


PAIR_KEYS = ("deployment", "prefill_replicas", "decode_replicas", "decode_batch", "verify")


def _pair_key(r) -> tuple:
    return tuple(r[k].item() if hasattr(r[k], "item") else r[k] for k in PAIR_KEYS)


def _pairs(df) -> dict:
    """Per deployment and batch, the (TTFT, TPOT) pairs one schedule achieves together — one per TTFT step;
    a row's own pair is among them, and the best TTFT and the best TPOT of different steps are each a
    bound but not a pair."""
    out: dict = {}
    cols = list(PAIR_KEYS) + ["ttft_step", "ttft_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s_per_gpu"]
    for r in df[cols].itertuples(index=False):
        d = r._asdict()
        out.setdefault(_pair_key(d), []).append({k: d[k] for k in cols[len(PAIR_KEYS):]})
    return out


__all__ = ["SLA", "Space", "Traffic", "SearchResult", "search", "mappings", "launch_flags", "pareto_flags"]
