"""`graphsim layers --model MODEL` and `graphsim memory --model MODEL --context N` (a positional MODEL also
works): a model's layer roles and its memory (resident weights, KV capacity and KV read traffic are three
separate quantities)."""
from __future__ import annotations

import json

import attrs

from .errors import GraphsimError

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
    p = sub.add_parser("layers", help="per-layer roles: path, compress ratio, KV owner, Top-K producer, Engram")
    _model_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_layers)
    p = sub.add_parser("memory", help="resident weights by module/format, parameter counts, KV capacity and KV "
                       "read traffic")
    _model_arg(p)
    p.add_argument("--context", type=int, required=True, help="tokens held per request")
    from .cli import _model_args

    _model_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_memory)


def _v41(name):
    from .models import load_model

    m = load_model(name)
    if m.layer_table() is None:
        raise GraphsimError("model", f"{name!r} has no CSA2 layer table (supported: deepseek-v4.1-flash, deepseek-v4-flash)")
    return m


def cmd_layers(a) -> None:
    _resolve_model(a)
    m = _v41(a.model)
    rows = [attrs.asdict(li) for li in m.layers]
    for r, li in zip(rows, m.layers):
        r["path"] = li.path
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'layer':>5} {'stage':<8} {'path':<9} {'ratio':>5} {'kv_owner':>8} {'topk_from':>9} {'engram':>6} {'candidates':>10}")
    for li in m.layers:
        own = "-" if li.kv_owner is None else li.kv_owner
        tk = "-" if li.topk_producer is None else li.topk_producer
        stage = getattr(li, "stage", "trunk")
        cand = "source" if getattr(li, "candidate_source", False) else ("pool" if getattr(li, "candidate_limited", False) else "")
        print(f"{li.layer:>5} {stage:<8} {li.path:<9} {li.ratio:>5} {own!s:>8} {tk!s:>9} "
              f"{'yes' if getattr(li, 'engram', False) else '':>6} {cand:>10}")
    counts = {}
    for li in m.layers:
        counts[li.path] = counts.get(li.path, 0) + 1
    print("paths: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


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


def kv_read_per_token(model, context: int) -> dict:
    """Cache bytes one decode token reads when the request holds ``context`` positions, its own included
    (every consumer layer reads its selection)."""
    import graphsim as gs

    c = gs.compile_plan(model, gs.Plan([f"decode:{max(context - 1, 1)}"]), "gb200")
    s = c.schedule()
    from .ir import COMPONENTS

    return {"bytes_kv": float(s.components[0][:, COMPONENTS.index("bytes_kv")].sum())}


def cmd_memory(a) -> None:
    from .cli import load_model_args

    _resolve_model(a)
    m = load_model_args(a)
    d = memory_summary(m, a.context)
    if a.json:
        print(json.dumps(d, indent=2))
        return
    w = d["weights"]
    print(f"{m.name}: resident weights {w['total_bytes'] / GiB:,.2f} GiB ({w['total_params'] / 1e9:,.2f} B params, "
          f"{w['active_params_per_token'] / 1e9:,.2f} B active per token, "
          f"{w['active_params_with_embeddings'] / 1e9:,.2f} B with the embedding)")
    for g, v in w["bytes_by_group"].items():
        print(f"  {g:<8} {v / GiB:10.2f} GiB  {w['params_by_group'][g] / 1e9:8.2f} B params")
    print(f"  by format ({w['quantization']}): " + ", ".join(
        f"{k} {v / GiB:.2f} GiB ({w['params_by_format'][k] / 1e9:.2f} B params, {w['bytes_per_param_by_format'][k]:.4g} B/param)"
        for k, v in w["bytes_by_format"].items()))
    kv = d["kv_capacity"]
    print(f"KV capacity at {a.context:,} tokens per request: {kv['total_bytes'] / MiB:,.2f} MiB")
    if "global_entries" in kv:
        print(f"  global entries {kv['global_entries']:,} -> main KV {kv['main_kv_bytes'] / MiB:,.2f} MiB + index K "
              f"{kv['index_k_bytes'] / MiB:,.2f} MiB = {kv['global_bytes'] / MiB:,.2f} MiB")
        print(f"  SWA {kv['swa_bytes'] / MiB:,.2f} MiB; partial compression groups {kv['partial_group_bytes']:,.0f} B")
        print(f"KV read traffic per decode token at this context: {d['kv_read_per_decode_token']['bytes_kv'] / MiB:,.3f} MiB")
