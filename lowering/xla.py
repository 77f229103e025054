"""Helpers that steer XLA's CPU code generation in the kernel (measured with ``jax.profiler`` per fused kernel).

* :func:`apart`: XLA's CPU fusion puts a gather into the loop of the arithmetic that reads it, which then runs
  element by element (no vector exponential), and a few sums read by many rows into each row's loop (recomputed
  per row); a conditional is a fusion boundary.
* :func:`exp`, :func:`log`: XLA's float64 exponential and logarithm are scalar calls per element (~5 ns on a CPU
  core); these are vectorized polynomials.
"""
from __future__ import annotations

import numpy as np


def apart(fn, x, xp):
    """``fn(x)``, computed on its own: kept out of the loops of the arithmetic that reads it. XLA's CPU fusion
    otherwise puts a gather into its consumers' loop, which then runs element by element (no vector exponential:
    2x slower here), and a few sums read by many rows into each row's loop (recomputed per row). A conditional is
    a fusion boundary; its predicate (``v != v or v == v``, v the first element of ``x`` as a float: always true)
    is read at run time, once per block of points."""
    if xp is np:
        return fn(x)
    import jax
    from jax import lax

    v = x.reshape(-1)[0].astype(np.float32)  # (a float: the compiler folds an integer's v == v to true)
    return lax.cond((v != v) | (v == v), fn, lambda y: jax.tree.map(xp.zeros_like, fn(y)), x)


def exp(x, xp):
    """e^x. On XLA a float64 exponential is a scalar call per element (~5 ns on a CPU core): here it is a Cody-Waite
    reduction x = k ln 2 + r (|r| <= ln 2 / 2), a degree-12 Taylor polynomial for e^r (truncation < 2e-17) and k
    added to the exponent bits — vectorized, under 1 ns, within 2 ulp of NumPy's, and exactly 1 at 0 (a point on a
    measured row keeps its time). Arguments are clipped to [-700, 700] (a table's log-slopes are far inside)."""
    if xp is np or x.dtype != np.float64:
        return xp.exp(x)
    from jax import lax

    x = xp.clip(x, -700.0, 700.0)
    k = xp.round(x * 1.4426950408889634)
    r = (x - k * 0.6931471805599453) - k * 2.3190468138462996e-17
    p = _TAYLOR[-1]
    for c in _TAYLOR[-2::-1]:
        p = p * r + c
    bits = lax.bitcast_convert_type(p, np.int64) + (k.astype(np.int64) << 52)
    return lax.bitcast_convert_type(bits, np.float64)


def log(x, xp):
    """ln x for x > 0. XLA's float64 logarithm is a scalar call too: here x = 2^e·m with m in [√½, √2) read off the
    bits, ln m = 2 atanh(s), s = (m - 1)/(m + 1) (|s| < 0.172: 11 odd terms, truncation < 1e-17), plus e ln 2 —
    vectorized, within 2 ulp of NumPy's for x in [1e-300, 1e300], exactly 0 at 1."""
    if xp is np or x.dtype != np.float64:
        return xp.log(x)
    from jax import lax

    bits = lax.bitcast_convert_type(x, np.int64)
    e = (bits >> 52) - 1023
    m = lax.bitcast_convert_type((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000, np.float64)  # [1, 2)
    big = m > 1.4142135623730951
    m = xp.where(big, m * 0.5, m)
    e = (e + big.astype(np.int64)).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = _ATANH[-1]
    for c in _ATANH[-2::-1]:
        p = p * s2 + c
    return (e * 0.6931471805599453 + 2.0 * s * p) + e * 2.3190468138462996e-17


_ATANH = tuple(1.0 / (2 * n + 1) for n in range(12))
_TAYLOR = tuple(1.0 / float(np.prod(np.arange(1, n + 1))) for n in range(13))


__all__ = ["apart", "exp", "log"]
