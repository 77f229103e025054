"""The workload-feature registry: every feature kind a cost term can be linear in, with its closed form.

For a request whose token set covers query positions [lo, hi) (0-based), query i sees v = i + 1 positions.
Sums over queries use prefix sums S_f(x) = Σ_{v=1..x} f(v), so Σ_{i=lo}^{hi-1} f(i+1) = S_f(hi) - S_f(lo):
exact for every length graphsim admits (contexts < 2^26 keep every sum an exact float64 integer), no loop
over positions. The functions take any array module ``xp`` (NumPy or jax.numpy).

Each :class:`FeatureRule` says how one request contributes (``per_request``; batch-level kinds such as
``active`` or ``experts_touched`` are computed over the whole batch by the lowering), its parameters, and
two flags the passes read: ``query`` (grows with the query positions a rank processes, so context
parallelism divides it) and ``window`` (a sliding-window history, which a decoder-replay tail restarts).
``graphsim.core.ir.FEATURE_KINDS``, the sharding pass and the lowering all read this one table.
"""
from __future__ import annotations

from typing import Callable

import attrs


def s_causal(x):
    return x * (x + 1.0) / 2.0


def s_window(x, w, xp):
    a = xp.minimum(x, w)
    return a * (a + 1.0) / 2.0 + w * (x - a)


def s_chunk(x, c, xp):
    """Σ_{v=1..x} ((v-1) mod C + 1) = q·C(C+1)/2 + r(r+1)/2, q = ⌊x/C⌋, r = x - q·C."""
    q = xp.floor(x / c)
    r = x - q * c
    return q * c * (c + 1.0) / 2.0 + r * (r + 1.0) / 2.0


def s_floor(x, m, xp):
    """Σ_{v=1..x} ⌊v/m⌋ = m·q(q-1)/2 + q·(x - q·m + 1), q = ⌊x/m⌋."""
    q = xp.floor(x / m)
    return m * q * (q - 1.0) / 2.0 + q * (x - q * m + 1.0)


def s_floor_capped(x, m, k, xp):
    """Σ_{v=1..x} min(k, ⌊v/m⌋): the floor sum up to v = k·m - 1, then k per position."""
    edge = k * m - 1.0
    return s_floor(xp.minimum(x, edge), m, xp) + k * xp.maximum(x - edge, 0.0)


@attrs.frozen
class FeatureRule:
    kind: str
    doc: str
    params: tuple = ()  #: parameter names, in order
    per_request: Callable | None = None  #: (params, lo, hi, xp) -> value; None = batch-level (the lowering's)
    query: bool = False  #: grows with the query positions a rank processes: context parallelism divides it
    window: bool = False  #: over a sliding-window history (a decoder-replay tail starts its history at the tail)


FEATURES: dict[str, FeatureRule] = {}


def feature(kind: str, doc: str, params: tuple = (), *, query: bool = False, window: bool = False, batch: bool = False):
    def deco(fn):
        FEATURES[kind] = FeatureRule(kind, doc, params, None if batch else fn, query, window)
        return fn

    return deco


def _n(lo, hi):
    return hi - lo


@feature("one", "constant 1 (fixed per-forward work: collective latencies)", batch=True)
def _one(p, lo, hi, xp):
    return None


@feature("active", "1 when any request has positions in the set, else 0 (weights read once per forward that runs)",
         batch=True)
def _active(p, lo, hi, xp):
    return None


@feature("tokens", "Σ_requests count · |positions|", query=True)
def _tokens(p, lo, hi, xp):
    return hi - lo


@feature("requests", "Σ count · [request has positions in the set]")
def _requests(p, lo, hi, xp):
    return xp.where(hi - lo > 0, 1.0, 0.0)


@feature("kv_len", "Σ count · (last position + 1): visible context at the end of the set")
def _kv_len(p, lo, hi, xp):
    return xp.where(hi - lo > 0, hi, 0.0)


@feature("causal_pairs", "Σ count · Σ_i (i+1): dense causal attention", query=True)
def _causal_pairs(p, lo, hi, xp):
    return s_causal(hi) - s_causal(lo)


@feature("full_pairs", "Σ count · n²: bidirectional attention within the set (vision)", query=True)
def _full_pairs(p, lo, hi, xp):
    return (hi - lo) * (hi - lo)


@feature("block_pairs", "Σ count · (⌊n/B⌋·B² + (n mod B)²): bidirectional attention within consecutive blocks of B "
         "(a ViT run on fixed-size tiles or images: Llama 4, Gemma 3)", ("B",), query=True)
def _block_pairs(p, lo, hi, xp):
    (blk,) = p
    n = hi - lo
    q = xp.floor(n / float(blk))
    r = n - q * float(blk)
    return q * float(blk) * float(blk) + r * r


@feature("window_read", "Σ count · distinct positions a window of W reads for the set", ("W",), query=True,
         window=True)
def _window_read(p, lo, hi, xp):  # a rank reads its positions' windows (halo neglected under CP)
    (w,) = p
    return xp.where(hi - lo > 0, hi - xp.maximum(lo - float(w) + 1.0, 0.0), 0.0)


@feature("window_pairs", "Σ count · Σ_i min(i+1, W)", ("W",), query=True, window=True)
def _window_pairs(p, lo, hi, xp):
    (w,) = p
    return s_window(hi, float(w), xp) - s_window(lo, float(w), xp)


@feature("chunk_read", "Σ count · positions chunked-local attention reads (from the first query's chunk start)",
         ("C",), query=True)
def _chunk_read(p, lo, hi, xp):
    (c,) = p
    return xp.where(hi - lo > 0, hi - float(c) * xp.floor(lo / float(c)), 0.0)


@feature("chunk_pairs", "Σ count · Σ_i (i mod C + 1): attention within aligned chunks of C (Llama 4)", ("C",),
         query=True)
def _chunk_pairs(p, lo, hi, xp):
    (c,) = p
    return s_chunk(hi, float(c), xp) - s_chunk(lo, float(c), xp)


@feature("compressed", "Σ count · ⌊(last+1)/m⌋: compressed entries visible at the end", ("m",))
def _compressed(p, lo, hi, xp):
    (m,) = p
    return xp.where(hi - lo > 0, xp.floor(hi / m), 0.0)


@feature("compressed_pairs", "Σ count · Σ_i ⌊(i+1)/m⌋: a full scan over compressed entries", ("m",), query=True)
def _compressed_pairs(p, lo, hi, xp):
    (m,) = p
    return s_floor(hi, float(m), xp) - s_floor(lo, float(m), xp)


@feature("topk_pairs", "Σ count · Σ_i min(K, ⌊(i+1)/m⌋): sparse top-K selections", ("m", "K"), query=True)
def _topk_pairs(p, lo, hi, xp):
    m, k = float(p[0]), float(p[1])
    return s_floor_capped(hi, m, k, xp) - s_floor_capped(lo, m, k, xp)


@feature("sparse_read", "Σ count · min(Σ_i min(K,⌊(i+1)/m⌋), ⌊(last+1)/m⌋) entries read once", ("m", "K"))
def _sparse_read(p, lo, hi, xp):
    m, k = float(p[0]), float(p[1])
    pairs = s_floor_capped(hi, m, k, xp) - s_floor_capped(lo, m, k, xp)
    return xp.minimum(pairs, xp.where(hi - lo > 0, xp.floor(hi / m), 0.0))


@feature("new_groups", "Σ count · (⌊end/m⌋ - ⌊start/m⌋): compression groups completed", ("m",), query=True)
def _new_groups(p, lo, hi, xp):
    (m,) = p
    return xp.floor(hi / m) - xp.floor(lo / m)


@feature("experts_touched", "E·(1-(1-k/E)^T), T = tokens of the set over the batch", ("E", "k"), batch=True)
def _experts_touched(p, lo, hi, xp):
    return None


FEATURE_KINDS = tuple(FEATURES)
#: Kinds context parallelism divides (they grow with the query positions a rank processes); the others
#: (visible KV length, selected or compressed entries read, requests) are per-request context every CP rank
#: of a request reads whole once the KV is gathered.
QUERY_FEATURES = tuple(k for k, r in FEATURES.items() if r.query)
#: Kinds over the sliding-window (SWA) history rather than the global KV.
WINDOW_KINDS = tuple(k for k, r in FEATURES.items() if r.window)
