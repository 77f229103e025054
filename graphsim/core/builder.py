"""A small API to describe a forward pass by hand: stages, GEMMs, attention, elementwise ops, caches,
collectives and dependencies. The shipped model builders use exactly this API.

Ops are appended in program order. Unless ``deps`` is given, an op depends on the last op of the compute
stream (data flows down the layer); a comm or host-copy op depends on the last compute op, and later compute
ops do *not* wait for it unless told (``deps=[...]`` or :meth:`GraphBuilder.depends`) — that is overlap.
A branch that reads an earlier value (``deps=[that op]``) leaves the chain; :meth:`GraphBuilder.join` makes
the next compute op wait for the other branch too (e.g. the shared expert beside the routed experts): the
graph's edges are then the model's dataflow, and communication on one branch overlaps the other's compute.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Sequence

from .errors import require
from .ir import (
    CommSpec,
    Cost,
    Edge,
    Feature,
    Graph,
    Op,
    StorageFormat,
    Tensor,
    TokenSet,
    fmt,
    intern_cost,
    split_params,
    wider,
)


class GraphBuilder:
    """Accumulates ops, edges, tensors and token sets; :meth:`build` returns a validated :class:`Graph`."""

    def __init__(self, name: str, *, meta: dict | None = None):
        self.name = name
        self.meta = dict(meta or {})
        self._ops: list[Op] = []
        self._edges: list[Edge] = []
        self._tensors: dict[str, Tensor] = {}
        self._token_sets: dict[str, TokenSet] = {}
        self._stages: list[str] = []
        self._stage: str | None = None
        self._layer: int | None = None
        self._prefix = ""
        self._last: dict[str, str] = {}
        self._joins: list[str] = []
        self._costs: dict[Cost, Cost] = {}

    # ---- context ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def stage(self, name: str):
        """Ops created inside belong to stage ``name`` (stages are ordered by first use)."""
        self.declare_stage(name)
        prev, self._stage = self._stage, name
        try:
            yield
        finally:
            self._stage = prev

    def declare_stage(self, name: str) -> None:
        """Put stage ``name`` in the stage order now (before the stages of ops created earlier in program
        order but listed later), without creating ops in it yet."""
        if name not in self._stages:
            self._stages.append(name)

    @contextlib.contextmanager
    def layer(self, index: int | None, prefix: str | None = None):
        """Ops created inside belong to ``layer`` and get names prefixed ``layers.{index}.``."""
        prev = (self._layer, self._prefix)
        self._layer = index
        self._prefix = prefix if prefix is not None else (f"layers.{index}." if index is not None else "")
        try:
            yield
        finally:
            self._layer, self._prefix = prev

    @property
    def last(self) -> str | None:
        """The last op of the compute stream."""
        return self._last.get("compute")

    def last_on(self, stream: str) -> str | None:
        return self._last.get(stream)

    # ---- declarations ----------------------------------------------------------------------------
    def token_set(self, name: str, prefill: str = "all", decode: str = "all") -> str:
        ts = TokenSet(name, prefill, decode)
        old = self._token_sets.get(name)
        require(old is None or old == ts, f"token_set[{name}]", "declared twice with different rules")
        self._token_sets[name] = ts
        return name

    def tensor(self, name: str, role: str, format: str | StorageFormat, *, elems: int = 0,
               elems_per_token: int = 0, module: str = "", group: str = "trunk") -> str:
        t = Tensor(name, role, format, int(elems), int(elems_per_token), module or name, group)
        old = self._tensors.get(name)
        require(old is None or old == t, f"tensor[{name}]", "declared twice with different shapes or formats")
        self._tensors[name] = t
        return name

    def declare(self, t: Tensor) -> str:
        """Declare a prepared tensor (what :meth:`tensor` would make of its fields)."""
        old = self._tensors.get(t.name)
        require(old is None or old == t, f"tensor[{t.name}]", "declared twice with different shapes or formats")
        self._tensors[t.name] = t
        return t.name

    def weight(self, name: str, elems: int, format: str | StorageFormat, *, group: str = "trunk",
               module: str = "") -> str:
        """A resident weight (counted once in the inventory however many ops read it)."""
        return self.tensor(self._prefix + name, "weight", format, elems=elems, module=module, group=group)

    def depends(self, src: str, dst: str, kind: str = "data") -> None:
        self._edges.append(Edge(src, dst, kind))

    def join(self, *names: str) -> None:
        """The next compute op created with its default dependency also consumes ``names``' outputs: branches
        that left the chain rejoin the dataflow there (the sum of the routed and the shared experts)."""
        self._joins.extend(n for n in names if n and n not in self._joins)

    # ---- ops --------------------------------------------------------------------------------------
    def op(self, name: str, kind: str, cost: Cost = Cost(), *, stream: str = "compute", token_set: str = "",
           precision: str = "", split: Iterable[str] = (), reads: Sequence[str] = (), writes: Sequence[str] = (),
           comm: Sequence[CommSpec] = (), params: dict | None = None, formula: str = "",
           deps: Sequence[str] | None = None, dep_kind: str = "data", stage: str | None = None) -> str:
        """Append an op; returns its (prefixed) name."""
        st = stage or self._stage
        require(st is not None, f"op[{name}].stage", "create ops inside `with builder.stage(name):`")
        if st not in self._stages:
            self._stages.append(st)
        full = self._prefix + name
        info, notes = split_params(params)
        cost = intern_cost(cost, self._costs)  # repeated layers share their cost objects
        o = Op(full, kind, st, cost, self._layer, stream, token_set, precision, frozenset(split),
               tuple(reads), tuple(writes), tuple(comm), notes, formula, info=info)
        if deps is None:
            d = self._last.get("compute")
            deps = (d,) if d else ()
            if stream == "compute" and self._joins:
                deps, self._joins = (*deps, *(j for j in self._joins if j != d)), []
        self._ops.append(o)
        for d in deps:
            if d is not None:
                self._edges.append(Edge(d, full, dep_kind))
        self._last[stream] = full
        return full

    def gemm(self, name: str, token_set: str, k: int, n: int, *, weight_format: str | StorageFormat | None = None,
             weight: str | None = None, copies: int = 1, act_in: str = "bf16", act_out: str = "bf16",
             precision: str | None = None, group: str = "trunk", **kw) -> str:
        """Y[T, n] = X[T, k] · W[k, n]: 2kn FLOPs per token, weights read once, activations in and out.

        ``copies`` > 1 is a block-diagonal or per-head GEMM: ``copies`` independent k×n products per token
        (each on its own slice of the input), so FLOPs, weights and activations are all ``copies`` times one
        product's. A new weight tensor is declared (``copies`` × k × n elements) unless ``weight`` names an
        existing one.
        """
        if weight is None:
            require(weight_format is not None, f"gemm[{name}]", "give weight_format or an existing weight")
            weight = self.weight(name, copies * k * n, weight_format, group=group)
        wt = self._tensors[weight]
        prec = precision or wider(fmt(act_in).compute, wt.format.compute)
        t = Feature("tokens", token_set)
        # weights are read once per forward by an op that runs (any request has positions in its token set)
        cost = (Cost.of(Feature("active", token_set), bytes_weight=wt.format.nbytes(k * n * copies))
                + Cost.of(t, **{f"flops_{prec}": 2.0 * k * n * copies,
                                "bytes_act": copies * (fmt(act_in).nbytes(k) + fmt(act_out).nbytes(n))}))
        times = f"{copies}·" if copies > 1 else ""
        shape = f"{copies} x {k}x{n}" if copies > 1 else f"{k}x{n}"
        return self.op(name, kw.pop("kind", "gemm"), cost, token_set=token_set, precision=prec, reads=(weight,),
                       params={"k": k, "n": n, "copies": copies, "weight_format": wt.format.name,
                               **kw.pop("params", {})},
                       formula=f"2·{times}{k}·{n}·T flops; W {shape} {wt.format.name} read once", **kw)

    def moe_experts(self, name: str, token_set: str, *, experts: int, top_k: int, hidden: int, inter: int,
                    weight_format: str | StorageFormat | None = None, weight: str | tuple | None = None,
                    act_in: str = "fp8", act_out: str = "bf16", group: str = "trunk", matrices: int = 3,
                    exps_per_elem: float = 1.0, slots: int = 0, **kw) -> str:
        """Routed SwiGLU experts (w1, w3: hidden→inter; w2: inter→hidden; ``matrices=2`` for a non-gated
        expert such as ReLU²). FLOPs follow token-expert pairs; weight bytes follow the *expected distinct
        experts touched*, E·(1-(1-k/E)^T); activations as grouped GEMMs with a fused activation epilogue move
        them. ``slots`` > ``experts``: redundant copies held for EP load balancing (memory, not routing)."""
        per_expert = matrices * hidden * inter
        slots = slots or experts
        if weight is None:
            require(weight_format is not None, f"moe_experts[{name}]", "give weight_format or an existing weight")
            weight = self.weight(name, slots * per_expert, weight_format, group=group)
        names = (weight,) if isinstance(weight, str) else tuple(weight)  # one stacked tensor or (w1, w3, w2)
        tensors = [self._tensors[n] for n in names]
        require(sum(t.elems for t in tensors) == slots * per_expert, f"moe_experts[{name}]",
                f"expert weights must hold slots·{matrices}·hidden·inter elements")
        f = tensors[0].format
        prec = wider(fmt(act_in).compute, f.compute)  # FP8 activations x FP4 experts run at the FP8 rate
        t = Feature("tokens", token_set)
        touched = Feature("experts_touched", token_set, (experts, top_k))
        # grouped GEMMs with a fused SwiGLU epilogue: read the dispatched tokens, write the quantized SwiGLU
        # output once and read it back in w2, write the expert outputs; SiLU = one exponential per element
        act = top_k * (fmt(act_in).nbytes(hidden) + 2 * fmt(act_in).nbytes(inter) + fmt(act_out).nbytes(hidden))
        cost = (Cost.of(touched, bytes_weight=sum(x.nbytes for x in tensors) / slots)
                + Cost.of(t, **{f"flops_{prec}": 2.0 * per_expert * top_k, "bytes_act": act,
                                "exps": exps_per_elem * top_k * inter}))
        return self.op(name, "moe_experts", cost, token_set=token_set, precision=prec, reads=names,
                       params={"experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter, "slots": slots,
                               "weight_format": f.name, **kw.pop("params", {})},
                       formula=f"2·{matrices}·{hidden}·{inter}·{top_k}·T flops, {exps_per_elem * top_k * inter:g}·T "
                               "activation exps; weights of "
                               "E(1-(1-k/E)^T) experts", **kw)

    def elementwise(self, name: str, token_set: str, elems: int, *, bytes_in: float, bytes_out: float,
                    flops_per_elem: float = 1.0, precision: str = "fp32", kind: str = "elementwise",
                    exps: float = 0.0, **kw) -> str:
        """A memory-bound per-token op over ``elems`` elements per token (norms, activations, quantization);
        ``exps`` special-function ops per token (exp in SiLU/sigmoid/softmax, tanh in GELU) go to the SFU."""
        t = Feature("tokens", token_set)
        cost = Cost.of(t, **{f"flops_{precision}": flops_per_elem * elems,
                             "bytes_act": elems * (bytes_in + bytes_out), "exps": exps})
        params = {"elems": elems, "bytes_in": bytes_in, "bytes_out": bytes_out, **kw.pop("params", {})}
        sfu = f"; {exps:g} exps" if exps else ""
        return self.op(name, kind, cost, token_set=token_set, precision=precision, params=params,
                       formula=f"{elems}·({bytes_in:g}+{bytes_out:g}) B per token{sfu}", **kw)

    def attention(self, name: str, token_set: str, *, pairs: Feature, flops_per_pair: float, heads: int,
                  kv_read: Feature | None = None, kv_bytes_per_entry: float = 0.0, q_bytes_per_token: float = 0.0,
                  precision: str = "bf16", sinks: bool = False, **kw) -> str:
        """Attention core: ``flops_per_pair`` per (query, key) pair in ``pairs`` at ``precision`` (the QK^T and
        PV matrix products), and the softmax's exponentials: one per score it normalises, i.e. ``heads`` per
        pair (plus one per query and head for an attention sink's logit), on the SFU; the cache is read as
        ``kv_read`` entries of ``kv_bytes_per_entry`` (once per request, or per selection for sparse reads)."""
        t = Feature("tokens", token_set)
        cost = Cost.of(pairs, **{f"flops_{precision}": flops_per_pair, "exps": float(heads)})
        cost += Cost.of(t, bytes_act=q_bytes_per_token, exps=float(heads) if sinks else 0.0)
        if kv_read is not None:
            cost += Cost.of(kv_read, bytes_kv=kv_bytes_per_entry)
        params = {"heads": heads, "precision": precision, **kw.pop("params", {})}
        return self.op(name, kw.pop("kind", "attention"), cost, token_set=token_set, precision=precision,
                       params=params, formula=f"{flops_per_pair:g} {precision} flops and {heads} exps per pair of "
                       f"{pairs}" + (f" + {heads} sink exps per query" if sinks else ""), **kw)

    def cache_write(self, name: str, token_set: str, tensor: str, bytes_per_token: float, *,
                    per: Feature | None = None, **kw) -> str:
        """Write cache entries (``per`` defaults to one entry per token of the set)."""
        feat = per or Feature("tokens", token_set)
        return self.op(name, "cache_write", Cost.of(feat, bytes_kv=bytes_per_token), token_set=token_set,
                       writes=(tensor,), formula=f"{bytes_per_token:g} B per {feat}", **kw)

    def cache_read(self, name: str, token_set: str, tensor: str, bytes_per_entry: float, *,
                   per: Feature, **kw) -> str:
        return self.op(name, "cache_read", Cost.of(per, bytes_kv=bytes_per_entry), token_set=token_set,
                       reads=(tensor,), formula=f"{bytes_per_entry:g} B per {per}", **kw)

    def collective(self, name: str, collective: str, group: str, payload: Cost, *, algorithm: str = "auto",
                   deps: Sequence[str] | None = None, **kw) -> str:
        """An explicit collective on the comm stream; the sharding pass costs it by algorithm and link.
        It runs alongside later compute unless something depends on it."""
        if deps is None:
            deps = (self.last,) if self.last else ()
        spec = CommSpec(collective, group, payload, "after", algorithm)
        return self.op(name, "collective", Cost(), stream="comm", comm=(spec,), deps=deps,
                       params={"collective": collective, "group": group, "algorithm": algorithm}, **kw)

    def host_copy(self, name: str, token_set: str, *, bytes: Cost, deps: Sequence[str] | None = None, **kw) -> str:
        """A host→device copy over the C2C/PCIe link on the copy stream (e.g. an Engram prefetch)."""
        cost = Cost(tuple(("bytes_c2c", f, v) for c, f, v in bytes.terms))
        return self.op(name, "host_copy", cost, stream="host_copy", token_set=token_set,
                       deps=deps if deps is not None else (), **kw)

    # ---- result -----------------------------------------------------------------------------------
    def build(self) -> Graph:
        return Graph(self.name, tuple(self._ops), tuple(self._edges), tuple(self._tensors.values()),
                     tuple(self._token_sets.values()), tuple(self._stages), self.meta).validate()
