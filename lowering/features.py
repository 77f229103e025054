"""Workload features over the points of a workload, written once for any array module (NumPy or jax.numpy):
token-set intervals per request group, the registry's per-request closed forms (graphsim.core.features) summed
with request counts, and the batch-level kinds (``one``, ``active``, ``experts_touched``).
"""
from __future__ import annotations

from typing import Sequence

from graphsim.core.errors import GraphsimError
from graphsim.core.features import FEATURES, WINDOW_KINDS, s_causal, s_chunk, s_floor, s_floor_capped, s_window  # noqa: F401
from graphsim.core.ir import Feature, TokenSet
from graphsim.core.workload import TIERS


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


def per_request(kind: str, params: tuple, lo, hi, xp):
    """Value of a per-request feature for one group (before weighting by request count): the registry's
    closed form (graphsim.core.features)."""
    rule = FEATURES.get(kind)
    if rule is None or rule.per_request is None:
        raise GraphsimError("feature.kind", f"no per-request closed form for {kind!r}")
    return rule.per_request(params, lo, hi, xp)


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


def feature_column(f: Feature, token_sets: dict, kinds: Sequence[str], a: dict, xp, memo: dict | None = None):
    """One feature over all points: shape (P,). ``memo``: shared by the features of one call so that token-set
    intervals (and chunked arrays) are computed once, not once per feature (a smaller traced program)."""
    memo = {} if memo is None else memo
    if f.chunk:
        key = ("chunk", f.chunk)
        if key not in memo:
            memo[key] = chunk_arrays(a, kinds, f.chunk, xp)
        a = memo[key]
    count = a["count"]
    if f.kind == "one":
        return xp.ones(count.shape[0])
    ts: TokenSet = token_sets[f.token_set]

    def span(g, rule):
        key = (f.chunk, rule, g)
        if key not in memo:
            memo[key] = interval(rule, a, g, xp)
        return memo[key]

    def n_of(g):
        rule = ts.rule(kinds[g])
        if rule == "none":
            return 0.0
        lo, hi = span(g, rule)
        return hi - lo

    if f.kind == "active":  # any position in the set at all (micro-batch fractions do not matter)
        n = sum(count[:, g] * n_of(g) for g in range(len(kinds)))
        return xp.where(n > 0, 1.0, 0.0)
    if f.kind == "experts_touched":
        e, k = float(f.params[0]), float(f.params[1])
        t = sum(f.frac * count[:, g] * n_of(g) for g in range(len(kinds)))
        return e * (1.0 - (1.0 - k / e) ** t)
    total = 0.0 * count[:, 0]
    for g, kind in enumerate(kinds):
        rule = ts.rule(kind)
        if rule == "none":
            continue
        lo, hi = span(g, rule)
        if f.kind in WINDOW_KINDS and rule.partition(":")[0].endswith("dtail"):
            lo, hi = 0.0 * lo, hi - lo  # decoder replay: the tail's SWA history starts at the tail
        total = total + f.frac * count[:, g] * per_request(f.kind, f.params, lo, hi, xp)
    return total


def feature_matrix(features: Sequence[Feature], token_sets: dict, kinds: Sequence[str], a: dict, xp):
    """All features as a (P, F) array."""
    memo: dict = {}
    return xp.stack([feature_column(f, token_sets, kinds, a, xp, memo) for f in features], axis=1)
