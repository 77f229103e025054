"""One pass protocol and one verified pipeline.

Every transform after the model builds its graph — bounded replays, fusion, sharding and collectives,
Engram prefetch, pipeline and context parallelism, two-batch overlap — is a pass ``(graph, ctx) -> graph``:
pure, with what it may read besides the graph in a frozen :class:`PassContext`. :class:`PassPipeline` runs a
list of named passes and verifies the graph's invariants after each one, naming the pass that broke them and
the ones before it. Analyses (prefetch studies, stage-time estimates) are functions of a graph or a plan, not
passes.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import attrs

from graphsim.core.errors import GraphsimError, require
from graphsim.core.ir import Graph


@attrs.frozen
class PassContext:
    """What a pass may read besides the graph: the model, the plan (requests, mapping, policies) and the
    hardware. Passes that need a field require it (a one-line error names the pass and the field)."""

    model: object = None
    plan: object = None
    hw: object = None

    def need(self, field: str, pass_name: str):
        value = getattr(self, field)
        require(value is not None, f"pass[{pass_name}]", f"needs the context's {field}")
        return value


#: The protocol: a pure function of a graph and a context.
Pass = Callable[[Graph, PassContext], Graph]
NO_CONTEXT = PassContext()


def verify(graph: Graph, before: Graph | None = None, pass_name: str = "build") -> None:
    """Invariants: structure is valid; no tensor is written by two logical ops (copies of one op — two-batch
    halves, pipeline micro-batches — share its writes: each writes its own tokens); every activation or
    workspace read is produced; op names are unique (no op charged twice); resident weights unchanged by
    the pass."""
    try:
        graph.validate()
    except GraphsimError as e:
        raise GraphsimError(f"pass[{pass_name}]", str(e)) from None
    writers: dict[str, set] = {}
    reads: set = set()
    for op in graph.ops:
        if op.writes:
            who = op.origin or op.name
            for t in op.writes:
                writers.setdefault(t, set()).add(who)
        reads.update(op.reads)
    twice = [t for t, w in writers.items() if len(w) > 1]
    if twice:
        raise GraphsimError(f"pass[{pass_name}]", f"tensors written by two ops: {twice[:5]}")
    tensors = graph.tensor_map
    if any(not tensors[t].resident and tensors[t].role in ("activation", "workspace") for t in reads - writers.keys()):
        for op in graph.ops:  # name the first op (program order) reading what nothing produces
            for t in op.reads:
                tt = tensors[t]
                if not tt.resident and tt.role in ("activation", "workspace") and t not in writers:
                    raise GraphsimError(f"pass[{pass_name}]", f"op {op.name} reads {t} which nothing produces")
    if before is not None and before.tensors is not graph.tensors:
        if tuple(before.weights()) != tuple(graph.weights()):
            raise GraphsimError(f"pass[{pass_name}]", "resident weights changed: a pass may change work, never weights")
    if len(graph.op_index) != len(graph.ops):  # (validate() already refuses duplicate names)
        names = Counter(op.name for op in graph.ops)
        dup = [n for n, k in names.items() if k > 1]
        raise GraphsimError(f"pass[{pass_name}]", f"ops charged twice: {dup[:5]}")


class PassPipeline:
    """A list of (name, pass); :meth:`run` applies them in order, verifying after each and recording the
    names in the graph's meta (``passes``)."""

    def __init__(self, passes: Sequence[tuple[str, Pass]] = ()):
        self.passes = list(passes)

    def run(self, graph: Graph, ctx: PassContext = NO_CONTEXT) -> Graph:
        verify(graph)
        done: list[str] = []
        for name, fn in self.passes:
            try:
                new = fn(graph, ctx)
            except GraphsimError:
                raise
            require(isinstance(new, Graph), f"pass[{name}]", f"must return a Graph, got {type(new).__name__}")
            try:
                verify(new, graph, name)
            except GraphsimError as e:
                after = f" (after {', '.join(done)})" if done else ""
                raise GraphsimError(e.field, f"{str(e).split(': ', 1)[1]}{after}") from None
            done.append(name)
            graph = new.evolve(meta=attrs.evolve(new.meta, passes=(*new.meta.passes, name)))
        return graph
