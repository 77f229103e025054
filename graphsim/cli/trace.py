"""``graphsim trace --model ... --request ... -o trace.json``: a Perfetto / Chrome trace of one plan."""
from __future__ import annotations


def cmd_trace(a) -> None:
    from ..core.outputs import output_path

    output_path(a.output)  # before the work
    from .app import _compile
    from ..exports.trace import trace_of, write_trace

    c = _compile(a)
    t = trace_of(c)
    write_trace(t, a.output)
    n = sum(1 for e in t["traceEvents"] if e["ph"] == "X")
    print(f"wrote {a.output} ({n} slices; open in ui.perfetto.dev or chrome://tracing)")


def register(sub) -> None:
    from .app import _plan_args, add_command

    p = add_command(sub, "trace", help="Perfetto/Chrome trace JSON of a plan's schedule (tracks per stream)",
                    description="One plan's schedule as a Perfetto / Chrome trace: one track per stream (compute, "
                                "communication,\ncopies), a slice per op with its cost terms. Open it in "
                                "ui.perfetto.dev or chrome://tracing.",
                    examples=["graphsim trace --model deepseek-v4.1-flash --request decode:8192x64 --tp 4 "
                              "--overlap two-batch -o trace.json",
                              "graphsim trace --model llama-3.1-70b --hw h200 --tp 8 --request prefill:4096 -o t.json"])
    _plan_args(p)
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file (.json)")
    p.set_defaults(fn=cmd_trace)
