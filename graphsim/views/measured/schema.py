"""graphsim's measured-table format (docs/measured.md): one row per measurement, identity columns, the
shape coordinates of the row's table family, and the latency in seconds.

A row's **identity** (the common columns plus the family's own identity columns) names the partition it
belongs to: rows of different backends, versions, kernels, dtypes, boundaries or collection runs are
different partitions and are never interpolated across. Its **coordinates** are the shape it was timed at.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import attrs

from graphsim.core.errors import require

#: Identity columns every row carries ("" where unknown, e.g. an image digest the collector did not record).
COMMON = (
    "device",          # graphsim hardware name (gb200, h200, ...)
    "device_name",     # what the collector reported ("NVIDIA GB200")
    "framework",       # trtllm, sglang, vllm, nccl, jax, ...
    "version",         # the framework's version
    "image_digest",    # container image digest of the collection run
    "kernel_source",   # the kernel / implementation timed
    "family",          # table family (FAMILIES)
    "op",              # sub-operation inside the family (pre/post, dispatch/combine, all_reduce, ...)
    "dtype",           # compute / weight quantization (bfloat16, fp8, fp8_block, nvfp4, ...)
    "kv_dtype",        # KV-cache dtype (attention families), "" otherwise
    "boundary",        # what one timing covers: kernel (one op) or module (a fused block of ops)
    "collected",       # collection date (YYYY-MM-DD) or ""
    "source",          # provenance: where the rows came from (a collector, an importer and its input)
)
LATENCY = "latency_s"


@attrs.frozen
class Family:
    """A table family: its extra identity columns, its shape coordinates (integers), and how a row's
    coordinates are read (docs)."""

    name: str
    coords: tuple
    identity: tuple = ()
    doc: str = ""
    #: coordinates that must match exactly (categorical: head counts, head dims, group sizes); the others
    #: are interpolated in log space
    exact: tuple = ()


FAMILIES: dict[str, Family] = {}


def _family(name, coords, identity=(), doc="", exact=()):
    FAMILIES[name] = Family(name, tuple(coords), tuple(identity), doc, tuple(exact))


_family("gemm", ("m", "n", "k"), doc="C[m,n] = A[m,k] @ B[k,n]: m tokens, n output columns, k input width (per rank)")
_family("bmm", ("tokens", "heads", "k", "n"), doc="per-head batched GEMM (MLA's absorbed W_UK / W_UV): heads "
        "independent k x n products per token", exact=("k", "n"))
_family("attention_context", ("batch", "seq", "heads", "kv_heads", "head_dim", "window"),
        doc="prefill attention of batch prompts of seq new tokens each (no cached prefix); heads per rank",
        exact=("heads", "kv_heads", "head_dim", "window"))
_family("attention_generation", ("batch", "ctx", "heads", "kv_heads", "head_dim", "window"),
        doc="decode attention: batch requests, one query each, over ctx cached positions; heads per rank",
        exact=("heads", "kv_heads", "head_dim", "window"))
_family("mla_context", ("batch", "seq", "heads"), doc="MLA prefill attention core (MHA form), heads per rank",
        exact=("heads",))
_family("mla_generation", ("batch", "ctx", "heads"), doc="MLA decode attention over the 576-wide latent cache, "
        "heads per rank", exact=("heads",))
_family("moe", ("tokens", "hidden", "inter", "topk", "experts", "moe_tp", "moe_ep"), ("distribution",),
        doc="routed experts of one rank: tokens entering the layer on that rank, the expert shapes and the "
        "MoE TP x EP layout", exact=("topk", "experts", "moe_tp", "moe_ep"))
_family("collective", ("gpus", "bytes"), doc="a collective (op = all_reduce / all_gather / reduce_scatter / "
        "all_to_all) over gpus ranks of one NVLink domain; bytes = the message per rank", exact=("gpus",))
_family("moe_a2a", ("tokens", "hidden", "topk", "experts", "ep", "nodes"), doc="MoE token dispatch / combine "
        "(op = dispatch / combine) of tokens per rank", exact=("hidden", "topk", "experts", "ep", "nodes"))
_family("mhc", ("tokens", "hidden", "hc_mult", "sites", "sinkhorn"), doc="manifold hyper-connection module "
        "(op = pre: coefficients + Sinkhorn + pre-mix; post: residual mix)",
        exact=("hc_mult", "sites", "sinkhorn"))
_family("dsv4_attention", ("batch", "seq", "heads", "compress_ratio"), ("model",),
        doc="DeepSeek-V4 attention module (op = csa_context / csa_generation / hca_context / hca_generation): "
        "compressor, indexer and sparse attention as one timing; seq = new tokens (context) or cached "
        "positions (generation)", exact=("heads", "compress_ratio"))
_family("elementwise", ("tokens", "elems"), doc="a per-token elementwise op (op = rmsnorm: [tokens, elems] in and "
        "out; silu_mul: silu(g)·u of [tokens, 2·elems] -> [tokens, elems]; add: a residual add) on one rank")
_family("copy", ("bytes",), doc="a device memory copy / cache write (op = copy) of bytes on one rank")


#: What one timing covers.
BOUNDARIES = ("kernel", "module")


def identity_columns(family: str) -> tuple:
    return COMMON + FAMILIES[family].identity


def check_frame(df, where: str) -> None:
    """Validate a measured table (a pandas DataFrame): columns, one family, integer coordinates >= 0,
    finite latencies > 0, text identities. Raises a one-line GraphsimError naming the file and the column
    (field ``<file name>.<column>``; a file deeper in the store is named in full in the message)."""
    import re

    import numpy as np
    import pandas as pd

    name = where.replace("\\", "/").rsplit("/", 1)[-1]
    base = name if re.fullmatch(r"[A-Za-z_][\w\-]*(\.[\w\-]+)*", name) else "measured"
    suffix = f" (in {where})" if base != where else ""

    def need(cond, column: str, message: str) -> None:
        require(cond, f"{base}.{column}", message + suffix)

    need("family" in df.columns, "family", "missing column (every measured row names its family)")
    fams = set(df["family"].astype(str).unique())
    bad = sorted(fams - set(FAMILIES))
    need(not bad, "family", f"unknown {bad[:3]}; allowed: {', '.join(FAMILIES)}")
    need(len(fams) == 1, "family", f"one family per file, got {sorted(fams)}")
    fam = FAMILIES[fams.pop()]
    cols = list(identity_columns(fam.name)) + list(fam.coords) + [LATENCY]
    missing = [c for c in cols if c not in df.columns]
    need(not missing, missing[0] if missing else "", f"missing column; a {fam.name} table has {', '.join(cols)}")
    for c in fam.coords:
        col = df[c]
        ok = col.dtype.kind in "iu" and bool((col >= 0).all()) and bool((col < 2**53).all())
        need(ok, c, "shape coordinates are whole numbers in [0, 2**53)")
        if c not in fam.exact:  # interpolated in log space: a 0 has no logarithm
            need(bool((col >= 1).all()), c, "an interpolated shape coordinate is a whole number >= 1")
    for c in identity_columns(fam.name):
        col = df[c]
        # pandas' C type inference: text (None / NaN allowed) without a Python call per row
        ok = col.dtype.kind == "O" and pd.api.types.infer_dtype(col, skipna=True) in ("string", "empty")
        need(ok, c, f"identity columns hold text, got {col.dtype}")
    lat = df[LATENCY]
    ok = lat.dtype.kind == "f" and bool(((lat > 0) & np.isfinite(lat.to_numpy())).all())
    need(ok, LATENCY, "latencies are finite seconds > 0")
    bnd = sorted(set(df["boundary"].astype(str).unique()) - set(BOUNDARIES))
    need(not bnd, "boundary", f"must be one of {', '.join(BOUNDARIES)}, got {bnd[:3]}")


def measured_digest(folder, device: str | None = None) -> str:
    """A folder of measured tables: every ``.parquet`` file a store of ``device`` may read (importer layout
    ``<device>/<family>/<fw>@<ver>/`` of that device, and any file outside the layout), path and bytes."""
    from ...driver.identity import DIGEST_CHARS, _sha, file_digest

    root = Path(folder)
    try:
        files = sorted(p for p in root.rglob("*.parquet") if p.is_file())
    except OSError as e:
        return "missing:" + _sha(str(e).encode())
    if not files:
        return "missing:" + _sha(str(root).encode())
    h = hashlib.sha256()
    for f in files:
        rel = f.relative_to(root).parts
        layout = len(rel) == 4 and rel[1] in FAMILIES and "@" in rel[2]
        if device is not None and layout and rel[0].lower() != device.lower():
            continue
        h.update("/".join(rel).encode() + b"\0" + file_digest(f).encode() + b"\0")
    return h.hexdigest()[:DIGEST_CHARS]
