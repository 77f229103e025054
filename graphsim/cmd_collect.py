"""``graphsim collect ops`` (time graphsim's op families into measured tables) and ``graphsim collect
forward`` (run compiled plans as JAX programs and time whole forwards into FPM samples); docs/fpm.md."""
from __future__ import annotations


def cmd_collect(a) -> None:
    from .errors import GraphsimError

    if a.what == "ops":
        from .collect.ops import collect_ops

        if not a.hw:
            raise GraphsimError("hw", "required: the descriptor of this device (graphsim hw probe -o local.toml)")
        collect_ops(a.hw, a.output, families=a.family or None, quick=a.quick, warmup=a.warmup, reps=a.reps,
                    log=print)
        return
    if a.what == "forward":
        from .collect.forward import collect_forward, parse_grid

        if not a.model:
            raise GraphsimError("model", "required: a config.json path or shipped model name (--model)")
        if not a.grid:
            raise GraphsimError("grid", "required: the request mixes to time, e.g. 'decode:128,512x1,4;prefill:64x1,2'")
        if not a.hw:
            raise GraphsimError("hw", "required: the descriptor SOL is priced on (graphsim hw probe -o local.toml)")
        collect_forward(a.model, parse_grid(a.grid), a.hw, a.output, warmup=a.warmup, reps=a.reps, seed=a.seed,
                        mapping=(a.tp, a.dp, a.ep, a.pp, a.cp), weights=a.weights, log=print)
        return
    raise GraphsimError("what", f"must be ops or forward, got {a.what!r}")


def register(sub) -> None:
    p = sub.add_parser("collect", help="time this device: op tables (collect ops) or whole forwards of compiled "
                       "plans (collect forward)")
    p.add_argument("what", choices=("ops", "forward"))
    p.add_argument("--hw", default=None, help="this device's descriptor (graphsim hw probe -o local.toml)")
    p.add_argument("-o", "--output", required=True,
                   help="ops: folder of measured tables; forward: the samples file (.parquet)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls before timing (after compilation)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per point (the median is the sample)")
    p.add_argument("--quick", action="store_true", help="ops: a small grid (a minute on 2 cores)")
    p.add_argument("--family", action="append", default=[], help="ops: only this table family (repeatable)")
    p.add_argument("--model", default=None, help="forward: a config.json path or a shipped model name")
    p.add_argument("--weights", default=None, help="forward: override the checkpoint's weight format")
    p.add_argument("--grid", default=None, metavar="SPEC",
                   help="forward: request mixes, ';'-separated; each KIND:LENS[xCOUNTS][@CACHED] groups joined by "
                        "'+', lists comma-separated (a cartesian product), e.g. 'decode:128,512x1,4;prefill:64x2' "
                        "(or a file with one mix per line)")
    p.add_argument("--seed", type=int, default=0, help="forward: random weights and token ids")
    for ax in ("tp", "dp", "ep", "pp", "cp"):
        p.add_argument(f"--{ax}", type=int, default=1, help=f"forward: {ax} degree (one device runs 1)")
    p.set_defaults(fn=cmd_collect)
