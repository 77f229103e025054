"""``graphsim sweep SPEC -o results.parquet``: run a sweep spec (TOML/YAML/JSON) to Parquet or CSV."""
from __future__ import annotations

import sys


def cmd_sweep(a) -> None:
    from .sweep import SweepSpec, run

    spec = SweepSpec.load(a.spec)
    if a.chunk or a.precision:
        import attrs

        spec = attrs.evolve(spec, chunk=a.chunk or spec.chunk, precision=a.precision or spec.precision)
    progress = a.progress if a.progress is not None else sys.stderr.isatty()
    r = run(spec, a.output, executor=a.executor, address=a.address, progress=progress, resume=not a.fresh,
            jobs=a.jobs)
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
    p = sub.add_parser("sweep", help="run a sweep spec: one row per what-if point, to Parquet or CSV")
    p.add_argument("spec", help="sweep spec (.toml, .yaml or .json)")
    p.add_argument("-o", "--output", required=True, help="results file (.parquet or .csv); re-running resumes")
    p.add_argument("--executor", choices=("local", "processes", "ray"), default="local",
                   help="processes runs structural points on local worker processes (--jobs); ray distributes "
                        "them over a Ray cluster (pip install 'graphsim[ray]')")
    p.add_argument("--jobs", type=_jobs, default=None,
                   help="worker processes for --executor processes (default: one per CPU)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--chunk", type=int, default=None, help="points per vectorized call (bounds memory)")
    p.add_argument("--precision", choices=("exact", "fast"), default=None,
                   help="exact: float64 (default); fast: float32, relative error below 1e-5")
    p.add_argument("--fresh", action="store_true", help="ignore finished parts in the output and start over")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="show a progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(fn=cmd_sweep)
