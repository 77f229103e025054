"""Evaluate a CostProgram at many workload points.

* :class:`Evaluator` — the kernel of :mod:`graphsim.lowering.kernel` (sparse roofline over cost classes,
  segment kinds, level-scheduled max-plus): in NumPy for a few points (no compilation) and jitted JAX for
  many, in fixed-size chunks of blocks so memory stays bounded; one compilation serves every chunk and every
  program of the same structure. ``precision="exact"`` (float64, the reference) or ``"fast"`` (float32).
  JAX is imported on first use and float64 is enabled only inside graphsim's own calls.
* :func:`evaluate_reference` — pure NumPy over the *full* graph, straight from each op's ``Cost`` terms;
  an independent path used by tests and for single-point reports (start/finish per op, critical path).

Both take ``unit_time``: seconds per unit of each cost component (1/peak for FLOPs, 1/bandwidth for bytes,
latency per hop), shape (P, K) or (K,).
"""
from __future__ import annotations

from typing import Mapping

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENT_INDEX, COMPONENTS, Graph
from graphsim.core.workload import Workload

from . import kernel as K
from .features import feature_matrix
from .program import COMPONENT_GROUP, GROUPS, LATENCY, CostProgram



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
    #: measured views: each op's SOL duration and where its duration came from (graphsim.views.measured.view
    #: SOURCE_NAMES codes); None in the SOL view
    sol_duration: np.ndarray | None = None
    source: np.ndarray | None = None
    #: per op, the index in ``Op.alts`` of the alternative that ran (the fastest; 0 for ops without)
    choice: np.ndarray | None = None
    #: op index -> (its alternatives, P) SOL durations, for the ops that have alternatives
    alternatives: dict | None = None

    def algorithm(self, i: int, point: int = 0) -> str:
        """The label of the alternative op ``i`` ran at (``one_shot/LL``), "" for an op without alternatives."""
        alts = self.graph.ops[i].alts
        return alts[int(self.choice[point, i])][0] if alts and self.choice is not None else ""

    @property
    def forward(self) -> np.ndarray:
        return self.finish.max(axis=1)

    def __repr__(self) -> str:
        P, n = self.duration.shape
        fw = self.forward
        head = f"forward {fw[0] * 1e3:.4g} ms" if P == 1 else f"forward {fw.min() * 1e3:.4g}-{fw.max() * 1e3:.4g} ms"
        return f"Schedule({self.graph.name!r}: {n} ops x {P} point{'s' if P != 1 else ''}, {head})"

    def _repr_html_(self, top: int = 8) -> str:  # Jupyter: forward time, the critical path and its longest ops
        from html import escape

        from graphsim.core.display import html_table

        P, n = self.duration.shape
        g, fw, path, bounds = self.graph, self.forward, self.critical_path(0), self.bound(0)
        dur = self.duration[0]
        span = f" over {P} points ({fw.min() * 1e3:.4g}-{fw.max() * 1e3:.4g} ms); point 0 shown" if P > 1 else ""
        head = (f"<p><b>Schedule {escape(repr(g.name))}</b>: {n:,} ops, forward {fw[0] * 1e3:.4g} ms{span}; "
                f"critical path {len(path):,} ops</p>")
        longest = sorted(path, key=lambda i: -dur[i])[:top]
        rows = [(g.ops[i].name, g.ops[i].kind, g.ops[i].stage, f"{dur[i] * 1e6:,.2f}",
                 f"{100 * dur[i] / max(fw[0], 1e-30):.1f} %", bounds[i]) for i in longest]
        table = html_table(("op", "kind", "stage", "time (us)", "share", "bound"), rows, right=(3, 4),
                           caption=f"longest {len(rows)} ops on the critical path")
        return f'<div class="graphsim-schedule">{head}{table}</div>'

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
        t = self.components[point] * self.unit_time[point]  # (ops, K)
        parts = np.stack([t[:, COMPONENT_GROUP == g].sum(axis=1) for g in range(len(GROUPS))], axis=1)
        roof = parts[:, :LATENCY]
        names = np.array((*GROUPS, "idle"))  # GROUPS ends with "latency"
        pick = np.where(parts.max(axis=1) == 0, len(GROUPS),
                        np.where(roof.max(axis=1) > 0, roof.argmax(axis=1), LATENCY))
        return names[pick].tolist()


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
    ov = np.asarray(overhead, dtype=np.float64).reshape(-1, 1)
    dur = _durations_from_components(comp, ut[:, None, :], ov, np)
    # ops with alternatives: each at its fastest at every point (the first of equals), with its components
    choice = np.zeros((P, n), dtype=np.int64)
    alt_dur: dict = {}  # op -> (alternatives, P) durations
    rows = np.arange(P)
    for i, op in enumerate(g.ops):
        if not op.alts:
            continue
        cs = np.zeros((len(op.alts), P, len(COMPONENTS)))
        for j, (_, cost) in enumerate(op.alts):
            for c, f, v in cost.terms:
                cs[j, :, kidx[c]] += v * feats[:, fidx[f]]
        ds = _durations_from_components(cs, ut[None, :, :], ov[None, :, 0], np)  # (alternatives, P)
        pick = np.argmin(ds, axis=0)
        choice[:, i], comp[:, i], dur[:, i] = pick, cs[pick, rows], ds[pick, rows]
        alt_dur[i] = ds
    sol_dur = source = None
    if view is not None:
        vf = feature_matrix(view.features, g.token_set_map, workload.kinds, a, np) if view.features else np.zeros((P, 0))
        cls_view, flags = view.apply(class_durations(program, dur, alt_dur), vf, np)
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
    return Schedule(g, dur, start, finish, comp, ut, argpred, sol_dur, source, choice, alt_dur)


def class_durations(program: CostProgram, dur: np.ndarray, alt_dur: dict) -> np.ndarray:
    """(P, C) per cost class: the duration of its first op, and of each alternative class its op's alternative."""
    n = program.n_ops
    first = np.zeros(program.n_classes, dtype=np.int64)
    first[program.op_class[::-1]] = np.arange(n)[::-1]
    out = dur[:, first]
    for a, p, j in zip(program.alt_class.tolist(), program.alt_primary.tolist(), program.alt_index.tolist()):
        out[:, a] = alt_dur[int(first[p])][j]
    return out


# ---------------------------------------------------------------------------------------------------
# The fast kernel (lowering/kernel.py): NumPy for a few points, jitted JAX for many
# ---------------------------------------------------------------------------------------------------

def op_kinds(program: CostProgram) -> tuple:
    """Op kinds in first-appearance order: the columns of the ``kinds`` output."""
    return tuple(dict.fromkeys(op.kind for op in program.graph.ops))


#: float64 is the reference; "fast" evaluates in float32 (relative error below 1e-5 on the shipped models)
PRECISIONS = {"exact": np.float64, "fast": np.float32}


def _jax():
    """JAX, imported on first use (``import graphsim`` and commands that do not evaluate never load it)."""
    import jax

    return jax


#: jitted kernels by structure: programs with the same features, groups and level shape share one
#: compilation (their coefficients, slots and schedules are arguments, not constants)
_KERNELS: dict = {}


#: (kernel key, points per call) pairs that have been compiled
_COMPILED: set = set()


def _kernel_key(lay, features, token_sets, kinds, outputs, varying, precision, view) -> tuple:
    key = (features, tuple(sorted(token_sets.items())), kinds, outputs, varying, precision, lay.signature,
           id(view) if view is not None else None)
    try:
        hash(key)
    except TypeError:  # pragma: no cover - every structural field is a frozen value
        key = (id(lay), outputs, varying, precision)
    return key


def _kernel(key, lay, features, token_sets, kinds, outputs, varying, precision, view):
    jax = _jax()
    fn = _KERNELS.get(key)
    if fn is None:
        import jax.numpy as jnp

        dtype = PRECISIONS[precision]

        def body(consts, arrays, ut, ut0, overhead):
            return K.run(lay, consts, features, token_sets, kinds, arrays, ut, ut0, overhead, varying, outputs,
                         jnp, scan=jax.lax.scan, view=view, dtype=dtype)

        def kernel(consts, arrays, ut, ut0, overhead):
            P = overhead.shape[0]
            if P <= BLOCK or P % BLOCK:
                return body(consts, arrays, ut, ut0, overhead)
            # blocks of BLOCK points, one after another: every intermediate stays in cache
            nb = P // BLOCK
            xs = ({k: v.reshape(nb, BLOCK, *v.shape[1:]) for k, v in arrays.items()},
                  ut.reshape(ut.shape[0], nb, -1).transpose(1, 0, 2) if ut.shape[1] == P else
                  jnp.broadcast_to(ut[None], (nb, *ut.shape)), overhead.reshape(nb, BLOCK))
            out = jax.lax.map(lambda x: body(consts, x[0], x[1], ut0, x[2]), xs)
            return {k: v.reshape(P, *v.shape[2:]) for k, v in out.items()}

        if len(_KERNELS) > 64:  # bounded: a kernel holds its layout (and a measured view's tables)
            old = next(iter(_KERNELS))
            _KERNELS.pop(old)
            _COMPILED.difference_update({k for k in _COMPILED if k[0] == old})
        fn = _KERNELS[key] = jax.jit(kernel)
    return fn


def build_kernel(program: CostProgram, kinds: tuple, outputs=("forward", "stages", "classes"), view=None,
                 precision: str = "exact"):
    """A function (arrays, ut (P, K), overhead (P,)) -> outputs dict through the jitted kernel (all points in
    one call). Outputs: ``forward`` (P,), ``stages`` (P, n_stages: busy seconds per stage), ``classes``
    (P, n_classes: seconds per class op), ``kinds`` (P, n_kinds: busy seconds per op kind, columns
    :func:`op_kinds`), ``workspace`` (P,: the largest activation bytes of any one op) and ``components``
    (P, K: component totals over all ops — FLOPs per precision, bytes per kind, hops)."""
    ev = Evaluator(program, kinds, view=view, precision=precision, numpy_points=0)

    def call(arrays, ut, overhead):
        ut = np.asarray(ut, dtype=np.float64)
        P = np.asarray(overhead).reshape(-1).shape[0]
        return ev._jax_chunk(arrays, np.broadcast_to(ut, (P, len(COMPONENTS))), np.reshape(overhead, (P,)),
                             tuple(outputs), _varying(ut))

    return call


def _varying(ut) -> tuple:
    if ut.ndim < 2 or ut.shape[0] <= 1 or ut.strides[0] == 0:
        return (False,) * ut.shape[-1]
    return tuple(bool(v) for v in ~np.all(ut == ut[:1], axis=0))


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
        res["classes"] = class_durations(program, dur, s.alternatives or {})
    if "workspace" in outputs:
        act = s.components[:, :, COMPONENT_INDEX["bytes_act"]]
        alt = [i for i, op in enumerate(program.graph.ops) if op.alts]
        if alt:  # an op's workspace is its own cost's (what memory reads), whichever alternative ran
            g = program.graph
            feats = feature_matrix(program.features, g.token_set_map, workload.kinds, workload.arrays(), np)
            fidx = {f: j for j, f in enumerate(program.features)}
            act = act.copy()
            for i in alt:
                act[:, i] = sum((v * feats[:, fidx[f]] for c, f, v in g.ops[i].cost.terms if c == "bytes_act"),
                                np.zeros(workload.points))
        res["workspace"] = act.max(axis=1) if act.shape[1] else np.zeros(workload.points)
    if "components" in outputs:
        res["components"] = s.components.sum(axis=1)
    return {k: res[k] for k in outputs}


#: points per block inside the jitted kernel (a chunk is processed block after block; 2,048 points keep a
#: block's class durations and level window in cache)
BLOCK = 2048

#: below this many points the kernel runs in NumPy (no compilation); above it, jitted JAX in chunks
NUMPY_POINTS = 4096


@attrs.define
class Evaluator:
    """One program's evaluation: the kernel's layout is derived once; a call runs it in NumPy for a few
    points (single-point reports, small structural sweeps: no JIT) or through the jitted JAX kernel in
    fixed-size chunks (one compilation per program *shape* serves every chunk and every program of that
    shape). ``precision``: "exact" (float64, the reference) or "fast" (float32)."""

    program: CostProgram
    kinds: tuple
    chunk: int = 65536
    view: object = None  # a bound measured view (graphsim.views.measured.view.BoundView) or None (SOL)
    precision: str = attrs.field(default="exact")
    numpy_points: int = NUMPY_POINTS
    _layout: object = None
    _consts: dict = attrs.Factory(dict)
    _fns: dict = attrs.Factory(dict)
    _keys: dict = attrs.Factory(dict)
    _folds: dict = attrs.Factory(dict)

    @precision.validator
    def _check_precision(self, _, v):
        if v not in PRECISIONS:
            raise GraphsimError("precision", f"must be {' or '.join(PRECISIONS)}, got {v!r}")

    @property
    def layout(self):
        if self._layout is None:
            units = self.view.units() if hasattr(self.view, "units") else ()  # a measured view's blocks
            self._layout = K.layout(self.program, op_kinds(self.program), units)
        return self._layout

    def __repr__(self) -> str:
        return f"Evaluator({self.program!r}, precision={self.precision!r})"

    def __call__(self, workload: Workload, ut, overhead=0.0, outputs=("forward", "stages"),
                 precision: str | None = None) -> dict:
        outputs = tuple(outputs)
        precision = precision or self.precision
        if precision not in PRECISIONS:
            raise GraphsimError("precision", f"must be {' or '.join(PRECISIONS)}, got {precision!r}")
        P = workload.points
        ut_in = np.asarray(ut, dtype=np.float64)
        if not np.all(np.isfinite(ut_in) & (ut_in >= 0)):
            raise GraphsimError("unit_time", "seconds per unit must be finite and >= 0 for every component "
                                "(a rate of zero has no finite time; leave the component out of the costs instead)")
        varying = _varying(ut_in)
        ut = np.broadcast_to(np.asarray(ut, dtype=np.float64), (P, len(COMPONENTS)))
        ov = np.broadcast_to(np.asarray(overhead, dtype=np.float64).reshape(-1), (P,))
        a = workload.arrays()
        if P == 0:  # nothing to evaluate: outputs with zero rows
            return self._numpy(a, np.zeros((0, len(COMPONENTS))), ov, outputs, varying, precision)
        size = self._size(P)
        key = self._key(outputs, varying, precision)
        if P <= self.numpy_points and not (P >= 64 and (key, size) in _COMPILED):
            return self._numpy(a, ut, ov, outputs, varying, precision)  # no JIT for a few points
        out = {k: [] for k in outputs}
        for lo in range(0, P, size):
            hi = min(lo + size, P)
            pad = size - (hi - lo)  # pad the last chunk so one compiled shape serves every chunk

            def cut(x):
                x = x[lo:hi]
                return np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) if pad else x

            res = self._jax_chunk({k: cut(v) for k, v in a.items()}, cut(ut), cut(ov), outputs, varying, precision)
            for k in outputs:
                out[k].append(res[k][: hi - lo])
        _COMPILED.add((key, size))
        return {k: np.concatenate(v) for k, v in out.items()}

    def _size(self, P: int) -> int:
        """Points per JAX call: equal chunks of whole blocks for many points; below one chunk the next power of
        two (a few compiled shapes serve every size)."""
        if P > self.chunk:
            n_chunks = -(-P // self.chunk)
            size = -(-P // n_chunks)
            return -(-size // BLOCK) * BLOCK if size > BLOCK else size
        return max(256, 1 << (max(P, 1) - 1).bit_length())

    def _key(self, outputs, varying, precision) -> tuple:
        k = (outputs, varying, precision)
        if k not in self._keys:
            self._keys[k] = _kernel_key(self.layout, self.program.features, self.program.graph.token_set_map,
                                        self.kinds, outputs, varying, precision, self.view)
        return self._keys[k]

    def _fold(self, ut0: np.ndarray, precision: str) -> dict:
        k = (ut0.tobytes(), precision)
        if k not in self._folds:
            if len(self._folds) > 256:
                self._folds.clear()
            self._folds[k] = K.fold(self.layout, ut0, PRECISIONS[precision])
        return self._folds[k]

    def _const(self, precision: str, xp_name: str):
        key = (precision, xp_name)
        if key not in self._consts:
            c = self.layout.constants(PRECISIONS[precision])
            if xp_name == "jax":
                import jax.numpy as jnp

                c = {k: jnp.asarray(v) for k, v in c.items()}
            self._consts[key] = c
        return self._consts[key]

    def _numpy(self, a, ut, ov, outputs, varying, precision):
        dtype = PRECISIONS[precision]
        res = K.run(self.layout, self._const(precision, "numpy"), self.program.features,
                    self.program.graph.token_set_map, self.kinds, a, ut.T.astype(dtype),
                    self._fold(np.ascontiguousarray(ut[0]) if len(ut) else np.zeros(len(COMPONENTS)), precision),
                    ov.astype(dtype), varying, outputs, np,
                    view=self.view, dtype=dtype)
        return {k: np.asarray(v, dtype=np.float64) for k, v in res.items()}

    def _jax_chunk(self, a, ut, ov, outputs, varying, precision="exact"):
        jax = _jax()
        with jax.enable_x64(True):  # scoped: graphsim never flips the process's setting (features in float64)
            k = (outputs, varying, precision)
            fn = self._fns.get(k)
            if fn is None:
                fn = self._fns[k] = _kernel(self._key(outputs, varying, precision), self.layout,
                                            self.program.features, self.program.graph.token_set_map, self.kinds,
                                            outputs, varying, precision, self.view)
            # unit times per point only when some vary (a hardware axis); otherwise the kernel folds ut[0]
            per_point = np.ascontiguousarray(ut.T) if any(varying) else np.zeros((ut.shape[1], 1))
            res = fn(self._const(precision, "jax"), a, per_point, self._fold(np.ascontiguousarray(ut[0]), precision), ov)
            return {k: np.asarray(v, dtype=np.float64) for k, v in res.items()}


def evaluate(program: CostProgram, workload: Workload, ut, overhead=0.0, *, chunk: int = 65536,
             outputs=("forward", "stages")) -> dict:
    """One-shot convenience: compile and evaluate (prefer an :class:`Evaluator` for repeated calls)."""
    return Evaluator(program, workload.kinds, chunk)(workload, ut, overhead, outputs)
