"""Graph -> CostProgram: coefficient arrays over deduplicated features, cost classes and a reduced DAG.

An op's duration is a roofline over its components: max(tensor/CUDA-core compute, SFU exponentials, HBM,
NVLink, scale-out, C2C, disk) + hops·latency (+ an optional per-op overhead from an efficiency profile).
The units run concurrently (an attention kernel's exponentials overlap its matrix products), so an op takes
as long as its busiest unit. Identical cost rows share one *cost class*;
runs of ops that form a simple chain in the (transitively reduced) schedule DAG collapse into one
*segment* whose duration is a count-weighted sum of class durations; only forks and joins need max-plus.
"""
from __future__ import annotations

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENT_INDEX, COMPONENTS, Graph

#: Roofline groups: components in one group add up; groups take the max; "latency" (last) adds on top.
GROUPS = ("compute", "sfu", "hbm", "nvlink", "scaleout", "c2c", "disk", "latency")
LATENCY = len(GROUPS) - 1


def component_group(c: str) -> int:
    if c.startswith("flops_"):
        return 0
    if c in ("bytes_weight", "bytes_kv", "bytes_act"):
        return GROUPS.index("hbm")
    return GROUPS.index({"exps": "sfu", "bytes_nvlink": "nvlink", "bytes_scaleout": "scaleout", "bytes_c2c": "c2c",
                         "bytes_disk": "disk"}.get(c) or ("latency" if c.startswith("hops_") else c))


COMPONENT_GROUP = np.array([component_group(c) for c in COMPONENTS])


@attrs.frozen(eq=False)
class CostProgram:
    """Everything evaluation needs, as arrays. ``coef[f, c, k]``: coefficient of feature f in component k
    of cost class c. ``op_class[i]``: class of op i. Segments: ``seg_pairs`` (class, segment, count) and
    ``seg_preds`` (predecessor segments, topological order)."""

    graph: Graph
    features: tuple
    coef: np.ndarray
    op_class: np.ndarray
    n_classes: int
    n_segments: int
    seg_pairs: np.ndarray  # (n_pairs, 3): class, segment, count
    seg_preds: tuple
    op_segment: np.ndarray
    sched_preds: tuple  # full-graph predecessors per op (op indices)
    stage_of_op: np.ndarray
    stages: tuple
    #: ops with alternative costs (``Op.alts``): per alternative beyond the first, its own class
    #: (``alt_class``, no op counts it) and the class of its op (``alt_primary``), whose duration is the least
    #: of its own and its alternatives' at each point; ``alt_index``: the alternative's index in ``Op.alts``
    alt_class: np.ndarray = np.zeros(0, dtype=np.int64)
    alt_primary: np.ndarray = np.zeros(0, dtype=np.int64)
    alt_index: np.ndarray = np.zeros(0, dtype=np.int64)

    @property
    def n_ops(self) -> int:
        return len(self.graph.ops)

    def __repr__(self) -> str:
        return (f"CostProgram({self.graph.name!r}: {self.n_ops} ops -> {self.n_classes} cost classes, "
                f"{self.n_segments} segments, {len(self.features)} features)")


def lower(graph: Graph, class_key=None) -> CostProgram:
    """Lower a graph (already sharded for its mapping) to a CostProgram. ``class_key(i)`` (a string) further
    separates ops whose cost rows are equal but whose durations a measured view reads from different
    tables."""
    graph.validate()
    # Repeated layers repeat their costs: build one row per distinct Cost (in order of first use, so
    # features are numbered as a walk over every op's terms would number them).
    cost_id: dict = {}
    op_cost = [cost_id.setdefault(op.cost, len(cost_id)) for op in graph.ops]
    # an op's other alternatives are rows too (after every op's own: the ops' features keep their numbers)
    op_alts = [tuple(cost_id.setdefault(c, len(cost_id)) for _, c in op.alts[1:]) for op in graph.ops]
    costs = list(cost_id)
    feats: dict = {}
    for cost in costs:
        for f in cost.features():
            feats.setdefault(f, len(feats))
    n_ops, nf, nk = len(graph.ops), max(len(feats), 1), len(COMPONENTS)
    rows = np.zeros((len(costs), nf, nk))
    for r, cost in enumerate(costs):
        for c, f, v in cost.terms:
            rows[r, feats[f], COMPONENT_INDEX[c]] += v
    # Cost classes: ops with byte-identical rows (and class keys) share one, numbered in op order.
    row_id: dict[bytes, int] = {}
    cost_row = [row_id.setdefault(rows[r].tobytes(), len(row_id)) for r in range(len(costs))]
    keys: dict[tuple, int] = {}
    op_class = np.empty(n_ops, dtype=np.int64)
    first: list[int] = []  # a distinct cost of each class
    for i in range(n_ops):
        # an op with alternatives shares its class only with ops of the same alternatives
        key = (cost_row[op_cost[i]], tuple(cost_row[a] for a in op_alts[i]), class_key(i) if class_key else "")
        k = keys.get(key)
        if k is None:
            k = keys[key] = len(keys)
            first.append(op_cost[i])
        op_class[i] = k
    alts: list[tuple[int, int, int]] = []  # (alternative's class, its op's class, index in Op.alts)
    done: set = set()
    for i in range(n_ops):
        if op_alts[i] and op_class[i] not in done:
            done.add(op_class[i])
            for j, a in enumerate(op_alts[i]):
                alts.append((len(first), int(op_class[i]), j + 1))
                first.append(a)
    n_classes = len(first)
    coef = np.zeros((nf, n_classes, nk))
    if n_classes:
        coef[:] = rows[first].transpose(1, 0, 2)
    preds = _preds(graph)
    segments, seg_preds = _segments(n_ops, _transitive_reduction(n_ops, preds))
    pairs: dict[tuple[int, int], int] = {}
    for key in zip(op_class.tolist(), segments.tolist()):
        pairs[key] = pairs.get(key, 0) + 1
    seg_pairs = np.array([(c, s, n) for (c, s), n in sorted(pairs.items())], dtype=np.int64).reshape(-1, 3)
    stage_index = {s: j for j, s in enumerate(graph.stages)}
    alt = np.array(alts, dtype=np.int64).reshape(-1, 3)
    return CostProgram(graph, tuple(feats) or (), coef, op_class, n_classes, int(segments.max()) + 1 if n_ops else 0,
                       seg_pairs, seg_preds, segments, preds,
                       np.array([stage_index[o.stage] for o in graph.ops], dtype=np.int64), tuple(graph.stages),
                       alt[:, 0].copy(), alt[:, 1].copy(), alt[:, 2].copy())


def _preds(graph: Graph) -> tuple:
    preds = [set() for _ in graph.ops]
    for a, b in graph.schedule_edges():
        if a >= b:
            raise GraphsimError("edge", f"{graph.ops[a].name} -> {graph.ops[b].name} is not in program order")
        preds[b].add(a)
    return tuple(tuple(sorted(p)) for p in preds)


def _transitive_reduction(n: int, preds: tuple) -> list[list[int]]:
    """Drop edges implied by longer paths (bitset reachability; ops are in topological order)."""
    succs = [[] for _ in range(n)]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].append(v)
    # u -> v is implied when another successor w of u reaches v: v is in the union of the successors'
    # descendant sets (v's own set never holds v: a DAG), so one union per op decides all its out-edges
    desc = [0] * n
    reach = [0] * n
    for u in range(n - 1, -1, -1):
        r = own = 0
        for v in succs[u]:
            r |= desc[v]
            own |= 1 << v
        reach[u] = r
        desc[u] = r | own
    reduced = [[] for _ in range(n)]
    for u in range(n):
        r = reach[u]
        for v in succs[u]:
            if not (r >> v) & 1:
                reduced[v].append(u)
    return reduced


def _segments(n: int, preds: list[list[int]]):
    """Collapse simple chains: v joins u's segment when u -> v is u's only out-edge and v's only in-edge."""
    outdeg = [0] * n
    for ps in preds:
        for u in ps:
            outdeg[u] += 1
    seg = [0] * n  # (Python ints while walking; one array at the end)
    seg_preds: list[tuple] = []
    for v in range(n):
        ps = preds[v]
        if len(ps) == 1 and outdeg[ps[0]] == 1:
            seg[v] = seg[ps[0]]
        else:
            seg[v] = len(seg_preds)
            seg_preds.append(tuple(sorted({seg[u] for u in ps})))
    return np.array(seg, dtype=np.int64).reshape(n), tuple(seg_preds)
