"""Reports: one evaluated plan -> times, throughput, memory per device, breakdowns and the critical path."""
from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from ..core.display import text_table
from ..core.ir import COMPONENTS


@attrs.frozen
class Report:
    """Everything a user asks of one plan; ``to_dict`` is the ``--json`` form."""

    identity: dict
    forward_s: float
    stages: dict
    breakdown: dict
    layers: dict
    critical_path: list
    memory: dict
    tokens: dict
    traffic: dict
    #: measured views: per op kind SOL / view time, efficiency and sources; shares of the forward by
    #: source; SOL violations; the fallback basis (None in the SOL view)
    coverage: dict | None = None
    #: per collective and the algorithm x protocol its ops ran at this point: ops and summed time
    collectives: list = attrs.Factory(list)
    #: what the forward is — the bound itself (``sol``), or a prediction (an efficiency ``profile``, a measured
    #: view, an FPM model) — with the SOL forward of the same program beside it
    prediction: dict = attrs.Factory(dict)

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def to_json(self) -> str:
        """The ``estimate --json`` document (docs/json.md, schema_version 1); ``to_dict`` keeps the Python form."""
        from ..core.outputs import json_document

        return json_document("estimate", report_json(self))

    def __repr__(self) -> str:  # a summary line; print(report) or to_text() gives the whole report
        i, t = self.identity, self.tokens
        lat = [f"TTFT {_ms(t['ttft_s']).strip()}"] if t["prefill_tokens"] else []
        lat += [f"ITL {_ms(t['itl_s']).strip()}"] if t["decode_requests"] else []
        return (f"Report({i['model']} on {i['hw']} x{i['gpus']} {i['mapping']}: forward {_ms(self.forward_s).strip()}"
                f"{', ' if lat else ''}{', '.join(lat)}, {t['tokens_per_s_per_gpu']:,.0f} tok/s per GPU)")

    def __str__(self) -> str:
        return self.to_text()

    def _repr_html_(self, top: int = 12) -> str:  # Jupyter: what to_text says, as escaped HTML tables
        from html import escape

        from ..core.display import html_table, side_by_side

        i, t, m = self.identity, self.tokens, self.memory
        fwd = max(self.forward_s, 1e-30)
        fallbacks = i.get("precision_fallbacks") or {}
        head = (f"<p><b>graphsim {escape(i['model'])}</b> on {escape(i['hw'])} x{i['gpus']} ({escape(i['mapping'])})"
                f", view {escape(i.get('view', 'sol'))}, profile {escape(i.get('profile', 'SOL'))}<br>"
                f"requests: {escape(', '.join(i['requests']))}<br>policies: {escape(_policies_text(i['policies']))}"
                + "".join(f"<br>{escape(p)} runs at {escape(q)} on {escape(i['hw'])} (no {escape(p)} tensor rate)"
                          for p, q in fallbacks.items()) + "</p>")
        nums = [("forward", _ms(self.forward_s).strip())]
        if t["prefill_tokens"]:
            nums.append(("TTFT (prefill)", _ms(t["ttft_s"]).strip()))
        if t["decode_requests"]:
            nums += [("ITL (decode)", _ms(t["itl_s"]).strip()),
                     ("tokens/s per user", f"{t['tokens_per_s_per_user']:.1f}")]
        nums += [("tokens/s per GPU", f"{t['tokens_per_s_per_gpu']:,.0f}"),
                 ("tokens/s (replica)", f"{t['tokens_per_s']:,.0f}"),
                 ("memory per device", f"{m['total_gib']:.2f} of {m['capacity_gib']:.2f} GiB"),
                 ("fits in HBM", "yes" if m["fits"] else f"NO (over by {-m['headroom_gib']:.2f} GiB)"),
                 ("graph ops", f"{i['graph_ops']:,}")]
        memory = [*((f"weights/{k}", f"{v:.2f}") for k, v in m["weights_gib"].items()),
                  ("kv cache", f"{m['kv_gib']:.2f}"), ("workspace", f"{m['workspace_gib']:.2f}"),
                  ("runtime reserve", f"{m['reserve_gib']:.2f}"), ("total", f"{m['total_gib']:.2f}")]

        def share(s: float) -> str:
            return f"{100 * s / fwd:.1f} %"

        over = _overlap_note(sum(self.breakdown.values()), fwd)

        blocks = [
            html_table(("", "value"), nums, caption="headline", right=(1,)),
            html_table(("stage", "busy", "of forward"), [(s, _ms(v["busy_s"]).strip(), share(v["busy_s"]))
                                                         for s, v in self.stages.items()], caption="stages",
                       right=(1, 2)),
            html_table(("op kind", "busy", "of forward"), [(k, _ms(v).strip(), share(v)) for k, v in
                                                           sorted(self.breakdown.items(), key=lambda kv: -kv[1])],
                       caption="op kinds" + (f" ({over.strip()})" if over else ""), right=(1, 2)),
            html_table(("part", "GiB"), memory, caption="memory per device", right=(1,)),
        ]
        path = sorted(self.critical_path, key=lambda o: -o["duration_s"])[:top]
        crit = html_table(("op", "kind", "stage", "layer", "time", "share", "bound"),
                          [(o["name"], o["kind"], o["stage"], "" if o["layer"] is None else o["layer"],
                            _ms(o["duration_s"]).strip(), share(o["duration_s"]), o["bound"]) for o in path],
                          caption=f"critical path: top {len(path)} of {len(self.critical_path)} ops by time",
                          right=(3, 4, 5))
        cov = "<pre>" + escape("\n".join(coverage_text(self.coverage))) + "</pre>" if self.coverage else ""
        return f'<div class="graphsim-report">{head}{side_by_side(*blocks)}{cov}{crit}</div>'

    def to_text(self, top: int = 12) -> str:
        i, t, m = self.identity, self.tokens, self.memory
        lines = [
            f"graphsim {i['model']} on {i['hw']} x{i['gpus']} ({i['mapping']})",
            f"requests: {', '.join(i['requests'])}    policies: " + _policies_text(i["policies"]),
            *([f"precision fallbacks on {i['hw']}: " + ", ".join(
                f"{p} runs at {q} (no {p} tensor rate)" for p, q in i["precision_fallbacks"].items())]
              if i.get("precision_fallbacks") else []),
            "",
            f"forward          {_ms(self.forward_s)}"
            + (f"   predicted ({self.prediction['label']}); SOL {_ms(self.prediction['sol_forward_s']).strip()}"
               if self.prediction.get("source", "sol") != "sol" else "   (speed of light: a bound)"),
        ]
        if t["prefill_tokens"]:
            lines.append(f"TTFT (prefill)   {_ms(t['ttft_s'])}")
        if t["decode_requests"]:
            lines.append(f"ITL (decode)     {_ms(t['itl_s'])}   {t['tokens_per_s_per_user']:.1f} tok/s per user")
        lines.append(f"throughput       {t['tokens_per_s_per_gpu']:,.0f} tok/s per GPU  "
                     f"({t['tokens_per_s']:,.0f} tok/s for the replica)")
        if t.get("tokens_per_joule") is not None:
            lines.append(f"energy           {t['tokens_per_joule']:,.2f} tok/J at board power "
                         f"({t['energy_j']:,.2f} J per forward on {i['gpus']} GPUs at TDP: an upper bound on energy)")
        fwd = max(self.forward_s, 1e-30)
        lines += ["", *text_table(("stage", "busy", "of forward"), [(s, _ms(v["busy_s"]).strip(),
                                                                    f"{100 * v['busy_s'] / fwd:.1f} %")
                                                                   for s, v in self.stages.items()],
                                  right=(False, True, True), indent=2)]
        lines += ["", *text_table(("op kind", "busy", "of forward"),
                                  [(k, _ms(v).strip(), f"{100 * v / fwd:.1f} %")
                                   for k, v in sorted(self.breakdown.items(), key=lambda kv: -kv[1])],
                                  right=(False, True, True), indent=2)]
        if (over := _overlap_note(sum(self.breakdown.values()), fwd)):
            lines.append(over)
        if self.collectives:
            lines += ["", *text_table(("collective", "algorithm", "ops", "busy"),
                                      [(r["collective"], r["algorithm"], r["ops"], _ms(r["busy_s"]).strip())
                                       for r in self.collectives], right=(False, False, True, True), indent=2)]
        if self.coverage:
            lines += ["", *coverage_text(self.coverage)]
        lines += ["", "memory per device"]
        for k, v in m["weights_gib"].items():
            lines.append(f"  weights/{k:<9} {v:9.2f} GiB")
        lines += [f"  kv cache        {m['kv_gib']:9.2f} GiB", f"  workspace       {m['workspace_gib']:9.2f} GiB",
                  f"  runtime reserve {m['reserve_gib']:9.2f} GiB",
                  f"  total           {m['total_gib']:9.2f} GiB of {m['capacity_gib']:.2f} GiB -> "
                  + ("fits" if m["fits"] else f"does NOT fit by {-m['headroom_gib']:.2f} GiB")]
        comm = self.breakdown.get("collective", 0.0)
        if comm:  # what of the communication the schedule hides beside compute, and what stays exposed
            exposed = sum(o["duration_s"] for o in self.critical_path if o["stream"] == "comm")
            lines += ["", f"communication    {_ms(comm)} busy, {_ms(exposed).strip()} exposed on the critical path, "
                          f"{_ms(max(comm - exposed, 0.0)).strip()} hidden beside compute"]
        lines += ["", f"critical path (top {top} of {len(self.critical_path)} ops by time)"]
        lines += text_table(("op", "kind", "time", "bound", "algorithm"),
                            [(op["name"], op["kind"], _ms(op["duration_s"]).strip(), op["bound"],
                              op.get("algorithm") or "")
                             for op in sorted(self.critical_path, key=lambda o: -o["duration_s"])[:top]],
                            right=(False, False, True, False, False), indent=2)
        return "\n".join(lines)


def report_json(r: Report) -> dict:
    """The keys of ``estimate --json`` (docs/json.md): the same for every model family and view — breakdowns
    by name are lists of records, precisions and sources list every category with 0 where absent, and the
    measured-view sections are null where they do not apply."""
    from ..core.ir import PRECISIONS

    i, m, t = r.identity, r.memory, r.traffic
    pol = dict(i["policies"])
    pol["algorithms"] = [{"collective": c, "algorithm": a} for c, a in pol["algorithms"]]
    pol["acceptance"] = list(pol["acceptance"])
    fpm = r.coverage if r.coverage is not None and r.coverage.get("view") == "fpm" else None
    cov = r.coverage if r.coverage is not None and fpm is None else None
    return {
        "mode": "plan",
        "identity": {
            "model": i["model"], "hw": i["hw"], "mapping": i["mapping"], "gpus": i["gpus"],
            "requests": list(i["requests"]), "policies": pol, "profile": i["profile"], "graph_ops": i["graph_ops"],
            "view": i["view"], "backend": i.get("backend", ""),
            "precision_fallbacks": [{"precision": p, "runs_at": q} for p, q in i["precision_fallbacks"].items()],
        },
        "forward_s": r.forward_s,
        "stages": [{"stage": s, "busy_s": v["busy_s"], "start_s": v["start_s"], "end_s": v["end_s"]}
                   for s, v in r.stages.items()],
        "op_kinds": [{"kind": k, "busy_s": v} for k, v in r.breakdown.items()],
        "layers": [{"layer": int(k), "busy_s": v} for k, v in r.layers.items()],
        "critical_path": [{**{k: op[k] for k in ("name", "kind", "stage", "layer", "stream", "start_s", "duration_s",
                                                 "bound", "formula")}, "source": op.get("source", "sol"),
                           "algorithm": op.get("algorithm", "")}
                          for op in r.critical_path],
        "collectives": [dict(c) for c in r.collectives],
        "memory": {"weights_by_group": [{"group": g, "size_gib": v} for g, v in m["weights_gib"].items()],
                   **{k: v for k, v in m.items() if k != "weights_gib"}},
        "tokens": dict(r.tokens),
        "traffic": {"flops": {p: t["flops"].get(p, 0.0) for p in PRECISIONS},
                    **{f"hbm_{k}_bytes": v for k, v in t["hbm_bytes"].items()},
                    **{f"{k}_bytes": v for k, v in t["link_bytes"].items()}},
        "coverage": _coverage_json(cov) if cov is not None else None,
        "fpm": dict(fpm) if fpm is not None else None,
        "prediction": {k: r.prediction.get(k) for k in ("source", "label", "sol_forward_s", "prediction_over_sol")},
    }


def _coverage_json(cov: dict) -> dict:
    """A measured view's coverage (op / hybrid) with records for its per-kind, per-op and per-family parts."""
    from .views import SOURCE_NAMES

    return {
        "view": cov["view"], "backend": cov["backend"], "device": cov["device"],
        "sol_forward_s": cov["sol_forward_s"], "prediction_over_sol": cov["prediction_over_sol"],
        "kinds": [{"kind": k, "sol_s": v["sol_s"], "view_s": v["view_s"], "efficiency": v["efficiency"],
                   "sources": {n: v["sources"].get(n, 0) for n in SOURCE_NAMES}} for k, v in cov["kinds"].items()],
        "forward_share": {n: cov["forward_share"].get(n, 0.0) for n in SOURCE_NAMES},
        "sol_violations": [dict(v) for v in cov["sol_violations"]],
        "uncovered": [{"kind": k, "ops": u["ops"], "why": u["why"]} for k, u in cov["uncovered"].items()],
        "fallback": [{"family": f, **b} for f, b in cov["fallback"].items()],
    }


def coverage_text(cov: dict) -> list[str]:
    """The coverage table of a measured view (per op kind: SOL, view time, efficiency, sources); for the FPM
    view, the partition, the ratio to SOL and whether the point was inside the sampled coordinates."""
    if cov.get("view") == "fpm":
        e = cov["train_error"]
        dom = "in domain" if cov["domain"] == "in" else f"EXTRAPOLATED (outside the samples in {', '.join(cov['outside'])})"
        return [f"fpm view: {cov['backend']} forwards on {cov['device']}, partition {cov['partition']}",
                f"  forward = SOL {_ms(cov['sol_forward_s']).strip()} x {cov['ratio']:.3f} = "
                f"{_ms(cov['fpm_forward_s']).strip()}  [{cov['mix']} curve, {cov['samples']} samples, {dom}]",
                f"  curve: {cov['curve']}",
                f"  training error: median {100 * e['median']:.1f} %, p90 {100 * e['p90']:.1f} %, worst "
                f"{100 * e['worst']:.1f} % (held-out error: graphsim fpm eval)",
                "  stages, op kinds and the critical path below are SOL's (FPM times whole forwards)"]
    lines = [f"{cov['view']} view: {cov['backend']} tables on {cov['device']} — forward by source: "
             + ", ".join(f"{k} {100 * v:.1f} %" for k, v in cov["forward_share"].items() if v)]
    if "sol_forward_s" in cov:
        lines.append(f"  predicted forward beside its bound: SOL {_ms(cov['sol_forward_s']).strip()} "
                     f"(prediction / SOL {cov['prediction_over_sol']:.2f})")
    lines.append("op kind          SOL          view        SOL/view  sources (ops)")
    for k, v in sorted(cov["kinds"].items(), key=lambda kv: -kv[1]["view_s"]):
        src = ", ".join(f"{n} {c}" for n, c in v["sources"].items() if c)
        lines.append(f"  {k:<14} {_ms(v['sol_s'])} {_ms(v['view_s'])}  {v['efficiency']:6.3f}  {src}")
    for fam, b in cov.get("fallback", {}).items():
        lines.append(f"  fallback {fam}: {b['a_s'] * 1e6:.2f} us + {b['b']:.3f} x SOL per op (least squares over "
                     f"{b['fitted_from']}): {_ms(b['sol_s']).strip()} -> {_ms(b['view_s']).strip()}")
    if cov["sol_violations"]:
        lines.append(f"  SOL VIOLATIONS ({len(cov['sol_violations'])} ops measured below their SOL — a missing cost "
                     "or a wrong rate):")
        for v in cov["sol_violations"][:5]:
            lines.append(f"    {v['name']} ({v['kind']}): measured {_ms(v['view_s'])} < SOL {_ms(v['sol_s'])}  "
                         f"[{v['table']}]")
    if cov["uncovered"]:
        lines.append("  uncovered: " + "; ".join(f"{k} x{n['ops']}: {n['why']}" for k, n in
                                                 list(cov["uncovered"].items())[:4]))
    return lines


def _policies_text(policies: dict) -> str:
    """The policies that differ from the defaults (the JSON identity always has them all)."""
    import attrs

    from ..core.plan import Policies

    default = attrs.asdict(Policies())
    diff = [f"{k}={v}" for k, v in policies.items() if default.get(k) != v]
    return ", ".join(diff) if diff else "defaults (no replay, unfused, no overlap, Engram in HBM, DSpark off)"


def _overlap_note(busy: float, forward: float) -> str:
    """A line saying why the busy times add to more than the forward (streams run side by side), or ""."""
    if busy <= forward * (1 + 1e-9):
        return ""
    return (f"  the busy times add to {100 * busy / forward:.1f} % of the forward: streams overlap (communication "
            "and copies run beside compute)")


def _ms(s: float) -> str:
    return f"{s * 1e3:9.4f} ms" if s < 10 else f"{s:9.3f} s "


GiB = 2.0**30


def make_report(compiled, point: int = 0) -> Report:
    """Evaluate one plan at its own workload (reference path) and summarize it."""
    from .memory import DEFAULT_RESERVE_GIB, device_weights, kv_per_device

    c = compiled
    g, plan, m = c.graph, c.plan, c.plan.mapping
    wl = plan.workload()
    sched = c.schedule(wl)
    dur, start, finish = sched.duration[point], sched.start[point], sched.finish[point]
    forward = float(finish.max())
    sol_forward = forward  # the SOL view's own forward (an FPM view scales it; a profile or a measured view: below)
    fpm = c.fpm.describe(wl.point(point), np.array([forward])) if c.fpm is not None else None
    if fpm is not None:  # the FPM view: the forward is measured-and-fitted; the breakdowns stay SOL's
        forward = fpm["fpm_forward_s"]
    bounds = sched.bound(point)
    stages: dict[str, dict] = {}
    kinds: dict[str, float] = {}
    layers: dict[str, float] = {}
    for i, op in enumerate(g.ops):
        s = stages.setdefault(op.stage, {"busy_s": 0.0, "start_s": float(start[i]), "end_s": 0.0})
        s["busy_s"] += float(dur[i])
        s["start_s"] = min(s["start_s"], float(start[i]))
        s["end_s"] = max(s["end_s"], float(finish[i]))
        kinds[op.kind] = kinds.get(op.kind, 0.0) + float(dur[i])
        if op.layer is not None:
            layers[str(op.layer)] = layers.get(str(op.layer), 0.0) + float(dur[i])
    path = [
        {"name": g.ops[i].name, "kind": g.ops[i].kind, "stage": g.ops[i].stage, "layer": g.ops[i].layer,
         "stream": g.ops[i].stream, "start_s": float(start[i]), "duration_s": float(dur[i]), "bound": bounds[i],
         "formula": g.ops[i].formula, "algorithm": sched.algorithm(i, point)}
        for i in sched.critical_path(point)
    ]
    # which algorithm x protocol each collective ran at (the fastest of its alternatives at this point)
    ran: dict[tuple, list] = {}
    for i, op in enumerate(g.ops):
        if op.alts and op.cost.terms:
            r = ran.setdefault((op.info.collective or op.kind, sched.algorithm(i, point)), [0, 0.0])
            r[0] += 1
            r[1] += float(dur[i])
    collectives = [{"collective": k[0], "algorithm": k[1], "ops": v[0], "busy_s": v[1]}
                   for k, v in sorted(ran.items(), key=lambda kv: (kv[0][0], -kv[1][1]))]
    if sched.source is not None:  # a measured view: the bound is its SOL roofline's; where the time came from
        from .views import SOURCE_NAMES

        for p, i in zip(path, sched.critical_path(point)):
            p["source"] = SOURCE_NAMES[int(sched.source[point, i])]
            p["bound"] = f"{p['bound']} at SOL; {p['source']}"
    comps = sched.components[point]
    totals = dict(zip(COMPONENTS, comps.sum(axis=0).tolist()))
    # ---- tokens and throughput (the sweep metrics' definitions, at this one point)
    from .metrics import token_metrics

    wl_new = np.array([[r.new_tokens for r in plan.requests]], dtype=np.float64)
    wl_count = np.array([[r.count for r in plan.requests]], dtype=np.float64)
    tm = token_metrics(plan.kinds, wl_count, wl_new, np.array([forward]), m.gpus, plan.policies, c.hw.power_w)
    tokens = {k: float(v[0]) for k, v in tm.items()}
    for k in ("prefill_tokens", "decode_tokens", "decode_requests"):
        tokens[k] = int(round(tokens[k])) if float(tokens[k]).is_integer() else tokens[k]
    for k in ("ttft_s", "itl_s", "energy_j", "tokens_per_joule", "output_tokens_per_joule"):
        tokens[k] = None if np.isnan(tokens[k]) else tokens[k]
    reqs = plan.requests
    # ---- memory per device
    weights = device_weights(c)
    kv = sum(r.count * kv_per_device(c.model, r.past_tokens + r.new_tokens, m, plan.policies) for r in reqs)
    act = comps[:, COMPONENTS.index("bytes_act")]
    workspace = float(act.max()) if len(act) else 0.0
    reserve = DEFAULT_RESERVE_GIB * GiB
    total = weights.total + kv + workspace + reserve
    cap = c.hw.hbm_capacity_bytes
    memory = {
        "weights_gib": {k: v / GiB for k, v in weights.hbm.items()}, "weights_total_gib": weights.total / GiB,
        "engram_tables_gib": weights.tables / GiB, "engram_tables_in": plan.policies.engram,
        "kv_gib": kv / GiB, "workspace_gib": workspace / GiB, "reserve_gib": reserve / GiB, "total_gib": total / GiB,
        "capacity_gib": cap / GiB, "headroom_gib": (cap - total) / GiB, "fits": bool(total <= cap),
    }
    traffic = {
        "flops": {k[6:]: v for k, v in totals.items() if k.startswith("flops_") and v},
        "hbm_bytes": {k[6:]: totals[k] for k in ("bytes_weight", "bytes_kv", "bytes_act")},
        "link_bytes": {k[6:]: totals[k] for k in ("bytes_nvlink", "bytes_scaleout", "bytes_c2c")},
    }
    # precisions the graph computes in that this chip has no tensor rate for: they run at the next one it has
    from ..hw.descriptor import PRECISIONS

    used = sorted({op.precision for op in g.ops if op.precision in PRECISIONS}, key=PRECISIONS.index)
    fallbacks = {p: c.hw.resolve_precision(p) for p in used if c.hw.resolve_precision(p) != p}
    identity = {
        "model": c.model.name, "hw": c.hw.name, "mapping": str(m), "gpus": m.gpus,
        "requests": [str(r) for r in reqs], "policies": plan.policies.identity(),
        "profile": c.profile.name if c.profile else "SOL", "graph_ops": len(g.ops),
        "precision_fallbacks": fallbacks, "view": c.view_name,
    }
    if c.view is not None:
        identity["backend"] = c.view.backend
    cov = coverage(c, sched, point) if c.view is not None else None
    if fpm is not None:
        identity["backend"] = fpm["backend"]
        cov = fpm
    pred = _prediction(c, wl, point, forward, sol_forward, cov, fpm)
    return Report(identity, forward, stages, kinds, layers, path, memory, tokens, traffic, cov, collectives, pred)


def _prediction(c, wl, point: int, forward: float, sol_forward: float, cov, fpm) -> dict:
    """What the report's forward is and its bound: the SOL view's forward is the bound itself; a profile derates the
    same program (its SOL: the program at the descriptor's peaks, no per-op overhead); a measured view's bound is its
    coverage's SOL forward; an FPM view scales the SOL forward it was fitted on."""
    if fpm is not None:
        source, label, bound = "fpm", f"fpm model ({fpm.get('backend') or 'local'})", sol_forward
    elif cov is not None:
        source, bound = c.view_name, float(cov["sol_forward_s"])
        label = f"{c.view_name} view ({cov.get('backend') or 'measured'} tables)"
    elif c.profile is not None:
        from ..lowering.evaluate import evaluate_reference, unit_time

        source, label = "profile", f"{c.profile.name} profile"
        bound = float(evaluate_reference(c.program, wl, unit_time(c.hw.rates(None)), 0.0, None).finish[point].max())
    else:
        return {"source": "sol", "label": "speed of light (a bound)", "sol_forward_s": forward,
                "prediction_over_sol": 1.0}
    return {"source": source, "label": label, "sol_forward_s": bound,
            "prediction_over_sol": forward / bound if bound > 0 else float("nan")}


def coverage(c, sched, point: int = 0) -> dict:
    """Per op kind: SOL and view time, SOL/view and sources; the forward's critical path by source; SOL
    violations (a measured op faster than its SOL); uncovered ops and why; the fallback basis."""
    from .views import SOURCE_NAMES

    v, g = c.view, c.graph
    sol, dur, src = sched.sol_duration[point], sched.duration[point], sched.source[point]
    kinds: dict = {}
    for i, op in enumerate(g.ops):
        k = kinds.setdefault(op.kind, {"sol_s": 0.0, "view_s": 0.0, "sources": {n: 0 for n in SOURCE_NAMES}})
        k["sol_s"] += float(sol[i])
        k["view_s"] += float(dur[i])
        k["sources"][SOURCE_NAMES[int(src[i])]] += 1
    for k in kinds.values():
        k["efficiency"] = k["sol_s"] / k["view_s"] if k["view_s"] > 0 else 1.0
    path = sched.critical_path(point)
    fwd = float(sched.finish[point].max())
    share = {n: 0.0 for n in SOURCE_NAMES}
    for i in path:
        share[SOURCE_NAMES[int(src[i])]] += float(dur[i]) / fwd if fwd > 0 else 0.0
    viol = [{"name": op.name, "kind": op.kind, "sol_s": float(sol[i]), "view_s": float(dur[i]),
             "table": v.op_note[i]} for i, op in enumerate(g.ops)
            if int(src[i]) <= 2 and dur[i] < sol[i] * (1 - 1e-9)]
    unc: dict = {}
    for i, op in enumerate(g.ops):
        if v.op_source[i] != "table" and (v.op_family[i] or v.op_source[i] == "fallback"):
            u = unc.setdefault(op.kind, {"ops": 0, "why": v.op_note[i]})
            u["ops"] += 1
    from ..lowering.features import feature_matrix

    wl = c.plan.workload()
    first = np.zeros(c.program.n_classes, dtype=np.int64)
    first[c.program.op_class[::-1]] = np.arange(len(g.ops))[::-1]
    vf = (feature_matrix(v.features, g.token_set_map, wl.kinds, wl.arrays(), np) if v.features
          else np.zeros((1, 0)))
    basis = v.fallback_basis(sched.sol_duration[point:point + 1][:, first], vf[point:point + 1])
    # the bound beside the prediction: the same program scheduled at SOL (its own critical path)
    from ..lowering.evaluate import evaluate_reference

    bound = float(evaluate_reference(c.program, wl, c.unit_time(), c.overhead, None).finish[point].max())
    return {"view": v.spec.name, "backend": v.backend, "device": v.device, "kinds": kinds, "forward_share": share,
            "sol_violations": viol, "uncovered": unc, "fallback": basis, "sol_forward_s": bound,
            "prediction_over_sol": fwd / bound if bound > 0 else float("nan")}
