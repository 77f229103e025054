"""Evaluate a CostProgram at many workload points.

* :func:`evaluate` — jitted JAX over the reduced graph (cost classes, collapsed chains, unrolled max-plus),
  points processed in fixed-size chunks so memory stays bounded and one compilation serves all chunks.
* :func:`evaluate_reference` — pure NumPy over the *full* graph, straight from each op's ``Cost`` terms;
  an independent path used by tests and for single-point reports (start/finish per op, critical path).

Both take ``unit_time``: seconds per unit of each cost component (1/peak for FLOPs, 1/bandwidth for bytes,
latency per hop), shape (P, K) or (K,).
"""
from __future__ import annotations

from typing import Mapping

import attrs
import numpy as np

from graphsim.ir import COMPONENT_INDEX, COMPONENTS, Graph
from graphsim.workload import Workload

from .features import feature_matrix
from .program import COMPONENT_GROUP, GROUPS, LATENCY, CostProgram

try:  # exactness first: costs are float64 end to end
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
except ImportError:  # pragma: no cover - jax is a declared dependency
    jax = None


def unit_time(rates: Mapping[str, float]) -> np.ndarray:
    """Seconds per unit of each component from a rates dict (``HardwareSpec.rates()``)."""
    out = np.empty(len(COMPONENTS))
    for k, c in enumerate(COMPONENTS):
        r = float(rates[c])
        out[k] = r if c.startswith("hops_") else (1.0 / r if r > 0 else np.inf)
    return out


def _durations_from_components(comp, ut, overhead, xp):
    """Roofline per row: comp (..., K) component totals -> seconds."""
    t = comp * ut
    parts = [xp.sum(t[..., COMPONENT_GROUP == g], axis=-1) for g in range(len(GROUPS))]
    roof = parts[0]
    for p in parts[1:LATENCY]:
        roof = xp.maximum(roof, p)
    return roof + parts[LATENCY] + overhead


@attrs.frozen(eq=False)
class Schedule:
    """Reference evaluation: per-op durations, starts and finishes (P, ops) and the bound of each op."""

    graph: Graph
    duration: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    components: np.ndarray  # (P, ops, K) raw component totals (FLOPs, bytes, hops)
    unit_time: np.ndarray  # (P, K)
    argpred: np.ndarray  # (P, ops): the predecessor that set the start (-1 if none)
    #: measured views: each op's SOL duration and where its duration came from (graphsim.measured.view
    #: SOURCE_NAMES codes); None in the SOL view
    sol_duration: np.ndarray | None = None
    source: np.ndarray | None = None

    @property
    def forward(self) -> np.ndarray:
        return self.finish.max(axis=1)

    def critical_path(self, point: int = 0) -> list[int]:
        """Op indices on the critical path of one point, first to last."""
        i = int(np.argmax(self.finish[point]))
        path = []
        while i >= 0:
            path.append(i)
            i = int(self.argpred[point, i])
        return path[::-1]

    def bound(self, point: int = 0) -> list[str]:
        """Per op, which roofline term bounds it: compute / sfu / hbm / nvlink / scaleout / c2c / disk / latency
        / idle."""
        t = self.components[point] * self.unit_time[point]
        out = []
        for row in t:
            parts = [row[COMPONENT_GROUP == g].sum() for g in range(len(GROUPS))]
            roof = parts[:LATENCY]
            out.append("idle" if max(parts) == 0 else GROUPS[int(np.argmax(roof))] if max(roof) > 0 else "latency")
        return out


def evaluate_reference(program: CostProgram, workload: Workload, ut, overhead=0.0, view=None) -> Schedule:
    """NumPy, full graph, each op's cost evaluated from its own terms (not from the class matrices); a bound
    measured ``view`` replaces op durations by its tables' (the schedule's structure is unchanged)."""
    g = program.graph
    a = workload.arrays()
    P = workload.points
    ut = np.broadcast_to(np.asarray(ut, dtype=np.float64), (P, len(COMPONENTS)))
    feats = feature_matrix(program.features, g.token_set_map, workload.kinds, a, np) if program.features else np.zeros((P, 0))
    fidx = {f: i for i, f in enumerate(program.features)}
    kidx = {c: k for k, c in enumerate(COMPONENTS)}
    n = len(g.ops)
    comp = np.zeros((P, n, len(COMPONENTS)))
    for i, op in enumerate(g.ops):
        for c, f, v in op.cost.terms:
            comp[:, i, kidx[c]] += v * feats[:, fidx[f]]
    dur = _durations_from_components(comp, ut[:, None, :], np.asarray(overhead, dtype=np.float64).reshape(-1, 1), np)
    sol_dur = source = None
    if view is not None:
        first = np.zeros(program.n_classes, dtype=np.int64)
        first[program.op_class[::-1]] = np.arange(n)[::-1]
        vf = feature_matrix(view.features, g.token_set_map, workload.kinds, a, np) if view.features else np.zeros((P, 0))
        cls_view, flags = view.apply(dur[:, first], vf, np)
        sol_dur, dur, source = dur, cls_view[:, program.op_class], flags[:, program.op_class]
    start = np.zeros((P, n))
    finish = np.zeros((P, n))
    argpred = np.full((P, n), -1, dtype=np.int64)
    for i, ps in enumerate(program.sched_preds):
        if ps:
            pf = finish[:, list(ps)]
            j = np.argmax(pf, axis=1)
            start[:, i] = pf[np.arange(P), j]
            argpred[:, i] = np.asarray(ps)[j]
        finish[:, i] = start[:, i] + dur[:, i]
    return Schedule(g, dur, start, finish, comp, ut, argpred, sol_dur, source)


# ---------------------------------------------------------------------------------------------------
# JAX path
# ---------------------------------------------------------------------------------------------------

def op_kinds(program: CostProgram) -> tuple:
    """Op kinds in first-appearance order: the columns of the ``kinds`` output."""
    return tuple(dict.fromkeys(op.kind for op in program.graph.ops))


def build_kernel(program: CostProgram, kinds: tuple, outputs=("forward", "stages", "classes"), view=None):
    """A jitted function (arrays, ut (P,K), overhead (P,)) -> dict with ``forward`` (P,), ``stages``
    (P, n_stages: busy seconds per stage) and ``classes`` (P, n_classes: seconds per class op).

    Optional outputs: ``kinds`` (P, n_kinds: busy seconds per op kind, columns :func:`op_kinds`),
    ``workspace`` (P,: the largest activation bytes of any one op, the report's workspace) and
    ``components`` (P, K: component totals over all ops — FLOPs per precision, bytes per kind, hops)."""
    # Per used component k: (P,F)@(F,C) class totals, scaled by its unit time and summed into its roofline
    # group. Cheaper than gathering nonzero columns into (class, group) slots, and exact.
    nf = len(program.features)
    used = [k for k in range(program.coef.shape[2]) if np.any(program.coef[:nf, :, k] != 0.0)]
    mats = [(k, int(COMPONENT_GROUP[k]), jnp.asarray(program.coef[:nf, :, k])) for k in used]
    G = len(GROUPS)
    C, S = program.n_classes, program.n_segments
    pc, ps, pn = (jnp.asarray(program.seg_pairs[:, i]) for i in range(3))
    seg_mat = None
    if C * S <= 2_000_000:  # class -> segment counts as a dense matrix
        m = np.zeros((C, S))
        np.add.at(m, (program.seg_pairs[:, 0], program.seg_pairs[:, 1]), program.seg_pairs[:, 2])
        seg_mat = m
    # class -> stage busy counts
    st_np = np.zeros((C, len(program.stages)))
    np.add.at(st_np, (program.op_class, program.stage_of_op), 1.0)
    kind_index = {k: j for j, k in enumerate(op_kinds(program))}
    km_np = np.zeros((C, len(kind_index)))  # class -> op-kind busy counts
    np.add.at(km_np, (program.op_class, [kind_index[op.kind] for op in program.graph.ops]), 1.0)
    # One class row is one op's row, so the max over classes is the max over ops.
    act = jnp.asarray(program.coef[:nf, :, COMPONENT_INDEX["bytes_act"]])
    per_class = np.bincount(program.op_class, minlength=C).astype(np.float64)
    totals = jnp.asarray(np.einsum("fck,c->fk", program.coef[:nf], per_class))
    seg_preds = program.seg_preds
    token_sets = program.graph.token_set_map
    features = program.features

    def kernel(arrays, ut, overhead):
        P = ut.shape[0]
        feats = feature_matrix(features, token_sets, kinds, arrays, jnp) if features else jnp.zeros((P, 0))
        parts = [jnp.zeros((P, C)) for _ in range(G)]
        for k, g, mat in mats:
            parts[g] = parts[g] + (feats @ mat) * ut[:, k : k + 1]
        roof = parts[0]
        for g in range(1, LATENCY):
            roof = jnp.maximum(roof, parts[g])
        cls = roof + parts[LATENCY] + overhead[:, None]
        V = None
        if view is not None:  # a measured view: class durations from its tables, as base + Vᵀ·E
            vf = feature_matrix(view.features, token_sets, kinds, arrays, jnp) if view.features else jnp.zeros((P, 0))
            cls, V, E = view.split(cls, vf, jnp)

        def prod(M):  # (class durations) @ M
            return cls @ M if V is None else cls @ M + jnp.einsum("kp,km->pm", V, jnp.asarray(E @ np.asarray(M)))

        if V is not None and (seg_mat is None or "classes" in outputs):
            cls, V = cls + jnp.einsum("kp,kc->pc", V, jnp.asarray(E)), None
        seg = prod(seg_mat) if seg_mat is not None else jnp.zeros((P, S)).at[:, ps].add(cls[:, pc] * pn)
        finish = []
        for s in range(S):  # unrolled max-plus over the reduced graph
            p = seg_preds[s]
            start = jnp.max(jnp.stack([finish[j] for j in p], axis=1), axis=1) if p else 0.0
            finish.append(start + seg[:, s])
        forward = jnp.max(jnp.stack(finish, axis=1), axis=1) if finish else jnp.zeros(P)
        res = {"forward": forward, "classes": cls}
        if "stages" in outputs:
            res["stages"] = prod(st_np)
        if "kinds" in outputs:
            res["kinds"] = prod(km_np)
        if "workspace" in outputs:
            res["workspace"] = jnp.max(feats @ act, axis=1) if C else jnp.zeros(P)
        if "components" in outputs:
            res["components"] = feats @ totals
        return {k: res[k] for k in outputs}

    return jax.jit(kernel)


#: programs with more segments than this evaluate few points (points x ops <= NUMPY_WORK) with NumPy
NUMPY_SEGMENTS = 256
NUMPY_WORK = 2_000_000


def reference_outputs(program: CostProgram, workload: Workload, ut, overhead=0.0, view=None,
                      outputs=("forward", "stages")) -> dict:
    """The kernel's outputs from the NumPy full-graph schedule (same definitions, same numbers)."""
    s = evaluate_reference(program, workload, ut, overhead, view)
    dur = s.duration
    res = {"forward": s.forward}
    if "stages" in outputs:
        res["stages"] = np.stack([dur[:, program.stage_of_op == j].sum(axis=1) for j in range(len(program.stages))], 1)
    if "kinds" in outputs:
        kinds = op_kinds(program)
        of = np.array([kinds.index(op.kind) for op in program.graph.ops])
        res["kinds"] = np.stack([dur[:, of == j].sum(axis=1) for j in range(len(kinds))], axis=1)
    if "classes" in outputs:
        first = np.zeros(program.n_classes, dtype=np.int64)
        first[program.op_class[::-1]] = np.arange(program.n_ops)[::-1]
        res["classes"] = dur[:, first]
    if "workspace" in outputs:
        act = s.components[:, :, COMPONENT_INDEX["bytes_act"]]
        res["workspace"] = act.max(axis=1) if act.shape[1] else np.zeros(workload.points)
    if "components" in outputs:
        res["components"] = s.components.sum(axis=1)
    return {k: res[k] for k in outputs}


@attrs.define
class Evaluator:
    """Compiled once per (program, group structure); call with a workload and unit times."""

    program: CostProgram
    kinds: tuple
    chunk: int = 65536
    view: object = None  # a bound measured view (graphsim.measured.view.BoundView) or None (SOL)
    _kernels: dict = attrs.Factory(dict)

    def __call__(self, workload: Workload, ut, overhead=0.0, outputs=("forward", "stages")) -> dict:
        outputs = tuple(outputs)
        P = workload.points
        if self.program.n_segments > NUMPY_SEGMENTS and P * self.program.n_ops <= NUMPY_WORK:
            # a big DAG at a few points: NumPy over the full graph beats compiling the unrolled max-plus
            # (10,595 ops / 2,405 segments, 3 points: 0.8 s instead of 40 s)
            return reference_outputs(self.program, workload, ut, overhead, self.view, outputs)
        if outputs not in self._kernels:
            self._kernels[outputs] = build_kernel(self.program, self.kinds, outputs, self.view)
        kernel = self._kernels[outputs]
        ut = np.broadcast_to(np.asarray(ut, dtype=np.float64), (P, len(COMPONENTS)))
        ov = np.broadcast_to(np.asarray(overhead, dtype=np.float64).reshape(-1), (P,))
        a = workload.arrays()
        n_chunks = -(-P // self.chunk)
        size = -(-P // n_chunks)  # equal chunks: at most n_chunks - 1 padded rows
        out = {k: [] for k in outputs}
        for lo in range(0, P, size):
            hi = min(lo + size, P)
            pad = size - (hi - lo)  # pad the last chunk so one compiled shape serves every chunk

            def cut(x):
                x = x[lo:hi]
                return np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) if pad else x

            res = kernel({k: cut(v) for k, v in a.items()}, cut(ut), cut(ov))
            for k in outputs:
                out[k].append(np.asarray(res[k])[: hi - lo])
        return {k: np.concatenate(v) for k, v in out.items()}


def evaluate(program: CostProgram, workload: Workload, ut, overhead=0.0, *, chunk: int = 65536,
             outputs=("forward", "stages")) -> dict:
    """One-shot convenience: compile and evaluate (prefer an :class:`Evaluator` for repeated calls)."""
    return Evaluator(program, workload.kinds, chunk)(workload, ut, overhead, outputs)
