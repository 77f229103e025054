"""SOL -> OP -> FPM -> held-out error, end to end on this machine (a CPU is a real device with real timings).

1. probe this device into a hardware descriptor (peak GEMM per dtype, copy bandwidth, exp throughput);
2. time graphsim's op families on it into measured tables (the OP view's input);
3. run a small Llama-family model's compiled graphs as JAX programs on a training grid and on held-out
   batches / lengths / contexts (some inside the training ranges, some outside);
4. fit FPM on the training forwards, then report every view's error on the held-out forwards.

Run: ``python examples/local_fpm.py`` (a few minutes on 2 cores; ``--quick`` for a smaller grid).
The same script runs unchanged on a GPU: JAX's default device is what gets probed and timed.
Outputs land in ``./local_fpm/`` (descriptor, op tables, samples, model, report).
"""
import argparse
import pathlib
import time

from graphsim.views.collect.forward import collect_forward, parse_grid
from graphsim.views.collect.ops import collect_ops
from graphsim.views.collect.probe import probe, to_toml
from graphsim.views.fpm.evaluate import evaluate, to_text
from graphsim.views.fpm.fit import fit
from graphsim.views.measured.view import ViewSpec

HERE = pathlib.Path(__file__).resolve().parent
MODEL = str(HERE / "configs" / "tiny-llama.json")

#: training grid: decode batch x context, prefill batch x prompt, and mixed steps
TRAIN = "decode:128,1024x1,4,16;prefill:64,256x1,4;prefill:64x1+decode:512x2,8"
#: held out: in-domain points between the training values, and out-of-domain ones beyond them
HOLDOUT = ("decode:512x2;decode:256x8;prefill:128x2;prefill:64x1+decode:512x4;"  # inside the ranges
           "decode:1024x32;decode:4096x4;prefill:512x2;prefill:1024x1")           # outside
QUICK_TRAIN = "decode:128,1024x1,8;prefill:64,256x1,4"
QUICK_HOLDOUT = "decode:512x4;prefill:128x2;decode:2048x16;prefill:512x1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller grids and fewer repetitions (about a minute)")
    ap.add_argument("-o", "--out", default="local_fpm", help="output folder")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    reps = 3 if a.quick else 5

    desc = probe("local", quick=a.quick)
    hw = out / "local.toml"
    hw.write_text(to_toml(desc))
    peaks = ", ".join(f"{p} {v / 1e9:,.0f} GFLOP/s" for p, v in desc["peak_flops"].items())
    print(f"1. probed {desc['description']}: {peaks}; copy {desc['hbm_bw'] / 1e9:.1f} GB/s; "
          f"exp {desc['exp_rate'] / 1e9:.2f} G/s  -> {hw}")

    collect_ops(str(hw), str(out / "ops"), quick=True, warmup=1, reps=reps)
    print(f"2. op tables -> {out / 'ops'}")

    common = dict(warmup=1, reps=reps)
    train = collect_forward(MODEL, parse_grid(QUICK_TRAIN if a.quick else TRAIN), str(hw), out / "train.parquet", **common)
    hold = collect_forward(MODEL, parse_grid(QUICK_HOLDOUT if a.quick else HOLDOUT), str(hw), out / "holdout.parquet",
                           **common)
    print(f"3. forwards: {int((train['status'] == 'ok').sum())} training, {int((hold['status'] == 'ok').sum())} held out "
          f"(model {pathlib.Path(MODEL).name})")

    model = fit(train)
    model.save(out / "model.fpm")
    for p in model.partitions:
        for c in p.curves.values():
            print(f"4. fit {c.mix}: {c.n} samples, training error median {100 * c.train_err[0]:.1f} %")

    from graphsim.hw import load_hw
    from graphsim.models import load_model

    op_view = (load_model(MODEL), load_hw(str(hw)), ViewSpec("hybrid", str(out / "ops"), "jax"))
    rep = evaluate(model, hold, op_view=op_view)
    text = to_text(rep)
    (out / "report.txt").write_text(text + "\n")
    print()
    print(text)
    print(f"\n(done in {time.perf_counter() - t0:.0f} s; outputs in {out}/)")


if __name__ == "__main__":
    main()
