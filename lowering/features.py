"""Closed forms of workload features, written once for any array module (NumPy or jax.numpy).

For a request whose token set covers query positions [lo, hi) (0-based), query i sees v = i + 1 positions.
Sums over queries use prefix sums S_f(x) = Σ_{v=1..x} f(v), so Σ_{i=lo}^{hi-1} f(i+1) = S_f(hi) - S_f(lo):
exact for every length, no loop over positions.
"""
from __future__ import annotations

from typing import Sequence

from graphsim.errors import GraphsimError
from graphsim.ir import Feature, TokenSet
from graphsim.workload import TIERS


def interval(rule: str, a: dict, g: int, xp):
    """Positions [lo, hi) that ``rule`` selects in group ``g`` (columns of the workload arrays)."""
    rule, at, tier = rule.partition("@")
    if at:  # only requests whose cached prefix lives in this tier
        lo, hi = interval(rule, a, g, xp)
        keep = a["tier"][:, g] == float(TIERS.index(tier))
        return lo, xp.where(keep, hi, lo)
    new, past = a["new"][:, g], a["past"][:, g]
    replay = a["replay"][:, g]
    if rule.startswith("replay+"):  # the rule over the replayed cached positions and the new ones together
        rule, past, new = rule[len("replay+"):], past - replay, new + replay
    head, _, arg = rule.partition(":")
    end = past + new
    if head == "all":
        return past, end
    if head == "none":
        return past, past
    if head in ("tail", "dtail"):
        return end - xp.minimum(new, float(arg)), end
    if head == "replay":
        return past - replay, past
    if head == "text":
        return past, end - a["image"][:, g]
    if head == "image":
        return end - a["image"][:, g], end
    if head == "patches":
        return 0.0 * past, a["patches"][:, g]
    if head == "one":  # (not on the leading chunks of a prompt split into causal chunks)
        return end - xp.minimum(new, a.get("logits", 1.0)), end
    if head == "cached":
        return 0.0 * past, past
    if head == "cached_swa":  # restored SWA window; nothing when the window is replayed instead
        keep = xp.where(replay > 0, 0.0, xp.minimum(past, float(arg)))
        return past - keep, past
    if head == "ahead":  # draft positions: they follow the new ones and are not cached yet
        return end, end + float(arg)
    raise GraphsimError("token_set.rule", f"unknown rule {rule!r}")


def s_causal(x):
    return x * (x + 1.0) / 2.0


def s_window(x, w, xp):
    a = xp.minimum(x, w)
    return a * (a + 1.0) / 2.0 + w * (x - a)


def s_floor(x, m, xp):
    """Σ_{v=1..x} ⌊v/m⌋ = m·q(q-1)/2 + q·(x - q·m + 1), q = ⌊x/m⌋."""
    q = xp.floor(x / m)
    return m * q * (q - 1.0) / 2.0 + q * (x - q * m + 1.0)


def s_floor_capped(x, m, k, xp):
    """Σ_{v=1..x} min(k, ⌊v/m⌋): the floor sum up to v = k·m - 1, then k per position."""
    edge = k * m - 1.0
    return s_floor(xp.minimum(x, edge), m, xp) + k * xp.maximum(x - edge, 0.0)


def per_request(kind: str, params: tuple, lo, hi, xp):
    """Value of a per-request feature for one group (before weighting by request count)."""
    n = hi - lo
    if kind == "tokens":
        return n
    if kind == "requests":
        return xp.where(n > 0, 1.0, 0.0)
    if kind == "kv_len":
        return xp.where(n > 0, hi, 0.0)
    if kind == "window_read":  # distinct cached positions a sliding window of W reads for queries [lo, hi)
        (w,) = params
        return xp.where(n > 0, hi - xp.maximum(lo - float(w) + 1.0, 0.0), 0.0)
    if kind == "causal_pairs":
        return s_causal(hi) - s_causal(lo)
    if kind == "full_pairs":
        return n * n
    if kind == "window_pairs":
        (w,) = params
        return s_window(hi, float(w), xp) - s_window(lo, float(w), xp)
    if kind == "compressed":
        (m,) = params
        return xp.where(n > 0, xp.floor(hi / m), 0.0)
    if kind == "compressed_pairs":
        (m,) = params
        return s_floor(hi, float(m), xp) - s_floor(lo, float(m), xp)
    if kind in ("topk_pairs", "sparse_read"):
        m, k = float(params[0]), float(params[1])
        pairs = s_floor_capped(hi, m, k, xp) - s_floor_capped(lo, m, k, xp)
        if kind == "topk_pairs":
            return pairs
        return xp.minimum(pairs, xp.where(n > 0, xp.floor(hi / m), 0.0))
    if kind == "new_groups":
        (m,) = params
        return xp.floor(hi / m) - xp.floor(lo / m)
    raise GraphsimError("feature.kind", f"no closed form for {kind!r}")


def chunk_arrays(a: dict, kinds: Sequence[str], chunk: tuple, xp) -> dict:
    """The workload of causal chunk j of m of every prefill request: new positions [s, e) with
    s = ⌊j·n/m⌋, e = ⌊(j+1)·n/m⌋, everything before them cached — earlier chunks in HBM, so only chunk 0
    restores a prefix hit, replays, encodes images and its patches; only the last chunk needs logits.
    Decode groups are never chunked."""
    j, m = float(chunk[0]), float(chunk[1])
    new, past = a["new"], a["past"]
    s, e = xp.floor(j * new / m), xp.floor((j + 1.0) * new / m)
    pre = xp.asarray([[k == "prefill" for k in kinds]])
    first = 1.0 if j == 0 else 0.0
    out = dict(a)
    out["new"] = xp.where(pre, e - s, new)
    out["past"] = xp.where(pre, past + s, past)
    out["image"] = xp.where(pre, xp.clip(a["image"] - s, 0.0, e - s), a["image"])  # images lead the prompt
    for k in ("replay", "patches"):
        out[k] = xp.where(pre, a[k] * first, a[k])
    out["tier"] = xp.where(pre & (j > 0), 0.0, a["tier"])  # later chunks find every earlier position in HBM
    out["logits"] = 1.0 if j == m - 1 else 0.0
    return out


def feature_column(f: Feature, token_sets: dict, kinds: Sequence[str], a: dict, xp):
    """One feature over all points: shape (P,)."""
    if f.chunk:
        a = chunk_arrays(a, kinds, f.chunk, xp)
    count = a["count"]
    if f.kind == "one":
        return xp.ones(count.shape[0])
    ts: TokenSet = token_sets[f.token_set]
    if f.kind == "active":  # any position in the set at all (micro-batch fractions do not matter)
        n = sum(count[:, g] * _n(ts, kinds[g], a, g, xp) for g in range(len(kinds)))
        return xp.where(n > 0, 1.0, 0.0)
    if f.kind == "experts_touched":
        e, k = float(f.params[0]), float(f.params[1])
        t = sum(f.frac * count[:, g] * _n(ts, kinds[g], a, g, xp) for g in range(len(kinds)))
        return e * (1.0 - (1.0 - k / e) ** t)
    total = 0.0 * count[:, 0]
    for g, kind in enumerate(kinds):
        rule = ts.rule(kind)
        if rule == "none":
            continue
        lo, hi = interval(rule, a, g, xp)
        if f.kind in WINDOW_KINDS and rule.partition(":")[0].endswith("dtail"):
            lo, hi = 0.0 * lo, hi - lo  # decoder replay: the tail's SWA history starts at the tail
        total = total + f.frac * count[:, g] * per_request(f.kind, f.params, lo, hi, xp)
    return total


#: Features over the sliding-window (SWA) history rather than the global KV.
WINDOW_KINDS = ("window_pairs", "window_read")


def _n(ts: TokenSet, kind: str, a: dict, g: int, xp):
    rule = ts.rule(kind)
    if rule == "none":
        return 0.0
    lo, hi = interval(rule, a, g, xp)
    return hi - lo


def feature_matrix(features: Sequence[Feature], token_sets: dict, kinds: Sequence[str], a: dict, xp):
    """All features as a (P, F) array."""
    return xp.stack([feature_column(f, token_sets, kinds, a, xp) for f in features], axis=1)
