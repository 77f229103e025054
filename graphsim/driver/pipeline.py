"""Compile a plan: build the model graph, run passes (each verified), shard it, lower it, evaluate it."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import attrs
import numpy as np

from ..core.errors import GraphsimError, one_of, require
from ..core.ir import ATTENTION_PRECISIONS, Graph
from ..core.limits import MAX_CONTEXT, MAX_LAYERS, MAX_MICRO_BATCHES, MAX_RANKS, check_int, check_number
from ..core.plan import ParallelMapping, Request, workload_of
from ..core.workload import Workload

# Import-time wiring of the installed subpackages.
from ..hw import EfficiencyProfile, HardwareSpec, load_hw
from ..lowering.evaluate import Evaluator, Schedule, evaluate_reference, unit_time
from ..lowering.program import CostProgram, lower
from ..passes.pipeline import PassContext, PassPipeline
from ..passes.runtime import plan_passes


def _int_in(lo: int, hi: int):
    def check(_inst, attr, v):
        check_int(f"policies.{attr.name}", v, lo, hi)
    return check


def _number_in(lo: float, hi: float):
    def check(_inst, attr, v):
        check_number(f"policies.{attr.name}", v, lo, hi)
    return check


def _as_float(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _floats(v):
    """A sequence of numbers -> a tuple of floats; anything else is left for the validator to name."""
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return tuple(float(x) for x in v)
    return v


def _algorithms(value) -> tuple:
    from ..passes.sharding import check_algorithms

    return check_algorithms(value)


#: Values of ``Policies.overlap`` (passes/overlap.py).
OVERLAPS = ("none", "serial", "two-batch")


@attrs.frozen
class Policies:
    """Runtime strategies a result is computed under (recorded in every report)."""

    decoder_replay: str = attrs.field(default="off", validator=one_of("policies", ("off", "sglang", "paper")))
    encoder_replay: str = attrs.field(default="on", validator=one_of("policies", ("on", "off")))
    fusion: str = attrs.field(default="unfused", validator=one_of("policies", ("unfused", "two-pass", "single-pass")))
    #: "none": one batch, its collectives overlapping the compute that does not depend on them (the model's
    #: dataflow; the SOL default); "serial": no overlap inside the batch (every collective exposed);
    #: "two-batch": two micro-batches (requests, or one prompt's tokens), each hiding the other's exchanges
    overlap: str = attrs.field(default="none", validator=one_of("policies", OVERLAPS))
    engram: str = attrs.field(default="hbm", validator=one_of("policies", ("hbm", "host")))
    #: Engram host residency: blocks ahead the row copy may start
    prefetch_distance: int = attrs.field(default=1, validator=_int_in(0, MAX_LAYERS))
    dspark: str = attrs.field(default="off", validator=one_of("policies", ("off", "on")))
    #: MTP drafting depth K (0 = off): the checkpoint's MTP module drafts K tokens per decode request and the
    #: verify forward checks 1 + K positions; ``acceptance`` a_1..a_K turns them into expected emitted tokens
    mtp: int = attrs.field(default=0, validator=_int_in(0, 16))
    #: W of both bounded replays (the SWA window of DeepSeek-V4.1)
    replay_window: int = attrs.field(default=128, validator=_int_in(1, MAX_CONTEXT))
    #: hottest EP rank's routed work / the mean (>= 1, at most ep); scales its expert work and its
    #: dispatch/combine bytes
    ep_imbalance: float = attrs.field(default=1.0, converter=_as_float, validator=_number_in(1.0, MAX_RANKS))
    #: pipeline micro-batches per forward (0 = as many as pipeline stages)
    pp_micro_batches: int = attrs.field(default=0, validator=_int_in(0, MAX_MICRO_BATCHES))
    #: collective -> algorithm overrides, e.g. {"all_reduce": "tree"} (see passes.sharding.ALGORITHMS)
    algorithms: tuple = attrs.field(default=(), converter=_algorithms)
    #: DSpark per-position conditional acceptance a_1..a_D: turns verified positions into E[emitted]
    acceptance: tuple = attrs.field(default=(), converter=_floats)
    #: the attention math's precision (QK^T, PV): "auto" = from the KV cache formats; an explicit narrower
    #: one also narrows a wider KV cache to what the kernel reads (FP8 attention keeps an FP8 cache)
    attention_precision: str = attrs.field(default="auto", validator=one_of("policies", ATTENTION_PRECISIONS))
    #: sequence parallelism: norm / mHC / elementwise runs after a TP all-reduce shard their tokens over TP
    #: (reduce-scatter in, all-gather out)
    sp: str = attrs.field(default="off", validator=one_of("policies", ("off", "on")))
    #: Engram table rows sharded over the TP group ("tp") or over every rank of the stage ("world", TP x EP:
    #: each rank holds 1/world of the rows; lookups become an all-to-all)
    engram_shard: str = attrs.field(default="tp", validator=one_of("policies", ("tp", "world")))
    #: the Engram projection 6144 -> 25600 replicated on every rank or column-split over TP (+ all-gather)
    engram_proj: str = attrs.field(default="replicated", validator=one_of("policies", ("replicated", "tp")))
    #: contexts beyond the model's max_position_embeddings: refused, or allowed as a what-if (up to
    #: graphsim.core.limits.MAX_CONTEXT; the choice is part of every result's identity)
    beyond_context: str = attrs.field(default="refuse", validator=one_of("policies", ("refuse", "allow")))

    @acceptance.validator
    def _acc(self, _, v):
        ok = isinstance(v, tuple) and len(v) <= 1024 and all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in v)
        require(ok, "policies.acceptance", f"must be numbers a_1..a_D in [0, 1], got {v!r}")

    def identity(self) -> dict:
        return attrs.asdict(self)


@functools.lru_cache(maxsize=4096)
def policy_text(p: Policies) -> str:
    """The policies that differ from the defaults, e.g. ``fusion=single-pass,overlap=two-batch`` (``default``: none;
    ``acceptance`` is left out: it is a probability vector, not a choice)."""
    base = Policies()
    out = []
    for f in attrs.fields(Policies):
        v = getattr(p, f.name)
        if v != getattr(base, f.name) and f.name != "acceptance":
            out.append(f"{f.name}={v}")
    return ",".join(out) or "default"


def parse_policy_text(text: str, field: str = "policies") -> Policies:
    """:func:`policy_text`'s inverse for scalar fields (``default`` -> the defaults); a one-line error naming
    ``field`` for an unknown field, a value of the wrong type, or a tuple field (give those as flags)."""
    if text in ("", "default", "nan"):
        return Policies()
    kw = {}
    fields = {f.name for f in attrs.fields(Policies)}
    for item in str(text).split(","):
        k, sep, v = item.partition("=")
        require(bool(sep) and k in fields, field, f"{item!r} in {text!r} is not FIELD=VALUE of Policies")
        default = getattr(Policies(), k)
        if isinstance(default, bool):
            kw[k] = v == "True"
        elif isinstance(default, (int, float)):
            try:
                kw[k] = type(default)(v)
            except ValueError:
                raise GraphsimError(field, f"{item!r}: {v!r} is not a "
                                    f"{'whole number' if isinstance(default, int) else 'number'}") from None
        elif isinstance(default, tuple):
            raise GraphsimError(field, f"{k} cannot be read from text; give it as a flag")
        else:
            kw[k] = v
    return Policies(**kw)


def _requests(rs) -> tuple:
    """Request strings or Requests (one alone, or a sequence of them) -> a tuple of Requests."""
    if isinstance(rs, (str, Request)):
        rs = (rs,)
    require(isinstance(rs, (list, tuple)), "requests", f"a list of requests, got {type(rs).__name__}")
    out = tuple(Request.parse(r) if isinstance(r, str) else r for r in rs)
    bad = [r for r in out if not isinstance(r, Request)]
    require(not bad, "requests", f"each request is a string like 'decode:4096x8' or a Request, got {bad[0]!r}"
            if bad else "")
    return out


@attrs.frozen
class Plan:
    """What runs: a batch of requests (one group per request spec), a mapping and policies."""

    requests: tuple = attrs.field(converter=_requests)
    mapping: ParallelMapping = ParallelMapping()
    policies: Policies = Policies()

    def __attrs_post_init__(self):
        require(len(self.requests) > 0, "requests", "give at least one request")

    @property
    def kinds(self) -> tuple:
        return tuple(r.kind for r in self.requests)

    def workload(self) -> Workload:
        p = self.policies
        return workload_of(self.requests, replay_window=p.replay_window, encoder_replay=p.encoder_replay == "on")


@attrs.frozen(eq=False)
class Compiled:
    """A lowered plan on one hardware descriptor: evaluate it at one point (report) or many (sweep)."""

    model: object
    plan: Plan
    hw: HardwareSpec
    profile: EfficiencyProfile | None
    logical: Graph
    graph: Graph
    program: CostProgram
    evaluator: Evaluator
    #: a measured view bound to this graph (graphsim.views.measured.view.BoundView); None = the SOL view
    view: object = None
    #: the FPM view (graphsim.views.fpm.view.FPMView): whole forwards = SOL forward x the partition's fitted ratio
    fpm: object = None

    def __repr__(self) -> str:  # a summary line (the fields hold the graphs: str(c.graph.ops) shows the ops)
        p = self.program
        return (f"Compiled({self.model.name} on {self.hw.name} {self.plan.mapping}, "
                f"{', '.join(str(r) for r in self.plan.requests)}, view {self.view_name}"
                f"{', profile ' + self.profile.name if self.profile else ''}: {p.n_ops} ops, "
                f"{p.n_classes} classes, {p.n_segments} segments)")

    def _repr_html_(self) -> str:  # Jupyter: the summary line, then the report (evaluated when shown)
        from html import escape

        return f"<p><code>{escape(repr(self))}</code></p>{self.report()._repr_html_()}"

    @property
    def view_name(self) -> str:
        if self.fpm is not None:
            return "fpm"
        return self.view.spec.name if self.view is not None else "sol"

    def unit_time(self, hw: HardwareSpec | None = None) -> np.ndarray:
        return unit_time((hw or self.hw).rates(self.profile))

    @property
    def overhead(self) -> float:
        return self.profile.op_overhead_s if self.profile else 0.0

    def schedule(self, workload: Workload | None = None) -> Schedule:
        """Reference (NumPy, full-graph) schedule: per-op start/finish and the critical path."""
        return evaluate_reference(self.program, workload or self.plan.workload(), self.unit_time(), self.overhead,
                                  self.view)

    def evaluate(self, workload: Workload, ut=None, overhead=None, outputs=("forward", "stages"),
                 precision: str | None = None) -> dict:
        """Vectorized evaluation over every point of ``workload`` (NumPy for a few points, jitted JAX for
        many); ``precision`` "exact" (float64, default) or "fast" (float32, relative error < 1e-5)."""
        ut = self.unit_time() if ut is None else ut
        out = self.evaluator(workload, ut, self.overhead if overhead is None else overhead, outputs, precision)
        if self.fpm is not None and "forward" in out:  # FPM times whole forwards: scale SOL's, mark the domain
            sol = np.asarray(out["forward"], np.float64)
            pr = self.fpm.scale(workload, sol)
            ratio = np.where(sol > 0, pr.t / np.where(sol > 0, sol, 1.0), np.nan)
            out = dict(out, forward=pr.t, sol_forward=sol, fpm_in_domain=pr.inside)
            if "stages" in out:
                out["stages"] = np.asarray(out["stages"]) * ratio[:, None]
        return out

    def report(self):
        from .report import make_report

        return make_report(self)


#: Policies a model without its own ``POLICY_SUPPORT`` accepts (CED replay, mHC fusion, DSpark, Engram are
#: DeepSeek-V4.1 features).
BASE_SUPPORT = {"decoder_replay": ("off",), "fusion": ("unfused",), "dspark": ("off",), "engram": ("hbm",)}


def check_policies(model, plan: Plan) -> None:
    """Reject policies the model cannot honour instead of silently ignoring them."""
    support = {**BASE_SUPPORT, **model.POLICY_SUPPORT}
    for field, allowed in support.items():
        v = getattr(plan.policies, field)
        require(v in allowed, f"policies.{field}",
                f"{model.name} supports {field} in {allowed}, got {v!r}")
    if any(r.image_tokens or r.image_patches for r in plan.requests):
        why = model.vision()
        require(not why, "request.image", f"{why}: image inputs cannot be priced (send text requests)")
    k = plan.policies.mtp
    if k:
        most = model.max_mtp()
        require(most > 0, "policies.mtp", f"{model.name} has no MTP drafter in graphsim (MTP drafting is modelled "
                "for the DeepSeek-V3 family — V3/R1/V3.2, Kimi K2, GLM-5 — when num_nextn_predict_layers > 0)")
        require(k <= most, "policies.mtp", f"{model.name} drafts at most {most} tokens with its MTP module, got {k}")
        require(plan.policies.dspark != "on", "policies.mtp", "MTP and DSpark are two drafters: choose one")
        acc = plan.policies.acceptance
        require(not acc or len(acc) == k, "policies.acceptance", f"give {k} values a_1..a_{k} for MTP-{k}, got {len(acc)}")
    if plan.policies.dspark != "on":
        for r in plan.requests:
            if r.kind == "decode" and r.new - 1 > k:
                raise GraphsimError("request.verify", f"{r} verifies {r.new - 1} draft positions: speculative decoding "
                                    "needs policies.dspark='on' or policies.mtp >= the draft length, and an "
                                    "acceptance profile")
    model.validate_plan(plan)


def check_context(model, plan: Plan) -> None:
    """Every request's context (cached + new positions, + a draft block with DSpark) within the model's
    ``max_position_embeddings`` — or, with ``policies.beyond_context == "allow"``, within graphsim's own bound
    (:data:`graphsim.core.limits.MAX_CONTEXT`), reported as a what-if in the plan's identity."""
    from ..core.limits import MAX_CONTEXT

    allow = plan.policies.beyond_context == "allow"
    cap = MAX_CONTEXT if allow else model.max_context()
    ahead = model.draft_ahead(plan.policies)
    for r in plan.requests:
        ctx = r.past_tokens + r.new_tokens + ahead
        if ctx > cap:
            hint = "" if allow else (f" (the model's max_position_embeddings); policies.beyond_context='allow' "
                                     f"(--beyond-context) runs it as a what-if up to {MAX_CONTEXT:,}")
            raise GraphsimError("request.length", f"{r}: context {ctx:,} exceeds {cap:,}{hint}")


def check_hardware(plan: Plan, hw: HardwareSpec) -> None:
    """Reject what the chip cannot run: an explicit attention precision needs its own tensor rate (the
    model's derived precisions may fall back, an explicit choice may not)."""
    p = plan.policies.attention_precision
    if p != "auto":
        have = [q for q, _ in hw.peak_flops if q in ATTENTION_PRECISIONS]
        require(p in have, "policies.attention_precision",
                f"{hw.name} has no {p} tensor rate; allowed on it: {', '.join(['auto', *have])}")


def default_passes(model, policies: Policies) -> list[tuple[str, Callable]]:
    """The model's policy passes (replay, fusion, overlap…), in order; models add theirs via ``passes``."""
    return list(model.passes(policies))


@functools.lru_cache(maxsize=16)
def _shipped_hw(name: str) -> HardwareSpec:
    """A shipped descriptor by name (package data, read once per process; descriptors are frozen)."""
    return load_hw(name)


def _images_for(model, plan: Plan) -> Plan:
    """The plan with ``+img:WxH`` images that were parsed without a model (``Plan(["prefill:1000+img:1024x768"])``)
    counted by this model's own image processor (Qwen-VL's differs from the default DeepSeek-V4.1 one)."""
    proc = model.image_processor()
    if proc is None or not any(r.image_sizes for r in plan.requests):
        return plan
    return attrs.evolve(plan, requests=tuple(r.for_processor(proc) for r in plan.requests))


def compile_plan(model, plan: Plan, hw: HardwareSpec | str, profile: EfficiencyProfile | None = None,
                 *, extra_passes: Sequence[tuple[str, Callable]] = (), chunk: int = 65536, view=None) -> Compiled:
    """build -> passes (policy, ``extra_passes``, sharding, runtime; each ``(graph, ctx) -> graph`` and
    verified) -> lower. ``view``: a :class:`graphsim.views.measured.view.ViewSpec` (op / hybrid durations from
    measured tables on this same graph); None or "sol" = speed of light."""
    if isinstance(hw, str):
        hw = _shipped_hw(hw) if hw.isidentifier() else load_hw(hw)
    if isinstance(model, str):
        from ..models import load_model

        model = load_model(model)
    plan = _images_for(model, plan)
    model.validate_mapping(plan.mapping)
    check_policies(model, plan)
    check_context(model, plan)
    check_hardware(plan, hw)
    logical = model.build(plan.kinds, policies=plan.policies, requests=plan.requests)
    ctx = PassContext(model, plan, hw)
    # one verified pipeline: the model's policy passes, the caller's, then sharding and the runtime passes
    passes = [*default_passes(model, plan.policies), *extra_passes, *plan_passes(ctx)]
    graph = PassPipeline(passes).run(logical, ctx)
    graph = graph.evolve(meta=attrs.evolve(graph.meta, hw=hw.name, policies=str(plan.policies.identity())))
    bound = fpm = None
    if view is not None and getattr(view, "name", "sol") == "fpm":
        from ..views.fpm.view import bind_fpm

        require(profile is None, "profile", "an efficiency profile derates the SOL view; the fpm view takes its "
                "forwards from measured samples (drop --profile)")
        fpm = bind_fpm(view, model, plan, hw)
    elif view is not None and getattr(view, "name", "sol") != "sol":
        from ..views.measured.view import bind

        require(profile is None, "profile", "an efficiency profile derates the SOL view; the op and hybrid views "
                "take their times from measured tables (drop --profile)")
        bound = bind(view, graph, logical, plan, hw, model)
    program = lower(graph, (lambda i: bound.op_key[i]) if bound else None)
    if bound is not None:
        bound = bound.attach(program)
    return Compiled(model, plan, hw, profile, logical, graph, program,
                    Evaluator(program, plan.kinds, chunk, view=bound), bound, fpm)
