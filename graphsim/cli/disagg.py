"""``graphsim disagg``: a prefill pool and a decode pool with their own mappings; TTFT, ITL, tokens/s per GPU
and per user, and the Pareto frontier when several decode mappings or batches are given."""
from __future__ import annotations

import re

from ..core.errors import GraphsimError

def parse_mapping(text: str):
    """``tp=4,dp=8,ep=32`` or ``tp4-dp8-ep32`` -> ParallelMapping (:meth:`graphsim.core.plan.ParallelMapping.parse`)."""
    from ..core.plan import ParallelMapping

    return ParallelMapping.parse(text)


def register(sub) -> None:
    from .app import _view_args, add_command, model_hw_args, output_args

    p = add_command(sub, "disagg", help="disaggregated prefill/decode pools: TTFT, ITL, tokens/s per GPU and user",
                    description="A prefill pool and a decode pool, each with its own mapping, batch and replicas; "
                                "the KV handover\nbetween them over a link. Reports TTFT, ITL, tokens/s per GPU "
                                "and per user, the bottleneck pool,\nand the Pareto frontier when several decode "
                                "mappings or batches are given.",
                    examples=["graphsim disagg --model deepseek-v3 --hw gb200 --isl 4096 --osl 1024 --prefill "
                              "tp=4,ep=4 --decode tp=4,ep=4 --decode-batch 16,64,256",
                              "graphsim disagg --model deepseek-v4.1-flash --isl 8192 --osl 1024 --prefill dp=8,ep=8 "
                              "--decode tp4-ep4 --decode tp=8,ep=8 --kv global+swa --json -o disagg.json"])
    model_hw_args(p, weights=False)
    g = p.add_argument_group("requests")
    g.add_argument("--isl", type=int, required=True, metavar="TOKENS", help="prompt tokens per request")
    g.add_argument("--osl", type=int, required=True, metavar="TOKENS", help="output tokens per request")
    g = p.add_argument_group("pools", "MAPPING: tp=4,dp=8,ep=32 or tp4-dp8-ep32 (axes tp, dp, ep, pp, cp; default 1)")
    g.add_argument("--prefill", required=True, metavar="MAPPING", help="the prefill pool's mapping, e.g. dp=32,ep=32")
    g.add_argument("--prefill-batch", type=int, default=1, metavar="N",
                   help="prompts per prefill forward per replica (default 1)")
    g.add_argument("--prefill-replicas", type=int, default=1, metavar="N",
                   help="prefill pool replicas of that mapping (default 1)")
    g.add_argument("--decode", action="append", required=True, metavar="MAPPING",
                   help="a decode pool mapping (repeatable: each is a point of the sweep)")
    g.add_argument("--decode-batch", default="64", metavar="N[,N...]",
                   help="requests per decode replica; a comma list sweeps (default 64)")
    g.add_argument("--decode-replicas", type=int, default=1, metavar="N",
                   help="decode pool replicas of each mapping (default 1)")
    g = p.add_argument_group("policies")
    g.add_argument("--kv", default="global", choices=("global", "global+swa"),
                   help="what the handover sends: the global KV cache (with unfinished compression groups), or "
                        "also the SWA window (DeepSeek-V4)")
    g.add_argument("--link", default="scaleout", choices=("scaleout", "nvlink"),
                   help="the handover link between the pools: scale-out NICs or NVLink (one domain)")
    g.add_argument("--overlap", default="none", choices=("none", "serial", "two-batch"),
                   help="none = one batch per forward, collectives overlapping independent compute; serial = no "
                        "overlap inside the batch; two-batch = two micro-batches hiding each other's "
                        "communication")
    _view_args(p)
    output_args(p)
    p.set_defaults(fn=run)


def disagg_json(a, res, best) -> dict:
    """The keys of ``disagg --json`` (docs/json.md): every point, flagged when it is on the Pareto frontier, and
    the frontier as indices into the points."""
    def rec(r) -> dict:
        d = r.to_dict()
        return {"prefill_mapping": d["prefill_mapping"], "prefill_gpus": d["prefill_gpus"],
                "prefill_batch": d["prefill_batch"], "prefill_replicas": r.prefill.replicas,
                "decode_mapping": d["decode_mapping"], "decode_gpus": d["decode_gpus"],
                "decode_batch": d["decode_batch"], "decode_replicas": r.decode.replicas, "gpus": r.gpus,
                "kv_bytes": d["kv_bytes"], "prefill_s": d["prefill_s"], "transfer_s": d["transfer_s"],
                "ttft_s": d["ttft_s"], "itl_s": d["itl_s"], "prefill_requests_per_s": d["prefill_rate"],
                "decode_requests_per_s": d["decode_rate"], "bottleneck": d["bottleneck"],
                "tokens_per_s_per_gpu": d["tokens_per_s_per_gpu"],
                "input_tokens_per_s_per_gpu": d["input_tokens_per_s_per_gpu"],
                "tokens_per_s_per_user": d["tokens_per_s_per_user"], "pareto": r in best}

    return {"model": a.model, "hw": a.hw, "isl_tokens": a.isl, "osl_tokens": a.osl, "kv": a.kv, "link": a.link,
            "view": a.view, "backend": a.backend, "points": [rec(r) for r in res],
            "frontier": [i for i, r in enumerate(res) if r in best]}


def run(a) -> None:
    from .app import int_list, view_spec
    from ..serving.disagg import Pool, frontier, sweep
    from ..core.outputs import check_output, emit, json_document
    from ..driver.pipeline import Policies

    check_output(a.output)
    pol = Policies(overlap=a.overlap)
    pre = Pool(parse_mapping(a.prefill), a.prefill_batch, a.prefill_replicas, pol)
    decs = [Pool(parse_mapping(d), b, a.decode_replicas, pol) for d in a.decode
            for b in int_list(a.decode_batch, "decode_batch")]

    res = sweep(a.model, a.hw, [pre], decs, isl=a.isl, osl=a.osl, kv=a.kv, link=a.link, profile=a.profile,
                view=view_spec(a))
    best = frontier(res)
    if a.json:
        emit(a.output, json_document("disagg", disagg_json(a, res, best)) + "\n", "JSON")
        return
    view = f"; {a.view} view on {a.backend} tables" if a.view != "sol" else ""
    lines = [f"graphsim disagg {a.model} on {a.hw}: ISL {a.isl}, OSL {a.osl}, KV {a.kv} over {a.link}{view}",
             f"{'decode mapping':<22}{'batch':>7}{'GPUs':>6}{'TTFT ms':>10}{'xfer ms':>9}{'ITL ms':>9}"
             f"{'tok/s/user':>12}{'tok/s/GPU':>11}  bound  pareto"]
    for r in res:
        lines.append(f"{str(r.decode.mapping):<22}{r.decode.batch:>7}{r.gpus:>6}{r.ttft_s * 1e3:>10.2f}"
                     f"{r.transfer_s * 1e3:>9.3f}{r.itl_s * 1e3:>9.2f}{r.tokens_per_s_per_user:>12.1f}"
                     f"{r.tokens_per_s_per_gpu:>11.1f}  {r.bottleneck:<7}{'*' if r in best else ''}")
    emit(a.output, "\n".join(lines) + "\n", "text")
