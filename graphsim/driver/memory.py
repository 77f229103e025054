"""Memory of one device: the single place the report, the sweep metrics and ``graphsim fit`` take it from.

* weights — each resident tensor divided as the ops reading it are split (TP heads/columns, EP experts),
  taken from the model's *reference graph* (every stage the model can have: vision, draft…) so a tensor's
  share never depends on which stages this batch happens to run; with pipeline parallelism, the most
  loaded stage; Engram tables (role ``table``) are in HBM only when ``policies.engram == "hbm"`` — their
  projections stay in HBM either way; groups the model does not load under the policies (e.g. DSpark off)
  are left out;
* KV — one request's cache on the most loaded device (:func:`kv_per_device`): split as
  ``model.kv_split(mapping)`` says, whole on every CP rank (the KV is all-gathered), per pipeline stage
  from the model's per-layer breakdown (shared owners' KV counted where it lives and where it is read);
* workspace — the largest activation bytes any one op moves at the workload;
* a runtime reserve (CUDA context, NCCL/DeepEP buffers, CUDA graphs, fragmentation), a parameter.
"""
from __future__ import annotations

import functools

import attrs
import numpy as np

from ..core.ir import Graph
from ..core.plan import ParallelMapping

GiB = 2.0**30
from ..core.limits import DEFAULT_RESERVE_GIB  # noqa: E402,F401  (defined where the CLI's help can read it cheaply)


def kv_request_bytes(model, context, policies=None) -> float:
    """KV bytes one request holds at ``context`` tokens under ``policies`` (drafters' caches included)."""
    return model.kv_request_bytes(context, policies)  # arrays stay arrays where the model's formula takes them


def kv_layer_bytes(model, context, policies=None) -> dict:
    """One request's KV bytes per layer (owners hold the shared global KV; extra keys sort after the
    trunk, e.g. draft blocks)."""
    return model.kv_bytes_by_layer(int(context), policies)


def kv_per_device(model, context, mapping: ParallelMapping, policies=None) -> float:
    """One request's KV bytes on the most loaded device: split as ``model.kv_split`` says (attention-DP by
    default), not by cp (context parallelism all-gathers each layer's KV), and with pipeline parallelism
    the stage holding the most — its own layers' caches plus copies of owners' KV its layers read."""
    split = model.kv_split(mapping)
    if mapping.pp == 1:
        return kv_request_bytes(model, context, policies) / split
    from ..passes.pipeline_parallel import stage_sizes

    per = kv_layer_bytes(model, context, policies)
    n = model.num_layers()
    bounds = np.cumsum(stage_sizes(n, mapping.pp))
    stage = {k: min(int(np.searchsorted(bounds, k, side="right")), mapping.pp - 1) for k in per}
    load = np.zeros(mapping.pp)
    for k, v in per.items():
        load[stage[k]] += v
    owners = model.kv_owners()
    for s in range(mapping.pp):  # a stage keeps a copy of every earlier owner's KV its layers read
        for o in {own for lay, own in owners.items() if stage[lay] == s and stage[own] != s}:
            load[s] += model.owner_kv_bytes(int(context), o)
    return float(load.max()) / split



@functools.lru_cache(maxsize=256)  # a search asks for every (mapping, policies) of a work set, then its SOL twin
def _reference_splits(model, mapping: ParallelMapping, policies=None, hw=None) -> dict[str, float]:
    """tensor -> weight divisor, from the model's reference graph (all of its stages) under the policies'
    sharding options, with the token layouts the sharding pass picks (a scattered MoE block holds its shared
    expert whole on every TP rank)."""
    from ..passes.sharding import layout_of, split_factors

    graph = model.reference_graph(policies)
    layout = layout_of(graph, mapping, hw.nvlink_domain if hw is not None else 1 << 30, policies, hw)
    div: dict[str, float] = {}
    for op in graph.ops:
        _, w = split_factors(op, mapping)
        if layout.of(op.name).replicate_weights and "tp" in op.split:
            w /= mapping.tp
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
    from ..passes.pipeline_parallel import stage_of_ops, stage_sizes, trunk_layers

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
    div = _reference_splits(model, attrs.evolve(m, pp=1), policies, compiled.hw)
    groups = model.resident_groups(policies)
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
