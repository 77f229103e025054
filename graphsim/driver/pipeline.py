"""Compile a plan: build the model graph, run passes (each verified), shard it, lower it, evaluate it."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import attrs
import numpy as np

from ..core.errors import GraphsimError, require
from ..core.ir import ATTENTION_PRECISIONS, Graph
from ..core.plan import (OVERLAPS, ParallelMapping, Plan, Policies, Request, parse_policy_text,  # noqa: F401
                         policy_text, workload_of)
from ..core.workload import Workload

# Import-time wiring of the installed subpackages.
from ..hw import EfficiencyProfile, HardwareSpec, load_hw
from ..lowering.evaluate import Evaluator, Schedule, evaluate_reference, unit_time
from ..lowering.program import CostProgram, lower
from ..passes.pipeline import PassContext, PassPipeline
from ..passes.runtime import plan_passes
from .views import ViewContext, as_view


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
    #: the view's name (graphsim.driver.views: sol, op, hybrid, fpm)
    view_name: str = "sol"

    def __repr__(self) -> str:  # a summary line (the fields hold the graphs: str(c.graph.ops) shows the ops)
        p = self.program
        return (f"Compiled({self.model.name} on {self.hw.name} {self.plan.mapping}, "
                f"{', '.join(str(r) for r in self.plan.requests)}, view {self.view_name}"
                f"{', profile ' + self.profile.name if self.profile else ''}: {p.n_ops} ops, "
                f"{p.n_classes} classes, {p.n_segments} segments)")

    def _repr_html_(self) -> str:  # Jupyter: the summary line, then the report (evaluated when shown)
        from html import escape

        return f"<p><code>{escape(repr(self))}</code></p>{self.report()._repr_html_()}"

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


class CompileCache:
    """What :func:`compile_plan` may share between the plans of one caller (a search compiles every plan twice:
    for its prediction and for the SOL twin, with another view or profile).

    * the logical and the sharded graph per (model object, plan, descriptor, extra passes): the passes read
      nothing else (:class:`PassContext`); the profile and the view come after them;
    * the lowered program and its evaluator per sharded graph and chunk, for a view that keeps the SOL cost
      classes (its binding refines no op keys): the profile enters only at evaluation (unit times, overhead).

    A graph is served once — the second compile of a plan takes it (and its program) out — so the cache holds
    only plans compiled once so far; its owner clears what is left when those plans are done (a search: after
    each work set), and it holds at most ``limit`` graphs (the first ones). A descriptor is a value (an edited
    one is another key); a model is keyed by its object, as its own build cache is."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self.graphs: dict = {}  # (id(model), plan, hw, extra passes) -> (model, logical, graph)
        self.programs: dict = {}  # (graph key, chunk) -> (program, evaluator)
        self.hits = 0

    def graph(self, model, plan: Plan, hw: HardwareSpec, extra_passes, make: Callable) -> tuple:
        key = (id(model), plan, hw, tuple(extra_passes))
        got = self.graphs.pop(key, None)
        if got is not None and got[0] is model:
            self.hits += 1
            return key, got[1], got[2]
        logical, graph = make()
        if len(self.graphs) < self.limit:
            self.graphs[key] = (model, logical, graph)
        return key, logical, graph

    def program(self, key, chunk: int, graph: Graph, kinds: tuple) -> tuple:
        """The SOL-class program of a graph, and its evaluator: the one lowered at the graph's first compile
        (taken out), else lowered now (and kept while the cache holds the graph)."""
        got = self.programs.pop((key, chunk), None)
        if got is None:
            program = lower(graph, None)
            got = program, Evaluator(program, kinds, chunk)
            if key in self.graphs:
                self.programs[(key, chunk)] = got
        return got

    def clear(self) -> None:
        self.graphs.clear()
        self.programs.clear()


def compile_plan(model, plan: Plan, hw: HardwareSpec | str, profile: EfficiencyProfile | None = None,
                 *, extra_passes: Sequence[tuple[str, Callable]] = (), chunk: int = 65536, view=None,
                 cache: CompileCache | None = None) -> Compiled:
    """build -> passes (policy, ``extra_passes``, sharding, runtime; each ``(graph, ctx) -> graph`` and
    verified) -> lower. ``view``: any view of :mod:`graphsim.driver.views` (``graphsim.ViewSpec``: op / hybrid
    durations from measured tables on this same graph, fpm forwards); None or "sol" = speed of light.
    ``cache``: a :class:`CompileCache` shared by the caller's plans (the graphs, and SOL-class programs, of
    plans compiled before are reused; the result is the same)."""
    view = as_view(view)
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
    if cache is None:
        logical, graph = _graphs(model, plan, hw, extra_passes)
    else:
        gkey, logical, graph = cache.graph(model, plan, hw, extra_passes,
                                           lambda: _graphs(model, plan, hw, extra_passes))
    binding = view.bind(ViewContext(model, plan, hw, profile, logical, graph))
    if cache is not None and binding.op_key is None and binding.attach is None:  # the SOL cost classes
        program, evaluator = cache.program(gkey, chunk, graph, plan.kinds)
        return Compiled(model, plan, hw, profile, logical, graph, program, evaluator, None, binding.forward,
                        binding.name)
    program = lower(graph, binding.op_key)
    bound = binding.attach(program) if binding.attach is not None else None
    return Compiled(model, plan, hw, profile, logical, graph, program,
                    Evaluator(program, plan.kinds, chunk, view=bound), bound, binding.forward, binding.name)


def _graphs(model, plan: Plan, hw: HardwareSpec, extra_passes) -> tuple[Graph, Graph]:
    """The plan's logical graph and the sharded graph its passes make."""
    logical = model.build(plan.kinds, policies=plan.policies, requests=plan.requests)
    ctx = PassContext(model, plan, hw)
    # one verified pipeline: the model's policy passes, the caller's, then sharding and the runtime passes
    passes = [*default_passes(model, plan.policies), *extra_passes, *plan_passes(ctx)]
    graph = PassPipeline(passes).run(logical, ctx)
    return logical, graph.evolve(meta=attrs.evolve(graph.meta, hw=hw.name, policies=str(plan.policies.identity())))
