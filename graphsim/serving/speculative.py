"""DSpark verify lengths chosen on graphsim's own step-time curve (V41_FACTS §9).

``throughput ≈ E[emitted tokens] / E[step time]``: the acceptance model (:mod:`graphsim.models.dspark`) gives
E[emitted | k] per request; the step time of one draft + verify + commit step comes from ONE compiled
program of the model (dspark on), evaluated vectorized over every candidate k-vector at once.

Batch structure — classes and the (bucket, k) histogram
-------------------------------------------------------
* A **class** is a set of requests sharing an acceptance vector and a context bucket; the scheduler picks
  one verify length per class (its requests are interchangeable), weighting each class by its size.
* The program is built for ``B`` context buckets × (``k_max`` + 1) verify lengths: workload group (b, k)
  holds the requests of bucket b that verify k drafts (``new = 1 + k``, ``past`` = the bucket's context).
  A candidate k-vector over the classes is ONE workload point whose ``count`` row is the histogram of
  (bucket, k) over the batch. The structure — hence the compile time — depends on B and D only, never on
  the batch size or the number of classes, and integer verify lengths are priced exactly (no averaging).
* Buckets: at most ``max_buckets`` (default 4). With more distinct contexts, requests are cut into
  count-weighted quantile buckets, each priced at the mean context of its requests: the step time is
  close to linear in context (KV reads, index scans), so the mean keeps that work exact.

Many distinct acceptance rows make many classes; the scheduler's rounds grow with classes × D, so
``schedule_verify(..., max_classes=N)`` first merges classes within each bucket into count-weighted
quantiles of E[emitted | D] (:func:`merge_classes`: exact E totals, one shared k per merged class).

The scheduler (:func:`graphsim.models.dspark.choose_verify_lengths`) maximizes Σ_rows E_r / t(K) over its rows.
Its rows here are classes, so the callable it is given returns ``t(K) · Σ_c E_c / Σ_c n_c E_c``: its
objective is then exactly the batch's Σ_c n_c E_c / t(K) (with every n_c = 1 it is t itself). Reported
step times and throughputs are re-priced with the true t.

A verify step's time is not the ITL: each step delivers a burst of 1 + accepted tokens per request
(:class:`graphsim.models.dspark.RequestBurst`); the mean gap is t / E[emitted], a fraction 1 - 1/E[emitted] of
token gaps are zero (inside a burst) and the rest are one step.
"""
from __future__ import annotations

import attrs
import numpy as np

from ..models.dspark import AcceptanceProfile, RequestBurst, choose_verify_lengths
from ..core.errors import GraphsimError, require
from ..lowering.evaluate import Evaluator
from ..driver.pipeline import Compiled, Plan, Policies, compile_plan
from ..core.plan import ParallelMapping, Request
from ..core.workload import Workload

__all__ = ["DecodeBatch", "StepCurve", "SpecDecodeResult", "schedule_verify", "price_verify", "bucket_contexts",
           "merge_classes"]

#: Stages that are not the target's verify forward (the trunk stages are the verify).
DSPARK_STAGES = ("commit", "draft")


# --------------------------------------------------------------------------------------------------
# The batch
# --------------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class DecodeBatch:
    """Decode requests as classes: class c holds ``counts[c]`` requests at context ``contexts[c]`` with
    acceptance row ``profile.a[c]``."""

    contexts: tuple = attrs.field(converter=lambda x: tuple(int(v) for v in np.atleast_1d(x)))
    counts: tuple = attrs.field(converter=lambda x: tuple(int(v) for v in np.atleast_1d(x)))
    profile: AcceptanceProfile = attrs.field()

    def __attrs_post_init__(self):
        require(isinstance(self.profile, AcceptanceProfile), "profile", "must be an AcceptanceProfile (one row per class)")
        n = self.profile.n_requests
        require(len(self.contexts) == n, "contexts", f"has {len(self.contexts)} entries for {n} acceptance rows")
        require(len(self.counts) == n, "counts", f"has {len(self.counts)} entries for {n} acceptance rows")
        require(all(v > 0 for v in self.contexts), "contexts", "decode contexts must be positive")
        require(all(v > 0 for v in self.counts), "counts", "class sizes must be positive")

    @classmethod
    def uniform(cls, context: int, count: int, a) -> "DecodeBatch":
        """``count`` requests at one context sharing acceptance vector ``a``."""
        return cls((context,), (count,), AcceptanceProfile.constant(a))

    @classmethod
    def from_requests(cls, contexts, profile: AcceptanceProfile) -> "DecodeBatch":
        """One entry per request (``contexts`` (R,), ``profile`` R rows) -> classes of identical
        (context, acceptance row), in first-appearance order."""
        ctx = np.atleast_1d(np.asarray(contexts))
        require(ctx.shape == (profile.n_requests,), "contexts", f"needs one context per profile row ({profile.n_requests})")
        keys: dict = {}
        for r in range(profile.n_requests):
            keys.setdefault((int(ctx[r]), profile.a[r].tobytes()), []).append(r)
        rows = [v[0] for v in keys.values()]
        return cls([int(ctx[r]) for r in rows], [len(v) for v in keys.values()],
                   AcceptanceProfile.from_table(profile.a[rows]))

    @property
    def n_classes(self) -> int:
        return len(self.counts)

    @property
    def n_requests(self) -> int:
        return sum(self.counts)


def bucket_contexts(contexts, counts=None, max_buckets: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(representative context per bucket, upper bound per bucket): every distinct context is its own
    bucket when there are at most ``max_buckets``; otherwise count-weighted quantile buckets priced at
    the mean context of their requests (rounded)."""
    require(isinstance(max_buckets, int) and max_buckets >= 1, "max_buckets", f"must be a positive integer, got {max_buckets!r}")
    ctx = np.atleast_1d(np.asarray(contexts, dtype=np.int64))
    w = np.ones(ctx.shape) if counts is None else np.atleast_1d(np.asarray(counts, dtype=np.float64))
    require(ctx.size > 0 and ctx.shape == w.shape, "contexts", "needs at least one context (and one count per context)")
    u, inv = np.unique(ctx, return_inverse=True)
    wu = np.bincount(inv, weights=w)
    if u.size <= max_buckets:
        return u.copy(), u.copy()
    # the bucket of a context = where the middle of its weight falls among max_buckets equal shares
    mid = (np.cumsum(wu) - wu / 2) / wu.sum()
    which = np.minimum((mid * max_buckets).astype(np.int64), max_buckets - 1)
    used = np.unique(which)
    rep = np.array([round(float(np.average(u[which == b], weights=wu[which == b]))) for b in used], dtype=np.int64)
    upper = np.array([u[which == b].max() for b in used], dtype=np.int64)
    return rep, upper


# --------------------------------------------------------------------------------------------------
# The step-time curve
# --------------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class StepCurve:
    """One compiled decode step for ``B`` context buckets × verify lengths 0..``k_max``; prices
    (bucket, k) histograms vectorized. ``k_max`` is D with DSpark on, 0 for plain decode."""

    compiled: Compiled
    contexts: np.ndarray  #: (B,) context each bucket is priced at
    upper: np.ndarray  #: (B,) largest context of each bucket (bucket b covers (upper[b-1], upper[b]])
    k_max: int
    #: points per evaluation call: every call is padded to a multiple of it, so one kernel is compiled
    block: int = 16
    evaluator: Evaluator = attrs.field(default=attrs.Factory(
        lambda self: Evaluator(self.compiled.program, self.compiled.plan.kinds, self.block, view=self.compiled.view),
        takes_self=True))

    @classmethod
    def compile(cls, model, hw, contexts, *, counts=None, mapping: ParallelMapping = ParallelMapping(),
                policies: Policies = Policies(dspark="on"), profile=None, max_buckets: int = 4) -> "StepCurve":
        """Build, shard and lower the decode step for the buckets of ``contexts`` (weighted by ``counts``)."""
        if isinstance(model, str):
            from ..models import load_model

            model = load_model(model)
        rep, upper = bucket_contexts(contexts, counts, max_buckets)
        if policies.dspark == "on":
            k_max = model.draft_ahead(policies)
            require(k_max > 0, "policies.dspark", f"{model.name} has no DSpark drafter")
        else:
            k_max = 0
        # count=1 placeholders: the evaluated counts come from each candidate's histogram
        reqs = [Request("decode", int(c), 1, new=1 + k) for c in rep for k in range(k_max + 1)]
        compiled = compile_plan(model, Plan(reqs, mapping, policies), hw, profile)
        return cls(compiled, rep, upper, k_max)

    @property
    def n_buckets(self) -> int:
        return self.contexts.shape[0]

    @property
    def gpus(self) -> int:
        return self.compiled.plan.mapping.gpus

    def bucket_of(self, contexts) -> np.ndarray:
        """Bucket index of each context: the first bucket whose largest context is >= it (a context
        between two buckets is priced at the larger one); beyond the last bucket, the last one."""
        b = np.searchsorted(self.upper, np.asarray(contexts), side="left")
        return np.minimum(b, self.n_buckets - 1)

    def workload(self, hist) -> Workload:
        """Workload points from histograms ``hist`` (P, B, k_max+1): requests per (bucket, k)."""
        h = np.asarray(hist, dtype=np.float64)
        K1 = self.k_max + 1
        require(h.ndim == 3 and h.shape[1:] == (self.n_buckets, K1), "hist",
                f"must have shape (P, {self.n_buckets}, {K1}), got {h.shape}")
        new = np.tile(1.0 + np.arange(K1), self.n_buckets)[None, :]
        past = np.repeat(self.contexts.astype(np.float64), K1)[None, :]
        return Workload(self.compiled.plan.kinds, h.reshape(h.shape[0], -1), new, past)

    def evaluate(self, hist) -> dict:
        """``forward`` (P,) and ``stages`` (P, stages) seconds of histograms (P, B, k_max+1), vectorized.
        Points are padded to a multiple of ``block``: one compiled kernel serves every call."""
        h = np.asarray(hist, dtype=np.float64)
        P = h.shape[0]
        pad = -P % self.block
        padded = np.concatenate([h, np.repeat(h[-1:], pad, axis=0)]) if pad else h
        c = self.compiled
        out = self.evaluator(self.workload(padded), c.unit_time(), c.overhead, ("forward", "stages"))
        return {k: v[:P] for k, v in out.items()}

    def histogram(self, buckets, counts, K) -> np.ndarray:
        """(P, B, k_max+1) histograms of class verify lengths ``K`` (P, C) for classes in ``buckets`` (C,)
        of sizes ``counts`` (C,)."""
        K = np.asarray(K, dtype=np.int64)
        if K.size and (K.min() < 0 or K.max() > self.k_max):
            raise GraphsimError("k", f"verify lengths must lie in 0..{self.k_max}")
        h = np.zeros((K.shape[0], self.n_buckets, self.k_max + 1))
        rows = np.arange(K.shape[0])[:, None]
        np.add.at(h, (rows, np.asarray(buckets)[None, :], K), np.asarray(counts, dtype=np.float64)[None, :])
        return h

    def stage_names(self) -> tuple:
        return self.compiled.program.stages


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class SpecDecodeResult:
    """A decode step of ``batch`` at class verify lengths ``k`` and what it delivers."""

    batch: DecodeBatch
    k: np.ndarray  #: (C,) verify length per class
    expected_emitted: np.ndarray  #: (C,) E[emitted | k] per request of each class
    step_time: float  #: seconds per draft + verify + commit step (the forward, critical path)
    stages: dict  #: busy seconds per stage; ``verify`` = the trunk stages together
    gpus: int
    evaluations: int = 0  #: candidate k-vectors the scheduler priced
    #: when schedule_verify merged classes: the merged class of each class it was given (k = k[class_of])
    class_of: np.ndarray | None = None

    @property
    def emitted_per_step(self) -> float:
        """Σ_c n_c E_c: expected tokens the batch emits per step."""
        return float(np.dot(self.batch.counts, self.expected_emitted))

    @property
    def throughput(self) -> float:
        """Expected emitted tokens per second of the replica: Σ E[emitted] / step time."""
        return self.emitted_per_step / self.step_time

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.throughput / self.gpus

    @property
    def tokens_per_s_per_user(self) -> np.ndarray:
        """(C,) E[emitted] / step time for a request of each class."""
        return self.expected_emitted / self.step_time

    def bursts(self) -> tuple[RequestBurst, ...]:
        """Per class: the burst a client receives each step (ITL is bursty, not the step time)."""
        dist = self.batch.profile.emitted_distribution(self.k)
        return tuple(RequestBurst(int(k), float(e), self.step_time, self.step_time / float(e), tuple(map(float, p)))
                     for k, e, p in zip(self.k, self.expected_emitted, dist))

    def itl(self) -> dict:
        """Per-token gap statistics per class: mean (step / E), the share of zero gaps (tokens after the
        first of a burst) and the gap between bursts (one step)."""
        e = self.expected_emitted
        return {"mean_s": self.step_time / e, "zero_gap_fraction": 1.0 - 1.0 / e,
                "burst_gap_s": np.full(e.shape, self.step_time)}

    def to_text(self) -> str:
        lines = [f"step {self.step_time * 1e3:.3f} ms  ({', '.join(f'{s} {v * 1e3:.3f}' for s, v in self.stages.items())} ms busy)",
                 f"throughput {self.throughput:,.0f} tok/s ({self.tokens_per_s_per_gpu:,.0f} per GPU)",
                 "class  context  count  k  E[emitted]  tok/s/user  P(burst = 1..D+1)"]
        for c, b in enumerate(self.bursts()):
            lines.append(f"{c:5d} {self.batch.contexts[c]:8d} {self.batch.counts[c]:6d} {b.k:2d} {b.tokens_per_step:10.3f} "
                         f"{b.tokens_per_step / self.step_time:11.1f}  " + " ".join(f"{p:.3f}" for p in b.burst_distribution))
        return "\n".join(lines)


def merge_classes(curve: StepCurve, batch: DecodeBatch, max_classes: int) -> tuple[DecodeBatch, np.ndarray]:
    """At most ``max_classes`` classes (at least one per used bucket): within each bucket of ``curve``,
    classes sorted by E[emitted | k = D] are cut into count-weighted quantile groups. A group's acceptance
    row is the one whose prefix products are the mean survival of its requests
    (:meth:`AcceptanceProfile.from_mixture`), so its Σ E[emitted] at a shared k is exact; the only
    approximation is that the group shares one k. Returns the merged batch and each class's group."""
    require(isinstance(max_classes, int) and max_classes >= 1, "max_classes", f"must be a positive integer, got {max_classes!r}")
    buckets = curve.bucket_of(batch.contexts)
    used = np.unique(buckets)
    per = max(1, max_classes // used.size)
    n = np.asarray(batch.counts, dtype=np.float64)
    full = batch.profile.expected_emitted_table()[:, -1]
    class_of = np.empty(batch.n_classes, dtype=np.int64)
    contexts, counts, rows = [], [], []
    for b in used:
        members = np.flatnonzero(buckets == b)
        members = members[np.argsort(full[members], kind="stable")]
        mid = (np.cumsum(n[members]) - n[members] / 2) / n[members].sum()
        part = np.minimum((mid * per).astype(np.int64), per - 1)
        for q in np.unique(part):
            group = members[part == q]
            class_of[group] = len(counts)
            contexts.append(int(curve.upper[b]))
            counts.append(int(n[group].sum()))
            rows.append(AcceptanceProfile.from_mixture(batch.profile.a[group], n[group]).a[0])
    return DecodeBatch(contexts, counts, AcceptanceProfile.from_table(rows)), class_of


def price_verify(curve: StepCurve, batch: DecodeBatch, k, *, evaluations: int = 0) -> SpecDecodeResult:
    """The step at class verify lengths ``k`` (C,), priced on ``curve`` (k = 0 on a plain-decode curve)."""
    k = np.broadcast_to(np.asarray(k, dtype=np.int64), (batch.n_classes,)).copy()
    e = batch.profile.expected_emitted(k)
    out = curve.evaluate(curve.histogram(curve.bucket_of(batch.contexts), batch.counts, k[None, :]))
    names = curve.stage_names()
    stages = {s: float(out["stages"][0, i]) for i, s in enumerate(names)}
    stages = {"verify": sum(v for s, v in stages.items() if s not in DSPARK_STAGES),
              **{s: v for s, v in stages.items() if s in DSPARK_STAGES}}
    k.setflags(write=False)
    return SpecDecodeResult(batch, k, e, float(out["forward"][0]), stages, curve.gpus, evaluations)


def schedule_verify(curve: StepCurve, batch: DecodeBatch, *, k_max: int | None = None,
                    max_classes: int | None = None) -> SpecDecodeResult:
    """Choose each class's verify length with :func:`choose_verify_lengths` on ``curve``'s step times.

    The scheduler moves one class by ±1 per round (≤ classes·D rounds, each one vectorized call), so a
    batch of many distinct acceptance rows schedules faster with ``max_classes`` (see :func:`merge_classes`).
    """
    require(curve.k_max > 0, "curve", "a plain-decode curve (DSpark off) has no verify lengths to choose")
    d = batch.profile.block_size
    require(d == curve.k_max, "batch.profile", f"has {d} draft positions; the drafter drafts {curve.k_max}")
    class_of = None
    if max_classes is not None and batch.n_classes > max_classes:
        batch, class_of = merge_classes(curve, batch, max_classes)
    buckets = curve.bucket_of(batch.contexts)
    n = np.asarray(batch.counts, dtype=np.float64)
    table = batch.profile.expected_emitted_table()
    rows = np.arange(batch.n_classes)
    memo: dict[bytes, float] = {}  # step time per (bucket, k) histogram: many moves land on the same one

    def step_time(K: np.ndarray) -> np.ndarray:
        hist = curve.histogram(buckets, n, K)
        keys = [row.tobytes() for row in hist]
        todo = {key: i for i, key in reversed(list(enumerate(keys))) if key not in memo}
        if todo:
            t = curve.evaluate(hist[list(todo.values())])["forward"]
            memo.update(zip(todo, t.tolist()))
        t = np.array([memo[key] for key in keys])
        e = table[rows[None, :], K]
        return t * e.sum(axis=1) / (e @ n)  # class-weighted: see the module docstring

    plan = choose_verify_lengths(batch.profile, step_time, k_max=d if k_max is None else k_max)
    return attrs.evolve(price_verify(curve, batch, plan.k, evaluations=plan.evaluations), class_of=class_of)
