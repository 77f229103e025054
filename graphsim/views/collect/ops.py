"""``graphsim collect ops``: time the op families graphsim prices on this machine's default JAX device and
write them as measured tables (docs/measured.md), so ``--view op|hybrid --measured DIR --backend jax@VERSION``
prices a compiled plan from them.

Families and what one row times (one jitted JAX function per shape, inputs random normal, resident on the
device before timing). The kernels are the forward executor's own (:mod:`graphsim.views.collect.kernels`): an op
timed here and the same op inside ``graphsim collect forward`` run the same code.

``gemm``                  A[m, k] @ W[k, n] in the inputs' dtype with fp32 accumulation, the result cast back
                          (bf16 out for bf16, as the models' linear layers produce), dtypes bfloat16 and float32
                          (and float16 on accelerators);
``attention_context``     causal GQA prefill, q [b, s, H, d], k/v [b, s, Hkv, d], scores and softmax in fp32,
                          bf16 in and out (a reference implementation: full score matrix; a sliding window is
                          computed block-banded, so only the visible band is worked on);
``attention_generation``  decode: one query per request over a random KV cache [b, ctx, Hkv, d] (a sliding
                          window reads only its last ``window`` positions), fp32 softmax;
``elementwise``           ``rmsnorm`` over [tokens, elems] (bf16 in/out, fp32 math, with its weight), ``silu_mul``
                          silu(g)·u of [tokens, 2·elems] -> [tokens, elems], ``add`` (a residual add);
``copy``                  a cache write: ``bytes`` copied into a donated (in-place) device buffer at an offset.

**Timing.** Per point: one untimed call (compilation and the first run), ``warmup`` untimed calls, then
``reps`` calls each timed with ``time.perf_counter()`` around the call and ``block_until_ready()`` on its
result: a jitted call from the host, launch and synchronisation included, inputs resident
(:data:`graphsim.views.collect.env.BOUNDARY_NOTE`). The row's ``latency_s`` is the median of the reps; the rows
also carry ``latency_min_s`` and ``reps``. Points are timed one after another in one process.

**Grids** are chosen by platform (:func:`default_grid`): on a CPU small enough that the full grid takes a few
minutes on two cores (``quick``: under a minute), with caps on the work and memory of one point (a few
hundred MB at most); on an accelerator the same code with larger sizes. ``grid=`` replaces them (tests,
a model's own shapes): family -> list of points (dicts of the family's coordinates; ``dtype`` for GEMMs,
``op`` for elementwise), e.g. built with :func:`cartesian`.

Output: ``DIR/<device>/<family>/jax@<version>/local.parquet`` (``device`` = the descriptor's name, lower
case: the OP view selects tables by it) and ``DIR/provenance.json`` (environment, grids, warm-up, reps,
timestamps, per family; a later run of other families into the same folder adds to it).
"""
from __future__ import annotations

import datetime
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np

from graphsim.core.errors import require

from .env import BOUNDARY_NOTE, COLLECTOR_REVISION, environment
from .kernels import gated, gqa_attention, matmul, rmsnorm

#: the families this collector times, in collection order
FAMILIES = ("gemm", "attention_context", "attention_generation", "elementwise", "copy")
FILE = "local.parquet"
#: RMSNorm epsilon of the timed kernel (any value: the work does not depend on it)
EPS = 1e-5


def cartesian(**axes) -> list[dict]:
    """Every combination of the given axis values, as points: ``cartesian(m=(1, 2), n=(256,), k=(256,))``."""
    names = list(axes)
    vals = [tuple(v) if isinstance(v, (list, tuple)) else (v,) for v in axes.values()]
    return [dict(zip(names, combo)) for combo in itertools.product(*vals)]


# ---- grids -----------------------------------------------------------------------------------------------

def _gemm_grid(accel: bool, quick: bool) -> tuple[list, dict]:
    if accel:
        ms = (1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192, 16384)
        if quick:
            ms = ms[::2]
        widths = (512, 1024, 2048, 4096, 8192, 16384) if not quick else (1024, 4096, 16384)
        dtypes = ("bfloat16", "float16", "float32") if not quick else ("bfloat16", "float32")
        cap = 2.0 ** 42
        ns, ks = widths, widths
    elif quick:
        ms = (1, 4, 16, 64, 256, 1024)
        ns, ks = (256, 1024, 4096), (256, 1024, 4096)
        dtypes = ("bfloat16", "float32")
        cap = 2.0 ** 30
    else:
        ms = (1, 2, 3, 4, 8, 16, 24, 32, 64, 96, 128, 256, 384, 512, 1024, 2048)
        ns, ks = (256, 1024, 4096, 8192), (256, 1024, 4096)
        dtypes = ("bfloat16", "float32")
        cap = 2.0 ** 32
    # a weight of at most 2^24 elements on a CPU (64 MB in fp32: memory stays a few hundred MB)
    most = 2.0 ** 40 if accel else 2.0 ** 24
    pts = [p for p in cartesian(dtype=dtypes, k=ks, n=ns, m=ms)
           if 2.0 * p["m"] * p["n"] * p["k"] <= cap and p["n"] * p["k"] <= most]
    return pts, {"dtype": dtypes, "m": ms, "n": ns, "k": ks, "max_flops": cap, "max_weight_elems": most}


#: (heads, kv_heads, head_dim) per rank: small models' layouts (a lookup matches them exactly)
HEADS_CPU = ((4, 2, 64), (16, 4, 64), (32, 8, 128))
HEADS_CPU_QUICK = ((4, 2, 64), (32, 8, 128))
HEADS_ACCEL = ((4, 2, 64), (8, 1, 128), (8, 8, 128), (16, 4, 64), (32, 8, 64), (32, 8, 128))
#: the sliding window timed besides full attention (for the first head layout only, or two on an accelerator)
WINDOW = 128


def _context_grid(accel: bool, quick: bool) -> tuple[list, dict]:
    if accel:
        heads, batch = HEADS_ACCEL, (1, 2, 4, 8, 16)
        seq = (64, 128, 256, 512, 1024, 2048, 4096, 8192) if not quick else (128, 1024, 8192)
        cap = 2.0 ** 30  # score elements b·H·s² (fp32: 4 GB)
    elif quick:
        heads, batch, seq, cap = HEADS_CPU_QUICK, (1, 4), (16, 64, 256, 1024), 2.0 ** 23
    else:
        heads, batch, seq, cap = HEADS_CPU, (1, 2, 4), (16, 64, 128, 256, 512, 1024, 2048), 2.0 ** 23
    pts = []
    for j, (h, kvh, d) in enumerate(heads):
        windows = (0, WINDOW) if j < (2 if accel else 1) else (0,)
        for w in windows:
            for b in batch:
                for s in seq:
                    work = b * h * s * (min(s, 2 * w) if w else s)
                    if work <= cap:
                        pts.append({"batch": b, "seq": s, "heads": h, "kv_heads": kvh, "head_dim": d, "window": w})
    return pts, {"heads_kv_heads_head_dim": heads, "batch": batch, "seq": seq, "window": (0, WINDOW),
                 "max_score_elems": cap}


def _generation_grid(accel: bool, quick: bool) -> tuple[list, dict]:
    if accel:
        heads, batch = HEADS_ACCEL, (1, 2, 4, 8, 16, 32, 64, 128, 256)
        ctx = (128, 512, 2048, 4096, 8192, 16384, 32768) if not quick else (128, 2048, 32768)
        cap = 2.0 ** 32  # KV-cache bytes held
    elif quick:
        heads, batch, ctx, cap = HEADS_CPU_QUICK, (1, 4, 16), (64, 256, 1024, 4096), 2.0 ** 24
    else:
        heads, batch, ctx, cap = HEADS_CPU, (1, 2, 4, 8, 16, 32), (64, 256, 1024, 2048, 4096, 8192), 2.0 ** 25
    pts = []
    for j, (h, kvh, d) in enumerate(heads):
        windows = (0, WINDOW) if j < (2 if accel else 1) else (0,)
        for w in windows:
            for b in batch:
                for c in ctx:
                    if 2 * 2 * b * c * kvh * d <= cap:  # the cache held (a window reads less of it)
                        pts.append({"batch": b, "ctx": c, "heads": h, "kv_heads": kvh, "head_dim": d, "window": w})
    return pts, {"heads_kv_heads_head_dim": heads, "batch": batch, "ctx": ctx, "window": (0, WINDOW),
                 "max_kv_bytes": cap}


def _elementwise_grid(accel: bool, quick: bool) -> tuple[list, dict]:
    ops = ("rmsnorm", "silu_mul", "add")
    if accel:
        tokens = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)[::2 if quick else 1]
        elems = (256, 1024, 2048, 4096, 8192, 16384, 32768)
        cap = 2.0 ** 29
    elif quick:
        tokens, elems, cap = (1, 16, 256, 4096), (256, 1024, 4096, 16384), 2.0 ** 23
    else:
        tokens, elems, cap = (1, 4, 16, 64, 256, 1024, 4096), (256, 1024, 4096, 16384), 2.0 ** 24
    pts = [p for p in cartesian(op=ops, elems=elems, tokens=tokens) if p["tokens"] * p["elems"] <= cap]
    return pts, {"op": ops, "tokens": tokens, "elems": elems, "max_elems": cap}


def _copy_grid(accel: bool, quick: bool) -> tuple[list, dict]:
    top = 30 if accel else 24
    sizes = tuple(2 ** e for e in range(10, top + 1, 2))
    return [{"bytes": b} for b in sizes], {"bytes": sizes}


GRIDS = {"gemm": _gemm_grid, "attention_context": _context_grid, "attention_generation": _generation_grid,
         "elementwise": _elementwise_grid, "copy": _copy_grid}


def default_grid(platform: str, quick: bool = False) -> dict:
    """family -> (points, description) for a JAX platform ("cpu", "gpu", "tpu")."""
    accel = platform != "cpu"
    return {f: GRIDS[f](accel, quick) for f in FAMILIES}


# ---- timing ----------------------------------------------------------------------------------------------

def time_call(call, warmup: int, reps: int) -> tuple[float, float] | tuple[None, None]:
    """(median, min) seconds of ``call()`` (which returns the arrays to wait for): one untimed call
    (compilation), ``warmup`` untimed calls, then ``reps`` timed calls, each synchronised with
    ``block_until_ready``. (None, None) when the point does not fit in the device's memory."""
    import jax

    try:
        jax.block_until_ready(call())
    except Exception as e:  # noqa: BLE001 - XLA's runtime error type moved between jaxlib releases
        if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
            return None, None
        raise
    for _ in range(warmup):
        jax.block_until_ready(call())
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = call()
        jax.block_until_ready(out)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


class _Inputs:
    """Random normal device arrays, kept while consecutive points share them (a GEMM's weights over its m
    sweep) and dropped when the key changes (bounded memory). Values come from a host pool of standard
    normals, tiled from a moving start (no RNG kernel to compile per shape) and cast to the point's dtype."""

    POOL = 1 << 20

    def __init__(self, seed: int = 0):
        self._pool = np.random.default_rng(seed).standard_normal(self.POOL, dtype=np.float32)
        self._cast: dict = {}
        self._held: dict = {}
        self._shift = 0

    def host(self, shape, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        if dt not in self._cast:
            self._cast[dt] = self._pool.view(np.uint8) if dt == np.uint8 else self._pool.astype(dt)
        src = self._cast[dt]
        self._shift = (self._shift + 7919) % len(src)
        return np.resize(np.roll(src, self._shift), int(np.prod(shape))).reshape(shape)

    def get(self, key, shape, dtype):
        import jax

        if key not in self._held:
            self._held[key] = jax.block_until_ready(jax.device_put(self.host(shape, dtype)))
        return self._held[key]

    def keep(self, *keys):
        """Drop every held array but ``keys``, and the compiled kernels of the point just timed (each
        shape compiles its own: a sweep would otherwise hold hundreds of them)."""
        import jax

        self._held = {k: v for k, v in self._held.items() if k in keys}
        jax.clear_caches()
        _trim()


def _trim() -> None:
    """Give freed heap memory back to the system (glibc), so the process stays near the largest point's
    footprint instead of growing with fragmentation over a sweep."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


# ---- kernels ---------------------------------------------------------------------------------------------

def _gemm_fn():
    """The executor's GEMM: both operands in the inputs' dtype, fp32 accumulation, the result cast back."""
    import jax

    return jax.jit(lambda a, w: matmul(a, w, a.dtype).astype(a.dtype))


def _attend(q, k, v, window: int):
    """The executor's attention for a request group whose queries are the last ``q.shape[1]`` of the
    ``k.shape[1]`` cached positions (a prompt: all of them; a decode step: the last one)."""
    new = q.shape[1]
    return gqa_attention(q, k, v, k.shape[1] - new, new, window).astype(q.dtype)


def _rmsnorm(x, w):
    return rmsnorm(x, w, EPS).astype(x.dtype)


def _silu_mul(gu):
    return gated(gu, "silu").astype(gu.dtype)


def _add(a, b):
    return a + b


# ---- families --------------------------------------------------------------------------------------------

def _run_gemm(points, inp, warmup, reps, tick):
    import jax.numpy as jnp

    f = _gemm_fn()
    for p in sorted(points, key=lambda p: (p["dtype"], p["k"], p["n"], p["m"])):
        dt = jnp.dtype(p["dtype"])
        wkey = ("w", p["dtype"], p["k"], p["n"])
        w = inp.get(wkey, (p["k"], p["n"]), dt)
        a = inp.get(("a", p["dtype"], p["m"], p["k"]), (p["m"], p["k"]), dt)
        med, lo = time_call(lambda: f(a, w), warmup, reps)
        inp.keep(wkey)
        tick()
        yield {"op": "gemm", "dtype": p["dtype"], "kv_dtype": "", "kernel": "jnp.dot",
               "m": p["m"], "n": p["n"], "k": p["k"]}, med, lo


def _attention_runner(phase: str):
    """The runner of ``attention_<phase>``: a prompt of ``seq`` positions (context) or one query over ``ctx``
    cached positions (generation), per head layout and window, through the executor's kernel."""
    length = "seq" if phase == "context" else "ctx"

    def run(points, inp, warmup, reps, tick):
        import jax
        import jax.numpy as jnp

        bf = jnp.bfloat16
        fns = {}
        order = ("heads", "kv_heads", "head_dim", "window", "batch", length)
        for p in sorted(points, key=lambda p: tuple(p[c] for c in order)):
            b, n, h, hk, d, w = (p[c] for c in ("batch", length, "heads", "kv_heads", "head_dim", "window"))
            require(h % hk == 0 and hk > 0, f"grid.attention_{phase}", f"heads {h} not a multiple of kv_heads {hk}")
            if w not in fns:
                fns[w] = jax.jit(lambda q, k, v, w=w: _attend(q, k, v, w))
            nq = n if phase == "context" else 1
            q = inp.get(("q", b, nq, h, d), (b, nq, h, d), bf)
            k = inp.get(("k", b, n, hk, d), (b, n, hk, d), bf)
            v = inp.get(("v", b, n, hk, d), (b, n, hk, d), bf)
            med, lo = time_call(lambda: fns[w](q, k, v), warmup, reps)
            inp.keep()
            tick()
            yield {"op": phase, "dtype": "bfloat16", "kv_dtype": "bfloat16", "kernel": "graphsim gqa_attention",
                   **p}, med, lo

    return run


def _run_elementwise(points, inp, warmup, reps, tick):
    import jax
    import jax.numpy as jnp

    bf = jnp.bfloat16
    fns = {"rmsnorm": jax.jit(_rmsnorm), "silu_mul": jax.jit(_silu_mul), "add": jax.jit(_add)}
    for p in sorted(points, key=lambda p: (p["op"], p["elems"], p["tokens"])):
        op, t, e = p["op"], p["tokens"], p["elems"]
        require(op in fns, "grid.elementwise", f"op {op!r}: the collector times {', '.join(fns)}")
        if op == "rmsnorm":
            args = (inp.get(("x", t, e), (t, e), bf), inp.get(("w", e), (e,), bf))
        elif op == "silu_mul":
            args = (inp.get(("gu", t, e), (t, 2 * e), bf),)
        else:
            args = (inp.get(("x", t, e), (t, e), bf), inp.get(("y", t, e), (t, e), bf))
        med, lo = time_call(lambda: fns[op](*args), warmup, reps)
        inp.keep()
        tick()
        yield {"op": op, "dtype": "bfloat16", "kv_dtype": "", "kernel": f"jnp {op}", "tokens": t, "elems": e}, med, lo


def _run_copy(points, inp, warmup, reps, tick):
    """A cache write: ``bytes`` written into a buffer twice that size at a moving offset; the buffer is donated,
    so the update is in place (the call's work is reading and writing ``bytes``, no new allocation)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    f = jax.jit(lambda buf, x, off: lax.dynamic_update_slice(buf, x, (off,)), donate_argnums=0)
    for p in points:
        n = p.get("bytes") if isinstance(p, dict) else None
        require(isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**48, "grid.copy.bytes",
                f"must be a whole number of bytes in [1, 2**48), got {n!r}")
    for p in sorted(points, key=lambda p: p["bytes"]):
        n = int(p["bytes"])
        try:
            x = inp.get(("bytes", n), (n,), np.uint8)
            state = {"buf": jax.device_put(np.zeros((2 * n,), np.uint8)), "i": 0}
        except MemoryError:  # the host cannot hold the inputs: like a point the device cannot hold
            tick()
            yield {"op": "copy", "dtype": "uint8", "kv_dtype": "", "kernel": "dynamic_update_slice (donated)",
                   "bytes": n}, None, None
            continue
        offs = [jnp.int32(o) for o in (0, n // 3, n // 2, n)]

        def call():
            state["i"] += 1
            state["buf"] = f(state["buf"], x, offs[state["i"] % len(offs)])
            return state["buf"]

        med, lo = time_call(call, warmup, reps)
        state.clear()
        inp.keep()
        tick()
        yield {"op": "copy", "dtype": "uint8", "kv_dtype": "", "kernel": "dynamic_update_slice (donated)",
               "bytes": n}, med, lo


RUNNERS = {"gemm": _run_gemm, "attention_context": _attention_runner("context"),
           "attention_generation": _attention_runner("generation"),
           "elementwise": _run_elementwise, "copy": _run_copy}


# ---- the command -----------------------------------------------------------------------------------------

def _grid_summary(points: list) -> dict:
    keys = list(dict.fromkeys(k for p in points for k in p))
    return {k: sorted({p[k] for p in points if k in p}, key=lambda v: (isinstance(v, str), v)) for k in keys}


def _frame(family: str, env: dict, rows: list, reps: int):
    import pandas as pd

    from graphsim.views.measured.schema import COMMON, FAMILIES as TABLES, LATENCY, check_frame

    fam = TABLES[family]
    source = f"graphsim collect ops r{COLLECTOR_REVISION}"
    out = {c: [] for c in COMMON + fam.identity + fam.coords + (LATENCY, "latency_min_s", "reps")}
    for r, med, lo in rows:
        ident = {"device": env["device"], "device_name": env["device_name"], "framework": env["framework"],
                 "version": env["version"], "image_digest": env["image_digest"],
                 "kernel_source": f"{env['kernel_source']} {r['kernel']}", "family": family, "op": r["op"],
                 "dtype": r["dtype"], "kv_dtype": r["kv_dtype"], "boundary": "kernel",
                 "collected": env["collected"], "source": source}
        for c in COMMON + fam.identity:
            out[c].append(str(ident.get(c, "")))
        for c in fam.coords:
            out[c].append(int(r[c]))
        out[LATENCY].append(float(med))
        out["latency_min_s"].append(float(lo))
        out["reps"].append(int(reps))
    df = pd.DataFrame(out)
    for c in fam.coords:
        df[c] = df[c].astype(np.int64)
    df[LATENCY] = df[LATENCY].astype(np.float64)
    check_frame(df, f"collect ops {family}")
    return df


def _device_name(hw) -> str:
    if hasattr(hw, "name"):
        return str(hw.name)
    from graphsim.hw import load_hw

    return str(load_hw(hw).name)


def collect_ops(hw, out_dir, *, families=None, quick: bool = False, warmup: int = 2, reps: int = 5, log=None,
                grid: dict | None = None, seed: int = 0) -> dict:
    """Time the op families on the default JAX device; write ``out_dir/<device>/<family>/jax@<version>/
    local.parquet`` and ``out_dir/provenance.json``. ``hw``: a descriptor name or TOML path (or a loaded one);
    ``grid``: family -> points replacing the default grid (families = its keys unless given). Returns
    {"device", "backend", "rows": {family: n}, "seconds": {family: s}, "total_s", "files"}."""
    log = log or (lambda *a, **k: None)
    require(isinstance(warmup, int) and warmup >= 0, "warmup", f"must be a whole number >= 0, got {warmup!r}")
    require(isinstance(reps, int) and reps >= 1, "reps", f"must be a whole number >= 1, got {reps!r}")
    if grid is not None:
        bad = sorted(set(grid) - set(FAMILIES))
        require(not bad, "grid", f"unknown families {bad}; the collector times {', '.join(FAMILIES)}")
    wanted = list(families) if families else (list(grid) if grid is not None else list(FAMILIES))
    bad = sorted(set(wanted) - set(FAMILIES))
    require(not bad, "family", f"unknown {bad}; the collector times {', '.join(FAMILIES)}")
    wanted = [f for f in FAMILIES if f in wanted]
    from graphsim.core.outputs import exclusive, output_path, safe_name

    device = safe_name(_device_name(hw).lower(), "hw.name")  # it names a folder under the output
    out = output_path(out_dir, folder=True)  # before any work: a file, a device, an unwritable place
    with exclusive(out):
        return _collect(out, out_dir, device, wanted, grid, quick, warmup, reps, log, seed)


def _collect(out: Path, out_dir, device: str, wanted: list, grid, quick: bool, warmup: int, reps: int, log,
             seed: int) -> dict:
    from graphsim.core.outputs import atomic_target, safe_name

    env = environment(device)
    grids = default_grid(env["platform"], quick)
    if grid is not None:
        grids = {f: (list(grid.get(f, ())), None) for f in grid} | {f: g for f, g in grids.items() if f not in grid}
    todo = {f: grids[f][0] for f in wanted}
    total = sum(len(p) for p in todo.values())
    backend = f"jax@{env['version']}"
    log(f"collect ops on {env['device_name']} ({env['platform']}) as {env['device']} / {backend}: "
        f"{total} points over {', '.join(wanted)} (warmup {warmup}, reps {reps}{', quick' if quick else ''})")
    summary = {"device": env["device"], "backend": backend, "rows": {}, "seconds": {}, "files": []}
    prov_families = {}
    t_all = time.perf_counter()
    inp = _Inputs(seed)
    for fam in wanted:
        pts = todo[fam]
        if not pts:
            continue
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        t0 = time.perf_counter()
        done = [0]
        last = [t0]

        def tick(fam=fam, n=len(pts)):
            done[0] += 1
            now = time.perf_counter()
            if now - last[0] > 15 or done[0] == n:
                last[0] = now
                log(f"  {fam}: {done[0]}/{n} points, {now - t0:.1f} s")

        rows = list(RUNNERS[fam](pts, inp, warmup, reps, tick))
        skipped = [r for r, med, _ in rows if med is None]
        rows = [r for r in rows if r[1] is not None]
        if skipped:
            log(f"  {fam}: {len(skipped)} points did not fit in the device's memory (skipped)")
        if not rows:
            continue
        inp.keep()
        secs = time.perf_counter() - t0
        df = _frame(fam, env, rows, reps)
        dst = out / safe_name(env["device"], "hw.name") / fam / safe_name(backend, "backend") / FILE
        with atomic_target(dst, suffixes=(".parquet",)) as tmp:
            df.to_parquet(tmp, index=False)
        summary["rows"][fam] = len(df)
        summary["seconds"][fam] = round(secs, 3)
        summary["files"].append(str(dst))
        desc = grids[fam][1]
        prov_families[fam] = {
            "file": dst.relative_to(out).as_posix(), "rows": len(df), "seconds": round(secs, 3),
            "started": started, "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "grid": "default" + (" (quick)" if quick else "") if desc is not None else "given (grid=)",
            "grid_axes": {k: list(v) if isinstance(v, tuple) else v for k, v in desc.items()} if desc is not None
            else _grid_summary(pts),
            "ops": sorted(set(df["op"])), "kernel_sources": sorted(set(df["kernel_source"])),
            "skipped_out_of_memory": [{k: v for k, v in r.items() if k != "kernel"} for r in skipped]}
    summary["total_s"] = round(time.perf_counter() - t_all, 3)
    _write_provenance(out, env, warmup, reps, prov_families)
    log(f"wrote {sum(summary['rows'].values())} rows ({', '.join(f'{f} {n}' for f, n in summary['rows'].items())}) "
        f"to {out} in {summary['total_s']:.1f} s; price a plan with --view op --measured {out_dir} --backend {backend}")
    return summary


def _write_provenance(out: Path, env: dict, warmup: int, reps: int, families: dict) -> None:
    """provenance.json: the collector, its timing method and the environment; per family the run that wrote
    its table (families collected by an earlier run into the same folder are kept)."""
    from graphsim.core.outputs import write_text

    path = out / "provenance.json"
    prev = {}
    if path.is_file():
        try:
            prev = json.loads(path.read_text())
        except (OSError, ValueError):
            prev = {}
    kept = prev.get("families", {}) if prev.get("collector") == "graphsim collect ops" else {}
    timing = {"warmup": warmup, "reps": reps, "statistic": "median of reps (latency_s); min in latency_min_s",
              "method": "one untimed call (compilation + first run), `warmup` untimed calls, then `reps` calls "
                        "each timed with time.perf_counter() around the call and block_until_ready() on its result",
              "boundary": BOUNDARY_NOTE}
    for fam in families:
        families[fam] = {**families[fam], "timing": timing, "environment": env}
    prov = {"collector": "graphsim collect ops", "revision": COLLECTOR_REVISION,
            "source": f"graphsim collect ops r{COLLECTOR_REVISION}", "environment": env, "timing": timing,
            "families": {**kept, **families}}
    write_text(path, json.dumps(prov, indent=2, default=str))


__all__ = ["collect_ops", "default_grid", "cartesian", "time_call", "FAMILIES"]
