"""`graphsim ledger`: token×layer totals per stage and request under the replay policies."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("ledger", help="exact tokens per (request, stage, layer) under the plan's policies")
    p.add_argument("--model", required=True)
    p.add_argument("--request", action="append", required=True, metavar="KIND:LEN[xCOUNT][@CACHED[/noswa]]")
    p.add_argument("--decoder-replay", default="off", choices=("off", "sglang", "paper"))
    p.add_argument("--encoder-replay", default="on", choices=("on", "off"))
    p.add_argument("--chunk", type=int, default=None, help="chunked prefill: tokens per forward step")
    p.add_argument("--layers", action="store_true", help="print every (stage, layer) row")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_ledger)


def cmd_ledger(a) -> None:
    from .ledger import ledger
    from .pipeline import Policies

    led = ledger(a.model, a.request, Policies(decoder_replay=a.decoder_replay, encoder_replay=a.encoder_replay),
                 chunk=a.chunk)
    if a.json:
        print(json.dumps(led.to_dict(), indent=2))
        return
    by = led.by_stage()
    stages = list(dict.fromkeys(r.stage for r in led.rows))
    print(f"token x layer per stage (decoder_replay={a.decoder_replay}, encoder_replay={a.encoder_replay}"
          + (f", chunk={a.chunk}" if a.chunk else "") + ")")
    print(f"{'request':<28}" + "".join(f"{s:>14}" for s in stages) + f"{'trunk':>14}")
    for req, d in by.items():
        print(f"{req:<28}" + "".join(f"{d.get(s, 0):>14,}" for s in stages) + f"{led.trunk_total(req):>14,}")
    print(f"{'all':<28}" + "".join(f"{led.total([s]):>14,}" for s in stages) + f"{led.trunk_total():>14,}")
    if a.layers:
        for r in led.rows:
            print(f"  step {r.step} {r.request:<24} {r.stage:<10} layer {r.layer!s:>4} {r.token_set:<10} "
                  f"{r.count} x {r.tokens_per_request:,}")
