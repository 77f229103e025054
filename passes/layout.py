"""Token layouts across a TP group: where a row-parallel output is reduce-scattered instead of all-reduced,
which ops then run on 1/tp of the tokens, and where an all-gather restores the replicated layout. The
sharding pass (:func:`graphsim.passes.sharding.apply_mapping`) applies what :func:`plan_layout` decides.

Two rules share this:

* **MoE blocks whose experts span the TP group** (tp > 1, EP over the whole stage: moe_tp = 1). The data
  moves once, in one of two valid ways, and SOL takes the one with less link time per token:

  - ``replicated`` (dp = cp = 1 only: every EP rank already holds every token): the attention output is
    all-reduced as before; each rank runs its experts on the tokens routed to them (no dispatch: they are
    there) and the routed partial sums ride the shared expert's all-reduce — two all-reduces, no
    all-to-all (TensorRT-LLM's TP MoE);
  - ``scatter``: the attention output is reduce-scattered, so each rank owns 1/tp of its TP group's tokens;
    the rest of the layer runs on them (norms, router, dispatch from them, combine back to them, the shared
    expert with its weights replicated over the group), and one all-gather of the residual state ends the
    layer — reduce-scatter into dispatch, combine into all-gather (SGLang with DeepEP).

* **Sequence parallelism** (``policies.sp == "on"``): after every remaining TP all-reduce of a row-parallel
  output, the run of norm / mHC / elementwise ops that follows runs on 1/tp of the tokens (reduce-scatter
  instead of all-reduce), and an all-gather of the run's output feeds the next op.
"""
from __future__ import annotations

import functools

import attrs

from graphsim.core.ir import Cost, CommSpec, Feature, Graph, Op

from .links import _group_size, _payload_divisor, group_stride, link_cost, members_in_domain

#: Ops sequence parallelism shards by token: per-token, weights (if any) replicated across TP.
SP_KINDS = ("norm", "mhc", "elementwise", "quant")
MOE_OUT = "moe_out"  # the merge key of MoE output reductions (graphsim.models.base.MOE_OUT)


@attrs.frozen
class OpLayout:
    """How one op changes: replacement CommSpecs (None keeps the op's), the extra token divisor of its
    per-token work, whether its TP-split weights become replicated, and collectives added around it."""

    comm: tuple | None = None
    token_div: int = 1
    replicate_weights: bool = False
    before: tuple = ()
    after: tuple = ()


@attrs.frozen
class Layout:
    ops: dict  #: op name -> OpLayout
    moe: dict  #: layer -> "replicated" | "scatter"

    def of(self, name: str) -> OpLayout:
        return self.ops.get(name, _KEEP)


_KEEP = OpLayout()
EMPTY = Layout({}, {})


def _tp_reduce(op: Op) -> CommSpec | None:
    return next((s for s in op.comm if s.collective == "all_reduce" and s.group == "tp" and s.merge != MOE_OUT), None)


def _per_token(cost: Cost) -> float:
    return sum(v for _, f, v in cost.terms if f.kind == "tokens")


def _link_time(spec: CommSpec, group: str, mapping, domain: int, weights: dict, top_k: int) -> float:
    """Link seconds (up to the NVLink rate) per token of one collective, for comparing layouts."""
    return _link_time_of(spec, group, mapping, domain, tuple(sorted(weights.items())), top_k)


@functools.lru_cache(maxsize=4096)  # a pure function of values; every MoE layer asks the same questions
def _link_time_of(spec: CommSpec, group: str, mapping, domain: int, weights: tuple, top_k: int) -> float:
    weights = dict(weights)
    n = _group_size(group, mapping)
    if n <= 1:
        return 0.0
    payload = spec.payload * (1.0 / _payload_divisor(group, mapping, top_k))
    cost, _ = link_cost(spec.collective, n, members_in_domain(n, group_stride(group, mapping), domain), payload,
                        "auto", top_k)
    return sum(weights.get(c, 0.0) * v for c, f, v in cost.terms if f.kind == "tokens")


def plan_layout(graph: Graph, mapping, domain: int, *, sp: bool = False, residual_bytes: float = 0.0,
                scaleout_cost: float = 1.0) -> Layout:
    """Decide the token layouts of ``graph`` under ``mapping``. ``residual_bytes``: the residual state one
    token carries between layers (the scatter layout's closing all-gather; 0 disables that layout);
    ``scaleout_cost``: seconds of one scale-out byte in NVLink bytes (nvlink_bw / scaleout_bw)."""
    if mapping.tp <= 1:
        return EMPTY
    t = mapping.tp
    weights = {"bytes_nvlink": 1.0, "bytes_scaleout": scaleout_cost}
    out: dict[str, OpLayout] = {}
    moe: dict[int, str] = {}
    compute = [op for op in graph.ops if op.stream == "compute"]
    by_layer: dict[int, list[Op]] = {}
    for op in compute:
        if op.layer is not None:
            by_layer.setdefault(op.layer, []).append(op)
    if mapping.moe_tp == 1 and mapping.ep > 1:
        for layer, ops in by_layer.items():
            ep = next((k for k, o in enumerate(ops) if "ep" in o.split and
                       any(s.collective == "all_to_all" for s in o.comm)), None)
            if ep is None:
                continue
            attn = next((k for k in range(ep - 1, -1, -1) if _tp_reduce(ops[k]) is not None), None)
            if attn is None:
                continue
            choice = _moe_choice(ops, attn, ep, mapping, domain, weights, residual_bytes)
            if choice is None:
                continue
            moe[layer] = choice
            out.update(_moe_layout(ops, attn, ep, choice, t, residual_bytes))
    if sp:
        out.update(_sp_layout(compute, out, t, mapping))
    return Layout(out, moe)


def _moe_choice(ops, attn, ep, mapping, domain, weights, residual_bytes) -> str | None:
    expert = ops[ep]
    top_k = expert.info.top_k
    ar = _tp_reduce(ops[attn])
    a2a = sum(_link_time(s, s.group, mapping, domain, weights, top_k) for s in expert.comm
              if s.collective == "all_to_all")
    options = {}
    if residual_bytes:
        rs = attrs.evolve(ar, collective="reduce_scatter")
        ag = CommSpec("all_gather", "tp", Cost.of(Feature("tokens", ops[-1].token_set), bytes_act=residual_bytes))
        options["scatter"] = (_link_time(rs, "tp", mapping, domain, weights, 0) + a2a
                              + _link_time(ag, "tp", mapping, domain, weights, 0))
    if mapping.dp * mapping.cp == 1:
        attn_ar = _link_time(ar, "tp", mapping, domain, weights, 0)
        # the shared expert's all-reduce (or the routed one, without shared experts) carries the layer's output
        out_ar = CommSpec("all_reduce", "tp", _routed_reduce_payload(expert))
        options["replicated"] = 2 * attn_ar if _shared_reduce(ops, ep) else attn_ar + _link_time(
            out_ar, "tp", mapping, domain, weights, 0)
    return min(options, key=options.get) if options else None


def _routed_reduce_payload(expert: Op) -> Cost:
    return Cost.of(Feature("tokens", expert.token_set), bytes_act=2.0 * expert.info.hidden)


def _shared_reduce(ops, ep) -> bool:
    return any(s.merge == MOE_OUT and s.group == "tp" for o in ops[ep + 1:] for s in o.comm)


def _moe_layout(ops, attn, ep, choice, t, residual_bytes) -> dict:
    expert = ops[ep]
    if choice == "replicated":
        comm = tuple(s for s in expert.comm if s.collective != "all_to_all")
        comm += (CommSpec("all_reduce", "tp", _routed_reduce_payload(expert), "after",
                          note="routed partial sums (tokens replicated: no dispatch)", merge=MOE_OUT),)
        return {expert.name: OpLayout(comm=comm)}
    ar = _tp_reduce(ops[attn])
    out = {ops[attn].name: OpLayout(comm=tuple(attrs.evolve(s, collective="reduce_scatter",
                                                            note=f"{s.note}; scattered into the MoE block")
                                               if s is ar else s for s in ops[attn].comm))}
    for o in ops[attn + 1:]:
        if o is expert:
            continue
        if "tp" in o.split:  # shared expert: replicated weights on the rank's own tokens, no reduction
            out[o.name] = OpLayout(comm=tuple(s for s in o.comm if s.group != "tp"), replicate_weights=True)
        else:
            out[o.name] = OpLayout(token_div=t)
    last = ops[-1]
    gather = CommSpec("all_gather", "tp", Cost.of(Feature("tokens", last.token_set), bytes_act=residual_bytes),
                      "after", note="residual state back to every TP rank (combine into all-gather)")
    old = out.get(last.name, _KEEP)
    out[last.name] = attrs.evolve(old, after=old.after + (gather,))
    return out


def _sp_out_bytes(op: Op) -> float:
    return op.info.elems * op.info.bytes_out


def _merged_with(compute: list[Op], op: Op, spec: CommSpec) -> list[Op]:
    """Earlier ops of the layer whose output reduction rides ``spec`` (same merge key)."""
    return [o for o in compute if o.layer == op.layer and o is not op
            and any(s.merge == spec.merge and s.collective == "all_reduce" for s in o.comm)]


def _sp_layout(compute: list[Op], taken: dict, t: int, mapping) -> dict:
    out: dict[str, OpLayout] = {}

    def sp_able(o: Op) -> bool:
        return (o.kind in SP_KINDS and not ({"tp", "ep"} & set(o.split)) and bool(o.token_set)
                and o.name not in taken)

    def reduce_of(o: Op) -> CommSpec | None:
        return next((s for s in o.comm if s.collective == "all_reduce" and s.group == "tp"), None)

    k = 0
    while k < len(compute):
        op = compute[k]
        ar = reduce_of(op)
        if ar is None or op.name in taken or k + 1 >= len(compute) or not sp_able(compute[k + 1]):
            k += 1
            continue
        riders = _merged_with(compute, op, ar) if ar.merge else []
        # a merged reduction (routed experts' partial sums riding the shared expert's) scatters as one only
        # when it spans the same ranks: expert TP over exactly the TP group
        if riders and not (mapping.moe_tp == mapping.tp and mapping.dp * mapping.cp == 1):
            k += 1
            continue
        for o in riders:
            if o.name in taken:
                break
            out[o.name] = OpLayout(comm=tuple(attrs.evolve(s, collective="reduce_scatter")
                                              if s.merge == ar.merge and s.collective == "all_reduce" else s
                                              for s in o.comm))
        run = []
        j = k + 1
        while j < len(compute) and sp_able(compute[j]):
            run.append(compute[j])
            j += 1
        out[op.name] = OpLayout(comm=tuple(attrs.evolve(s, collective="reduce_scatter", note=f"{s.note}; sequence parallel")
                                           if s is ar else s for s in op.comm))
        for o in run:
            out[o.name] = OpLayout(token_div=t)
        if j < len(compute):
            nxt, last = compute[j], run[-1]
            size = _sp_out_bytes(last) or max(_sp_out_bytes(o) for o in run)
            if size:
                gather = CommSpec("all_gather", "tp", Cost.of(Feature("tokens", last.token_set), bytes_act=size),
                                  "before", note="sequence-parallel run gathered for the next op")
                old = out.get(nxt.name, _KEEP)
                out[nxt.name] = attrs.evolve(old, before=old.before + (gather,))
        k = j
    return out
