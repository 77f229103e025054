"""Rebuild the measured-table fixture the tests use (so CI needs no aiconfigurator wheel).

    python -m pip download --no-deps aiconfigurator-core -d /tmp/aic && unzip -q /tmp/aic/*.whl -d /tmp/aic/x
    graphsim measured import aiconfigurator --from /tmp/aic/x --system gb200 --system h200_sxm -o /tmp/meas
    python tests/data/measured/make_fixture.py /tmp/meas       # both fixtures (fmha(): tests/data/measured_fmha)

It compiles the test plans in the hybrid view against the full import and keeps, of every partition a lookup
chose, the rows at the lookup's categorical coordinates and its neighbouring measured values of the
interpolated fixed ones (all values of the varying ones) — plus the TRT-LLM collectives. Rows are NVIDIA's
(Apache-2.0, see NOTICE.md beside the tables).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent
PLANS = [  # (model, hw, tp, ep, requests, backend)
    ("deepseek-v3", "gb200", 4, 4, ["decode:1024x16"], "trtllm@1.3.0rc20"),
    ("deepseek-v3", "gb200", 4, 4, ["prefill:2048x2"], "trtllm@1.3.0rc20"),
    ("deepseek-v3", "gb200", 8, 8, ["decode:4096x64"], "trtllm@1.3.0rc20"),
    ("deepseek-v3", "h200", 8, 8, ["decode:1024x16"], "trtllm@1.3.0rc20"),
    ("deepseek-v4.1-flash", "gb200", 4, 4, ["decode:1024x16"], "trtllm@1.3.0rc20"),
]


def main(full: str) -> None:
    import graphsim as gs
    from graphsim.views.measured.schema import FAMILIES
    from graphsim.views.measured.view import ViewSpec

    keep: dict = {}  # partition source file -> row mask
    for model, hw, tp, ep, reqs, backend in PLANS:
        c = gs.compile_plan(model, gs.Plan(reqs, gs.ParallelMapping(tp=tp, ep=ep)), hw,
                            view=ViewSpec("hybrid", full, backend))
        for cv, lk in c.view.curves.values():
            p = cv.partition
            fam = FAMILIES[p.family]
            sel = np.ones(len(p.t), dtype=bool)
            for j, name in enumerate(p.coords):
                fixed = dict(lk.fixed)
                if name not in fixed:
                    continue
                col = p.x[:, j]
                if name in fam.exact:
                    sel &= col == fixed[name]
                else:
                    vals = np.unique(col)
                    lo = vals[vals <= fixed[name]].max(initial=vals.min())
                    hi = vals[vals >= fixed[name]].min(initial=vals.max())
                    sel &= (col == lo) | (col == hi)
            keep.setdefault(p.identity["source"], []).append((p.identity, sel, p))
    out = HERE
    n = 0
    for src, items in keep.items():
        rel = src.split("systems/data/", 1)[1]
        system, family, fw, ver, fname = rel.split("/")
        ident, _, p0 = items[0]
        files = list(Path(full).rglob(fname))
        frame = None
        for f in files:
            df = pd.read_parquet(f)
            if len(df) and df["source"].iloc[0] == src:
                frame = df
                break
        mask = np.zeros(len(frame), dtype=bool)
        for ident, sel, p in items:
            m = np.ones(len(frame), dtype=bool)
            for k, v in ident.items():
                m &= frame[k].astype(str).to_numpy() == v
            idx = np.where(m)[0]
            mask[idx[sel]] = True
        sub = frame[mask]
        dst = out / ident["device"] / p0.family / f"{ident['framework']}@{ident['version']}" / fname
        dst.parent.mkdir(parents=True, exist_ok=True)
        sub.to_parquet(dst, index=False)
        n += len(sub)
    (out / "NOTICE.md").write_text((Path(full) / "NOTICE.md").read_text())
    print(f"fixture: {n} rows")


def fmha(full: str) -> None:
    """The second fixture, ``tests/data/measured_fmha``: TensorRT-LLM's MLA context attention at 128 heads (one
    GPU holds every head of a DeepSeek-V3 prefill) on GB200 and GB300, every batch and sequence length — what the
    128K FP8 FMHA extrapolation test reads (the tables end at 32K)."""
    out = HERE.parent / "measured_fmha"
    n = 0
    for dev in ("gb200", "gb300"):
        for f in Path(full, dev, "mla_context").glob("trtllm@1.3.0rc20/*.parquet"):
            df = pd.read_parquet(f)
            sub = df[df["heads"] == 128]
            dst = out / dev / "mla_context" / "trtllm@1.3.0rc20" / f.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            sub.to_parquet(dst, index=False)
            n += len(sub)
    (out / "NOTICE.md").write_text((Path(full) / "NOTICE.md").read_text())
    print(f"fmha fixture: {n} rows")


if __name__ == "__main__":
    main(sys.argv[1])
    fmha(sys.argv[1])
