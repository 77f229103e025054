"""Views are one protocol (graphsim.driver.views, issue 30): the driver binds any object with ``name`` and
``bind(ctx) -> Binding`` and applies what the binding holds, so a view written outside graphsim plugs in as the
measured and FPM views do; anything else is a one-line error naming ``view``."""
from __future__ import annotations

import attrs
import numpy as np
import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.driver.views import SOL, Binding, View, as_view, view_name

PLAN = gs.Plan(["decode:4096x8"], gs.ParallelMapping(tp=4, ep=4))


@attrs.frozen
class _Scaled:
    t: np.ndarray
    inside: np.ndarray


@attrs.frozen
class _Twice:
    """A whole-forward view: every forward takes twice its SOL (a stand-in for a fitted forward model)."""

    name: str = "twice"
    seen: list = attrs.field(factory=list, eq=False)

    def scale(self, workload, sol):
        return _Scaled(2.0 * np.asarray(sol), np.ones(len(sol), bool))

    def bind(self, ctx) -> Binding:
        self.seen.append((ctx.model.name, ctx.hw.name, len(ctx.graph.ops)))
        return Binding(self.name, forward=self)


def test_the_sol_view_is_the_default():
    assert as_view(None) is SOL and as_view("sol") is SOL and view_name(None) == "sol"
    assert isinstance(gs.ViewSpec("sol"), View) and view_name(gs.ViewSpec("sol")) == "sol"
    c = gs.compile_plan("deepseek-v3", PLAN, "gb200", view=gs.ViewSpec("sol"))
    assert c.view_name == "sol" and c.view is None and c.fpm is None


def test_a_view_from_outside_plugs_in():
    v = _Twice()
    sol = gs.compile_plan("deepseek-v3", PLAN, "gb200")
    c = gs.compile_plan("deepseek-v3", PLAN, "gb200", view=v)
    assert v.seen == [("deepseek-v3", "GB200", len(c.graph.ops))]  # bound once, to the sharded graph
    assert c.view_name == "twice"
    wl = PLAN.workload()
    out, ref = c.evaluate(wl), sol.evaluate(wl)
    assert out["forward"][0] == pytest.approx(2.0 * ref["forward"][0], rel=1e-12)
    assert out["sol_forward"][0] == pytest.approx(ref["forward"][0], rel=1e-12)


@pytest.mark.parametrize("bad", [object(), "hybrid", 3])
def test_anything_else_is_refused_naming_the_field(bad):
    with pytest.raises(GraphsimError, match=r"^view: "):
        gs.compile_plan("deepseek-v3", PLAN, "gb200", view=bad)
