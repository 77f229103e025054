"""Memory of one device: the single place the report, the sweep metrics and ``graphsim fit`` take it from.

* weights — each resident tensor divided as the ops reading it are split (TP heads/columns, EP experts),
  taken from the model's *reference graph* (every stage the model can have: vision, draft…) so a tensor's
  share never depends on which stages this batch happens to run; with pipeline parallelism, the most
  loaded stage; Engram tables (role ``table``) are in HBM only when ``policies.engram == "hbm"`` — their
  projections stay in HBM either way; groups the model does not load under the policies (e.g. DSpark off)
  are left out;
* KV — ``model.kv_bytes(context)`` per request divided over the devices sharing a request's cache:
  ``model.kv_split(mapping)`` (attention-DP by default) × cp (positions) × pp (layers, ≈ evenly);
* workspace — the largest activation bytes any one op moves at the workload;
* a runtime reserve (CUDA context, NCCL/DeepEP buffers, CUDA graphs, fragmentation), a parameter.
"""
from __future__ import annotations

import functools

import attrs

from .ir import Graph
from .plan import ParallelMapping

GiB = 2.0**30
#: Runtime reserve per GPU. CUDA context ≈ 0.5–1 GiB; NCCL + DeepEP normal/low-latency buffers ≈ 2–4 GiB;
#: CUDA graphs, cuBLAS/DeepGEMM workspaces and allocator fragmentation ≈ 2–3 GiB. (SGLang's default
#: mem_fraction_static keeps 10–15 % of HBM back for this *and* activations, which are counted separately.)
DEFAULT_RESERVE_GIB = 8.0


def kv_divisor(model, mapping: ParallelMapping) -> int:
    """Devices one request's KV is spread over."""
    split = model.kv_split(mapping) if hasattr(model, "kv_split") else mapping.dp
    return split * mapping.cp * mapping.pp


def kv_request_bytes(model, context, policies=None) -> float:
    """KV bytes one request holds at ``context`` tokens under ``policies`` (DSpark adds its SWA blocks)."""
    if policies is not None and getattr(policies, "dspark", "off") == "on" and hasattr(model, "kv_capacity"):
        return model.kv_capacity(int(context), dspark=True).total
    return model.kv_bytes(context)


@functools.lru_cache(maxsize=32)
def _reference_splits(model, mapping: ParallelMapping) -> dict[str, float]:
    """tensor -> weight divisor, from the model's reference graph (all of its stages)."""
    from .passes.sharding import split_factors

    graph = model.reference_graph() if hasattr(model, "reference_graph") else model.build(("prefill", "decode"))
    div: dict[str, float] = {}
    for op in graph.ops:
        _, w = split_factors(op, mapping)
        for t in op.reads:
            div[t] = max(div.get(t, 1.0), w)
    return div


def _stage_tensors(compiled) -> list[set]:
    """Tensor names held by each pipeline stage (one set without pipeline parallelism)."""
    g: Graph = compiled.logical
    m = compiled.plan.mapping
    names = {t.name for t in g.weights()}
    if m.pp == 1:
        return [names]
    from .passes.pipeline_parallel import stage_of_ops, stage_sizes, trunk_layers

    stage = stage_of_ops(g, stage_sizes(trunk_layers(compiled.model, g), m.pp))
    reads = [{t for op, s in zip(g.ops, stage) if s == k for t in op.reads if t in names} for k in range(m.pp)]
    unread = names - set().union(*reads)
    reads[0] |= unread  # resident tensors no op of this batch reads (e.g. the vision tower) sit on stage 0
    return reads


@attrs.frozen
class DeviceWeights:
    hbm: dict  #: bytes per inventory group in HBM on the most loaded device
    tables: float  #: Engram table bytes of that device, wherever they live

    @property
    def total(self) -> float:
        return sum(self.hbm.values())


def device_weights(compiled) -> DeviceWeights:
    """Resident bytes on the most loaded device of a compiled plan."""
    model, plan = compiled.model, compiled.plan
    m, policies = plan.mapping, plan.policies
    div = _reference_splits(model, attrs.evolve(m, pp=1))
    groups = model.resident_groups(policies) if hasattr(model, "resident_groups") else None
    host_tables = getattr(policies, "engram", "hbm") == "host"
    tensors = {t.name: t for t in compiled.logical.weights()}
    best = None
    for names in _stage_tensors(compiled):
        hbm: dict[str, float] = {}
        tables = 0.0
        for n in names:
            t = tensors[n]
            if groups is not None and t.group not in groups:
                continue
            b = t.nbytes / div.get(n, 1.0)
            if t.role == "table":
                tables += b
                if host_tables:
                    continue
            hbm[t.group] = hbm.get(t.group, 0.0) + b
        cand = DeviceWeights(dict(sorted(hbm.items())), tables)
        best = cand if best is None or cand.total > best.total else best
    return best
