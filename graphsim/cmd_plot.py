"""``graphsim plot``: pictures of a sweep's results, or of one plan (roofline, op kinds).

    graphsim plot results.parquet --kind pareto -o pareto.png
    graphsim plot results.parquet --kind latency --where "mapping == 'tp4-dp1-ep4-pp1'" -o lat.png
    graphsim plot --kind roofline --model deepseek-v3 --tp 4 --ep 4 --request decode:4096x64 -o roof.png
"""
from __future__ import annotations

from .errors import GraphsimError

KINDS = ("latency", "pareto", "kinds", "memory", "roofline")


def cmd_plot(a) -> None:
    from .exports import plots

    if a.results is None:
        if a.kind not in ("roofline", "kinds"):
            raise GraphsimError("results", f"--kind {a.kind} plots a sweep: give the results file")
        if not a.model or not a.request:
            raise GraphsimError("model", "give a results file, or --model and --request to plot one plan")
        from .cli import _compile

        c = _compile(a)
        if a.kind == "roofline":
            path = plots.plot_roofline(c.schedule(), a.output, title=f"roofline: {c.model.name} on {c.hw.name} "
                                       f"{c.plan.mapping} [{', '.join(map(str, c.plan.requests))}]")
        else:
            path = plots.plot_kinds(c.report(), a.output)
    else:
        if a.kind == "roofline":
            raise GraphsimError("kind", "a roofline needs one plan's schedule: use --model/--request, not a results file")
        from .outputs import output_path
        from .sweep import read_results

        output_path(a.output, suffixes=plots.IMAGE_SUFFIXES)  # before reading anything
        df = read_results(a.results)
        kw = {"where": a.where}
        if a.kind in ("latency", "memory") and a.x:
            kw["x"] = a.x
        if a.kind == "pareto":
            kw.update({k: v for k, v in (("x", a.x), ("y", a.y), ("color", a.color)) if v})
        path = plots.PLOTS[a.kind](df, a.output, **kw)
    print(f"wrote {path}")


def register(sub) -> None:
    from .cli import _plan_args

    p = sub.add_parser("plot", help="plot sweep results (latency, pareto, kinds, memory) or a plan's roofline")
    p.add_argument("results", nargs="?", default=None, help="results file from `graphsim sweep` (.parquet/.csv)")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
    p.add_argument("--x", default=None, help="x column (default: the context/prompt axis; pareto: per-user tok/s)")
    p.add_argument("--y", default=None, help="y column (pareto; default tokens_per_s_per_gpu)")
    p.add_argument("--color", default=None, help="column colouring the pareto scatter (default mapping)")
    p.add_argument("--where", default=None,
                   help="rows to plot: comparisons (== != < <= > >= in) of a column with a number, 'text' or "
                        "true/false, joined by and/or/not, e.g. \"decode.count == 64 and hw == 'GB200'\"")
    _plan_args(p, requests=False)
    p.add_argument("--request", action="append", default=None, metavar="KIND:LEN[xCOUNT][@CACHED]",
                   help="plan to plot (roofline / kinds without a results file)")
    for act in p._actions:  # the plan arguments are optional here: a results file needs none of them
        if act.dest == "model":
            act.required = False
            act.default = None
    p.set_defaults(fn=cmd_plot)
