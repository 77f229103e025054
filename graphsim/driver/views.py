"""Views: where the time of an op or of a whole forward comes from, one protocol the driver dispatches on.

The seeds' three views of one graph (``../shared/seeds``): **SOL** (every op at the hardware's speed of light,
the default), **OP / Hybrid** (op times from measured kernel tables: :class:`graphsim.views.measured.view.ViewSpec`
named ``op`` or ``hybrid``), **FPM** (whole forwards from a model fitted on measured forwards:
:class:`~graphsim.views.measured.view.ViewSpec` named ``fpm``). A view is any object with a ``name`` and a
``bind(ctx) -> Binding``; :func:`graphsim.driver.pipeline.compile_plan` calls ``bind`` once per compiled plan and
applies what the binding holds, never asking which view it is:

* ``op_key(i)``: op ``i``'s lookup identity, which refines the program's cost classes (ops priced by different
  table rows never share a class); None keeps the SOL classes;
* ``attach(program)``: the op-level binding the evaluator applies to the SOL durations of every class (its
  ``apply``, ``features`` and per-class sources); None: SOL durations;
* ``forward``: a whole-forward scaler (``scale(workload, sol_forward)`` and ``describe``) applied to the SOL
  forward; None: the forward is the scheduled ops'.

The views live above the driver (``graphsim/views/``) and import it; the driver imports none of them.
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import attrs

from ..core.errors import GraphsimError

#: where an op's duration came from in a measured view (per-class codes of the evaluator's ``source`` output)
SOURCE_NAMES = ("measured", "interpolated", "extrapolated", "fallback", "sol")


@attrs.frozen(eq=False)
class ViewContext:
    """What a view binds to: the model, the plan, the hardware and profile, the logical and the sharded graph."""

    model: object
    plan: object
    hw: object
    profile: object
    logical: object
    graph: object


@attrs.frozen(eq=False)
class Binding:
    """A view bound to one compiled graph (see the module's docstring for each part)."""

    name: str
    op_key: Callable | None = None
    attach: Callable | None = None
    forward: object = None


@runtime_checkable
class View(Protocol):
    name: str

    def bind(self, ctx: ViewContext) -> Binding: ...


@attrs.frozen
class SolView:
    """The speed-of-light view: every op at the descriptor's rates (derated by an efficiency profile if given)."""

    name: str = "sol"

    def bind(self, ctx: ViewContext) -> Binding:
        return Binding("sol")


SOL = SolView()


def as_view(view) -> View:
    """``None`` or ``"sol"`` -> the SOL view; a view object as it is; anything else a one-line error."""
    if view is None or (isinstance(view, str) and view == "sol"):
        return SOL
    if isinstance(view, View):
        return view
    raise GraphsimError("view", f"a view object (graphsim.ViewSpec: sol, op, hybrid or fpm) or None, got "
                        f"{type(view).__name__}")


def view_name(view) -> str:
    """The name of ``view`` (None: ``sol``)."""
    return as_view(view).name


__all__ = ["SOURCE_NAMES", "ViewContext", "Binding", "View", "SolView", "SOL", "as_view", "view_name"]
