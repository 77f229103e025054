"""The FPM sample format (docs/fpm.md): one row per timed forward (or failed attempt).

The seed separates what may never be mixed from what may be interpolated:

* **identity** (:data:`IDENTITY`) — the partition keys: the model (name and a digest of its semantics and
  weight formats), the runtime (framework, version, image digest, kernel source, instrumentation revision),
  the device and topology, the parallel mapping, the execution policies (decoder replay, encoder restore,
  fusion, overlap, Engram residency, DSpark / MTP), the measurement boundary, the workload's content,
  prefix residency and warm-up, and the SOL reference the samples are normalised by (descriptor and digest).
  Rows that differ in any of these are different partitions: a fit never pools them.
* **coordinates** (:data:`COORDS`) — sums over the forward's request groups, per kind: requests, new
  tokens, cached positions. They are the sampling coordinates inside a partition.
* **results** (:data:`RESULTS`) — latency statistics over the timed repetitions, compile time, the SOL
  forward of the same compiled plan, and ``status`` (:data:`STATUSES`) with the error text of a failure.
"""
from __future__ import annotations

import hashlib
import math

from graphsim.core.errors import GraphsimError, require

IDENTITY = (
    "model", "model_digest", "weights", "kv_dtype", "attention_precision",
    "framework", "version", "image_digest", "kernel_source", "instrumentation", "boundary",
    "device", "device_name", "devices", "mapping",
    "decoder_replay", "encoder_restore", "fusion", "overlap", "engram", "dspark", "mtp",
    "content", "prefix_tier", "warmup",
    "sol_hw", "sol_hw_digest",
)
#: integer sampling coordinates: per request kind, Σ requests, Σ new tokens, Σ cached positions
COORDS = ("prefill_requests", "prefill_tokens", "prefill_past", "decode_requests", "decode_tokens", "decode_past")
RESULTS = ("latency_s", "latency_min_s", "latency_p90_s", "reps", "compile_s", "sol_s")
#: ok, or why there is no usable time (the seed's failure categories)
STATUSES = ("ok", "unsupported", "init_failure", "oom", "execution_failure", "invalid_output", "missing_sample")
#: what one local forward timing covers
BOUNDARY = "forward: host call -> logits ready (launch + sync), weights and caches resident"
CONTENT = "uniform random token ids; random KV history"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_identity(model) -> tuple[str, str, str]:
    """(name, digest of its semantics, weight formats) of a loaded model."""
    formats = "+".join(sorted({t.format.name for t in model.weights()}))
    sem = repr((type(model).__name__, getattr(model, "cfg", None), getattr(model, "quant", None)))
    return model.name, digest(sem), formats


def hw_digest(spec) -> str:
    import attrs

    d = attrs.asdict(spec)
    d.pop("sources", None)
    d.pop("description", None)
    return digest(repr(sorted(d.items())))


def plan_identity(model, mapping, policies, spec) -> dict:
    """The identity fields a plan determines — its model, mapping, policies and descriptor (what an estimate's
    query must match); its requests are coordinates, not identity."""
    name, mdig, formats = model_identity(model)
    p, m = policies, mapping
    kv = ""
    if hasattr(model, "kv_cache_format"):
        try:
            kv = str(model.kv_cache_format(p))
        except Exception:  # noqa: BLE001 - a model without one simple KV format
            kv = ""
    return {
        "model": name, "model_digest": mdig, "weights": formats, "kv_dtype": kv,
        "attention_precision": p.attention_precision,
        "device": spec.name.lower(), "mapping": f"tp{m.tp}-dp{m.dp}-ep{m.ep}-pp{m.pp}-cp{m.cp}",
        "decoder_replay": p.decoder_replay, "encoder_restore": p.encoder_replay, "fusion": p.fusion,
        "overlap": p.overlap, "engram": p.engram, "dspark": p.dspark, "mtp": int(p.mtp),
        "sol_hw": spec.name, "sol_hw_digest": hw_digest(spec),
    }


def sample_identity(model, mapping, policies, spec, env: dict, warmup: int) -> dict:
    """Every identity field of a local sample: the plan's, the run environment's and the workload's."""
    ident = plan_identity(model, mapping, policies, spec)
    ident.update({
        "framework": env["framework"], "version": env["version"], "image_digest": env["image_digest"],
        "kernel_source": env["kernel_source"] + " graphsim executor", "instrumentation": env["instrumentation"],
        "boundary": BOUNDARY, "device_name": env["device_name"], "devices": int(env["devices"]),
        "content": CONTENT, "prefix_tier": "hbm", "warmup": int(warmup),
    })
    return ident


def check_samples(df, where: str) -> None:
    """Validate a samples table: every column present, known statuses, coordinates whole numbers >= 0, and
    ok rows with finite positive latency and SOL. One-line errors naming the file and the column."""
    need = IDENTITY + COORDS + RESULTS + ("status", "error", "requests")
    missing = [c for c in need if c not in df.columns]
    require(not missing, f"{where}.{missing[0] if missing else ''}", f"missing column; FPM samples have "
            f"{', '.join(need)} (docs/fpm.md)")
    bad = sorted(set(df["status"].astype(str)) - set(STATUSES))
    require(not bad, f"{where}.status", f"unknown {bad[:3]}; allowed: {', '.join(STATUSES)}")
    for c in COORDS:
        col = df[c]
        require(col.dtype.kind in "iu" and bool((col >= 0).all()), f"{where}.{c}", "coordinates are whole numbers >= 0")
    for c in ("devices", "mtp", "warmup"):  # integer identity fields (everything else is text)
        col = df[c]
        if col.dtype.kind in "iu":
            good = bool((col >= 0).all())
        else:
            import pandas as pd

            v = pd.to_numeric(col, errors="coerce") if col.dtype.kind in "fO" else None
            good = v is not None and bool((v.notna() & (v >= 0) & (v == v.round()) & (v.abs() < 2**53)).all())
        require(good, f"{where}.{c}", "an integer >= 0 in every row")
    for c in RESULTS:
        try:
            v = df[c].astype(float)
        except (TypeError, ValueError):
            raise GraphsimError(f"{where}.{c}", "must be numbers (NaN where nothing was timed)") from None
        require(not bool((v < 0).any()) and not bool((v == math.inf).any()), f"{where}.{c}",
                "must be finite and >= 0 (NaN where nothing was timed)")
    ok = df[df["status"] == "ok"]
    for c in ("latency_s", "sol_s"):
        v = ok[c].astype(float)
        good = bool(((v > 0) & v.apply(math.isfinite)).all())
        require(good, f"{where}.{c}", "an ok sample has a finite time > 0 in seconds")


def read_samples(path) -> "object":
    """A samples file (Parquet) as a validated DataFrame."""
    from pathlib import Path

    import pyarrow.parquet as pq

    p = Path(path)
    try:
        found = p.is_file()
    except (OSError, ValueError):
        found = False
    require(found, "samples", f"{path}: no such file (write one with graphsim collect forward)")
    try:
        df = pq.read_table(p).to_pandas()
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file is the user's input
        raise GraphsimError("samples", f"{p.name}: not a readable Parquet table ({type(e).__name__})") from None
    check_samples(df, p.name)
    for c in IDENTITY:
        df[c] = df[c].astype(str) if c not in ("devices", "mtp", "warmup") else df[c].astype(float).astype("int64")
    return df
