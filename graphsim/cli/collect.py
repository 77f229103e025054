"""``graphsim collect ops`` (time graphsim's op families into measured tables) and ``graphsim collect
forward`` (run compiled plans as JAX programs and time whole forwards into FPM samples); docs/fpm.md."""
from __future__ import annotations


def cmd_collect(a) -> None:
    from ..core.errors import GraphsimError

    if a.what == "ops":
        from ..views.collect.ops import collect_ops

        if not a.hw:
            raise GraphsimError("hw", "required: the descriptor of this device (graphsim hw probe -o local.toml)")
        collect_ops(a.hw, a.output, families=a.family or None, quick=a.quick, warmup=a.warmup, reps=a.reps,
                    log=print)
        return
    if a.what == "forward":
        from ..views.collect.forward import collect_forward, parse_grid

        if not a.model:
            raise GraphsimError("model", "required: a config.json path or shipped model name (--model)")
        if not a.grid:
            raise GraphsimError("grid", "required: the request mixes to time, e.g. 'decode:128,512x1,4;prefill:64x1,2'")
        if not a.hw:
            raise GraphsimError("hw", "required: the descriptor SOL is priced on (graphsim hw probe -o local.toml)")
        from ..driver.pipeline import Policies

        policies = Policies(decoder_replay=a.decoder_replay, fusion=a.fusion, dspark=a.dspark)
        collect_forward(a.model, parse_grid(a.grid), a.hw, a.output, warmup=a.warmup, reps=a.reps, seed=a.seed,
                        mapping=(a.tp, a.dp, a.ep, a.pp, a.cp), weights=a.weights, policies=policies, log=print)
        return
    raise GraphsimError("what", f"must be ops or forward, got {a.what!r}")


def register(sub) -> None:
    from .app import add_command

    p = add_command(sub, "collect", help="time this device: op tables (collect ops) or whole forwards of compiled "
                    "plans (collect forward)",
                    description="Time this machine's default JAX device (docs/fpm.md, docs/measured.md): `collect "
                                "ops` times graphsim's\nop families into measured tables (--view op|hybrid); "
                                "`collect forward` runs compiled plans as JAX programs\nand times whole forwards "
                                "into FPM samples (graphsim fpm fit).",
                    examples=["graphsim collect ops --hw local.toml --quick -o tables",
                              "graphsim collect forward --model deepseek-v3 --hw local.toml --grid "
                              "'decode:128,512x1,4' -o samples.parquet"])
    g = p.add_argument_group("what")
    g.add_argument("what", choices=("ops", "forward"),
                   help="ops: op-family tables; forward: whole forwards of compiled plans")
    g.add_argument("--hw", default=None, help="this device's descriptor (graphsim hw probe -o local.toml)")
    g = p.add_argument_group("timing")
    g.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed calls before timing (after compilation)")
    g.add_argument("--reps", type=int, default=5, metavar="N", help="timed calls per point (the median is the sample)")
    g.add_argument("--quick", action="store_true", help="ops: a small grid (a minute on 2 cores)")
    g.add_argument("--family", action="append", default=[], help="ops: only this table family (repeatable)")
    g = p.add_argument_group("forward: the plans")
    g.add_argument("--model", default=None, help="forward: a config.json path or a shipped model name")
    g.add_argument("--weights", default=None, help="forward: override the checkpoint's weight format")
    g.add_argument("--grid", default=None, metavar="SPEC",
                   help="forward: request mixes, ';'-separated; each KIND:LENS[xCOUNTS][@CACHED] groups joined by "
                        "'+', lists comma-separated (a cartesian product), e.g. 'decode:128,512x1,4;prefill:64x2' "
                        "(or a file with one mix per line)")
    g.add_argument("--seed", type=int, default=0, help="forward: random weights and token ids")
    for ax in ("tp", "dp", "ep", "pp", "cp"):
        g.add_argument(f"--{ax}", type=int, default=1, metavar="N", help=f"forward: {ax} degree (one device runs 1)")
    g.add_argument("--decoder-replay", default="off", choices=("off", "sglang", "paper"),
                   help="forward: DeepSeek-V4.1 decoder bounded replay of prefills (as graphsim estimate)")
    g.add_argument("--fusion", default="unfused", choices=("unfused", "two-pass", "single-pass"),
                   help="forward: mHC fusion profile of the graph that runs (as graphsim estimate)")
    g.add_argument("--dspark", default="off", choices=("off", "on"),
                   help="forward: DSpark speculative decoding (DeepSeek-V4.1)")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", required=True, metavar="DIR|FILE",
                   help="ops: folder of measured tables; forward: the samples file (.parquet)")
    p.set_defaults(fn=cmd_collect)
