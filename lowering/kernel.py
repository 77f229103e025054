"""The evaluation kernel: a sparse roofline over cost classes and a level-scheduled max-plus.

A :class:`Layout` is derived once from a :class:`~graphsim.lowering.program.CostProgram`:

* **Sparse roofline.** Each cost class depends on a handful of features. Per roofline group the nonzero
  (class, feature[, component]) terms become padded slots ``(C, m)``, so a class's group time is a sum of
  ``m`` feature rows times a weight — not a dense ``(P × F)·(F × C)`` product per component. When a group's
  unit times are the same at every point (no hardware axis varies them) its components fold into one weight
  per (class, feature) slot on the host: ``Σ_k coef[f, c, k] · unit_time[k]`` (:func:`fold`).
* **Blocks** (JAX). Classes with the same features per group form a block; blocks merge greedily while the
  padding they add stays small (a merged block carries the union of its features; a class's missing ones
  weigh zero). A block is broadcast products of static feature rows — no gathers, no concatenation — so XLA
  fuses it into one vectorized loop over points. NumPy gathers the slots per class instead.
* **Segment kinds.** Segments (collapsed chains) with the same class counts are one *kind*; their
  durations are computed once (the 43 layers of a two-batch overlap repeat a few kinds).
* **Levels.** Segments are grouped by depth (longest path from a source); a level's starts are the max over
  its predecessors' finishes, kept in a ring of the last R ≤ :data:`RING` levels, plus a side row for each
  finish read further back. JAX runs the levels as one ``lax.scan`` (compile time flat in the DAG's size, a
  level's cost independent of how far edges reach); NumPy loops over them.

Arrays are point-minor (``(rows, P)``): gathers copy contiguous rows. Everything is written once for any array
module; :func:`run` is traced by JAX (inside ``jit``) or run eagerly by NumPy with the same numbers.
"""
from __future__ import annotations

import attrs
import numpy as np

from graphsim.core.ir import COMPONENT_INDEX

from .features import feature_column
from .program import COMPONENT_GROUP, GROUPS, LATENCY, CostProgram
from .xla import apart


@attrs.frozen(eq=False)
class GroupSlots:
    """The terms of one roofline group: per class, ``m`` slots of (feature, component, coefficient) and,
    folded over the group's components, ``m2`` feature slots (their weights come from :func:`fold`)."""

    group: int
    components: tuple  # component indices in this group
    feat: np.ndarray  # (C, m) feature index per (class, slot)
    comp: np.ndarray  # (C, m) component index
    coef: np.ndarray  # (C, m)
    ffeat: np.ndarray  # (C, m2) folded: feature index
    n: np.ndarray  # (C,) used slots per class
    fn: np.ndarray  # (C,) used folded slots per class


@attrs.frozen(eq=False)
class Layout:
    """A program's kernel data: group slots, segment kinds and the level schedule (NumPy arrays)."""

    n_features: int
    n_classes: int
    groups: tuple
    kind_counts: np.ndarray  # (U, C): ops of each class in a segment of each kind
    level_kind: np.ndarray  # (L, W): segment kind at each level slot (U = an empty slot)
    level_preds: np.ndarray  # (L, W, D): rows of the predecessors: ring, then side rows, then none (0)
    level_save: np.ndarray  # (L, W): the side row a slot's finish is also kept in (n_side: none)
    n_side: int  # finishes read more than R levels later (kept in side rows)
    reach: int  # R: the ring holds the last R levels (edges reaching further use side rows)
    width: int  # W
    stage_counts: np.ndarray  # (n_stages, C)
    kind_of_op_counts: np.ndarray  # (n_kinds, C)
    act: np.ndarray  # (F, C) bytes_act coefficients (the workspace)
    totals: np.ndarray  # (F, K) component totals over every op
    order: np.ndarray  # (C,) the program's class id of each kernel class (kernel classes run block by block)
    #: JAX blocks: (lo, hi, {group: features}, {group: ((feature, component), ...)}) over kernel classes
    blocks: tuple = ()
    coef: np.ndarray = None  # (F, C, K) the program's coefficients in kernel class order
    #: ops with alternatives: (class, (its alternatives' classes, ...)) in kernel class ids; the class takes
    #: the least of the durations at each point (:func:`least`)
    alts: tuple = ()

    #: what a traced kernel bakes in (slot patterns, blocks, sparsity of the count matrices, shapes): programs
    #: with equal signatures and features share one compiled kernel (set by :func:`layout`)
    signature: str = ""

    def _signature(self) -> str:
        import hashlib

        h = hashlib.sha1()
        for s in self.groups:
            h.update(repr((s.group, s.components)).encode())
            for a in (s.feat, s.comp, s.ffeat, s.n, s.fn):
                h.update(a.tobytes() + repr(a.shape).encode())
        for a in (self.kind_counts, self.stage_counts, self.kind_of_op_counts, self.act, self.totals):
            h.update((a != 0).tobytes() + repr(a.shape).encode())
        h.update(repr((self.level_kind.shape, self.level_preds.shape, self.reach, self.width, self.n_side)).encode())
        h.update(self.order.tobytes())
        h.update(repr(self.alts).encode())
        h.update(repr([(lo, hi, sorted(fs.items()), sorted(ps.items())) for lo, hi, fs, ps in self.blocks]).encode())
        return h.hexdigest()

    @property
    def n_levels(self) -> int:
        return self.level_kind.shape[0]

    @property
    def chain(self) -> bool:
        """One segment: the forward is the weighted sum of class durations."""
        return self.level_kind.shape == (1, 1)

    def constants(self, dtype) -> dict:
        """The arrays the kernel reads, as arguments (a new program of the same shapes reuses the compiled
        kernel)."""
        d = {"kind_counts": self.kind_counts.astype(dtype), "stage_counts": self.stage_counts.astype(dtype),
             "kind_of_op_counts": self.kind_of_op_counts.astype(dtype), "act": self.act.astype(dtype),
             "totals": self.totals.astype(dtype), "level_kind": self.level_kind, "level_preds": self.level_preds,
             "level_row": (np.arange(self.n_levels, dtype=np.int32) % self.reach) * self.width,
             "level_save": self.level_save}
        for s in self.groups:
            g = s.group
            d[f"g{g}.feat"], d[f"g{g}.comp"], d[f"g{g}.coef"] = s.feat, s.comp, s.coef.astype(dtype)
            d[f"g{g}.ffeat"] = s.ffeat
        if self.alts:  # the coefficients of each op with alternatives and of its alternatives, and its op count
            idx = [c for p, a in self.alts for c in (p, *a)]
            d["alt_coef"] = self.coef[:, idx, :].astype(dtype)
            d["alt_count"] = self.kind_of_op_counts.sum(axis=0)[[p for p, _ in self.alts]].astype(dtype)
        for b, (lo, hi, _, pairs) in enumerate(self.blocks):  # per-point unit times: one weight per (f, k)
            for g, fk in pairs.items():
                f, k = np.array(fk).T
                d[f"b{b}.g{g}"] = self.coef[f[:, None], np.arange(lo, hi)[None, :], k[:, None]].T.astype(dtype)
        return d


#: JAX computes the classes in blocks; a block is one fused loop (XLA compile time grows with the number of
#: blocks, run time with the slots a block carries for its classes). Blocks of equal slot patterns merge while
#: the added slot work stays small, and further while there are more than MAX_BLOCKS.
MAX_BLOCKS, SLOT_BUDGET = 6, 1.5


def _blocks(coef: np.ndarray) -> list[list[int]]:
    """Program classes grouped into blocks: classes with the same features per roofline group first, then
    greedy merges of the pair that adds the fewest padded slots (a merged block carries the union of its
    features per group; a class's missing ones weigh zero) while the total stays within SLOT_BUDGET of the
    unpadded work, or while there are more than MAX_BLOCKS blocks."""
    F, C, _ = coef.shape
    if C == 0:
        return []
    nz = coef != 0.0
    use = np.stack([nz[:, :, COMPONENT_GROUP == g].any(axis=2) for g in range(len(GROUPS))])  # (G, F, C)
    pattern = use.transpose(2, 0, 1).reshape(C, -1)
    masks, inverse = np.unique(pattern, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    members = [list(np.flatnonzero(inverse == u)) for u in range(len(masks))]
    n = np.array([len(m) for m in members], dtype=np.int64)
    cost = n * masks.sum(axis=1)
    alive = np.ones(len(masks), dtype=bool)

    def added(i):  # slots added by merging block i with each block
        row = ((n[i] + n) * (masks[i] | masks).sum(axis=1) - cost[i] - cost).astype(np.float64)
        row[~alive] = np.inf
        row[i] = np.inf
        return row

    delta = np.stack([added(i) for i in range(len(masks))])
    least = max(int(cost.sum()), 1)
    total = least
    while alive.sum() > 1:
        i, j = np.unravel_index(np.argmin(delta), delta.shape)
        d = delta[i, j]
        if alive.sum() <= MAX_BLOCKS and total + d > SLOT_BUDGET * least:
            break
        total += d
        masks[i] |= masks[j]
        n[i] += n[j]
        cost[i] = n[i] * masks[i].sum()
        members[i] = members[i] + members[j]
        alive[j] = False
        delta[j, :] = delta[:, j] = np.inf
        delta[i, :] = delta[:, i] = added(i)
    return sorted(sorted(int(c) for c in members[b]) for b in np.flatnonzero(alive))


def _slots(mask: np.ndarray):
    """Nonzero (class, ...) entries of ``mask`` (C, ...) as per-class padded slot lists: (class, rank, rest...)
    indices and the count per class."""
    idx = np.nonzero(mask)
    c = idx[0]
    count = np.bincount(c, minlength=mask.shape[0])
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    rank = np.arange(len(c)) - start[c]
    return idx, rank, count


def layout(program: CostProgram, kinds: tuple, units: tuple = ()) -> Layout:
    """Derive the kernel's arrays from a program (``kinds``: op kinds, the columns of the kinds output).
    ``units``: lists of program classes a measured view reads together (its lookups' classes per curve group,
    a module's members, a fallback family): each becomes a block of its own, after the others, in the order
    given, so the view reads their SOL rows as one block (no copy) and its rows weigh one slice of columns."""
    nf, C = len(program.features), program.n_classes
    # kernel classes run block by block (see _blocks): each block's classes are contiguous
    own = [list(u) for u in units if u]
    taken = {c for u in own for c in u}
    rest = [c for c in range(C) if c not in taken]
    members = [[rest[i] for i in m] for m in _blocks(program.coef[:nf][:, rest])] + own
    order = np.array([c for m in members for c in m], dtype=np.int64)
    coef = program.coef[:nf][:, order]
    kernel_class = np.argsort(order)  # program class id -> kernel class id
    op_class = kernel_class[program.op_class]
    groups = []
    for g in range(len(GROUPS)):
        comps = tuple(int(k) for k in np.flatnonzero(COMPONENT_GROUP == g))
        sub = coef[:, :, list(comps)].transpose(1, 0, 2)  # (C, F, k)
        if not np.any(sub):
            continue
        (c, f, j), rank, count = _slots(sub != 0.0)  # per class: (feature, component) pairs, feature-major
        m = max(int(count.max()), 1)
        feat, comp, cf = np.zeros((C, m), np.int32), np.zeros((C, m), np.int32), np.zeros((C, m))
        feat[c, rank], comp[c, rank], cf[c, rank] = f, np.asarray(comps)[j], sub[c, f, j]
        (c2, f2), rank2, count2 = _slots((sub != 0.0).any(axis=2))  # per class: features
        m2 = max(int(count2.max()), 1)
        ffeat = np.zeros((C, m2), np.int32)
        ffeat[c2, rank2] = f2
        groups.append(GroupSlots(g, comps, feat, comp, cf, ffeat, count, count2))
    # segment kinds: segments with equal class counts share one duration
    S = program.n_segments
    counts = np.zeros((S, C))
    np.add.at(counts, (program.seg_pairs[:, 1], kernel_class[program.seg_pairs[:, 0]]), program.seg_pairs[:, 2])
    kind_index: dict = {}
    seg_kind = np.array([kind_index.setdefault(counts[s].tobytes(), len(kind_index)) for s in range(S)], dtype=np.int64)
    U = len(kind_index)
    kind_counts = np.zeros((U, C))
    kind_counts[seg_kind] = counts
    # levels: depth = longest path from a source; an edge reaches depth[s] - depth[p] levels back
    depth = np.zeros(S, dtype=np.int64)
    for s, ps in enumerate(program.seg_preds):
        depth[s] = max((depth[p] + 1 for p in ps), default=0)
    L = int(depth.max()) + 1 if S else 1
    by_level = [[] for _ in range(L)]
    slot = np.zeros(S, dtype=np.int64)
    for s in range(S):
        slot[s] = len(by_level[depth[s]])
        by_level[depth[s]].append(s)
    W = max(len(b) for b in by_level) if S else 1
    reach = [int(depth[s] - depth[p]) for s, ps in enumerate(program.seg_preds) for p in ps]
    R = max((r for r in reach if r <= RING), default=1)  # longer edges read side rows
    # a finish read more than R levels later is also kept in a side row of its own until the end
    far = sorted({p for s, ps in enumerate(program.seg_preds) for p in ps if depth[s] - depth[p] > R})
    side = {p: i for i, p in enumerate(far)}
    n_side = len(far)
    none = R * W + n_side  # "no predecessor"
    D = max((len(ps) for ps in program.seg_preds), default=1) or 1
    level_kind = np.full((L, W), U, dtype=np.int32)
    level_preds = np.full((L, W, D), none, dtype=np.int32)
    level_save = np.full((L, W), n_side, dtype=np.int32)  # side row a slot's finish is kept in (n_side: none)
    for lvl, segs in enumerate(by_level):
        for w, s in enumerate(segs):
            level_kind[lvl, w] = seg_kind[s]
            level_save[lvl, w] = side.get(s, n_side)
            for j, p in enumerate(program.seg_preds[s]):
                near = depth[s] - depth[p] <= R
                level_preds[lvl, w, j] = (depth[p] % R) * W + slot[p] if near else R * W + side[p]
    stage_counts = np.zeros((len(program.stages), C))
    np.add.at(stage_counts, (program.stage_of_op, op_class), 1.0)
    kind_col = {k: j for j, k in enumerate(kinds)}
    kind_of_op_counts = np.zeros((len(kinds), C))
    np.add.at(kind_of_op_counts, ([kind_col[op.kind] for op in program.graph.ops], op_class), 1.0)
    per_class = np.bincount(op_class, minlength=C).astype(np.float64)
    blocks, lo = [], 0
    for m in members:
        hi = lo + len(m)
        sub = coef[:, lo:hi] != 0.0  # (F, n, K)
        feats, pairs = {}, {}
        for g in range(len(GROUPS)):
            comps = np.flatnonzero(COMPONENT_GROUP == g)
            f_used = np.flatnonzero(sub[:, :, comps].any(axis=(1, 2)))
            if len(f_used):
                feats[g] = tuple(int(f) for f in f_used)
                pairs[g] = tuple((int(f), int(k)) for f in f_used for k in comps if sub[f, :, k].any())
        blocks.append((lo, hi, feats, pairs))
        lo = hi
    by_primary: dict = {}
    for a, p in zip(program.alt_class.tolist(), program.alt_primary.tolist()):
        by_primary.setdefault(int(kernel_class[p]), []).append(int(kernel_class[a]))
    act = coef[:, :, COMPONENT_INDEX["bytes_act"]].copy()
    # an op's workspace is its own cost's (what memory reads), whichever alternative runs
    act[:, [a for al in by_primary.values() for a in al]] = 0.0
    lay = Layout(nf, C, tuple(groups), kind_counts, level_kind, level_preds, level_save, n_side, R, W, stage_counts,
                 kind_of_op_counts, act, np.einsum("fck,c->fk", coef, per_class), order,
                 tuple(blocks), coef, tuple((p, tuple(a)) for p, a in sorted(by_primary.items())))
    return attrs.evolve(lay, signature=lay._signature())


def feature_rows(features, token_sets, kinds, arrays, xp, P):
    """All features as (F, P)."""
    if not features:
        return xp.zeros((0, P))
    memo: dict = {}
    return xp.stack([xp.broadcast_to(feature_column(f, token_sets, kinds, arrays, xp, memo), (P,)) for f in features],
                    axis=0)


def fold(lay: Layout, ut0: np.ndarray, dtype) -> dict:
    """Per group whose unit times are the same at every point: its slot weights with them folded in,
    ``Σ_k coef[f, c, k] · ut0[k]`` (C, m2) — computed on the host, an argument of the kernel."""
    out = {}
    with np.errstate(invalid="ignore"):  # a zero coefficient is no term, even where a rate is zero (ut = inf)
        for s in lay.groups:
            k = list(s.components)
            sub = lay.coef[:, :, k]
            w = np.where(sub != 0.0, sub * ut0[k], 0.0).sum(axis=2)  # (F, C)
            used = np.arange(s.ffeat.shape[1])[None, :] < s.fn[:, None]
            out[f"g{s.group}"] = np.where(used, w[s.ffeat, np.arange(lay.n_classes)[:, None]], 0.0).astype(dtype)
            for b, (lo, hi, feats, _) in enumerate(lay.blocks):  # a block's union features (zero where unused)
                if s.group in feats:
                    out[f"b{b}.g{s.group}"] = w[list(feats[s.group]), lo:hi].T.astype(dtype)
    return out


def class_durations(lay: Layout, consts: dict, feats, ut, ut0, overhead, varying: tuple, xp):
    """(C, P) SOL seconds per class op: per group Σ slots feature·coefficient·unit time, the max over the
    concurrent groups, plus latency and overhead. ``ut`` (K, P): unit times per point (read for the groups
    whose unit times vary); ``ut0``: :func:`fold`'s weights for the others; ``varying[k]``: unit time k
    differs between points."""
    P = feats.shape[1]
    parts = {}
    for s in lay.groups:
        g = s.group
        if any(varying[k] for k in s.components):
            f, k, w = consts[f"g{g}.feat"], consts[f"g{g}.comp"], consts[f"g{g}.coef"]
            terms = feats[f] * ut[k] * w[:, :, None]  # (C, m, P)
        else:
            terms = feats[consts[f"g{g}.ffeat"]] * ut0[f"g{g}"][:, :, None]  # weights with unit times folded
        parts[g] = xp.sum(terms, axis=1)
    roof = None
    for g in range(LATENCY):
        if g in parts:
            roof = parts[g] if roof is None else xp.maximum(roof, parts[g])
    cls = xp.zeros((lay.n_classes, P), dtype=feats.dtype) if roof is None else roof
    if LATENCY in parts:
        cls = cls + parts[LATENCY]
    return cls + overhead[None, :]


def class_blocks(lay: Layout, consts: dict, feats, ut, ut0, overhead, varying: tuple, xp):
    """:func:`class_durations` for JAX, block by block (:data:`MAX_BLOCKS`): a block's classes share their
    feature rows per group, so the block is a sum of static feature rows times per-class weights (broadcast)
    — one fused loop over points, no gathers. Returns the blocks, ``(n_b, P)`` each, in kernel class order
    (never concatenated in the kernel: a concatenation fuses into one loop that branches per element and
    does not vectorize)."""
    P = feats.shape[1]
    out = []
    for b, (lo, hi, fs, pairs) in enumerate(lay.blocks):
        parts = {}
        for g in fs:
            if any(varying[k] for k in next(s for s in lay.groups if s.group == g).components):
                w = consts[f"b{b}.g{g}"]
                terms = [feats[f][None, :] * ut[k][None, :] * w[:, j][:, None] for j, (f, k) in enumerate(pairs[g])]
            else:
                w = ut0[f"b{b}.g{g}"]
                terms = [feats[f][None, :] * w[:, j][:, None] for j, f in enumerate(fs[g])]
            parts[g] = sum(terms[1:], terms[0])
        roof = None
        for g in range(LATENCY):
            if g in parts:
                roof = parts[g] if roof is None else xp.maximum(roof, parts[g])
        d = xp.zeros((hi - lo, P), dtype=feats.dtype) if roof is None else roof
        if LATENCY in parts:
            d = d + parts[LATENCY]
        out.append(d + overhead[None, :])
    return out


#: the ring holds at most this many levels; an edge reaching further back reads a side row
RING = 4


def schedule(lay: Layout, consts: dict, kd, xp, scan=None):
    """Forward seconds (P,) from segment-kind durations ``kd`` (U, P): the max-plus over levels. The last R
    levels' finishes live in a ring of R·W rows (level l writes rows (l mod R)·W …); a finish read further
    back is also kept in a side row of its own. A level costs the same however far an edge reaches.
    ``scan``: ``lax.scan`` (JAX: rows read by dynamic slices, written in place) or None (NumPy: a loop)."""
    if lay.chain:
        return kd[0]
    P = kd.shape[1]
    W, D, RW, NS = lay.width, lay.level_preds.shape[2], lay.reach * lay.width, lay.n_side
    xs = (consts["level_kind"], consts["level_preds"], consts["level_row"], consts["level_save"])
    kd = xp.concatenate([kd, xp.zeros((1, P), dtype=kd.dtype)])  # row U: an empty level slot
    if scan is None:
        rows = xp.zeros((RW + NS + 2, P), dtype=kd.dtype)  # ring, side rows, a scratch row, "none" (0)
        fmax = xp.zeros(P, dtype=kd.dtype)
        none = RW + NS
        for kind, preds, row, save in zip(*xs):
            fin = xp.max(rows[xp.where(preds == none, RW + NS + 1, preds)], axis=1) + kd[kind]  # (W, P)
            rows[row: row + W] = fin
            rows[RW + save] = fin  # (a slot with no side row writes the scratch row)
            fmax = xp.maximum(fmax, xp.max(fin, axis=0))
        return fmax
    from jax import lax

    def pred(ring, side, j):  # the finish in row j: ring, side, or none (0)
        near = lax.dynamic_index_in_dim(ring, xp.minimum(j, RW - 1), keepdims=False)
        if not NS:
            return xp.where(j < RW, near, 0.0)
        far = lax.dynamic_index_in_dim(side, xp.clip(j - RW, 0, NS - 1), keepdims=False)
        return xp.where(j < RW, near, xp.where(j < RW + NS, far, 0.0))

    def step(carry, x):
        ring, side, fmax = carry
        kind, preds, row, save = x
        fins = []
        for w in range(W):
            start = pred(ring, side, preds[w, 0])
            for d in range(1, D):
                start = xp.maximum(start, pred(ring, side, preds[w, d]))
            fins.append(start + lax.dynamic_index_in_dim(kd, kind[w], keepdims=False))
        top = fins[0]
        for f in fins[1:]:
            top = xp.maximum(top, f)
        fin = xp.stack(fins)
        zero = xp.zeros((), row.dtype)
        ring = fin if lay.reach == 1 else lax.dynamic_update_slice(ring, fin, (row, zero))
        if NS:
            for w in range(W):  # (side row NS is a scratch row for slots that keep nothing)
                side = lax.dynamic_update_slice(side, fins[w][None, :], (save[w], zero))
        return (ring, side, xp.maximum(fmax, top)), None

    carry = (xp.zeros((RW, P), dtype=kd.dtype), xp.zeros((NS + 1, P), dtype=kd.dtype), xp.zeros(P, dtype=kd.dtype))
    carry, _ = scan(step, carry, xs)
    return carry[2]


def run(lay: Layout, consts: dict, features, token_sets, kinds, arrays, ut, ut0, overhead, varying, outputs,
        xp, scan=None, view=None, dtype=np.float64):
    """The kernel's outputs (point-major, like the reference): ``forward`` (P,), ``stages``, ``kinds``,
    ``classes`` (P, n; program class order), ``workspace`` (P,), ``components`` (P, K). Features are computed
    in the arrays' precision and then cast to ``dtype``. JAX (``scan``) keeps the SOL classes in blocks (a
    measured view's rows replace their classes in the products); NumPy uses one (C, P) array."""
    P = overhead.shape[0]
    feats = feature_rows(features, token_sets, kinds, arrays, xp, P).astype(dtype)
    overhead = overhead.astype(dtype)
    # what the kernel reads from the class durations: products with count matrices (segment kinds, stages, op
    # kinds), stacked so that JAX forms one matrix product per block (products compile fast; XLA's reductions
    # over classes do not)
    wanted = [("kind", consts["kind_counts"])] + [(n, consts[m]) for n, m in (("stages", "stage_counts"),
                                                  ("kinds", "kind_of_op_counts")) if n in outputs]
    M = xp.concatenate([m for _, m in wanted])
    if scan is not None:
        from jax import lax

        # features once, as an array: without the barrier XLA recomputes them inside every block's loop
        feats = lax.optimization_barrier(feats)
        blocks = class_blocks(lay, consts, feats, ut, ut0, overhead, varying, xp)
        starts = [lo for lo, _, _, _ in lay.blocks]

        def row(c):  # (static indices: slices of one block)
            b = int(np.searchsorted(starts, c, side="right")) - 1
            return blocks[b][c - starts[b]]

        alt_rows = [[row(c) for c in (p, *a)] for p, a in lay.alts]
        least_rows = {p: _least(r, xp) for (p, _), r in zip(lay.alts, alt_rows)}
        # a measured view: its rows replace their classes' in the products (the SOL blocks stay whole — never
        # concatenated: a concatenation fuses into a loop that does not vectorize — and the replaced classes'
        # columns of the count matrices weigh zero there)
        whole = {(lo, hi): b for b, (lo, hi, _, _) in enumerate(lay.blocks)}

        def sol_rows(ks):  # a block of its own (the layout's units): the block itself; else its classes' rows
            b = whole.get((ks[0], ks[-1] + 1)) if len(ks) else None
            if b is None or list(ks) != list(range(ks[0], ks[-1] + 1)):
                return xp.stack([least_rows[c] if c in least_rows else row(c) for c in ks])
            out = blocks[b]
            for c in ks:  # an op with alternatives: its least (a row written in place)
                if c in least_rows:
                    out = out.at[c - ks[0]].set(least_rows[c])
            return out

        rep, V = _view_rows(lay, view, sol_rows, features, feats, token_sets, kinds, arrays, xp, dtype)
        gone = set(rep)
        Mk = M
        if rep:  # the replaced classes weigh zero in the SOL products (a block wholly replaced is left out)
            keep = np.ones(M.shape[1], dtype=dtype)
            keep[rep] = 0.0
            Mk = M * keep[None, :]
        parts = [(M if not gone & set(range(lo, hi)) else Mk)[:, lo:hi] @ b
                 for (lo, hi, _, _), b in zip(lay.blocks, blocks) if not set(range(lo, hi)) <= gone]
        prods = sum(parts[1:], parts[0]) if parts else xp.zeros((M.shape[0], P), dtype=dtype)
        if lay.alts:  # the ops with alternatives: their rows' least, as a correction of the products
            prim = np.array([p for p, _ in lay.alts])
            kept = [(p, r) for p, r in zip(prim, alt_rows) if p not in gone]  # (a replaced class weighs zero)
            if kept:
                d = xp.stack([least_rows[p] - r[0] for p, r in kept])
                prods = prods + M[:, np.array([p for p, _ in kept])] @ d
        if rep:  # the view's rows, each block computed on its own, then one product with their columns
            Vall = apart(lambda _: xp.concatenate(V) if len(V) > 1 else V[0], V[0][0], xp)
            cols = slice(rep[0], rep[-1] + 1) if rep == list(range(rep[0], rep[-1] + 1)) else np.asarray(rep)
            prods = prods + M[:, cols] @ Vall
        cls = None
        if "classes" in outputs:
            cls = xp.concatenate(blocks) if blocks else xp.zeros((0, P), dtype=dtype)
            if lay.alts:
                cls = cls.at[prim].set(xp.stack([least_rows[p] for p in prim]))
            if rep:
                cls = cls.at[np.asarray(rep)].set(xp.concatenate(V))
    else:
        raw, cls = _class_array(lay, consts, feats, ut, ut0, overhead, varying, arrays, token_sets, kinds, view, xp,
                                dtype, features)
        alt_rows = [[raw[c] for c in (p, *a)] for p, a in lay.alts]
        prods = M @ cls
    rows, at = {}, 0
    for name, m in wanted:
        rows[name], at = prods[at: at + m.shape[0]], at + m.shape[0]
    res = {"forward": schedule(lay, consts, rows["kind"], xp, scan)}
    if "stages" in outputs:
        res["stages"] = rows["stages"].T
    if "kinds" in outputs:
        res["kinds"] = rows["kinds"].T
    if "classes" in outputs:
        res["classes"] = cls.T[:, np.argsort(lay.order)]
    if "workspace" in outputs:
        res["workspace"] = xp.max(consts["act"].T @ feats, axis=0) if lay.n_classes else xp.zeros(P, dtype=dtype)
    if "components" in outputs:
        comp = consts["totals"].T @ feats
        if lay.alts:  # each op with alternatives counts the components of the one that ran
            comp = comp + _chosen_components(lay, consts, feats, alt_rows, xp)
        res["components"] = comp.T
    return {k: res[k] for k in outputs}


def _least(rows: list, xp):
    out = rows[0]
    for r in rows[1:]:
        out = xp.minimum(out, r)
    return out


def least(lay: Layout, cls, xp):
    """(C, P) class durations with each op's class at the least of its own and its alternatives' rows."""
    if not lay.alts:
        return cls
    prim = np.array([p for p, _ in lay.alts])
    best = xp.stack([_least([cls[c] for c in (p, *a)], xp) for p, a in lay.alts])
    if hasattr(cls, "at"):
        return cls.at[prim].set(best)
    out = cls.copy()
    out[prim] = best
    return out


def _chosen_components(lay: Layout, consts: dict, feats, rows: list, xp):
    """(K, P): per op with alternatives, (its alternative that ran at each point - its first) x its op count;
    the first of equal durations runs (as ``np.argmin`` picks)."""
    coef, count = consts["alt_coef"], consts["alt_count"]
    out, j = 0.0, 0
    for g, r in enumerate(rows):
        comps = [coef[:, j + i, :].T @ feats for i in range(len(r))]  # (K, P) each
        j += len(r)
        d, chosen = r[0], comps[0]
        for ri, ci in zip(r[1:], comps[1:]):
            better = ri < d
            d = xp.where(better, ri, d)
            chosen = xp.where(better[None, :], ci, chosen)
        out = out + count[g] * (chosen - comps[0])
    return out


def _class_array(lay, consts, feats, ut, ut0, overhead, varying, arrays, token_sets, kinds, view, xp, dtype,
                 features=()):
    """(C, P) class durations as one array (NumPy): the SOL roofline (each op at its fastest alternative), then
    a measured view's tables. Returns the roofline before the alternatives' least too."""
    raw = class_durations(lay, consts, feats, ut, ut0, overhead, varying, xp)
    cls = least(lay, raw, xp)
    rep, V = _view_rows(lay, view, lambda ks: cls[np.asarray(ks, dtype=np.int64)], features, feats, token_sets, kinds,
                        arrays, xp, dtype)
    if rep:
        cls = _set_rows(cls, np.asarray(rep), np.concatenate(V))
    return raw, cls


def _view_rows(lay, view, sol_rows, features, feats, token_sets, kinds, arrays, xp, dtype):
    """A measured view's replaced classes (kernel ids) and their durations as row blocks (concatenated: (n, P)),
    from the SOL rows of kernel classes ``sol_rows(kernel classes)`` -> (n, P); ([], []) without a view or when
    it replaces nothing."""
    if view is None:
        return [], []
    kc = np.argsort(lay.order)  # program class -> kernel class (the view indexes program classes)
    rep, V = view.replace(lambda cs: sol_rows([int(k) for k in kc[np.asarray(cs, dtype=np.int64)]]),
                          _view_columns(view, features, feats, token_sets, kinds, arrays, xp, dtype), xp)
    return ([int(k) for k in kc[rep]], V) if rep else ([], [])


def _view_columns(view, features, feats, token_sets, kinds, arrays, xp, dtype):
    """A measured view's features as rows (P,): the kernel's own rows where it has them, the others computed
    once (in the arrays' precision, then cast like the kernel's)."""
    have = {f: j for j, f in enumerate(features)}
    memo: dict = {}
    extra = {}
    for f in view.features:
        if f not in have:
            extra[f] = xp.broadcast_to(feature_column(f, token_sets, kinds, arrays, xp, memo),
                                       (feats.shape[1],)).astype(dtype)
    return lambda f: feats[have[f]] if f in have else extra[f]


def _set_rows(cls, rows, V):
    out = cls.copy()
    out[rows] = V
    return out
