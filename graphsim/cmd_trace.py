"""``graphsim trace --model ... --request ... -o trace.json``: a Perfetto / Chrome trace of one plan."""
from __future__ import annotations


def cmd_trace(a) -> None:
    from .outputs import output_path

    output_path(a.output)  # before the work
    from .cli import _compile
    from .exports.trace import trace_of, write_trace

    c = _compile(a)
    t = trace_of(c)
    write_trace(t, a.output)
    n = sum(1 for e in t["traceEvents"] if e["ph"] == "X")
    print(f"wrote {a.output} ({n} slices; open in ui.perfetto.dev or chrome://tracing)")


def register(sub) -> None:
    from .cli import _plan_args

    p = sub.add_parser("trace", help="Perfetto/Chrome trace JSON of a plan's schedule (tracks per stream)")
    _plan_args(p)
    p.add_argument("-o", "--output", required=True, help="trace file (.json)")
    p.set_defaults(fn=cmd_trace)
