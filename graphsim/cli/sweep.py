"""``graphsim sweep SPEC -o results.parquet``: run a sweep spec (TOML/YAML/JSON) to Parquet or CSV."""
from __future__ import annotations

import sys


def cmd_sweep(a) -> None:
    from ..sweep import SweepSpec, run

    spec = SweepSpec.load(a.spec)
    if a.chunk or a.precision:
        import attrs

        spec = attrs.evolve(spec, chunk=a.chunk or spec.chunk, precision=a.precision or spec.precision)
    progress = a.progress if a.progress is not None else sys.stderr.isatty()
    r = run(spec, a.output, executor=a.executor, address=a.address, progress=progress, resume=not a.fresh,
            jobs=a.jobs)
    for key, why in r.recomputed:
        print(f"recomputed {key}: {why}")
    print(f"wrote {r.path}: {r.rows:,} rows from {r.structural_points} structural points "
          f"({r.skipped} already done, {r.structural_errors} structural errors, {r.point_errors:,} point errors) "
          f"in {r.seconds:.1f} s")


def _jobs(text: str) -> int:
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return n


def register(sub) -> None:
    from .app import add_command

    p = add_command(sub, "sweep", help="run a sweep spec: one row per what-if point, to Parquet or CSV",
                    description="Run a sweep spec (TOML, YAML or JSON; see examples/ and the README): every "
                                "structural point is\ncompiled once and its axes evaluated as one vectorized "
                                "call; one row per point to Parquet or CSV.\nRe-running resumes from the "
                                "finished parts.",
                    examples=["graphsim sweep examples/sweep_spec.toml -o results.parquet",
                              "graphsim sweep spec.toml -o results.csv --executor processes --jobs 4 --no-progress"])
    g = p.add_argument_group("spec")
    g.add_argument("spec", help="sweep spec (.toml, .yaml or .json)")
    g.add_argument("--chunk", type=int, default=None, metavar="N", help="points per vectorized call (bounds memory)")
    g.add_argument("--precision", choices=("exact", "fast"), default=None,
                   help="exact: float64 (default); fast: float32, relative error below 1e-5")
    g = p.add_argument_group("execution")
    g.add_argument("--executor", choices=("local", "processes", "ray"), default="local",
                   help="local: this process; processes: structural points on local worker processes (--jobs); "
                        "ray: over a Ray cluster (pip install 'graphsim[ray]')")
    g.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                   help="worker processes for --executor processes (default: one per CPU)")
    g.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="results file (.parquet or .csv); re-running resumes")
    g.add_argument("--fresh", action="store_true", help="ignore finished parts in the output and start over")
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    p.set_defaults(fn=cmd_sweep)
