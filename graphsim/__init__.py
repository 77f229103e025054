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
from .core import display as _display
from .core.version import __version__  # noqa: F401 (one place; pyproject.toml says the same)

_display.provided_by("graphsim.exports")  # a Graph's SVG in notebooks (the core never imports the exporters)

# Public names resolve lazily (PEP 562): ``import graphsim`` loads nothing heavy (no JAX, pyarrow,
# not even NumPy), so a command that only lists hardware answers in a blink. ``graphsim.X`` and
# ``from graphsim import X`` work as before; each name's module is imported on first use
# (tests/test_light_imports.py).
_LAZY = {
    "GraphBuilder": ".core.builder", "GraphsimError": ".core.errors",
    "EfficiencyProfile": ".hw", "HardwareSpec": ".hw", "list_hw": ".hw", "load_hw": ".hw", "load_profile": ".hw",
    "ONE": ".core.ir", "CommSpec": ".core.ir", "Cost": ".core.ir", "Edge": ".core.ir", "Feature": ".core.ir",
    "Graph": ".core.ir", "Op": ".core.ir", "StorageFormat": ".core.ir", "Tensor": ".core.ir", "TokenSet": ".core.ir",
    "ViewSpec": ".views.measured.view", "list_models": ".models", "load_model": ".models",
    "Compiled": ".driver.pipeline", "Plan": ".core.plan", "Policies": ".core.plan",
    "compile_plan": ".driver.pipeline", "ParallelMapping": ".core.plan", "Request": ".core.plan",
    "Report": ".driver.report", "Workload": ".core.workload",
}
#: modules users reach as attributes (``gs.ir.COMPONENTS``, ``gs.search``) by their place in the layer packages
_MODULES = {
    **{m: f".core.{m}" for m in ("errors", "limits", "features", "ir", "workload", "plan", "builder", "rules",
                                 "rules_v4", "quant", "config", "vision", "outputs")},
    **{m: f".driver.{m}" for m in ("pipeline", "report", "metrics", "memory", "ledger", "identity")},
    **{m: f".views.{m}" for m in ("measured", "fpm", "collect")},
    **{m: f".serving.{m}" for m in ("search", "disagg", "speculative", "fit", "studies")},
    "hub": ".models.hub", "dspark": ".models.dspark",
}


def __getattr__(name: str):
    import importlib

    mod = _LAZY.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(mod, __name__), name)
        globals()[name] = value  # once resolved, a plain attribute
        return value
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name], __name__)
        globals()[name] = value
        return value
    if not name.startswith("__"):  # a subpackage used as an attribute (``gs.sweep``) before anyone imported it
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


__all__ = [
    "GraphBuilder", "GraphsimError", "EfficiencyProfile", "HardwareSpec", "list_hw", "load_hw", "load_profile",
    "ONE", "CommSpec", "Cost", "Edge", "Feature", "Graph", "Op", "StorageFormat", "Tensor", "TokenSet",
    "list_models", "load_model", "Compiled", "Plan", "Policies", "compile_plan", "ParallelMapping", "Request",
    "Report", "Workload", "ViewSpec",
]
