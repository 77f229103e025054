"""Storage and compute formats of DeepSeek-V4.1 emulated by rounding to their grids (V41_FACTS §8): what
:mod:`graphsim.views.collect.kernels_v41` applies where the model quantizes. ``EMULATE`` (on by default) switches
every rounding off at once — the tests compare with an independent reference in plain fp32 that way.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .registry import Unsupported

#: emulate the storage/compute formats by rounding (tests switch it off to compare in plain fp32)
EMULATE = True


@contextlib.contextmanager
def formats(on: bool):
    """Trace (and init) with format emulation on or off."""
    global EMULATE
    old, EMULATE = EMULATE, bool(on)
    try:
        yield
    finally:
        EMULATE = old


# ---- formats --------------------------------------------------------------------------------------

def _pow2_scale(amax, top):
    import jax.numpy as jnp

    return jnp.where(amax > 0, jnp.exp2(jnp.ceil(jnp.log2(jnp.maximum(amax, 1e-30) / top))), 1.0)


def _blocks(x, block):
    """[..., n] -> [..., n/b, b] with b = min(block, n)."""
    n = x.shape[-1]
    b = min(block, n)
    if n % b:
        raise ValueError(f"width {n} is not a multiple of the block {b}")
    return x.reshape(x.shape[:-1] + (n // b, b))


def fp8_block(x, block: int = 32):
    """FP8 E4M3 with a power-of-two (UE8M0) scale per ``block`` elements of the last axis."""
    import jax.numpy as jnp

    if not EMULATE:
        return x.astype(jnp.float32)
    xb = _blocks(x.astype(jnp.float32), block)
    s = _pow2_scale(jnp.max(jnp.abs(xb), axis=-1, keepdims=True), 448.0)
    return ((xb / s).astype(jnp.float8_e4m3fn).astype(jnp.float32) * s).reshape(x.shape)


def fp4_e4m3_16(x):
    """Main KV: FP4 E2M1 data, one E4M3 scale per 16 channels, no global scale (V41_FACTS §8)."""
    import jax.numpy as jnp

    if not EMULATE:
        return x.astype(jnp.float32)
    xb = _blocks(x.astype(jnp.float32), 16)
    amax = jnp.max(jnp.abs(xb), axis=-1, keepdims=True)
    s = (amax / 6.0).astype(jnp.float8_e4m3fn).astype(jnp.float32)
    s = jnp.where(s > 0, s, 1.0)
    q = jnp.clip(xb / s, -6.0, 6.0).astype(jnp.float4_e2m1fn).astype(jnp.float32)
    return (q * s).reshape(x.shape)


def mxfp4(x):
    """MXFP4 (OCP MX): E2M1 data, E8M0 scale 2^(floor(log2 amax) - 2) per 32 elements, saturating."""
    import jax.numpy as jnp

    if not EMULATE:
        return x.astype(jnp.float32)
    xb = _blocks(x.astype(jnp.float32), 32)
    amax = jnp.max(jnp.abs(xb), axis=-1, keepdims=True)
    s = jnp.where(amax > 0, jnp.exp2(jnp.floor(jnp.log2(jnp.maximum(amax, 1e-30))) - 2.0), 1.0)
    q = jnp.clip(xb / s, -6.0, 6.0).astype(jnp.float4_e2m1fn).astype(jnp.float32)
    return (q * s).reshape(x.shape)


def bf16(x):
    import jax.numpy as jnp

    return x.astype(jnp.bfloat16).astype(jnp.float32) if EMULATE else x.astype(jnp.float32)


def act_in(x, precision: str):
    """A GEMM's input at the op's precision."""
    if precision == "fp8":
        return fp8_block(x)
    if precision in ("bf16", "fp16"):
        return bf16(x)
    return x


def weight_format(w: np.ndarray, fmt: str) -> np.ndarray:
    """A weight array rounded to its storage format (done once at init, on the host)."""
    import ml_dtypes

    class jnp:  # noqa: N801 - the numpy spelling of the dtypes below
        float8_e4m3fn, float4_e2m1fn, float32 = ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn, np.float32

        @staticmethod
        def asarray(x):
            return np.asarray(x)

    if not EMULATE or fmt == "fp32":
        return w.astype(np.float32)
    if fmt == "bf16":
        return w.astype(ml_dtypes.bfloat16).astype(np.float32)
    if fmt.startswith("fp8_b") and "x" in fmt:  # 2-D blocks (32x32) with a power-of-two scale
        bs = int(fmt[len("fp8_b"):].split("x")[0])
        k, n = w.shape[-2:]
        bk, bn = min(bs, k), min(bs, n)
        t = w.reshape(w.shape[:-2] + (k // bk, bk, n // bn, bn))
        amax = np.abs(t).max(axis=(-3, -1), keepdims=True)
        s = np.where(amax > 0, np.exp2(np.ceil(np.log2(np.maximum(amax, 1e-30) / 448.0))), 1.0)
        q = np.asarray(jnp.asarray(t / s).astype(jnp.float8_e4m3fn).astype(jnp.float32)) * s
        return q.reshape(w.shape).astype(np.float32)
    if fmt.startswith("fp4"):  # E2M1, UE8M0 scale per 32 along the input (k) axis
        t = np.swapaxes(w, -1, -2)
        tb = t.reshape(t.shape[:-1] + (t.shape[-1] // min(32, t.shape[-1]), min(32, t.shape[-1])))
        amax = np.abs(tb).max(axis=-1, keepdims=True)
        s = np.where(amax > 0, np.exp2(np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0))), 1.0)
        q = np.asarray(jnp.asarray(tb / s).astype(jnp.float4_e2m1fn).astype(jnp.float32)) * s
        return np.swapaxes(q.reshape(t.shape), -1, -2).astype(np.float32)
    if fmt.startswith("fp8"):  # fp8 with a scale per 32 along the last axis (Engram tables, projections)
        b = min(32, w.shape[-1])
        t = w.reshape(w.shape[:-1] + (w.shape[-1] // b, b))
        amax = np.abs(t).max(axis=-1, keepdims=True)
        s = np.where(amax > 0, np.exp2(np.ceil(np.log2(np.maximum(amax, 1e-30) / 448.0))), 1.0)
        return ((t / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s).reshape(w.shape).astype(np.float32)
    raise Unsupported(None, f"a weight stored as {fmt}")




def swa_format(x):
    """SWA KV: FP8 with a power-of-two scale per 32 channels."""
    return fp8_block(x)


def np_format(x: np.ndarray, kind: str) -> np.ndarray:
    """Host-side rounding of random cache history to its format (the same grids as the kernels')."""
    import ml_dtypes

    if not EMULATE:
        return x.astype(np.float32)
    blk = {"swa": 32, "kv": 16, "ik": 32}[kind]
    b = min(blk, x.shape[-1])
    t = x.reshape(x.shape[:-1] + (x.shape[-1] // b, b)).astype(np.float32)
    amax = np.abs(t).max(axis=-1, keepdims=True)
    if kind == "swa":
        s = np.where(amax > 0, np.exp2(np.ceil(np.log2(np.maximum(amax, 1e-30) / 448.0))), 1.0)
        q = (t / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    elif kind == "kv":
        s = (amax / 6.0).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        s = np.where(s > 0, s, 1.0)
        q = np.clip(t / s, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    else:
        s = np.where(amax > 0, np.exp2(np.floor(np.log2(np.maximum(amax, 1e-30))) - 2.0), 1.0)
        q = np.clip(t / s, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return (q * s).reshape(x.shape).astype(np.float32)


