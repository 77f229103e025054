"""The OP and Hybrid views: per-op durations from measured tables on the same compiled DAG.

``sol``     every op at its roofline (the default; no tables).
``op``      every op a table family times is looked up in the selected backend's partition (strict: an op of
            such a kind without coverage is an error naming it); kinds no family times stay at SOL, labelled.
``hybrid``  like ``op``, but an uncovered op falls back to ``a + b x SOL``, least squares over the same
            backend's covered ops of its family in this plan at this point (a >= 0: a launch floor; b >= 1;
            over its group — compute or communication — when its family has none; SOL itself when nothing
            there is covered): never below its SOL, and the report says what it was fitted from.

The schedule (streams, overlap, critical path) is the SOL view's: only op durations change.
"""
from __future__ import annotations

import os

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError, require
from graphsim.driver.views import SOL as SOL_VIEW
from graphsim.driver.views import SOURCE_NAMES, Binding, ViewContext  # noqa: F401 (SOURCE_NAMES: its old home)
from graphsim.lowering.xla import apart, log

from .bank import Bank
from .interp import EXTRAPOLATED, INTERPOLATED, MEASURED, build_curve, eval_curve
from .mapping import Lookup, MapContext, Miss, lookup_for
from .store import FILLS, Backend, Store

VIEWS = ("sol", "op", "hybrid", "fpm")
#: A fallback op's family without covered ops borrows the measured/SOL of covered ops of its group (matrix
#: engines vs links), never across groups.
GROUPS = {"collective": "communication", "moe_a2a": "communication"}
FALLBACK, SOL = 3, 4
assert SOURCE_NAMES[FALLBACK] == "fallback" and SOURCE_NAMES[SOL] == "sol"


@attrs.frozen
class ViewSpec:
    """Which view, from which tables: ``measured`` a folder (or an open Store), ``backend`` FRAMEWORK[@VERSION]."""

    name: str = "sol"
    measured: object = None
    backend: str = ""
    fill: str = "older"

    def __attrs_post_init__(self):
        require(self.name in VIEWS, "view", f"must be one of {', '.join(VIEWS)}, got {self.name!r}")
        require(self.fill in FILLS, "fill", f"must be one of {', '.join(FILLS)}, got {self.fill!r}")
        if self.name == "fpm":
            require(self.measured is not None and self.measured != "", "fpm",
                    "the fpm view needs --fpm FILE (a model from graphsim fpm fit, docs/fpm.md)")
        elif self.name != "sol":
            require(self.measured is not None and self.measured != "", "measured",
                    f"the {self.name} view needs --measured DIR (a folder of measured tables, docs/measured.md)")
            require(bool(self.backend), "backend", f"the {self.name} view needs --backend FRAMEWORK[@VERSION], "
                    "e.g. trtllm@1.3.0rc20")

    def bind(self, ctx: ViewContext) -> Binding:
        """The view protocol (:mod:`graphsim.driver.views`): ``sol`` binds nothing, ``op`` / ``hybrid`` refine the
        cost classes by table lookup and replace their durations, ``fpm`` scales whole forwards."""
        if self.name == "sol":
            return SOL_VIEW.bind(ctx)
        if self.name == "fpm":
            from ..fpm.view import bind_fpm

            require(ctx.profile is None, "profile", "an efficiency profile derates the SOL view; the fpm view takes "
                    "its forwards from measured samples (drop --profile)")
            return Binding("fpm", forward=bind_fpm(self, ctx.model, ctx.plan, ctx.hw))
        require(ctx.profile is None, "profile", "an efficiency profile derates the SOL view; the op and hybrid views "
                "take their times from measured tables (drop --profile)")
        bound = bind(self, ctx.graph, ctx.logical, ctx.plan, ctx.hw, ctx.model)
        if bound is None:
            return SOL_VIEW.bind(ctx)
        return Binding(self.name, op_key=lambda i: bound.op_key[i], attach=bound.attach)

    def store(self) -> Store:
        return self.measured if isinstance(self.measured, Store) else _open(str(self.measured))


_STORES: dict = {}


def _open(path: str) -> Store:
    """Stores are cached per folder within a process (a sweep binds many programs to one store), and reopened
    when a table file changed (added, removed, rewritten: its size or modification time), so a notebook or a
    search that edits tables in place never reads the old rows."""
    sig = _signature(path)
    held = _STORES.get(path)
    if held is None or held[0] != sig:
        _STORES[path] = held = (sig, Store(path))
    return held[1]


def _signature(path: str) -> tuple:
    """(file, size, mtime) of every table file under ``path`` (``os.walk``: half the time of ``Path.rglob``,
    which a search pays once per bound program)."""
    out = []
    try:
        for root, _, files in os.walk(path):
            for f in files:
                if f.endswith(".parquet"):
                    p = os.path.join(root, f)
                    st = os.stat(p)
                    out.append((p, st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(out))


@attrs.frozen(eq=False)
class BoundView:
    """A view bound to one sharded graph: per op, its lookup and curve, or why it has none."""

    spec: ViewSpec
    backend: str  # resolved FRAMEWORK@VERSION
    device: str
    op_key: tuple  # per op: the lookup identity (refines cost classes)
    op_source: tuple  # per op: "table" / "fallback" / "sol"
    op_family: tuple  # per op: table family ("" none)
    op_note: tuple  # per op: partition key + rule, or the reason it has none
    curves: dict  # lookup key -> (Curve, Lookup)
    features: tuple  # extra workload features the lookups read
    op_module: tuple = ()  # per op: its fused-module instance ("" = none)
    #: (family, (ln SOL bin centres, median measured / SOL per bin, rows)) over the backend's tables of that family
    #: on the device, for the families an op falls back in (graphsim.views.measured.check.family_efficiency)
    family_eff: tuple = ()
    # set by attach():
    cls_kind: np.ndarray = None  # per class: 0 table, FALLBACK, SOL
    cls_curve: tuple = ()
    cls_family: tuple = ()
    cls_count: np.ndarray = None
    cls_lookup: tuple = ()  # per class: its lookup key ("" none)
    modules: dict = attrs.Factory(dict)  # module lookup key -> {class: members per instance}
    bank: Bank = None  # the table classes' curves (then the modules'), evaluated together
    bank_groups: tuple = ()  # per bank group: its table classes timed alone (its first rows)
    module_units: tuple = ()  # per fused module: (lookup key, its classes, (bank group, row))
    fallback_units: tuple = ()  # per fallback family: (family, its classes)

    def attach(self, program) -> "BoundView":
        C = program.n_classes
        kind = np.full(C, SOL, dtype=np.int64)
        curve = [None] * C
        fam = [""] * C
        for i, c in enumerate(program.op_class):
            src = self.op_source[i]
            kind[c] = 0 if src == "table" else FALLBACK if src == "fallback" else SOL
            curve[c] = self.curves.get(self.op_key[i]) if src == "table" else None
            fam[c] = self.op_family[i]
        count = np.bincount(program.op_class, minlength=C).astype(np.float64)
        lk = [""] * C
        instances: dict = {}
        for i, c in enumerate(program.op_class):
            lk[c] = self.op_key[i] if self.op_source[i] == "table" else ""
            if self.op_source[i] == "table" and self.op_module[i]:
                inst = instances.setdefault(self.op_key[i], {}).setdefault(self.op_module[i], {})
                inst[int(c)] = inst.get(int(c), 0) + 1
        modules = {}
        for key, insts in instances.items():
            shapes = {tuple(sorted(m.items())) for m in insts.values()}
            require(len(shapes) == 1, "view", f"module {key} has instances of different make-up: {sorted(shapes)[:2]}")
            modules[key] = dict(shapes.pop())
        # the bank: one curve per table class timed alone, then one per fused module; per curve group, its
        # classes (the group's first rows) and its modules (the rows after)
        table = [int(c) for c in np.flatnonzero(kind == 0)]
        single = [c for c in table if lk[c] not in modules]
        keys = [lk[c] for c in single] + list(modules)
        bank = Bank.build([(self.curves[k][0], tuple(co for _, co in self.curves[k][1].varying)) for k in keys])
        groups, where = [], {}
        for gi, g in enumerate(bank.groups):
            rows = [int(i) for i in g.rows]
            groups.append(tuple(single[i] for i in rows if i < len(single)))
            for j, i in enumerate(rows):
                if i >= len(single):
                    where[keys[i]] = (gi, j)
        module_units = tuple((key, tuple(c for c in table if lk[c] == key), where[key]) for key in modules)
        by_fam: dict = {}
        for c in np.flatnonzero(kind == FALLBACK):
            by_fam.setdefault(fam[c], []).append(int(c))
        return attrs.evolve(self, cls_kind=kind, cls_curve=tuple(curve), cls_family=tuple(fam), cls_count=count,
                            cls_lookup=tuple(lk), modules=modules, bank=bank, bank_groups=tuple(groups),
                            module_units=module_units, fallback_units=tuple((f, tuple(cs)) for f, cs in by_fam.items()))

    def units(self) -> tuple:
        """The program classes the view reads together (the kernel gives each list a block of its own): a curve
        group's table classes, a fused module's classes, a fallback family's classes."""
        return (tuple(cs for cs in self.bank_groups if cs) + tuple(cs for _, cs, _ in self.module_units)
                + tuple(cs for _, cs in self.fallback_units))

    # ---- evaluation (NumPy or JAX) --------------------------------------------------------------------
    def apply(self, cls_sol, fcols, xp):
        """(P, C) SOL class durations -> (view durations (P, C), source flags (P, C))."""
        rep, rows, F, _ = self._rows(lambda cs: cls_sol[:, cs].T, _columns(self.features, fcols), xp)
        V = xp.concatenate(rows) if rows else None
        P, C = cls_sol.shape
        kind = np.broadcast_to(np.asarray(self.cls_kind)[None, :], (P, C))
        if not rep:
            return cls_sol, xp.asarray(kind)
        tab = rep[: F.shape[0]]
        if xp is np:
            out, fl = cls_sol.copy(), kind.copy()
            out[:, rep], fl[:, tab] = V.T, F.T
            return out, fl
        return cls_sol.at[:, rep].set(V.T), xp.asarray(kind).at[:, tab].set(F.T)

    def replace(self, sol_rows, col, xp):
        """The replaced classes (program ids) and their view durations as row blocks ``[(k_i, P), ...]`` (their
        concatenation aligns with the classes), from the SOL durations of classes as rows (``sol_rows(classes)``
        -> (n, P)) and the features (``col(feature)`` -> (P,)): what the kernel swaps into its class rows
        (``[]`` and ``[]`` when nothing is replaced)."""
        rep, rows, _, _ = self._rows(sol_rows, col, xp, flags=False)
        return rep, rows

    def _rows(self, sol_rows, col, xp, flags: bool = True):
        """The view's classes as rows: ``rep`` the replaced classes (program ids: per curve group its table
        classes, per fused module its classes, per fallback family its classes — the kernel's blocks of its own,
        :meth:`units`), their durations as row blocks (concatenated: (len(rep), P)), ``F`` the table classes'
        source flags (``flags=False``: whether extrapolated); and the fits. ``sol_rows(classes)`` gives a unit's
        SOL rows (one block in the kernel). The lookups run through the curve bank (one search per feature for
        all the curves that read it); the post-processing (held at or above SOL beyond the tables, no time without
        work) runs per curve group; the hybrid fits are matrix products over the covered units, computed once
        (:meth:`_fits`)."""
        rep, rows, frows = [], [], []
        units = []  # (classes, their view durations (k, P), their SOL (k, P)): what the fits read
        if self.bank is not None and self.bank.n:
            Q = {co: co.value(col, xp) for co in self.bank.coords()}  # every base coordinate, once
            sols = [sol_rows(list(cs)) if cs else None for cs in self.bank_groups]

            def post(S, q0):  # at or above SOL beyond the tables; no time where the op has no work
                def run(t, f):
                    return xp.where((q0 > 0)[None, :], xp.where(_extrapolated(f, flags), xp.maximum(t, S), t), 0.0)
                return run

            # the post-processing runs with each group's arithmetic (its table classes are its first rows)
            got = self.bank.evaluate_groups(col, xp, Q, flags, [(len(cs), post(S, Q[g.coords[0]])) if cs else None
                                                                for S, cs, g in zip(sols, self.bank_groups,
                                                                                    self.bank.groups)])
            tails = []  # per group: its module rows
            for cs, g, (T, F), S in zip(self.bank_groups, self.bank.groups, got, sols):
                k = len(cs)
                head, tail = (T, None) if not cs or k == len(g.rows) else T
                tails.append(T if not cs else tail)
                if not cs:
                    continue
                t, f = head, F[:k] if k < len(g.rows) else F
                units.append((cs, t, S))
                rep += cs
                rows.append(t)
                frows.append(f)
            for key, cs, (gi, j) in self.module_units:  # one timing per module, split over its classes by SOL
                T, F = tails[gi], got[gi][1]
                jt = j - len(self.bank_groups[gi])  # its row among the group's module rows
                S = sol_rows(list(cs))
                members = list(self.modules[key].items())
                n = np.array([m for _, m in members], dtype=np.float64)
                Sm = S if [c for c, _ in members] == list(cs) else sol_rows([c for c, _ in members])
                total = xp.asarray(n) @ Sm
                t = xp.where(_extrapolated(F[j], flags), xp.maximum(T[jt], total), T[jt])
                t = xp.where((total > 0)[None, :], t[None, :] * S / xp.where(total > 0, total, 1.0)[None, :], 0.0)
                units.append((cs, t, S))
                rep += cs
                rows.append(t)
                frows.append(xp.broadcast_to(F[j][None, :], t.shape))
        fits = self._fits(units, xp)
        for fam, cs in self.fallback_units:
            eff = dict(self.family_eff).get(fam)
            covered = any(self.cls_family[c] == fam for u in units for c in u[0])
            if eff is not None and not covered:
                # no covered op of the family in this plan: the family's own tables on the device, at
                # this op's work (its median measured / SOL at the same SOL time)
                S = sol_rows(list(cs))
                rows.append(S * _efficiency_at(eff, S, xp))
                rep += cs
                continue
            a, b = fits[fam]
            S = sol_rows(list(cs))
            rows.append(S if a is None else a[None, :] + b[None, :] * S)  # nothing covered in its group: SOL
            rep += cs
        if not rows:
            return [], [], None, fits
        F = (frows[0] if len(frows) == 1 else xp.concatenate(frows)) if frows else xp.zeros((0, rows[0].shape[1]),
                                                                                            np.int64)
        return rep, rows, F, fits

    def _fits(self, units: list, xp) -> dict:
        """Per fallback family, (a, b) of t = a + b x SOL over its basis (the covered classes of its family, else
        of its group: :meth:`_basis`) by :func:`_affine`. The sums: per covered family a fit reads, one matrix
        product per unit of covered classes (computed once, apart from the fallback rows that read them); per
        basis, the sum of its families'."""
        fams = [f for f, _ in self.fallback_units]
        if not fams or not units:
            return {f: (None, None) for f in fams}
        covered = [self.cls_family[c] for u in units for c in u[0]]
        basis = [frozenset(self._basis(f, covered)) for f in fams]
        used = sorted(set().union(*basis))  # the covered families some fit reads: sums per family, then per basis

        def sums(_):
            acc = {f: None for f in used}
            for cs, t, S in units:
                for f in used:  # a class adds to its family's sums only (its rows, weighted by op count)
                    js = [j for j, c in enumerate(cs) if self.cls_family[c] == f]
                    if not js:
                        continue
                    part = [0.0, 0.0, 0.0, 0.0]
                    for j in js:  # (static rows: slices, no gather)
                        n, tr, sr = float(self.cls_count[cs[j]]), t[j], S[j]
                        ns = n * sr
                        part = [part[0] + n * tr, part[1] + ns, part[2] + ns * sr, part[3] + ns * tr]
                    acc[f] = part if acc[f] is None else [o + p for o, p in zip(acc[f], part)]
            return [[acc[f][q] for f in used] for q in range(4)]  # (rows apart: no stacking)

        got = apart(sums, units[0][1][0], xp) if used else None
        fits = {}
        for f, b in zip(fams, basis):
            if not b or got is None:
                fits[f] = None, None
                continue
            rows = [used.index(x) for x in sorted(b)]
            n = sum(self.cls_count[c] for u in units for c in u[0] if self.cls_family[c] in b)
            fits[f] = _affine(n, *(sum(s[j] for j in rows) for s in got), xp)
        return fits

    @staticmethod
    def _basis(fam: str, covered: list) -> set:
        """The families a fallback family's fit reads: its own covered classes, else those of its group."""
        return {fam} if fam in covered else {f for f in covered if group(f) == group(fam)}

    def _fitted_from(self, fam, covered, same) -> str:
        return _fitted_from_text(fam, covered, same, dict(self.family_eff).get(fam))

    def fallback_basis(self, cls_sol, fcols) -> dict:
        """Per fallback family at point 0: the fit t = a + b x SOL it was priced by, what it was fitted from,
        and its ops' SOL and view time."""
        view, _ = self.apply(cls_sol, fcols, np)
        fits = self._rows(lambda cs: cls_sol[:, cs].T, _columns(self.features, fcols), np)[3]
        out = {}
        covered = [self.cls_family[c] for c in range(len(self.cls_kind)) if self.cls_kind[c] == 0]
        for fam in sorted(fits):
            cs = [c for c in range(len(self.cls_kind)) if self.cls_kind[c] == FALLBACK and self.cls_family[c] == fam]
            a, b = fits[fam]
            same = sorted({f for f in covered if group(f) == group(fam)})
            out[fam or "other"] = {
                "a_s": float(a[0]) if a is not None else 0.0, "b": float(b[0]) if b is not None else 1.0,
                "sol_s": sum(float(cls_sol[0, c] * self.cls_count[c]) for c in cs),
                "view_s": sum(float(view[0, c] * self.cls_count[c]) for c in cs),
                "fitted_from": self._fitted_from(fam, covered, same)}
        return out


def _extrapolated(f, flags: bool):
    """Whether a bank's flag rows say extrapolated (with ``flags=False`` they are that already)."""
    return f == EXTRAPOLATED if flags else f


def _columns(features: tuple, fcols):
    """A feature's column of ``fcols`` (P, len(features))."""
    fidx = {f: j for j, f in enumerate(features)}
    return lambda f: fcols[:, fidx[f]]


def _efficiency_at(eff: tuple, sol, xp):
    """The family's median measured / SOL at SOL time ``sol`` (log-linear between bins, flat beyond)."""
    centres, meds, _ = eff
    x = log(xp.maximum(sol, 1e-300), xp)
    out = 0.0 * sol + meds[0]
    for j in range(len(centres) - 1):  # a sum of ramps (np.interp's numbers; no search or gather per point)
        c0, c1 = float(centres[j]), float(centres[j + 1])
        out = out + (float(meds[j + 1]) - float(meds[j])) * xp.clip((x - c0) * (1.0 / (c1 - c0)), 0.0, 1.0)
    return out


def _fitted_from_text(fam, covered, same, eff) -> str:
    if eff is not None and fam not in covered:
        centres, meds, n = eff
        return (f"no covered {fam} op: the {fam} tables on this device, median measured / SOL at each op's SOL "
                f"time ({meds[-1]:.2f}-{meds[0]:.2f} over {n:,} rows)")
    return (f"covered {fam} ops" if fam in covered else
            f"covered {group(fam)} ops ({', '.join(same)}; no covered {fam} op)" if same
            else "nothing in its group covered: SOL")


def group(family: str) -> str:
    return GROUPS.get(family, "compute")


def _affine(S1, Sy, Sx, Sxx, Sxy, xp):
    """Least-squares t = a + b·SOL over the covered classes from their sums (weighted by op count: S1 = Σn,
    Sy = Σn·t, Sx = Σn·SOL, Sxx = Σn·SOL², Sxy = Σn·SOL·t; per point), with a >= 0 (a launch / latency floor)
    and b >= 1 (never faster than SOL); b = Σt/ΣSOL, a = 0 when the SOLs do not spread."""
    den = S1 * Sxx - Sx * Sx
    ok = den > 1e-30 * xp.maximum(S1 * Sxx, 1e-300)
    b = xp.where(ok, (S1 * Sxy - Sx * Sy) / xp.where(ok, den, 1.0), xp.where(Sx > 0, Sy / xp.where(Sx > 0, Sx, 1.0), 1.0))
    b = xp.maximum(b, 1.0)
    a = xp.where(ok, xp.maximum((Sy - b * Sx) / S1, 0.0), 0.0)
    return a, b


def bind(spec: ViewSpec, graph, logical, plan, hw, model=None) -> BoundView | None:
    """Resolve every op of the sharded ``graph`` against the tables (None for the SOL view)."""
    if spec.name == "sol":
        return None
    store = spec.store()
    sel = store.select(hw.name, Backend.parse(spec.backend), spec.fill)
    ctx = MapContext(plan.mapping, logical, graph.tensor_map, plan.kinds, graph.token_set_map, model, sel)
    wl = plan.workload()
    curves: dict = {}
    failed: dict = {}
    keys, sources, fams, notes, modules = [], [], [], [], []
    at_plan: dict = {}  # lookup key -> its curve's latency at the plan's point (one graph, one point)
    note_of: dict = {}  # lookup key -> its table note

    def latency(alt, key):
        if key not in at_plan:
            at_plan[key] = _at_plan(curves[key][0], alt, graph, wl)
        return at_plan[key]

    for op in graph.ops:
        lk = lookup_for(op, ctx) if op.cost.terms else Miss("", "no cost")
        if isinstance(lk, tuple):  # implementations of one op: the fastest the tables cover, at the plan's point
            alts = [(alt, alt.key()) for alt in lk]
            for alt, key in alts:
                if key not in curves and key not in failed:
                    got = _resolve(sel, alt, graph, plan, wl)
                    (curves if not isinstance(got, str) else failed)[key] = got
            covered = [(alt, key) for alt, key in alts if key in curves]
            lk = min(covered, key=lambda ak: latency(*ak))[0] if covered else lk[-1]
        modules.append(lk.module if isinstance(lk, Lookup) else "")
        if isinstance(lk, Miss):
            keys.append("")
            fams.append(lk.family)
            notes.append(lk.reason)
            sources.append("fallback" if lk.family else "sol")
            continue
        key = lk.key()
        if key not in curves and key not in failed:
            got = _resolve(sel, lk, graph, plan, wl)
            (curves if not isinstance(got, str) else failed)[key] = got
        keys.append(key)
        fams.append(lk.family)
        if key in curves:
            if key not in note_of:
                cv = curves[key][0]
                note_of[key] = cv.partition.key + (f" ({cv.rule})" if cv.rule else "")
            sources.append("table")
            notes.append(note_of[key])
        else:
            sources.append("fallback")
            notes.append(failed[key])
    if spec.name == "op":
        bad = [(op, n) for op, s, n in zip(graph.ops, sources, notes) if s == "fallback"]
        if bad:
            op, why = bad[0]
            fam = fams[graph.ops.index(op)]
            raise GraphsimError("view", f"op {op.name} ({op.kind}) has no {sel.backend} coverage on {hw.name}: {why}"
                                f" [{len(bad)} uncovered ops; {fam} partitions there: {sel.what_exists(fam)}] — use "
                                "--view hybrid to fall back per op")
    feats = tuple(dict.fromkeys(f for cv, lk in curves.values() for _, c in lk.varying for f in c.features()))
    from .check import family_efficiency

    back = sel.backend
    eff = tuple((f, e) for f in sorted({f for f, src in zip(fams, sources) if src == "fallback" and f})
                if (e := family_efficiency(store, hw.name, f, back.framework, back.version)) is not None)
    return BoundView(spec, str(sel.backend), hw.name, tuple(keys), tuple(sources), tuple(fams), tuple(notes),
                     curves, feats, tuple(modules), eff)


def _resolve(sel, lk: Lookup, graph, plan, wl):
    """The curve for a lookup: among the partitions the selection admits, those that cover the op's fixed
    shape; of those, the fastest at the plan's own point (the runtime's autotuner picks the best kernel)."""
    cands = sel.candidates(lk.family, lk.op, dict(lk.where))
    if not cands:
        want = ", ".join(f"{k}={'|'.join(v)}" for k, v in lk.where)
        return f"no {lk.family}/{lk.op} partition" + (f" with {want}" if want else "")
    fixed = dict(lk.fixed)
    names = tuple(c for c, _ in lk.varying)
    built, why = [], []
    memo = sel.store.curves
    for part, rule in cands:
        key = (id(part), rule, tuple(sorted(fixed.items())), names)
        if key not in memo:
            memo[key] = build_curve(part, rule, fixed, names)
        cv = memo[key]
        (why if isinstance(cv, str) else built).append(cv if not isinstance(cv, str) else f"{part.key}: {cv}")
    if not built:
        return "; ".join(why[:3])
    if len(built) == 1:
        return built[0], lk
    best = min(built, key=lambda cv: (_at_plan(cv, lk, graph, wl), cv.partition.key))
    return best, lk


def _at_plan(cv, lk: Lookup, graph, wl) -> float:
    """A curve's latency at the plan's own workload point."""
    from graphsim.lowering.features import feature_column

    a = wl.arrays()

    def col(f):
        return feature_column(f, graph.token_set_map, wl.kinds, a, np)

    return float(eval_curve(cv, [c.value(col, np) for _, c in lk.varying], np)[0][0])


__all__ = ["VIEWS", "ViewSpec", "BoundView", "bind", "SOURCE_NAMES", "MEASURED", "INTERPOLATED", "EXTRAPOLATED",
           "FALLBACK", "SOL"]
