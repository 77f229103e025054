"""The token ledger: exactly which tokens every (request, stage, layer) processes under a plan's policies.

It reads the same token sets the costs use (after the policy passes), so the ledger and the estimate can
never disagree. Chunked prefill is a sequence of forward steps, each chunk with its own tail.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import attrs
import numpy as np

from ..core.errors import require
from ..core.ir import Graph
from ..core.limits import MAX_CHUNK_STEPS, MAX_CONTEXT, check_int
from ..lowering.features import interval
from ..core.plan import Request


def chunk_prefill(req: Request, chunk: int) -> list[Request]:
    """Split a prefill into forward steps of at most ``chunk`` new tokens; step i has the earlier chunks
    (and any cached prefix) cached, with their SWA state present, in HBM: the first step copies a host or
    disk prefix hit in, later steps read it and the earlier chunks' KV where it already is. Image tokens
    lead the prompt and spread over the first chunks; the vision encoder runs in the first."""
    check_int("chunk", chunk, 1, MAX_CONTEXT)
    if req.kind != "prefill" or req.new_tokens <= chunk:
        return [req]
    steps = -(-req.new_tokens // chunk)
    require(steps <= MAX_CHUNK_STEPS, "chunk", f"{req}: {req.new_tokens:,} tokens in chunks of {chunk:,} are "
            f"{steps:,} forward steps; at most {MAX_CHUNK_STEPS:,} (use chunks of at least "
            f"{-(-req.new_tokens // MAX_CHUNK_STEPS):,})")
    out, done = [], req.cached
    first = True
    images = req.image_tokens  # images lead the uncached prompt; the ViT runs once, in the first chunk
    while done < req.length:
        end = min(done + chunk, req.length)
        img = min(images, end - done)
        out.append(attrs.evolve(req, length=end, cached=done, swa_cached=req.swa_cached if first else True,
                                tier=req.tier if first else "hbm",
                                image_tokens=img, image_patches=req.image_patches if first else 0, image_sizes=()))
        done, first, images = end, False, images - img
    return out


@attrs.frozen
class LedgerRow:
    step: int
    request: str
    count: int
    stage: str
    layer: int | None
    token_set: str
    tokens_per_request: int

    @property
    def tokens(self) -> int:
        return self.count * self.tokens_per_request


@attrs.frozen
class Ledger:
    rows: tuple

    def total(self, stages: Sequence[str] | None = None, request: str | None = None) -> int:
        """Σ tokens × layers over the rows of ``stages`` (all if None) and ``request`` (all if None)."""
        return sum(r.tokens for r in self.rows
                   if (stages is None or r.stage in stages) and (request is None or r.request == request))

    def trunk_total(self, request: str | None = None) -> int:
        """Token × layer over the trunk (encoder and decoder layers; global-KV projection excluded)."""
        return self.total(("encoder", "decoder", "trunk"), request)

    def by_stage(self) -> dict:
        """{request: {stage: token×layer}} summed over steps."""
        out: dict = {}
        for r in self.rows:
            d = out.setdefault(r.request, {})
            d[r.stage] = d.get(r.stage, 0) + r.tokens
        return out

    def to_dict(self) -> dict:
        return {"rows": [attrs.asdict(r) | {"tokens": r.tokens} for r in self.rows], "by_stage": self.by_stage()}


def layer_token_sets(graph: Graph) -> dict:
    """The token sets each (stage, layer) runs on, most telling first: its attentions', else its KV writers',
    else the most common. A layer may run one path per request kind (DeepSeek-V3's MLA: an up-projected
    prefill attention, an absorbed decode attention): a request counts with the first set that selects any of
    its tokens."""
    sets: dict = {}
    for op in graph.ops:
        if op.token_set and op.stream == "compute":  # copies and collectives are not a layer's work
            sets.setdefault((op.stage, op.layer), Counter())[op.token_set] += 1
    out = {}
    caches = {t.name for t in graph.tensors if t.role == "kv_cache"}
    for key, cnt in sets.items():
        ops = [op for op in graph.ops if (op.stage, op.layer) == key]
        attn = [op.token_set for op in ops if op.kind == "attention"]
        kv = [op.token_set for op in ops if caches & set(op.writes)]  # a KV projection stage: what it writes
        out[key] = list(dict.fromkeys(attn or kv or [cnt.most_common(1)[0][0]]))
    return out


def ledger_for(compile_logical, requests: Sequence[Request], *, chunk: int | None = None, workload_of=None) -> Ledger:
    """Rows for every step (chunk) of ``requests``. ``compile_logical(kinds, step_requests)`` returns the
    policy-rewritten logical graph; ``workload_of(step_requests)`` its workload point. Every step has the same
    groups (a prompt that has finished keeps its last chunk and contributes nothing), so one graph serves
    all of them."""
    chunked = [(str(r), chunk_prefill(r, chunk) if chunk else [r]) for r in requests]
    depth = max(len(c) for _, c in chunked)
    first = [parts[0] for _, parts in chunked]
    graph = compile_logical(tuple(r.kind for r in first), first)
    tsm = graph.token_set_map
    layer_sets = [(key, [tsm[t] for t in names]) for key, names in layer_token_sets(graph).items()
                  if key[1] is not None]  # embedding, head: not layers of the token x layer count
    rows = []
    for s in range(depth):
        step = [parts[min(s, len(parts) - 1)] for _, parts in chunked]
        a = workload_of(step).arrays()
        for (stage, layer), candidates in layer_sets:
            for g, ((name, parts), r) in enumerate(zip(chunked, step)):
                ts = next((t for t in candidates if t.rule(r.kind) != "none"), None)
                if ts is None or s >= len(parts):
                    continue
                rule = ts.rule(r.kind)
                lo, hi = interval(rule, a, g, np)
                n = int(round(float(hi[0] - lo[0])))
                if n:
                    rows.append(LedgerRow(s, name, r.count, stage, layer, ts.name, n))
    return Ledger(tuple(rows))


def ledger(model, requests: Sequence, policies=None, *, chunk: int | None = None) -> Ledger:
    """The ledger of ``requests`` (Request objects or request strings) under ``policies``."""
    from ..models import load_model
    from ..passes.pipeline import PassPipeline
    from .pipeline import Plan, Policies, default_passes

    model = load_model(model) if isinstance(model, str) else model
    policies = policies or Policies()
    reqs = [Request.parse(r, model.image_processor()) if isinstance(r, str) else r for r in requests]

    def compile_logical(kinds, step):
        g = model.build(kinds, policies=policies, requests=tuple(step))
        return PassPipeline(default_passes(model, policies)).run(g)

    return ledger_for(compile_logical, reqs, chunk=chunk,
                      workload_of=lambda step: Plan(step, policies=policies).workload())
