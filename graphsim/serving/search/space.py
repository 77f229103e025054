"""The search space and its inputs: traffic classes, the SLA, the space of mappings, batches and policies
(:class:`Space`), and the enumeration of mappings and policy variants a model admits."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping

import attrs
import numpy as np

from ...core.errors import GraphsimError, require
from ...core.limits import MAX_CONTEXT, MAX_RANKS, MAX_REQUESTS, check_int, check_number
from ...core.plan import ParallelMapping, Policies


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
    from ...driver.pipeline import BASE_SUPPORT

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
        from ...core.ir import fmt

        return min(values, key=lambda v: fmt(model.kv_cache_format(Policies(attention_precision=v))).bytes_per_elem)
    return MEMORY_SAVERS[field] if MEMORY_SAVERS.get(field) in values else values[0]
