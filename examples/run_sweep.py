"""Run examples/sweep_spec.toml and draw the three pictures an inference engineer looks at first.

    python examples/run_sweep.py [OUT_DIR] [--small]

writes OUT_DIR/results.parquet, latency.png (time vs context by stage), pareto.png (throughput per GPU vs
per user, with the frontier) and memory.png (memory per device vs context, with the HBM line).
``--small`` (or GRAPHSIM_EXAMPLE_SMALL=1) keeps two values per axis: what the test suite runs.
"""
import os
import sys
from pathlib import Path

import attrs

from graphsim.exports import plots
from graphsim.sweep import SweepSpec, run

HERE = Path(__file__).resolve().parent


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    small = "--small" in args or os.environ.get("GRAPHSIM_EXAMPLE_SMALL") == "1"
    args = [a for a in args if a != "--small"]
    out = Path(args[0] if args else "out")
    out.mkdir(parents=True, exist_ok=True)
    spec = SweepSpec.load(HERE / "sweep_spec.toml")
    if small:  # first and last value of each axis: same columns, a few points
        spec = attrs.evolve(spec, axes=tuple(attrs.evolve(a, values=(a.values[0], a.values[-1])) for a in spec.axes))
    result = run(spec, out / "results.parquet", resume=False, progress=sys.stderr.isatty())
    df = result.to_pandas()
    ok = df[df["error"].isna()]
    best = ok.loc[ok["tokens_per_s_per_gpu"][ok["fits"]].idxmax()] if ok["fits"].any() else None
    print(f"{result.rows:,} points ({result.point_errors} point errors, {result.structural_errors} structural) "
          f"in {result.seconds:.1f} s -> {result.path}")
    if best is not None:
        print(f"best tokens/s/GPU that fits: {best['tokens_per_s_per_gpu']:,.0f} at {best['mapping']}, "
              f"batch {best['decode.count']:.0f}, context {best['decode.context']:.0f}, "
              f"HBM {best['hw.hbm_bw'] / 1e12:.1f} TB/s ({best['tokens_per_s_per_user']:.1f} tok/s per user)")
    x = "decode.context"
    # Lines need the other inputs fixed: the datasheet bandwidth at speed of light (and, for latency, one batch);
    # plots.slice_rows fixes whatever is still varying at its first value and says so in the title.
    where = f"`hw.hbm_bw` == {spec.axes[-1].values[0]} and profile == 'SOL'"
    batch = 256 if 256 in spec.axes[0].values else spec.axes[0].values[-1]
    for name, fn, kw in (("latency", plots.plot_latency, {"x": x, "where": f"{where} and `decode.count` == {batch}"}),
                         ("pareto", plots.plot_pareto, {"where": where}),
                         ("memory", plots.plot_memory, {"x": x, "where": where})):
        print("wrote", fn(df, out / f"{name}.png", **kw))
    return df


if __name__ == "__main__":
    main()
