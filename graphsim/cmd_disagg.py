"""``graphsim disagg``: a prefill pool and a decode pool with their own mappings; TTFT, ITL, tokens/s per GPU
and per user, and the Pareto frontier when several decode mappings or batches are given."""
from __future__ import annotations

import json
import re

from .errors import GraphsimError

_AX = re.compile(r"(tp|dp|ep|pp|cp)=?(\d+)")


def parse_mapping(text: str):
    """``tp=4,dp=8,ep=32`` or ``tp4-dp8-ep32`` -> ParallelMapping."""
    from .plan import ParallelMapping

    parts = [p for p in re.split(r"[,\-\s]+", text.strip()) if p]
    axes = {}
    for p in parts:
        m = _AX.fullmatch(p)
        if not m:
            raise GraphsimError("mapping", f"{p!r} in {text!r} is not AXIS=N with AXIS in tp, dp, ep, pp, cp")
        axes[m.group(1)] = int(m.group(2))
    return ParallelMapping(**axes)


def _ints(text: str, field: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise GraphsimError(field, f"{text!r} is not a comma-separated list of integers") from None


def register(sub) -> None:
    from .cli import _view_args

    p = sub.add_parser("disagg", help="disaggregated prefill/decode pools: TTFT, ITL, tokens/s per GPU and user")
    p.add_argument("--model", required=True)
    p.add_argument("--hw", default="gb200")
    p.add_argument("--profile", default=None, help="efficiency profile (default: SOL)")
    p.add_argument("--isl", type=int, required=True, help="prompt tokens per request")
    p.add_argument("--osl", type=int, required=True, help="output tokens per request")
    p.add_argument("--prefill", required=True, help="prefill mapping, e.g. dp=32,ep=32")
    p.add_argument("--prefill-batch", type=int, default=1, help="prompts per prefill forward per replica")
    p.add_argument("--prefill-replicas", type=int, default=1)
    p.add_argument("--decode", action="append", required=True, help="decode mapping (repeatable)")
    p.add_argument("--decode-batch", default="64", help="requests per decode replica; comma list sweeps")
    p.add_argument("--decode-replicas", type=int, default=1)
    p.add_argument("--kv", default="global", choices=("global", "global+swa"))
    p.add_argument("--link", default="scaleout", choices=("scaleout", "nvlink"))
    p.add_argument("--overlap", default="none", choices=("none", "two-batch"))
    _view_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=run)


def run(a) -> None:
    from .disagg import Pool, frontier, sweep
    from .pipeline import Policies

    pol = Policies(overlap=a.overlap)
    pre = Pool(parse_mapping(a.prefill), a.prefill_batch, a.prefill_replicas, pol)
    decs = [Pool(parse_mapping(d), b, a.decode_replicas, pol) for d in a.decode
            for b in _ints(a.decode_batch, "decode-batch")]
    from .cli import view_spec

    res = sweep(a.model, a.hw, [pre], decs, isl=a.isl, osl=a.osl, kv=a.kv, link=a.link, profile=a.profile,
                view=view_spec(a))
    best = frontier(res)
    if a.json:
        print(json.dumps({"view": a.view, "backend": a.backend, "points": [r.to_dict() for r in res],
                          "frontier": [r.to_dict() for r in best]}, indent=2, default=float))
        return
    view = f"; {a.view} view on {a.backend} tables" if a.view != "sol" else ""
    print(f"graphsim disagg {a.model} on {a.hw}: ISL {a.isl}, OSL {a.osl}, KV {a.kv} over {a.link}{view}")
    print(f"{'decode mapping':<22}{'batch':>7}{'GPUs':>6}{'TTFT ms':>10}{'xfer ms':>9}{'ITL ms':>9}"
          f"{'tok/s/user':>12}{'tok/s/GPU':>11}  bound  pareto")
    for r in res:
        print(f"{str(r.decode.mapping):<22}{r.decode.batch:>7}{r.gpus:>6}{r.ttft_s * 1e3:>10.2f}"
              f"{r.transfer_s * 1e3:>9.3f}{r.itl_s * 1e3:>9.2f}{r.tokens_per_s_per_user:>12.1f}"
              f"{r.tokens_per_s_per_gpu:>11.1f}  {r.bottleneck:<7}{'*' if r in best else ''}")
