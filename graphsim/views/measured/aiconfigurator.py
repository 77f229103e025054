"""Import NVIDIA aiconfigurator's collected kernel tables (Apache-2.0) into graphsim's measured format.

The tables ship in the ``aiconfigurator-core`` wheel under ``aiconfigurator_core/systems/data/<system>/
<family>/<framework>/<version>/*.parquet`` with a ``collection_meta.yaml`` per collection (runtime identity)
and ``reuse.yaml`` declarations (a version that reuses another's table). This module reads those files —
it does not import or run aiconfigurator's code — and rewrites each table in graphsim's format: latencies
from milliseconds to seconds, aiconfigurator's columns to graphsim's coordinates, one identity per row.
Every output file names its input in the ``source`` column; the output folder gets the Apache-2.0 notice
and a provenance file (input folder, package version, reuse declarations as they were written).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np

from graphsim.core.errors import GraphsimError, require

from .schema import COMMON, FAMILIES, LATENCY

#: aiconfigurator system folder -> graphsim hardware name
SYSTEMS = {"gb200": "gb200", "gb300": "gb300", "b200_sxm": "b200", "b300_sxm": "b300", "h200_sxm": "h200",
           "h100_sxm": "h100", "a100_sxm": "a100", "h100_pcie": "h100_pcie", "a100_pcie": "a100_pcie"}

NOTICE = """# Measured tables imported from NVIDIA aiconfigurator

These tables were converted by `graphsim measured import aiconfigurator` from the collected kernel data that
ships in the `aiconfigurator-core` package (https://github.com/ai-dynamo/aiconfigurator), directory
`aiconfigurator_core/systems/data/`.

    SPDX-FileCopyrightText: Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
    SPDX-License-Identifier: Apache-2.0

Licensed under the Apache License, Version 2.0 (https://www.apache.org/licenses/LICENSE-2.0). The data were
modified: columns renamed to graphsim's measured-table format, latencies converted from milliseconds to
seconds, rows grouped by identity. Each row's `source` column names the file it came from;
`provenance.json` records the input folder, the package version and the reuse declarations.
"""


def _ident(meta: dict, device: str, device_name: str, framework: str, version: str, family: str,
           source: str) -> dict:
    rt = (meta or {}).get("runtime") or {}
    digest = rt.get("image_digest") or rt.get("container_digest") or (meta or {}).get("image_digest") or ""
    if not digest and isinstance(rt.get("image"), str) and "@sha256:" in rt["image"]:
        digest = rt["image"].split("@", 1)[1]
    collected = str((meta or {}).get("collected_at") or (meta or {}).get("date") or rt.get("date") or "")[:10]
    return {"device": device, "device_name": device_name, "framework": framework, "version": version,
            "image_digest": str(digest), "family": family, "collected": collected, "source": source,
            "boundary": "kernel", "kv_dtype": ""}


def _s(col) -> np.ndarray:
    return col.astype(str).to_numpy()


def _i(col) -> np.ndarray:
    return col.astype(np.int64).to_numpy()


# Each converter: aiconfigurator frame -> dict of graphsim columns (identity beyond the common ones, op,
# kernel_source, dtype, coordinates), or None for a table graphsim has no family for.
def _gemm(df):
    return {"family": "gemm", "op": "gemm", "dtype": _s(df.gemm_dtype), "m": _i(df.m), "n": _i(df.n), "k": _i(df.k)}


def _attention(phase):
    def conv(df):
        df = df[(df.beam_width == 1)] if "beam_width" in df else df
        seq = _i(df.isl) + (_i(df.step) if phase == "generation" else 0)
        out = {"family": f"attention_{phase}", "op": phase, "dtype": _s(df.attn_dtype),
               "kv_dtype": _s(df.kv_cache_dtype), "batch": _i(df.batch_size), "heads": _i(df.num_heads),
               "kv_heads": _i(df.num_key_value_heads), "head_dim": _i(df.head_dim),
               "window": _i(df.window_size) if "window_size" in df else np.zeros(len(df), np.int64)}
        out["seq" if phase == "context" else "ctx"] = seq
        return out, df
    return conv


def _mla(phase):
    def conv(df):
        seq = _i(df.isl) + (_i(df.step) if phase == "generation" else 0)
        out = {"family": f"mla_{phase}", "op": phase, "dtype": _s(df.mla_dtype), "kv_dtype": _s(df.kv_cache_dtype),
               "batch": _i(df.batch_size), "heads": _i(df.num_heads)}
        out["seq" if phase == "context" else "ctx"] = seq
        return out, df
    return conv


def _mla_bmm(df):
    pre = df.op_name.astype(str).str.endswith("pre").to_numpy()
    return {"family": "bmm", "op": np.full(len(df), "bmm"), "dtype": _s(df.bmm_dtype),
            "tokens": _i(df.num_tokens), "heads": _i(df.num_heads),
            "k": np.where(pre, 128, 512).astype(np.int64), "n": np.where(pre, 512, 128).astype(np.int64)}, df


def _moe(df):
    return {"family": "moe", "op": "moe", "dtype": _s(df.moe_dtype), "distribution": _s(df.distribution),
            "tokens": _i(df.num_tokens), "hidden": _i(df.hidden_size), "inter": _i(df.inter_size),
            "topk": _i(df.topk), "experts": _i(df.num_experts), "moe_tp": _i(df.moe_tp_size),
            "moe_ep": _i(df.moe_ep_size)}, df


#: a converter's key for its table's latency unit in seconds (default: milliseconds)
LATENCY_SCALE = "_latency_scale"
_ELEM_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "fp16": 2, "int8": 1, "fp8": 1, "float32": 4, "default": 2}


def _allreduce(df):  # message_size: elements of the all-reduced buffer
    dt = _s(df.allreduce_dtype)
    nb = np.array([_ELEM_BYTES.get(d, 2) for d in dt], dtype=np.int64)
    return {"family": "collective", "op": np.full(len(df), "all_reduce"), "dtype": dt, "gpus": _i(df.num_gpus),
            "bytes": _i(df.message_size) * nb}, df


def _nccl(df):  # nccl-tests convention: message_size elements of the whole buffer
    dt = _s(df.nccl_dtype)
    nb = np.array([_ELEM_BYTES.get(d, 2) for d in dt], dtype=np.int64)
    op = np.where(_s(df.op_name) == "alltoall", "all_to_all", _s(df.op_name))
    return {"family": "collective", "op": op, "dtype": np.where(dt == "half", "bfloat16", dt), "gpus": _i(df.num_gpus),
            "bytes": _i(df.message_size) * nb}, df


def _moe_a2a(df):  # latency = transmit_us + notify_us: microseconds, unlike the other tables
    return {"family": "moe_a2a", LATENCY_SCALE: 1e-6, "op": _s(df.phase), "dtype": _s(df.comm_dtype),
            "kernel_source": _s(df.comm_backend),
            "tokens": _i(df.num_tokens), "hidden": _i(df.hidden_size), "topk": _i(df.topk),
            "experts": _i(df.num_experts), "ep": _i(df.ep_size), "nodes": _i(df.node_num)}, df


def _mhc(df):
    return {"family": "mhc", "op": _s(df.op_name), "dtype": np.full(len(df), "bfloat16"), "boundary": "module",
            "tokens": _i(df.num_tokens), "hidden": _i(df.hidden_size), "hc_mult": _i(df.hc_mult),
            "sites": _i(df.num_sites), "sinkhorn": _i(df.sinkhorn_iters)}, df


def _dsv4(kind, phase):
    def conv(df):
        seq = _i(df.isl) + (_i(df.step) if phase == "generation" else 0)
        return {"family": "dsv4_attention", "op": f"{kind}_{phase}", "dtype": _s(df.gemm_type),
                "kv_dtype": _s(df.kv_cache_dtype), "boundary": "module", "model": _s(df.model),
                "batch": _i(df.batch_size), "seq": seq, "heads": _i(df.num_heads),
                "compress_ratio": _i(df.compress_ratio) if "compress_ratio" in df else np.zeros(len(df), np.int64)}, df
    return conv


def _plain(fn):
    def conv(df):
        return fn(df), df
    return conv


CONVERTERS = {
    "gemm_perf.parquet": _plain(_gemm),
    "context_attention_perf.parquet": _attention("context"),
    "generation_attention_perf.parquet": _attention("generation"),
    "context_mla_perf.parquet": _mla("context"),
    "generation_mla_perf.parquet": _mla("generation"),
    "mla_bmm_perf.parquet": _mla_bmm,
    "moe_perf.parquet": _moe,
    "custom_allreduce_perf.parquet": _allreduce,
    "nccl_perf.parquet": _nccl,
    "moe_a2a_perf.parquet": _moe_a2a,
    "mhc_module_perf.parquet": _mhc,
    "dsv4_csa_context_module_perf.parquet": _dsv4("csa", "context"),
    "dsv4_csa_generation_module_perf.parquet": _dsv4("csa", "generation"),
    "dsv4_hca_context_module_perf.parquet": _dsv4("hca", "context"),
    "dsv4_hca_generation_module_perf.parquet": _dsv4("hca", "generation"),
}


def find_data(src: str | None) -> tuple[Path, str]:
    """The ``systems/data`` folder: under ``src`` (the data folder, ``systems/`` or the package folder), or
    of the installed ``aiconfigurator_core``; and the package version ("" if unknown)."""
    if src:
        p = Path(src)
        for cand in (p, p / "data", p / "systems" / "data", p / "aiconfigurator_core" / "systems" / "data"):
            if cand.is_dir() and any(c.is_dir() and c.name in SYSTEMS for c in cand.iterdir()):
                return cand, ""
        raise GraphsimError("from", f"{src} holds no aiconfigurator system tables (expected <system>/<family>/"
                            "<framework>/<version>/*.parquet, e.g. systems/data/gb200/gemm/trtllm/1.3.0rc20)")
    try:
        import aiconfigurator_core
    except ImportError:
        raise GraphsimError("from", "aiconfigurator-core is not installed: `pip install 'graphsim[measured]'` "
                            "or give --from DIR (an unpacked aiconfigurator_core folder)") from None
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("aiconfigurator-core")
    except PackageNotFoundError:  # pragma: no cover
        ver = ""
    return Path(aiconfigurator_core.__file__).parent / "systems" / "data", ver


def _yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        import yaml
    except ImportError:  # the runtime identity is optional: rows keep "" where it is unknown
        return {}
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}


def convert_file(path: Path, data_root: Path, pkg_version: str = ""):
    """One aiconfigurator table -> a pyarrow Table in graphsim's format (None if graphsim has no family for it).
    Columns every row shares (the identity of a collection) are repeated by Arrow, not built row by row."""
    import pandas as pd
    import pyarrow as pa

    conv = CONVERTERS.get(path.name)
    if conv is None:
        return None
    rel = path.relative_to(data_root)
    system, _family, framework, version = rel.parts[:4]
    device = SYSTEMS.get(system, system)
    df = pd.read_parquet(path)
    if not len(df):
        return None
    meta = _yaml(path.parent / "collection_meta.yaml")
    cols, df = conv(df)
    n = len(df)
    src = f"aiconfigurator-core{(' ' + pkg_version) if pkg_version else ''}: systems/data/{rel.as_posix()}"
    base = _ident(meta, device, str(df["device"].iloc[0]) if "device" in df else "", framework.lower(), version,
                  cols["family"], src)

    def text(v):
        if isinstance(v, np.ndarray):
            return pa.array(v.astype(str), type=pa.string())
        return pa.repeat(pa.scalar(str(v), type=pa.string()), n)

    out = {}
    for c in COMMON:
        v = cols.get(c, base.get(c, ""))
        if c == "kernel_source" and c not in cols:
            v = _s(df.kernel_source) if "kernel_source" in df else ""
        out[c] = text(v)
    fam = FAMILIES[cols["family"]]
    for c in fam.identity:
        out[c] = text(cols.get(c, ""))
    for c in fam.coords:
        out[c] = pa.array(np.asarray(cols[c], dtype=np.int64))
    # milliseconds -> seconds (a table whose latency is in other units says so)
    lat = df["latency"].to_numpy(np.float64) * cols.get(LATENCY_SCALE, 1e-3)
    out[LATENCY] = pa.array(lat)
    keep = (lat > 0) & np.isfinite(lat)
    table = pa.table(out)
    return table if keep.all() else table.filter(pa.array(keep))


def import_tables(src: str | None, out: str, *, systems=None, families=None, log=print) -> dict:
    """Convert every table graphsim has a family for; returns a summary {files, rows, skipped}."""
    from graphsim.core.outputs import locked_output

    data, pkg_version = find_data(src)
    with locked_output(out, folder=True) as out_dir:  # checked before work, one importer at a time
        return _import(data, pkg_version, out_dir, systems, families, log)


def _import(data: Path, pkg_version: str, out_dir: Path, systems, families, log) -> dict:
    import pyarrow.parquet as pq

    from graphsim.core.outputs import atomic_target, safe_name, write_text

    want_sys = set(systems) if systems else None
    want_fam = set(families) if families else None
    if want_fam:
        bad = sorted(want_fam - set(FAMILIES))
        require(not bad, "family", f"unknown {bad}; allowed: {', '.join(FAMILIES)}")
    files = rows = 0
    skipped: list[str] = []
    reuse: dict = {}
    for path in sorted(data.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(data)
        if len(rel.parts) != 5:
            continue
        if want_sys and rel.parts[0] not in want_sys and SYSTEMS.get(rel.parts[0]) not in want_sys:
            continue
        if path.name == "reuse.yaml":
            reuse[rel.parent.as_posix()] = _yaml(path).get("reuse", path.read_text())
            continue
        if path.suffix != ".parquet":
            continue
        table = convert_file(path, data, pkg_version)
        if table is None:
            skipped.append(rel.as_posix())
            continue
        fam = str(table["family"][0]) if table.num_rows else ""
        if not table.num_rows or (want_fam and fam not in want_fam):
            continue
        dev, fw, ver = (str(table[c][0]) for c in ("device", "framework", "version"))
        dst = out_dir / safe_name(dev, "device") / fam / safe_name(f"{fw}@{ver}", "version") / path.name
        with atomic_target(dst, suffixes=(".parquet",)) as tmp:
            pq.write_table(table, tmp)
        files += 1
        rows += table.num_rows
    require(files > 0, "from", f"{data}: no tables graphsim has a family for"
            + (f" (systems {sorted(want_sys)}, families {sorted(want_fam) if want_fam else 'all'})" if want_sys else ""))
    write_text(out_dir / "NOTICE.md", NOTICE)
    prov = {"importer": "graphsim measured import aiconfigurator", "input": "aiconfigurator_core/systems/data",
            "package_version": pkg_version, "imported": datetime.date.today().isoformat(), "files": files,
            "rows": rows, "not_imported": skipped, "reuse_declarations": reuse,
            "license": "Apache-2.0 (NOTICE.md)"}
    write_text(out_dir / "provenance.json", json.dumps(prov, indent=2, default=str))
    log(f"imported {rows:,} rows from {files} tables into {out_dir} ({len(skipped)} tables without a graphsim family)")
    return {"files": files, "rows": rows, "skipped": skipped}
