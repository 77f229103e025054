"""``graphsim plot``: pictures of a sweep's results, or of one plan (roofline, op kinds).

    graphsim plot results.parquet --kind pareto --marker profile -o pareto.png
    graphsim plot results.parquet --kind latency --where "mapping == 'tp4-dp1-ep4-pp1'" -o lat.png
    graphsim plot --kind roofline --model deepseek-v3 --tp 4 --ep 4 --request decode:4096x64 -o roof.png
    graphsim plot results.parquet --kind roofline --row 3 -o roof.png
"""
from __future__ import annotations

import sys

from ..core.errors import GraphsimError

KINDS = ("latency", "pareto", "kinds", "memory", "roofline")


def cmd_plot(a) -> None:
    from ..exports import plots
    from ..core.outputs import output_path

    output_path(a.output, suffixes=plots.IMAGE_SUFFIXES)  # before any work: a device, a directory, a wrong type

    if a.row is not None and (a.kind != "roofline" or a.results is None):
        raise GraphsimError("row", "--row picks the results row whose roofline to draw: give a results file and "
                            "--kind roofline")
    if a.kind != "pareto" and (a.y or a.color or a.marker):
        raise GraphsimError("kind", "--y, --color and --marker shape the pareto plot; give --kind pareto")
    if a.results is None:
        if a.kind not in ("roofline", "kinds"):
            raise GraphsimError("results", f"--kind {a.kind} plots a sweep: give the results file")
        if not a.model or not a.request:
            raise GraphsimError("model", "give a results file, or --model and --request to plot one plan")
        from .app import _compile

        c = _compile(a)
        if a.kind == "roofline":
            path = plots.plot_roofline(c.schedule(), a.output, title=a.title or f"roofline: {c.model.name} on "
                                       f"{c.hw.name} {c.plan.mapping} [{', '.join(map(str, c.plan.requests))}]")
        else:
            path = plots.plot_kinds(c.report(), a.output, title=a.title)
    else:
        if a.kind == "roofline" and a.row is None:
            raise GraphsimError("row", "a roofline is one plan's: give --row I (the row of the results, after "
                                "--where, whose plan to rebuild), or --model/--request instead of a file")
        from ..exports.filters import apply_filter
        from ..sweep import read_results

        df = read_results(a.results)
        if a.where is not None:
            df = apply_filter(df, a.where)  # an empty selection is an error naming the filter
        if a.kind == "roofline":
            print(f"wrote {_row_roofline(df, a, plots)}")
            return
        notes: list = []
        kw = {"where": None, "title": a.title, "notes": notes}
        if a.kind in ("latency", "memory") and a.x:
            kw["x"] = a.x
        if a.kind == "pareto":
            kw.update({k: v for k, v in (("x", a.x), ("y", a.y), ("color", a.color), ("marker", a.marker)) if v})
            kw.update({k: None for k in ("color", "marker") if kw.get(k) == "none"})
        path = plots.PLOTS[a.kind](df, a.output, **kw)
        for n in notes:  # what the picture leaves out, never silently
            print(f"graphsim: note: {n}", file=sys.stderr)
    print(f"wrote {path}")


def _row_roofline(df, a, plots) -> str:
    """The roofline of results row ``a.row`` (its position after --where): its plan rebuilt from its identity
    columns, scheduled at its inputs and rates (graphsim.sweep.rows)."""
    from ..sweep.rows import row_schedule

    if not -len(df) <= a.row < len(df):
        raise GraphsimError("row", f"the table has {len(df):,} row(s){' after --where' if a.where else ''}; "
                            f"--row is 0..{len(df) - 1}, got {a.row}")
    row = df.iloc[a.row].to_dict()
    c, schedule = row_schedule(row)
    ins = [f"{k}={v:g}" for k, v in row.items() if plots._INPUT.match(str(k)) and isinstance(v, (int, float))
           and v == v]
    title = a.title or (f"roofline of row {a.row}: {row['model']} on {row['hw']} {c.plan.mapping} [{row['requests']}]"
                        f" {row.get('profile') or 'SOL'}, view {row.get('view') or 'sol'}\n{' '.join(ins)}")
    return plots.plot_roofline(schedule, a.output, title=title)


def register(sub) -> None:
    from .app import _plan_args, add_command

    p = add_command(
        sub, "plot", help="plot sweep results (latency, pareto, kinds, memory) or a plan's roofline",
        description="Pictures of a results table from graphsim sweep (or search): latency vs context by stage, "
                    "the Pareto\nfront of throughput per GPU vs per user, busy time by op kind, memory per device; "
                    "or of one plan\n(roofline, op kinds). Axes are labelled with their units, each op kind has one "
                    "colour in every plot,\nlegends sit outside the axes. The Pareto plot colours points by "
                    "mapping (--color) and shapes them\nby profile or view (--marker), with one front per marker "
                    "series.",
        examples=["graphsim plot results.parquet --kind pareto --marker profile -o pareto.png",
                  "graphsim plot results.parquet --kind latency --where \"mapping == 'tp4-dp1-ep4-pp1'\" -o lat.png",
                  "graphsim plot --kind roofline --model deepseek-v3 --tp 4 --ep 4 --request decode:4096x64 "
                  "-o roof.png"])
    g = p.add_argument_group("what to plot")
    g.add_argument("results", nargs="?", default=None,
                   help="results file from graphsim sweep or search (.parquet/.csv); omit it to plot one plan "
                        "(--model, --request)")
    g.add_argument("--kind", choices=KINDS, required=True,
                   help="latency, pareto, kinds, memory: from a results file; roofline: of one plan, or of one "
                        "results row (--row); kinds of one plan too")
    g.add_argument("-o", "--output", required=True, metavar="FILE", help="image file (.png, .svg, .pdf, .jpg)")
    g = p.add_argument_group("rows and axes", "results-file plots; axes show known columns in their units "
                             "(forward_s in ms, *_gib in GiB, ...)")
    g.add_argument("--where", default=None, metavar="FILTER",
                   help="rows to plot: comparisons (== != < <= > >= in) of a column with a number, 'text' or "
                        "true/false, joined by and/or/not, e.g. \"decode.count == 64 and hw == 'GB200'\"")
    g.add_argument("--x", default=None, metavar="COLUMN",
                   help="x column (latency/memory default: the context/prompt axis; pareto default "
                        "tokens_per_s_per_user)")
    g.add_argument("--y", default=None, metavar="COLUMN", help="pareto: y column (default tokens_per_s_per_gpu)")
    g.add_argument("--color", default=None, metavar="COLUMN",
                   help="pareto: column colouring the points (default mapping when it varies; none: one colour)")
    g.add_argument("--marker", default=None, metavar="COLUMN",
                   help="pareto: column giving the marker shape, one Pareto front per value (default profile, "
                        "else view, when it varies; e.g. mode for a search table; none: one marker)")
    g.add_argument("--title", default=None, help="the plot's title (default: what the rows share)")
    g.add_argument("--row", type=int, default=None, metavar="I",
                   help="roofline of a results file: the row (0-based, after --where) whose plan is rebuilt from "
                        "its identity columns and drawn")
    _plan_args(p, requests=False)
    g = p.add_argument_group("one plan", "roofline, or kinds without a results file")
    g.add_argument("--request", action="append", default=None, metavar="KIND:LEN[xCOUNT][@CACHED]",
                   help="one group of identical requests of the plan to plot (repeatable), e.g. decode:4096x64")
    for act in p._actions:  # the plan arguments are optional here: a results file needs none of them
        if act.dest == "model":
            act.required = False
            act.default = None
    p.set_defaults(fn=cmd_plot)
