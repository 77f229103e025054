"""graphsim: a dataflow-graph compiler for LLM forward passes.

Build a stage-and-dependency DAG from a model's semantics and an execution plan, rewrite it with passes,
lower it to speed-of-light costs and schedule it on the critical path against a hardware descriptor::

    import graphsim as gs
    plan = gs.Plan(["decode:4096x64", "prefill:2048"], gs.ParallelMapping(tp=4, ep=4))
    report = gs.compile_plan("deepseek-v3", plan, "gb200").report()
    print(report.to_text())

The same graph from measured kernel tables (docs/measured.md)::

    view = gs.ViewSpec("hybrid", "tables", "trtllm@1.3.0rc20")
    print(gs.compile_plan("deepseek-v3", plan, "gb200", view=view).report().to_text())
"""
__version__ = "0.1.0"

from .builder import GraphBuilder
from .errors import GraphsimError
from .hw import EfficiencyProfile, HardwareSpec, list_hw, load_hw, load_profile
from .ir import ONE, CommSpec, Cost, Edge, Feature, Graph, Op, StorageFormat, Tensor, TokenSet
from .measured.view import ViewSpec
from .models import list_models, load_model
from .pipeline import Compiled, Plan, Policies, compile_plan
from .plan import ParallelMapping, Request
from .report import Report
from .workload import Workload

__all__ = [
    "GraphBuilder", "GraphsimError", "EfficiencyProfile", "HardwareSpec", "list_hw", "load_hw", "load_profile",
    "ONE", "CommSpec", "Cost", "Edge", "Feature", "Graph", "Op", "StorageFormat", "Tensor", "TokenSet",
    "list_models", "load_model", "Compiled", "Plan", "Policies", "compile_plan", "ParallelMapping", "Request",
    "Report", "Workload", "ViewSpec",
]
