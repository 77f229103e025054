"""Run passes in order and verify the graph's invariants after each one, naming the pass that broke them."""
from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

from graphsim.errors import GraphsimError
from graphsim.ir import Graph

Pass = Callable[[Graph], Graph]


def verify(graph: Graph, before: Graph | None = None, pass_name: str = "build") -> None:
    """Invariants: structure is valid; no tensor is written by two ops (caches may be appended to by one
    writer op per token set); every tensor read is resident or produced; op names are unique (no op
    charged twice); resident weights unchanged by the pass."""
    try:
        graph.validate()
    except GraphsimError as e:
        raise GraphsimError(f"pass[{pass_name}]", str(e)) from None
    writers = Counter(t for op in graph.ops for t in op.writes)
    twice = [t for t, n in writers.items() if n > 1]
    if twice:
        raise GraphsimError(f"pass[{pass_name}]", f"tensors written twice: {twice[:5]}")
    tensors = graph.tensor_map
    for op in graph.ops:
        for t in op.reads:
            tt = tensors[t]
            if not tt.resident and tt.role in ("activation", "workspace") and writers[t] == 0:
                raise GraphsimError(f"pass[{pass_name}]", f"op {op.name} reads {t} which nothing produces")
    if before is not None:
        if tuple(before.weights()) != tuple(graph.weights()):
            raise GraphsimError(f"pass[{pass_name}]", "resident weights changed: a pass may change work, never weights")


class PassPipeline:
    """A list of (name, pass); :meth:`run` applies them in order, verifying after each."""

    def __init__(self, passes: Sequence[tuple[str, Pass]] = ()):
        self.passes = list(passes)

    def run(self, graph: Graph) -> Graph:
        verify(graph)
        for name, fn in self.passes:
            new = fn(graph)
            verify(new, graph, name)
            graph = new.evolve(meta=tuple({**new.meta_dict, "passes": ",".join(
                filter(None, [new.meta_dict.get("passes", ""), name]))}.items()))
        return graph
