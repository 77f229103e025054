"""`graphsim layers --model MODEL` and `graphsim memory --model MODEL --context N` (a positional MODEL also
works): a model's layer roles and its memory (resident weights, KV capacity and KV read traffic are three
separate quantities)."""
from __future__ import annotations

from ..core.errors import GraphsimError

GiB = 2.0**30
MiB = 2.0**20


def _model_arg(p) -> None:
    """``--model NAME`` as in every other command; a positional MODEL is kept as an alias."""
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help="same as --model (kept for older scripts)")
    p.add_argument("--model", dest="model_opt", default=None,
                   help="shipped model name, a config.json path or a checkpoint directory (HF layout)")


def _resolve_model(a) -> None:
    if a.model_opt and a.model_pos and a.model_opt != a.model_pos:
        raise GraphsimError("model", f"given twice, as {a.model_pos!r} and --model {a.model_opt!r}: give one")
    a.model = a.model_opt or a.model_pos
    if not a.model:
        raise GraphsimError("model", "required: --model NAME (a shipped name, a config.json or a checkpoint folder)")


def register(sub) -> None:
    from .app import _model_args, add_command, output_args

    p = add_command(sub, "layers", help="per-layer roles: path, compress ratio, KV owner, Top-K producer, Engram",
                    description="Every trunk layer's role: its attention path (full, reindex, reuse, swa_only, local, "
                                "recurrent, none),\nthe compress ratio of its cache, whose KV and Top-K it reads, "
                                "Engram, MoE, hash routing\nand the DeepSeek-V4.1 decoder candidate pool.",
                    examples=["graphsim layers --model deepseek-v4.1-flash",
                              "graphsim layers --model deepseek-v3 --json -o layers.json"])
    g = p.add_argument_group("model")
    _model_arg(g)
    output_args(p)
    p.set_defaults(fn=cmd_layers)
    p = add_command(sub, "memory", help="resident weights by module/format, parameter counts, KV capacity and KV "
                    "read traffic",
                    description="A model's memory, independent of any mapping: resident weights by module group "
                                "and storage format,\nparameter counts (total, active per token), one request's "
                                "KV capacity at a context and the KV\nbytes one decode token reads there "
                                "(graphsim fit divides them over a mapping).",
                    examples=["graphsim memory --model deepseek-v4.1-flash --context 131072",
                              "graphsim memory --model llama-3.1-70b --context 8192 --weights nvfp4 --json"])
    g = p.add_argument_group("model")
    _model_arg(g)
    _model_args(g)
    g.add_argument("--context", type=int, required=True, metavar="TOKENS", help="tokens held per request")
    output_args(p)
    p.set_defaults(fn=cmd_memory)


#: every path ``graphsim layers`` reports (DeepSeek-V4.1's four, then the other families'): ``path_counts``
#: lists them all
LAYER_PATHS = ("swa_only", "full", "reindex", "reuse", "local", "recurrent", "none")


def layer_rows(model) -> list[dict]:
    """One record per trunk layer, the same keys for every family: the model's layer table where it has one
    (DeepSeek-V4/V4.1), else what its graph and config say (attention over every position is ``full`` with
    its own uncompressed cache, ratio 1)."""
    table = {li.layer: li for li in (model.layer_table() or ())}
    kinds: dict = {}
    for op in model.reference_graph().ops:
        if op.layer is not None:
            kinds.setdefault(op.layer, set()).add(op.kind)
    specs = getattr(getattr(model, "cfg", None), "layers", None)
    owners = model.kv_owners()
    rows = []
    for i in range(model.num_layers()):
        li, k = table.get(i), kinds.get(i, set())
        if li is not None:
            path, ratio, owner, topk = li.path, li.ratio, li.kv_owner, li.topk_producer
        else:
            mixer = getattr(specs[i], "mixer", None) if isinstance(specs, tuple) and i < len(specs) else None
            path = ("swa_only" if getattr(mixer, "window", 0) else "local" if getattr(mixer, "chunk", 0) else "full"
                    if "attention" in k else "recurrent" if "recurrent" in k else "none")
            ratio = 1 if path == "full" else 0
            owner, topk = (owners.get(i, i) if path in ("full", "swa_only", "local") else None), None
        rows.append({"layer": i, "stage": getattr(li, "stage", "trunk"), "path": path, "ratio": ratio,
                     "kv_owner": owner, "topk_producer": topk, "engram": bool(getattr(li, "engram", False)),
                     "moe": "moe_experts" in k, "hash_routed": bool(getattr(li, "hash_routed", False)),
                     "candidate_source": bool(getattr(li, "candidate_source", False)),
                     "candidate_limited": bool(getattr(li, "candidate_limited", False))})
    return rows


def cmd_layers(a) -> None:
    from ..models import load_model
    from ..core.outputs import check_output, emit, json_document

    _resolve_model(a)
    check_output(a.output)
    m = load_model(a.model)
    rows = layer_rows(m)
    counts = {p: sum(1 for r in rows if r["path"] == p) for p in LAYER_PATHS}
    if a.json:
        doc = {"model": m.name, "family": m.family, "layers": rows, "path_counts": counts}
        emit(a.output, json_document("layers", doc) + "\n", "JSON")
        return
    lines = [f"{'layer':>5} {'stage':<8} {'path':<9} {'ratio':>5} {'kv_owner':>8} {'topk_from':>9} {'engram':>6} "
             f"{'moe':>3} {'candidates':>10}"]
    for r in rows:
        own = "-" if r["kv_owner"] is None else r["kv_owner"]
        tk = "-" if r["topk_producer"] is None else r["topk_producer"]
        cand = "source" if r["candidate_source"] else ("pool" if r["candidate_limited"] else "")
        lines.append(f"{r['layer']:>5} {r['stage']:<8} {r['path']:<9} {r['ratio']:>5} {own!s:>8} {tk!s:>9} "
                     f"{'yes' if r['engram'] else '':>6} {'yes' if r['moe'] else '':>3} {cand:>10}")
    lines.append("paths: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    emit(a.output, "\n".join(lines) + "\n", "text")


def memory_summary(model, context: int) -> dict:
    """Weights by group and format, KV capacity for one request at ``context``, and per-token KV reads."""
    if context < 0:
        raise GraphsimError("context", f"must be >= 0, got {context}")
    by_group: dict[str, float] = {}
    by_format: dict[str, float] = {}
    params: dict[str, int] = {}
    for t in model.weights():
        by_group[t.group] = by_group.get(t.group, 0.0) + t.nbytes
        by_format[t.format.name] = by_format.get(t.format.name, 0.0) + t.nbytes
        params[t.group] = params.get(t.group, 0) + t.elems
    params_by_format: dict[str, int] = {}
    for t in model.weights():
        params_by_format[t.format.name] = params_by_format.get(t.format.name, 0) + t.elems
    counts = model.param_counts()
    quant = model.quant
    out = {"model": model.name, "family": model.family, "context": context,
           "weights": {"bytes_by_group": by_group, "bytes_by_format": by_format, "params_by_group": params,
                       "params_by_format": params_by_format,
                       "bytes_per_param_by_format": {f: by_format[f] / n for f, n in params_by_format.items() if n},
                       "quantization": quant.source if quant is not None else "model",
                       "total_bytes": sum(by_group.values()), **counts}}
    detail = model.kv_breakdown(context)
    if detail is not None:
        out["kv_capacity"] = detail
        out["kv_read_per_decode_token"] = kv_read_per_token(model, context)
    else:
        out["kv_capacity"] = {"total_bytes": model.kv_bytes(context)}
    return out


#: ``memory --json``'s KV capacity parts: every family reports them all (0 where its cache has no such part)
KV_PARTS = ("main_kv_bytes", "index_k_bytes", "global_bytes", "swa_bytes", "partial_group_bytes", "pending_bytes")


def memory_json(model, context: int) -> dict:
    """The keys of ``memory --json`` (docs/json.md), the same for every family: weights by group and by every
    storage format graphsim knows, parameter counts, one request's KV capacity in fixed parts (a family
    without a compressed cache has it all as main KV) and per layer, and one decode token's KV reads."""
    from ..core.ir import FORMATS

    d = memory_summary(model, context)
    w, kv = d["weights"], d["kv_capacity"]
    parts = {k: float(kv.get(k, 0.0)) for k in KV_PARTS}
    if model.kv_breakdown(context) is None:  # one uncompressed cache of every position
        parts["main_kv_bytes"] = parts["global_bytes"] = float(kv["total_bytes"])
    by_layer = model.kv_bytes_by_layer(context)
    reads = d.get("kv_read_per_decode_token") or kv_read_per_token(model, context)
    return {
        "model": model.name, "family": model.family, "context_tokens": context,
        "weights": {
            "total_bytes": w["total_bytes"], **{k: w[k] for k in ("total_params", "active_params_per_token",
                                                                  "active_params_with_embeddings", "shipped_params")},
            "quantization": w["quantization"],
            "by_group": [{"group": g, "bytes": v, "params": w["params_by_group"][g]}
                         for g, v in w["bytes_by_group"].items()],
            "by_format": [{"format": f, "bytes": w["bytes_by_format"].get(f, 0.0),
                           "params": w["params_by_format"].get(f, 0),
                           "bytes_per_param": w["bytes_per_param_by_format"].get(f, FORMATS[f].bytes_per_elem)}
                          for f in (*FORMATS, *(f for f in w["bytes_by_format"] if f not in FORMATS))
                          if f in FORMATS or f in w["bytes_by_format"]],
        },
        "kv_capacity": {"total_bytes": float(kv["total_bytes"]), **parts,
                        "global_entries": int(kv.get("global_entries", 0)),
                        "by_layer": [{"layer": int(i), "bytes": float(b)} for i, b in sorted(by_layer.items())]},
        "kv_read_bytes_per_decode_token": float(reads["bytes_kv"]),
    }


def kv_read_per_token(model, context: int) -> dict:
    """Cache bytes one decode token reads when the request holds ``context`` positions, its own included
    (every consumer layer reads its selection)."""
    from ..core.plan import Plan, Policies
    from ..driver.pipeline import compile_plan

    plan = Plan([f"decode:{max(context - 1, 1)}"], policies=Policies(beyond_context="allow"))
    c = compile_plan(model, plan, "gb200")
    s = c.schedule()
    from ..core.ir import COMPONENTS

    return {"bytes_kv": float(s.components[0][:, COMPONENTS.index("bytes_kv")].sum())}


def cmd_memory(a) -> None:
    from .app import load_model_args
    from ..core.outputs import check_output, emit, json_document

    _resolve_model(a)
    check_output(a.output)
    m = load_model_args(a)
    if a.json:
        emit(a.output, json_document("memory", memory_json(m, a.context)) + "\n", "JSON")
        return
    d = memory_summary(m, a.context)
    w = d["weights"]
    lines = [f"{m.name}: resident weights {w['total_bytes'] / GiB:,.2f} GiB ({w['total_params'] / 1e9:,.2f} B params, "
             f"{w['active_params_per_token'] / 1e9:,.2f} B active per token, "
             f"{w['active_params_with_embeddings'] / 1e9:,.2f} B with the embedding)"]
    for g, v in w["bytes_by_group"].items():
        lines.append(f"  {g:<8} {v / GiB:10.2f} GiB  {w['params_by_group'][g] / 1e9:8.2f} B params")
    lines.append(f"  by format ({w['quantization']}): " + ", ".join(
        f"{k} {v / GiB:.2f} GiB ({w['params_by_format'][k] / 1e9:.2f} B params, {w['bytes_per_param_by_format'][k]:.4g} B/param)"
        for k, v in w["bytes_by_format"].items()))
    kv = d["kv_capacity"]
    lines.append(f"KV capacity at {a.context:,} tokens per request: {kv['total_bytes'] / MiB:,.2f} MiB")
    if "global_entries" in kv:
        lines.append(f"  global entries {kv['global_entries']:,} -> main KV {kv['main_kv_bytes'] / MiB:,.2f} MiB + "
                     f"index K {kv['index_k_bytes'] / MiB:,.2f} MiB = {kv['global_bytes'] / MiB:,.2f} MiB")
        lines.append(f"  SWA {kv['swa_bytes'] / MiB:,.2f} MiB; partial compression groups "
                     f"{kv['partial_group_bytes']:,.0f} B")
        lines.append("KV read traffic per decode token at this context: "
                     f"{d['kv_read_per_decode_token']['bytes_kv'] / MiB:,.3f} MiB")
    emit(a.output, "\n".join(lines) + "\n", "text")
