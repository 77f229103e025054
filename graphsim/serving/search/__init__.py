"""Find the best deployment: an SLA-constrained search over aggregated and disaggregated serving, parallel
mappings, batch sizes and the model's policies, with the Pareto front of tokens/s per GPU against tokens/s
per user.

The serving model (docs/search.md says the same, with the launch-flag table):

* **traffic**: request classes (ISL, OSL, weight); one class from ``isl``/``osl``. Decode runs at the
  token-weighted mean context Σw·osl·(isl + osl/2) / Σw·osl; memory holds the steady-state occupancy: a
  slot's position is uniform over [isl, isl + osl], so the n requests of a DP rank are held at
  mean + kv_margin·σ/√n each (:meth:`Traffic.memory_context`);
* **aggregated** (``agg``): ``gpus // n`` replicas of an ``n``-GPU mapping, each running ``B`` requests. A
  new prompt is prefilled whole in one step *together with* the running decodes (mixed batches: vLLM's
  chunked prefill, SGLang's mixed chunks), so prefill and decode share each weight read — the fastest
  schedule, as a SOL must assume. Per step every request gets E tokens (1, or the expected emitted tokens of
  speculative decoding), so f = B·E/(ōsl·dp) of the steps carry one prompt per DP group:
  step = (1 − f)·T_dec(B) + f·T_mix(B, dp prompts) (f > 1: steps carry dp·⌊f⌋ or dp·⌈f⌉ prompts),
  TPOT = step / E, TTFT = T_mix (no queueing), output tokens/s per GPU = B / TPOT / n; a prefill-only step
  and a lone prompt are the other TTFT steps, each a row with the TPOT its schedule reaches
  (:func:`agg_schedules`), and TPOT p99 is the spike when more than 1 % of the steps prefill;
* **disaggregated** (``disagg``): ``x`` prefill replicas (``p`` prompts per forward) and ``y`` decode
  replicas (``B`` requests) with x·n_p + y·n_d ≤ the GPUs (as :mod:`graphsim.serving.disagg`): TTFT = T_pre(p) + the
  KV hand-over (streamed layer by layer, over NVLink inside a domain), TPOT = T_dec(B)/E, system rate =
  min(x·p/T_pre, y·B·E/(ōsl·T_dec)) requests/s, tokens/s per
  GPU over the GPUs used. For each pair of pools and batch, the replica counts near rate balance (and the
  most decode replicas that fit) are tried and the best tokens/s per GPU kept (fewest GPUs on a tie: TTFT and
  TPOT do not depend on the counts);
* every forward time is graphsim's (the view and profile the search runs under), evaluated for all batch
  sizes of a (kind, mapping, policies) program in one vectorized call; each program is compiled once.

The policy space is searched in two stages, neither of which looks at the SLA (it only ranks): every mapping
under the base policies (the first value of each policy axis) — where memory decides, with the residency and
sharding values that may rescue it, so memory is checked after them —, then, for the pools of the best
deployments along the front, every single-axis variant of their policies on the front plus every combination
of the values that reach it (``exhaustive=True``: the whole product). Speculative decoding
(MTP, DSpark) enters only with an acceptance profile: its throughput is E[emitted tokens] / step time, never
a fixed rate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import attrs
import numpy as np

from ...core.errors import GraphsimError, require
from ...core.limits import MAX_RANKS, check_int, check_number
from ...core.plan import Plan, Policies  # noqa: F401 (re-exported)
from ...driver.pipeline import compile_plan, policy_text  # noqa: F401 (re-exported)
from ...driver.views import view_name
from ..engines import kernels  # noqa: F401 (re-exported: a step's kernels, the engines' host terms)
from ..launch import SGLANG_POLICY_FLAGS, VLLM_POLICY_FLAGS, launch_flags  # noqa: F401 (re-exported)
from .cache import _Cache
from .evaluate import _Search  # noqa: F401 (re-exported)
from .rank import (SearchResult, _assemble, _ckey, _combos, _lead_key, _leaders, _misses, _pairs, _public, _rank,
                   _rescue, _spec_text, _variants, _with_sol, pareto_flags, start_twin)
from .space import (DEFAULT_BATCHES, DEFAULT_KV_MARGIN, DEFAULT_PREFILL_BATCHES, MEMORY_AXES, MODES,  # noqa: F401
                    ROW_KEYS, SLA, SOL_COLUMNS, TWIN_KEYS, Space, Traffic, mappings, policies_of, policy_axes)


def search(model, hw, *, gpus: int, traffic: Traffic, sla: SLA = SLA(), space: Space = Space(), top: int = 5,
           profile=None, view=None, reserve_gib: float | None = None, cache_dir: str | Path | None = None,
           progress: Callable[[int], None] | None = None, jobs: int = 1, engine: str | None = "auto",
           engine_set: tuple = (), executor: str = "local", address: str | None = None) -> SearchResult:
    """Search deployments of ``model`` on ``gpus`` GPUs of ``hw`` for ``traffic`` under ``sla``; the best
    ``top`` deployments (by output tokens/s per GPU among those meeting the SLA), the Pareto front and why the
    others lost. ``cache_dir`` keeps every evaluated program (a rerun resumes from it). ``progress(n)`` is called
    as programs are evaluated; if it has ``expect(n)``, that is called first with how many more are planned.
    ``jobs`` > 1 evaluates programs on that many spawned worker processes (the same results; a script using it
    needs the ``if __name__ == "__main__":`` guard, as for any spawned process).

    What is evaluated never depends on the SLA (it only ranks): a bound added to the SLA never hides a row
    that meets it. ``engine`` ("auto", "none", "sglang", "vllm", "trtllm"): whose documented memory rule and KV
    paging decide which batches fit (graphsim.serving); "auto" is the measured view's backend framework, none in
    the SOL view (a bound keeps every byte). A *prediction* (a measured view or a profile) also runs each step
    as its engine does (:mod:`graphsim.serving.engines`): decode batches within its requests and tokens per DP rank,
    prompts over its token budget in chunks (each a forward with the earlier chunks as ``past``; TTFT their sum),
    and a step's host time (kernel launches or a CUDA graph replay, the exposed scheduler); the SOL view and the
    SOL twin never pay those. ``engine_set``: ``FIELD=VALUE`` strings overriding the engine's documented terms.
    ``executor``: "local" (``jobs`` processes on this machine) or "ray" (a Ray cluster at ``address``, default a
    local instance): the same programs, so the same rows."""
    import pandas as pd

    from ..fit import DEFAULT_RESERVE_GIB
    from ...hw import load_hw, load_profile
    from ...models import load_model

    t0 = time.perf_counter()
    check_int("gpus", gpus, 1, MAX_RANKS)
    check_int("top", top, 1, 10_000)
    require(isinstance(traffic, Traffic), "traffic", "a graphsim.serving.search.Traffic")
    model = load_model(model) if isinstance(model, str) else model
    hw = load_hw(hw) if isinstance(hw, str) else hw
    profile = load_profile(profile) if isinstance(profile, str) else profile
    reserve = DEFAULT_RESERVE_GIB if reserve_gib is None else reserve_gib
    check_number("reserve_gib", reserve, 0.0, 1 << 20)
    check_int("jobs", jobs, 1, 1024)
    require(executor in ("local", "ray"), "executor", f"must be local or ray, got {executor!r}")
    terms = _engine(engine, view)
    require(not engine_set or terms is not None, "engine_set", "sets an engine's terms: choose an engine (--engine "
            "sglang|vllm|trtllm, or a measured view whose backend has one)")
    if terms is not None:  # the GPU's tier of each default computed at launch, then the user's settings
        terms = terms.on(hw.hbm_capacity_bytes).with_settings(engine_set)
    s = _Search(model, hw, gpus, traffic, sla, space, profile, view, reserve,
                _Cache(Path(cache_dir) if cache_dir else None), progress, jobs, terms, executor, address)
    axes = policy_axes(model, space)
    base = {f: v[0] for f, v in axes}
    dec_maps = mappings(model, hw, gpus, space, "decode")
    pre_maps = mappings(model, hw, gpus, space, "prefill") if "disagg" in space.modes else []
    require(bool(dec_maps), "gpus", f"no mapping of {model.name} fits the space on {gpus} GPUs "
            "(check --tp/--dp/--ep/--pp and the model's head/expert counts)")
    s.agg_maps = [m for m in dec_maps if m.gpus <= gpus] if "agg" in space.modes else []
    s.dd_maps = [m for m in dec_maps if m.gpus < gpus] if pre_maps else []
    s.pp_maps = pre_maps if s.dd_maps else []
    start_twin(s, view, profile)
    # stage 1: every mapping under the base policies; where memory decides, the residency values that may
    # rescue it (memory is checked after them)
    work = {("dec", m): [base] for m in dict.fromkeys(s.agg_maps + s.dd_maps)}
    work.update({("pre", m): [base] for m in s.pp_maps})
    rows = _assemble(s, work)
    rescue = {k: c for k, c in ((k, _rescue(s, k, base, axes)) for k in work) if c}
    rows += _assemble(s, rescue)
    choices = {_ckey(base)} | {_ckey(c) for cs in rescue.values() for c in cs}
    # stage 2: the mappings of the best deployments along the front, every single-axis variant of their
    # policies (or every combination), then every combination of the values that reach the front
    if space.refine and len(axes):
        leaders = _leaders(rows, space.refine, axes)
        stage2 = {k: _variants(axes, starts, space.exhaustive) for k, starts in leaders.items()}
        extra = _assemble(s, stage2)
        lead = [r for r in rows + extra if _lead_key(r) & set(leaders)]
        starts = [c for cs in leaders.values() for c in cs]
        combos = _combos(lead, axes, starts, {c for cs in stage2.values() for c in map(_ckey, cs)} | choices)
        extra += _assemble(s, {k: combos for k in leaders})
        rows += extra
        choices |= {_ckey(c) for cs in stage2.values() for c in cs} | {_ckey(c) for c in combos}
    if not rows:
        why = "; ".join(sorted({x["error"] for x in s.skipped}))[:300] or (
            "disaggregated serving needs a prefill and a decode pool: a decode mapping smaller than --gpus and a "
            "prefill mapping in what is left" if space.modes == ("disagg",) else "no mapping fits the space")
        if s.serving is not None and not s.skipped:
            sv = s.serving
            why = (f"{sv.name} runs no step of this traffic within its limits (step_tokens={sv.step_tokens}, "
                   f"chunked_prefill={str(sv.chunked_prefill).lower()}, max_running={sv.max_running}; the longest "
                   f"prompt has {max(traffic.isl)} tokens): --engine-set changes them")
        raise GraphsimError("search", f"no deployment could be evaluated: {why}")
    df = pd.DataFrame(rows)
    df["deployment"] = df["mode"] + " " + df["mapping"] + " [" + df["policies"] + "]"
    df = df.drop_duplicates(["deployment", "prefill_batch", "decode_batch", "verify", "ttft_step"]) \
        .reset_index(drop=True)
    df = _with_sol(df, s, view, profile)
    miss = _misses(df, sla)
    df["meets_sla"] = ~np.any([miss[k] for k in miss], axis=0)
    why = np.full(len(df), "", dtype=object)
    for k in reversed(list(miss)):  # the first bound missed, memory first
        why = np.where(miss[k], k, why)
    df["why"] = why
    ok_front = df["fits"] & ~np.asarray(miss["ttft"], dtype=bool)
    flags = np.zeros(len(df), dtype=bool)
    if ok_front.any():
        idx = np.flatnonzero(ok_front.to_numpy())
        flags[idx] = pareto_flags(df["tokens_per_s_per_user"].to_numpy()[idx],
                                  df["tokens_per_s_per_gpu"].to_numpy()[idx])
    df["pareto"] = flags
    df["bound"] = "lower" if view is None and profile is None else "estimate"
    best, rejected, reasons = _rank(df, top, "tpot_p99_ms" if sla.tpot_stat == "p99" else "tpot_ms")
    public = [k for k in ROW_KEYS] + ["why"]
    table = df[public].copy()
    for k, v in (("model", model.name), ("hw", hw.name), ("view", view_name(view)),
                 ("profile", profile.name if profile else "sol")):
        table[k] = v
    pairs = _pairs(df)
    pareto = [_public(r, pairs) for r in df[df["pareto"]].sort_values("tokens_per_s_per_user").to_dict("records")]
    best_rows = []
    for i, r in enumerate(best):
        d = _public(r, pairs)
        d["rank"] = i + 1
        pol = attrs.asdict(r["_policies"])
        pol["algorithms"] = [{"collective": c, "algorithm": a} for c, a in pol["algorithms"]]
        pol["acceptance"] = list(pol["acceptance"])
        d["policy_values"] = pol  # every policy field, as estimate's identity.policies (docs/json.md)
        d["speculative"] = _spec_text(r["_policies"])
        d["launch"] = launch_flags(model, r, traffic=traffic, terms=terms, hbm_bytes=hw.hbm_capacity_bytes)
        best_rows.append(d)
    space_d = {"modes": list(space.modes), "decode_mappings": len(dec_maps), "prefill_mappings": len(pre_maps),
               "batches_per_dp_rank": list(space.batches), "prefill_batches_per_dp_rank": list(space.prefill_batches),
               "policy_axes": [{"field": f, "values": list(v)} for f, v in axes],
               "memory_axes": [f for f, _ in axes if f in MEMORY_AXES], "policy_points": len(choices),
               "refine": space.refine, "exhaustive": space.exhaustive, "acceptance": list(space.acceptance),
               "nvlink_domain": hw.nvlink_domain, "engine": terms.name if terms else "none",
               "engine_terms": terms.to_dict() if terms else None,
               "engine_steps": "priced" if s.serving is not None else ("memory only" if terms else "none")}
    stats = {"programs_compiled": s.compiled, "programs_cached": s.cached, "rows": len(df),
             "sol_programs_compiled": s.twin_compiled,
             "rows_meeting_sla": int(df["meets_sla"].sum()), "pareto_points": int(df["pareto"].sum()),
             "wall_s": time.perf_counter() - t0}
    return SearchResult(model.name, hw.name, gpus, traffic, sla, view_name(view),
                        profile.name if profile else "sol", table, best_rows, pareto, rejected, reasons,
                        sorted(s.skipped, key=lambda x: (x["what"], x["error"])),
                        space_d, stats)


def _engine(engine, view):
    """The engine terms a search fits batches by: "auto" = the measured view's backend framework when graphsim
    knows its documented terms, none under SOL."""
    from .. import ENGINES, engine_terms

    if engine == "auto":
        if view_name(view) == "sol" or not getattr(view, "backend", ""):
            return None
        fw = str(view.backend).split("@", 1)[0]
        return ENGINES.get(fw)
    return engine_terms(engine)


__all__ = ["SLA", "Space", "Traffic", "SearchResult", "search", "mappings", "launch_flags", "pareto_flags"]
