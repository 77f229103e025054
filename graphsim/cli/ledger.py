"""`graphsim ledger`: token×layer totals per stage and request under the replay policies."""
from __future__ import annotations


def register(sub) -> None:
    from .app import add_command, output_args

    p = add_command(sub, "ledger", help="exact tokens per (request, stage, layer) under the plan's policies",
                    description="Token x layer accounting: how many tokens every (request, stage, layer) runs "
                                "under the replay policies\n(and chunked prefill), summed per request and stage; "
                                "no timing.",
                    examples=["graphsim ledger --model deepseek-v4.1-flash --request prefill:300 --request "
                              "decode:8192x4 --decoder-replay sglang",
                              "graphsim ledger --model deepseek-v3 --request prefill:4096 --chunk 1024 --layers",
                              "graphsim ledger --model llama-3.1-70b --request prefill:2048 --json -o ledger.json"])
    g = p.add_argument_group("model")
    g.add_argument("--model", required=True,
                   help="shipped model name (graphsim models), a config.json path or a checkpoint directory")
    g = p.add_argument_group("requests")
    g.add_argument("--request", action="append", required=True, metavar="KIND:LEN[xCOUNT][@CACHED[/noswa]]",
                   help="one group of identical requests (repeatable), e.g. prefill:2048 or decode:4096x8; "
                        "/noswa: a prefix hit without its SWA cache")
    g.add_argument("--chunk", type=int, default=None, metavar="TOKENS",
                   help="chunked prefill: tokens per forward step")
    g = p.add_argument_group("policies")
    g.add_argument("--decoder-replay", default="off", choices=("off", "sglang", "paper"),
                   help="DeepSeek-V4.1 decoder bounded replay: off = every layer runs every token; sglang = "
                        "layers 21-39 on each request's last 128 tokens; paper = the whole decoder on them")
    g.add_argument("--encoder-replay", default="on", choices=("on", "off"),
                   help="a prefix hit without its SWA cache: on = replay the last 128 cached tokens; off = "
                        "recompute the hit")
    g = p.add_argument_group("view")
    g.add_argument("--layers", action="store_true", help="text: also print every (step, request, stage, layer) row")
    output_args(p)
    p.set_defaults(fn=cmd_ledger)


def ledger_json(led, a) -> dict:
    """The keys of ``ledger --json`` (docs/json.md): every row, and the sums per (request, stage)."""
    return {"model": a.model, "decoder_replay": a.decoder_replay, "encoder_replay": a.encoder_replay,
            "chunk_tokens": a.chunk or 0,
            "rows": [{"step": r.step, "request": r.request, "count": r.count, "stage": r.stage, "layer": r.layer,
                      "token_set": r.token_set, "tokens_per_request": r.tokens_per_request, "tokens": r.tokens}
                     for r in led.rows],
            "by_stage": [{"request": req, "stage": s, "tokens": n} for req, d in led.by_stage().items()
                         for s, n in d.items()],
            "trunk_tokens": led.trunk_total(), "total_tokens": led.total()}


def cmd_ledger(a) -> None:
    from ..driver.ledger import ledger
    from ..core.outputs import check_output, emit, json_document
    from ..driver.pipeline import Policies

    check_output(a.output)
    led = ledger(a.model, a.request, Policies(decoder_replay=a.decoder_replay, encoder_replay=a.encoder_replay),
                 chunk=a.chunk)
    if a.json:
        emit(a.output, json_document("ledger", ledger_json(led, a)) + "\n", "JSON")
        return
    by = led.by_stage()
    stages = list(dict.fromkeys(r.stage for r in led.rows))
    lines = [f"token x layer per stage (decoder_replay={a.decoder_replay}, encoder_replay={a.encoder_replay}"
             + (f", chunk={a.chunk}" if a.chunk else "") + ")",
             f"{'request':<28}" + "".join(f"{s:>14}" for s in stages) + f"{'trunk':>14}"]
    for req, d in by.items():
        lines.append(f"{req:<28}" + "".join(f"{d.get(s, 0):>14,}" for s in stages) + f"{led.trunk_total(req):>14,}")
    lines.append(f"{'all':<28}" + "".join(f"{led.total([s]):>14,}" for s in stages) + f"{led.trunk_total():>14,}")
    if a.layers:
        for r in led.rows:
            lines.append(f"  step {r.step} {r.request:<24} {r.stage:<10} layer {r.layer!s:>4} {r.token_set:<10} "
                         f"{r.count} x {r.tokens_per_request:,}")
    emit(a.output, "\n".join(lines) + "\n", "text")
