"""``graphsim fit``: memory per device for a mapping, whether a batch at a context fits, the largest decode
batch at that context and the largest context for the batch; Engram in HBM and on host side by side."""
from __future__ import annotations

GiB = 2.0**30


def register(sub) -> None:
    from .app import add_command, mapping_args, model_hw_args, output_args, reserve_arg

    p = add_command(sub, "fit", help="memory per device: fits or not, largest batch and context",
                    description="Memory per device for one mapping: weights by group, KV cache, workspace and "
                                "runtime reserve\nagainst the HBM; whether a decode batch at a context fits, the "
                                "largest batch at that context\nand the largest context for the batch. A model with "
                                "Engram tables shows them in HBM and on the host.",
                    examples=["graphsim fit --model deepseek-v4.1-flash --hw gb200 --tp 4",
                              "graphsim fit --model deepseek-v3 --hw h200 --tp 8 --context 32768 --batch 64 --json",
                              "graphsim fit --model llama-3.1-70b --hw h100 --tp 4 --pp 2 -o fit.txt"])
    model_hw_args(p, profile=False)
    mapping_args(p)
    g = p.add_argument_group("requests")
    g.add_argument("--context", type=int, default=131072, metavar="TOKENS",
                   help="tokens per request (default 131072)")
    g.add_argument("--batch", type=int, default=1, metavar="N", help="decode requests in the replica (default 1)")
    g = p.add_argument_group("policies")
    reserve_arg(g)
    g.add_argument("--engram", default="both", choices=("both", "hbm", "host"),
                   help="Engram table residency to report: hbm, host, or both side by side (default; only when "
                        "the model has tables)")
    g.add_argument("--dspark", default="off", choices=("off", "on"),
                   help="on = DSpark speculative decoding: the drafter's weights and caches count too")
    output_args(p)
    p.set_defaults(fn=run)


def run(a) -> None:
    from .. import ParallelMapping, Policies, load_hw
    from ..serving.fit import DEFAULT_RESERVE_GIB, MemoryModel

    from .app import load_model_args
    from ..core.outputs import check_output, emit, json_document

    check_output(a.output)
    model, hw = load_model_args(a), load_hw(a.hw)
    mapping = ParallelMapping(a.tp, a.dp, a.ep, a.pp, a.cp)
    reserve = DEFAULT_RESERVE_GIB if a.reserve_gib is None else a.reserve_gib
    table_bytes = sum(t.nbytes for t in model.weights() if t.role == "table")
    has_tables = table_bytes > 0
    modes = (("hbm", "host") if has_tables else ("hbm",)) if a.engram == "both" else (a.engram,)
    rows = []
    for mode in modes:
        mm = MemoryModel(model, hw, mapping, Policies(engram=mode, dspark=a.dspark), reserve_gib=reserve)
        res = mm.fit(a.batch, a.context)
        rows.append((mode, res, mm.max_batch(a.context), mm.max_context(a.batch), mm.context_cap))
    if a.json:
        doc = fit_json(model, hw, mapping, a, reserve, rows, table_bytes)
        emit(a.output, json_document("fit", doc) + "\n", "JSON")
        return
    emit(a.output, _text(model.name, hw, mapping, a, reserve, rows, table_bytes) + "\n", "text")


def fit_json(model, hw, mapping, a, reserve, rows, table_bytes) -> dict:
    """The keys of ``fit --json`` (docs/json.md): the question, then one record per Engram residency."""
    results = []
    for mode, r, b, c, cap in rows:
        results.append({
            "engram": mode, "weights_by_group": [{"group": g, "bytes": v} for g, v in r.weights.items()],
            "weights_bytes": sum(r.weights.values()), "tables_bytes": r.tables_bytes, "kv_bytes": r.kv_bytes,
            "workspace_bytes": r.workspace_bytes, "reserve_bytes": r.reserve_bytes, "total_bytes": r.total_bytes,
            "capacity_bytes": r.capacity_bytes, "headroom_bytes": r.headroom_bytes, "host_bytes": r.host_bytes,
            "host_capacity_bytes": r.host_capacity_bytes, "host_fits": r.host_fits, "fits": r.fits,
            "verdict": r.verdict(), "max_batch": b, "max_context_tokens": c, "context_cap_tokens": cap})
    return {"model": model.name, "hw": hw.name, "mapping": str(mapping), "gpus": mapping.gpus,
            "context_tokens": a.context, "batch": a.batch, "reserve_gib": reserve, "dspark": a.dspark,
            "engram_tables_bytes": float(table_bytes), "results": results}


def _text(name, hw, mapping, a, reserve, rows, table_bytes) -> str:
    has_tables = table_bytes > 0
    cols = [f"engram={m}" if has_tables else "per device" for m, *_ in rows]
    w = 16
    lines = [f"graphsim fit {name} on {hw.name} ({mapping}, {mapping.gpus} GPUs): batch {a.batch} at "
             f"{a.context:,} tokens, runtime reserve {reserve:g} GiB",
             "", f"{'per device (GiB)':<28}" + "".join(f"{c:>{w}}" for c in cols)]

    def row(label, vals):
        lines.append(f"{label:<28}" + "".join(f"{v:>{w}}" for v in vals))

    groups = list(dict.fromkeys(g for _, r, *_ in rows for g in r.weights))
    for g in groups:
        row(f"weights/{g}", [f"{r.weights.get(g, 0.0) / GiB:.2f}" for _, r, *_ in rows])
    if has_tables:
        row("  of which Engram tables", [f"{(r.tables_bytes if m == 'hbm' else 0) / GiB:.2f}" for m, r, *_ in rows])
    row("kv cache", [f"{r.kv_bytes / GiB:.2f}" for _, r, *_ in rows])
    row("workspace", [f"{r.workspace_bytes / GiB:.2f}" for _, r, *_ in rows])
    row("runtime reserve", [f"{r.reserve_bytes / GiB:.2f}" for _, r, *_ in rows])
    row("total", [f"{r.total_bytes / GiB:.2f}" for _, r, *_ in rows])
    row("HBM capacity", [f"{r.capacity_bytes / GiB:.2f}" for _, r, *_ in rows])
    if has_tables:
        row("host: Engram tables", [f"{r.host_bytes / GiB:.2f}" for _, r, *_ in rows])
        row("host memory share", [f"{r.host_capacity_bytes / GiB:.2f}" for _, r, *_ in rows])
    lines.append("")
    for m, r, b, c, cap in rows:
        tag = f"engram={m}: " if has_tables else ""
        ctx = f"{c:,}" + (" (the model's maximum)" if c >= cap else "")
        lines.append(f"{tag}{r.verdict()}; largest decode batch at {a.context:,} tokens: {b:,}"
                     + (f" ({b / mapping.dp:,.0f} per DP rank)" if mapping.dp > 1 else "")
                     + f"; largest context at batch {a.batch}: {ctx}")
    if has_tables:
        lines.append(f"Engram tables, whole model: {table_bytes / GiB:.2f} GiB, rows sharded over tp={mapping.tp}")
    return "\n".join(lines)
