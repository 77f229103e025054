"""``graphsim fit``: memory per device for a mapping, whether a batch at a context fits, the largest decode
batch at that context and the largest context for the batch; Engram in HBM and on host side by side."""
from __future__ import annotations

import json

GiB = 2.0**30


def register(sub) -> None:
    p = sub.add_parser("fit", help="memory per device: fits or not, largest batch and context")
    p.add_argument("--model", required=True, help="shipped model name, a config.json path or a checkpoint directory")
    from .cli import _model_args

    _model_args(p)
    p.add_argument("--hw", default="gb200", help="hardware descriptor name or TOML path (default gb200)")
    for ax in ("tp", "dp", "ep", "pp", "cp"):
        p.add_argument(f"--{ax}", type=int, default=1)
    p.add_argument("--context", type=int, default=131072, help="tokens per request (default 131072)")
    p.add_argument("--batch", type=int, default=1, help="decode requests in the replica (default 1)")
    p.add_argument("--reserve-gib", type=float, default=None,
                   help="runtime reserve per GPU in GiB (default graphsim.fit.DEFAULT_RESERVE_GIB)")
    p.add_argument("--engram", default="both", choices=("both", "hbm", "host"),
                   help="Engram table residency to report (default both, when the model has tables)")
    p.add_argument("--dspark", default="off", choices=("off", "on"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=run)


def run(a) -> None:
    from . import ParallelMapping, Policies, load_hw
    from .fit import DEFAULT_RESERVE_GIB, MemoryModel

    from .cli import load_model_args

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
        print(json.dumps([{"engram": m, **r.to_dict(), "max_batch": b, "max_context": c, "context_cap": cap}
                          for m, r, b, c, cap in rows], indent=2, default=float))
        return
    print(_text(model.name, hw, mapping, a, reserve, rows, table_bytes))


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
