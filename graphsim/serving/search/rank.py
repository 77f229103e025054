"""Ranking: SLA checks, the Pareto front of tokens/s per GPU against tokens/s per user, the two-stage policy
refinement (leaders, single-axis variants, combinations), the SOL twin of every predicted row, and the public
rows a result reports."""
from __future__ import annotations

import itertools
import math

import attrs
import numpy as np

from ...core.plan import Policies
from .evaluate import Group, _Search, _key
from .space import (MEMORY_AXES, PREFILL_ONLY, REASONS, ROW_KEYS, SLA, SOL_COLUMNS, TWIN_KEYS, Traffic, _saver,
                    canonical, policies_of)


# ---- the search --------------------------------------------------------------------------------------------------
@attrs.frozen(eq=False)
class SearchResult:
    model: str
    hw: str
    gpus: int
    traffic: Traffic
    sla: SLA
    view: str
    profile: str
    table: object  #: pandas DataFrame, one row per (deployment, batch)
    best: list  #: top-N rows (dicts), one per deployment
    pareto: list  #: Pareto rows (dicts)
    rejected: list  #: deployments that lost, with the reason
    reasons: dict  #: reason -> deployments
    skipped: list  #: programs that could not be built: {"what", "error"}
    space: dict
    stats: dict

    def to_json(self) -> dict:
        from ...core.outputs import SCHEMA_VERSION

        return {"schema_version": SCHEMA_VERSION, "command": "search", "model": self.model, "hw": self.hw, "gpus": self.gpus,
                "traffic": self.traffic.to_dict(), "sla": self.sla.to_dict(), "view": self.view,
                "profile": self.profile, "space": self.space, "best": self.best, "pareto": self.pareto,
                "rejected": self.rejected, "reasons": self.reasons, "skipped": self.skipped, "stats": self.stats}


def _misses(df, sla: SLA) -> dict:
    """:func:`_meets` for every row of a DataFrame: bound -> bool array."""
    n = len(df)
    return {k: np.broadcast_to(np.asarray(v, dtype=bool), (n,)) for k, v in _meets(df, sla).items()}


def _meets(row, sla: SLA) -> dict:
    """Which SLA bounds a row misses (memory first); ``row`` a dict or a DataFrame (then each is a column)."""
    return {"memory": ~np.asarray(row["fits"], dtype=bool),
            "ttft": sla.ttft_ms is not None and row["ttft_ms"] > sla.ttft_ms * (1 + 1e-12),
            "tpot": sla.tpot_ms is not None
            and row["tpot_p99_ms" if sla.tpot_stat == "p99" else "tpot_ms"] > sla.tpot_ms * (1 + 1e-12),
            "min_user_speed": sla.min_tokens_per_s_per_user is not None
            and row["tokens_per_s_per_user"] < sla.min_tokens_per_s_per_user * (1 - 1e-12)}


def pareto_flags(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """True where no other point is at least as good on both x and y (higher is better) and better on one."""
    order = np.lexsort((-y, -x))
    flags = np.zeros(x.size, dtype=bool)
    best, at = -np.inf, None
    for i in order:
        if y[i] > best or (y[i] == best and x[i] == at):  # an identical point is as non-dominated as its twin
            flags[i] = True
            best, at = y[i], x[i]
    return flags


def _with_sol(df, s: _Search, view, profile):
    """``df`` with each row's SOL twin (:data:`SOL_COLUMNS`): in the SOL view its own figures; with a measured
    view or a profile, the same work sets replayed through a speed-of-light search of the same space (the same
    programs, compiled without the view), joined on :data:`TWIN_KEYS`. A disaggregated row whose SOL rate
    balance pairs its pools in other numbers has no twin (NaN)."""
    import pandas as pd

    s.twin_compiled = 0
    if view is None and profile is None:
        for k, c in SOL_COLUMNS.items():
            df[c] = df[k]
        return df
    twin, rows = s.twin, s.twin_rows  # every work set replayed (_assemble), as it was assembled
    s.twin_compiled = twin.compiled
    s.skipped += [x for x in twin.skipped if x not in s.skipped]
    if not rows:
        for c in SOL_COLUMNS.values():
            df[c] = np.nan
        return df
    sol = pd.DataFrame(rows)[list(TWIN_KEYS) + list(SOL_COLUMNS)].rename(columns=SOL_COLUMNS)
    sol = sol.drop_duplicates(list(TWIN_KEYS))
    return df.merge(sol, on=list(TWIN_KEYS), how="left")


def start_twin(s: _Search, view, profile) -> None:
    """With a measured view or a profile, ``s.twin``: the speed-of-light search of the same space (the same
    programs, compiled without the view) that :func:`_assemble` runs every work set through, step by step right
    after the prediction, while the compile cache holds the step's graphs; :func:`_with_sol` joins its rows.
    Its batches are the prediction's (the engine's memory rule decides which fit), at SOL times."""
    if view is None and profile is None:
        return
    twin = _Search(s.model, s.hw, s.gpus, s.traffic, s.sla, s.space, None, None, s.reserve_gib, None, None, s.jobs,
                   s.engine)
    twin.agg_maps, twin.dd_maps, twin.pp_maps = s.agg_maps, s.dd_maps, s.pp_maps
    twin.compiles = s.compiles  # the same plans: their graphs are built once
    s.twin = twin


def _ckey(choice: dict) -> tuple:
    return tuple(sorted(choice.items()))


def _planned(s: _Search, work: dict) -> list:
    """The programs :func:`_assemble` will need that are not evaluated yet, in order (a replica that fits at no
    batch skips its mixed program, so this is an upper bound)."""
    keys: dict = {}
    for (role, m), cs in work.items():
        for choice in cs:
            pol = policies_of(choice, s.space.acceptance)
            if role == "dec" and m in s.agg_maps:
                keys.update(dict.fromkeys([_key("decode", m, pol), _key("mixed", m, pol)]))
            if role == "dec" and m in s.dd_maps:
                keys.update(dict.fromkeys([_key("decode", m, pol)]))
            if role == "pre":
                keys.update(dict.fromkeys([_key("prefill", m, pol)]))
    return [k for k in keys if k not in s.groups]


def _assemble(s: _Search, work: dict) -> list[dict]:
    """Rows of the (role, mapping) -> policy choices in ``work``: aggregated replicas of each decode mapping,
    and disaggregated pairs of every prefill and decode pool evaluated under one choice so far (each pair
    once). With a SOL twin (:func:`start_twin`) the twin assembles the same work step by step right after the
    prediction — its own groups, pools and rows (``s.twin_rows``), as if it replayed the work set after it —
    so each plan's graph is compiled once for both and held only until the twin has it."""
    both = [s] if s.twin is None else [s, s.twin]
    for x in both:
        x.history.append(work)
        planned = _planned(x, work)
        if x.progress is not None and hasattr(x.progress, "expect"):
            x.progress.expect(len(planned))
        if x.jobs > 1:
            x.prefetch(planned)
    rows: list = [[] for _ in both]
    touched = set()
    for (role, m), cs in work.items():
        for choice in cs:
            pol = policies_of(choice, s.space.acceptance)
            for x, out in zip(both, rows):
                if role == "dec" and m in x.agg_maps and (m, canonical(pol, m)) not in x.assembled:
                    x.assembled.add((m, canonical(pol, m)))
                    out += x.agg_rows(m, pol)  # gpus // n replicas; tokens/s per GPU over the GPUs used
                if m in (x.pp_maps if role == "pre" else x.dd_maps):
                    # pools pair when their time axes agree (each pool keeps its own residency values)
                    tk = _ckey({f: v for f, v in choice.items() if f not in MEMORY_AXES})
                    x.pools.setdefault(tk, {"pre": {}, "dec": {}})[role][(m, canonical(pol, m))] = pol
                    touched.add(tk)
    for tk in touched:
        for x, out in zip(both, rows):
            pools = x.pools[tk]
            pre = [g for g in (x.group("prefill", m, p) for (m, _), p in pools["pre"].items()) if not g.error]
            dec = [g for g in (x.group("decode", m, p) for (m, _), p in pools["dec"].items()) if not g.error]
            out += x.disagg_rows(pre, dec)
    s.compiles.clear()  # what the twin did not take (a group is evaluated once: the next work set's are others)
    if s.twin is not None:
        s.twin_rows += rows[1]
    return rows[0]


def _rescue(s: _Search, key: tuple, base: dict, axes) -> list[dict]:
    """Residency values tried for one pool where memory decides (some batch of the grid does not fit under
    the base values): every memory axis at its saver value together — the least a device can hold. If that
    fits no more, no residency value rescues anything; else it joins the pool's policy points (the policy
    stage tries each memory axis back at its other values from there)."""
    mem = [(f, v) for f, v in axes if f in MEMORY_AXES]
    if not mem:
        return []
    role, m = key
    kind = "prefill" if role == "pre" else "decode"
    g0 = s.group(kind, m, policies_of(base, s.space.acceptance))
    if g0.error:
        return []
    grid = np.isin(g0.batch / m.dp, s.space.prefill_batches if kind == "prefill" else s.space.batches)
    if kind == "prefill" and (g0.headroom_bytes[grid] >= 0).any() or (g0.headroom_bytes[grid] >= 0).all():
        return []
    saver = {**base, **{f: _saver(s.model, f, v) for f, v in mem}}
    pol0, pols = policies_of(base, s.space.acceptance), policies_of(saver, s.space.acceptance)
    if canonical(pols, m) == canonical(pol0, m):
        return []
    gs = s.group(kind, m, pols)
    if gs.error or _most_fitting(gs) <= _most_fitting(g0):
        return []
    return [saver]


def _most_fitting(g: Group) -> float:
    fit = g.batch[g.headroom_bytes >= 0]
    return float(fit.max()) if fit.size else 0.0


def _lead_key(r: dict) -> set:
    return {("dec", r["_dmap"])} | ({("pre", r["_pmap"])} if r["mode"] == "disagg" else set())


def _choice_of(r: dict, axes) -> dict:
    """A row's point of the policy space (a disaggregated row's prefill-only fields from its prefill pool)."""
    out = {}
    for f, _ in axes:
        p = r["_prefill_policies"] if f in PREFILL_ONLY else r["_policies"]
        out[f] = _axis_value(p, f)
    return out


def _front(rows: list[dict]) -> list[dict]:
    ok = [r for r in rows if r["fits"]]
    if not ok:
        return []
    flags = pareto_flags(np.array([r["tokens_per_s_per_user"] for r in ok]),
                         np.array([r["tokens_per_s_per_gpu"] for r in ok]))
    return [r for r, f in zip(ok, flags) if f]


def _leaders(rows: list[dict], k: int, axes) -> dict:
    """Pools of the ``k`` best deployments along the front of tokens/s per GPU against per user (from the
    fastest per GPU down; then the fastest rows off it), each with the policy point of its fastest row there —
    chosen without the SLA, so a bound added to it never changes what is explored."""
    seen, out = set(), {}

    def take(r):  # a pool's start: the policy point of its fastest row per GPU on the front
        for key in _lead_key(r):
            out.setdefault(key, [_choice_of(r, axes)])

    for r in sorted(_front(rows), key=lambda r: -r["tokens_per_s_per_gpu"]):
        dep = (r["mode"], r["mapping"])
        if dep in seen or len(seen) < k:
            seen.add(dep)
            take(r)
    for r in sorted((r for r in rows if r["fits"]), key=lambda r: -r["tokens_per_s_per_gpu"]):
        if len(seen) >= k:
            break
        dep = (r["mode"], r["mapping"])
        if dep not in seen:
            seen.add(dep)
            take(r)
    return out


def _variants(axes, starts: list, exhaustive: bool) -> list[dict]:
    if exhaustive:
        return [dict(zip([f for f, _ in axes], vals)) for vals in itertools.product(*[v for _, v in axes])]
    out = []
    for start in starts:
        for f, vals in axes:
            for v in vals:
                c = {**start, f: v}
                if v != start[f] and c not in out:
                    out.append(c)
    return out


def _combos(rows: list[dict], axes, starts: list, done: set, cap: int = 8) -> list[dict]:
    """Combinations of each axis's winning values, less those evaluated: at most ``cap``, the most promising
    first (the product of each value's gain: its best tokens/s per GPU over the start's along that axis). An
    axis's winning values are those that put a row on the front (tokens/s per GPU against per user) among the
    rows of a start and its variants along that axis alone."""
    fields = [f for f, _ in axes]
    groups: dict = {}  # (axis, the other axes' values) -> rows
    for r in rows:
        c = _choice_of(r, axes)
        for f in fields:
            groups.setdefault((f, tuple(c[g] for g in fields if g != f)), []).append((r, c[f]))
    wins = {f: {} for f in fields}  # axis -> winning value -> its best tokens/s per GPU over the start's
    for start in starts:
        for f in fields:
            sub = groups.get((f, tuple(start[g] for g in fields if g != f)), [])
            on = {id(r) for r in _front([r for r, _ in sub])}
            ref = max((r["tokens_per_s_per_gpu"] for r, v in sub if v == start[f] and r["fits"]), default=0.0)
            for r, v in sub:
                if id(r) in on:
                    gain = r["tokens_per_s_per_gpu"] / ref if ref > 0 else 1.0
                    wins[f][v] = max(wins[f].get(v, 0.0), gain)
    if not all(wins.values()):
        return []
    # the most promising first: the product of each value's gain
    scored = sorted(itertools.product(*[list(wins[f].items()) for f in fields]),
                    key=lambda vs: -math.prod(g for _, g in vs))
    out = []
    for combo in scored:
        c = dict(zip(fields, [v for v, _ in combo]))
        if _ckey(c) not in done:
            out.append(c)
        if len(out) >= cap:
            break
    return out


def _axis_value(p: Policies, f: str):
    if f == "spec":
        return "dspark" if p.dspark == "on" else (f"mtp{p.mtp}" if p.mtp else "off")
    return getattr(p, f)


def _spec_text(p: Policies) -> str:
    if p.dspark == "on":
        return "dspark acceptance " + ",".join(f"{a:g}" for a in p.acceptance)
    if p.mtp:
        return f"mtp{p.mtp} acceptance " + ",".join(f"{a:g}" for a in p.acceptance)
    return "off"


def _rank(df, top: int, tpot_col: str = "tpot_ms"):
    """Top deployments (best batch each), and the reason each other deployment lost (``tpot_col``: the TPOT
    the SLA bounds)."""
    # ties: the shorter TTFT, then TPOT, then fewer GPUs (a stable sort keeps the table order after that)
    order = df.assign(_neg=-df["tokens_per_s_per_gpu"]).sort_values(
        ["_neg", "ttft_ms", "tpot_ms", "gpus"], kind="mergesort").drop(columns="_neg")
    ok = order[order["meets_sla"]]
    # one row per pool mapping(s) (its best policies, batch and replica counts): policy variants of a ranked
    # mapping are listed as lost
    pools = ["mode", "prefill_mapping", "decode_mapping"]
    best_idx = ok.drop_duplicates(pools).head(top)
    best = best_idx.to_dict("records")
    best_names = set(best_idx["deployment"])
    cutoff = best[-1]["tokens_per_s_per_gpu"] if best else None
    rank_of = {tuple(b[k] for k in pools): i + 1 for i, b in enumerate(best)}
    rejected, reasons = [], {k: 0 for k in REASONS}
    for name, g in order.groupby("deployment", sort=False):
        if name in best_names:
            continue
        if g["meets_sla"].any():
            g = g[g["meets_sla"]]
            r = g.iloc[0]
            k = rank_of.get(tuple(r[c] for c in pools))
            if k is not None:
                reason = "variant"
                detail = (f"{r['tokens_per_s_per_gpu']:.1f} tok/s/GPU at best, below the policies ranked #{k} "
                          f"on this mapping ({best[k - 1]['tokens_per_s_per_gpu']:.1f})")
            else:
                reason = "throughput"
                detail = f"{r['tokens_per_s_per_gpu']:.1f} tok/s/GPU at best, below #{len(best)}'s {cutoff:.1f}"
        else:
            fits = g[g["fits"]]
            timely = fits[fits["why"] != "ttft"]  # fits and meets TTFT: it misses TPOT or the user speed
            if fits.empty:
                reason, r = "memory", g.iloc[0]
                detail = f"does not fit at any batch ({-g['memory_headroom_gib'].max():.1f} GiB short at the smallest)"
            elif timely.empty:
                reason, r = "ttft", fits.iloc[0]
                detail = f"TTFT {fits['ttft_ms'].min():.0f} ms at best"
            else:
                r = timely.iloc[0]
                reason = r["why"]
                if reason == "tpot":
                    detail = f"TPOT {timely[tpot_col].min():.1f} ms at best (meeting TTFT)"
                else:
                    detail = f"{timely['tokens_per_s_per_user'].max():.1f} tok/s/user at best (meeting TTFT)"
        reasons[reason] += 1
        rejected.append({"deployment": name, "mode": r["mode"], "mapping": r["mapping"], "policies": r["policies"],
                         "reason": reason, "detail": detail,
                         "best_tokens_per_s_per_gpu": float(g["tokens_per_s_per_gpu"].max())})
    rejected.sort(key=lambda r: (REASONS.index(r["reason"]), -r["best_tokens_per_s_per_gpu"]))
    return best, rejected, reasons


def _public(r: dict, pairs: dict | None = None) -> dict:
    out = {}
    for k in ROW_KEYS:
        v = r.get(k)
        out[k] = v.item() if hasattr(v, "item") else v
    if pairs is not None:
        out["jointly_achievable"] = pairs.get(_pair_key(r), [])
    return out


PAIR_KEYS = ("deployment", "prefill_replicas", "decode_replicas", "decode_batch", "verify")


def _pair_key(r) -> tuple:
    return tuple(r[k].item() if hasattr(r[k], "item") else r[k] for k in PAIR_KEYS)


def _pairs(df) -> dict:
    """Per deployment and batch, the (TTFT, TPOT) pairs one schedule achieves together — one per TTFT step;
    a row's own pair is among them, and the best TTFT and the best TPOT of different steps are each a
    bound but not a pair."""
    out: dict = {}
    cols = list(PAIR_KEYS) + ["ttft_step", "ttft_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s_per_gpu"]
    for r in df[cols].itertuples(index=False):
        d = r._asdict()
        out.setdefault(_pair_key(d), []).append({k: d[k] for k in cols[len(PAIR_KEYS):]})
    return out
