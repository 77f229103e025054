"""``graphsim hw probe``: measure this machine's default JAX device and write a hardware descriptor.

``graphsim hw probe [NAME] [-o local.toml] [--quick]`` times a few kernels with JAX on ``jax.devices()[0]``
(a CPU here, a GPU where JAX sees one; the same code for both) and writes a TOML file that
:func:`graphsim.hw.load_hw` loads, so ``--hw local.toml`` prices a graph at this machine's speed of light.

What is measured (each figure with a ``[sources]`` note: what ran, sizes, repetitions, device, JAX, date):

* ``peak_flops``: jitted matmuls over several square and rectangular shapes per dtype the device runs —
  bf16 (and fp16, the same 16-bit class: ``bf16`` is the better of the two), fp32 (on a GPU ``Precision.HIGHEST``;
  ``tf32`` is fp32 at ``Precision.DEFAULT`` there, and equals fp32 on a CPU, which has no TF32 mode), fp8
  (``float8_e4m3fn`` inputs, fp32 result) and int8 (int32 result). A dtype whose matmul raises is left out,
  and the loader falls back for it (fp8 -> bf16, int8 -> fp8). There is no fp4 matmul in JAX: fp4 falls back.
* ``hbm_bw``: a jitted, donated ``x + 1`` over an fp32 array well beyond the last-level cache (>= 512 MiB and
  >= 4x the LLC on a CPU, 1 GiB on an accelerator), bytes = read + write. A cache-resident size is timed too and
  reported in the note only. Donation matters: without it every call faults in a fresh output buffer and a CPU
  "copy" measures the page-fault rate (several times slower), not DRAM.
* ``exp_rate``: exponentials per second from one fused kernel summing many *independent* ``exp(x - c_k)`` over
  an array that stays in cache (compute-bound). Independent, not a chain ``exp(exp(...))``: a serial chain
  measures the exp's latency on a CPU (each element's chain is one dependency chain), not its throughput.
  The kernel is timed at two fan-outs; time doubling with the fan-out shows XLA fused it.
* ``hbm_capacity_bytes``: an accelerator's ``memory_stats()["bytes_limit"]``; a CPU's physical memory.
* ``host_mem_bytes``: physical memory. ``host_bw`` and ``c2c_bw``: on a CPU the copy bandwidth (host memory
  is the device memory); on an accelerator a host -> device ``jax.device_put`` of a large NumPy array.
* ``nvlink_bw``: a device -> device ``jax.device_put`` where JAX sees a second device of the platform.

What is not measured (a single device cannot, or the probe will not): the scale-out network, local-disk reads,
link latencies and power. These get explicit nominal values whose note starts with ``not measured:`` and says
why; ``nvlink_domain`` is the number of devices JAX sees, and with one device ``nvlink_bw`` is the copy
bandwidth and the latencies are 0.

Why every peak is a maximum: a descriptor is a speed of light, a bound that no real run beats. Each figure is
the best achieved over sizes and repetitions (minimum time after a warm-up, to ``block_until_ready``), never a
mean. Each timing covers a jitted call from the host (launch and sync included), so small sizes understate the
hardware, which is why several sizes are tried. The result is what this software stack achieves on this
machine — not a datasheet figure — and a later probe on a quieter machine may well come out higher: probe an
idle machine (the description says so when the load average at the start exceeded half the cores).
``--quick`` times fewer shapes with fewer repetitions (seconds; a lower, looser figure).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
import warnings
from typing import Callable, Optional

import numpy as np

from ...hw import PRECISIONS

MiB = 2**20
GiB = 2**30

#: (m, k, n) matmul shapes per platform kind and mode: squares plus wide and deep rectangles.
GEMM_SHAPES = {
    # rectangular shapes with a narrow k as well: a CPU's matrix units (AMX) can run them faster than cubes
    ("cpu", False): [(s, s, s) for s in (256, 512, 1024, 2048)]
    + [(2048, 512, 2048), (512, 2048, 2048), (1024, 512, 1024), (1024, 512, 4096), (4096, 256, 1024)],
    ("cpu", True): [(512, 512, 512), (1024, 1024, 1024), (2048, 512, 2048), (1024, 512, 1024)],
    ("accel", False): [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)]
    + [(8192, 2048, 8192), (4096, 8192, 4096)],
    ("accel", True): [(1024, 1024, 1024), (4096, 4096, 4096), (4096, 1024, 4096)],
}
#: Timed repetitions (after one warm-up call) per platform kind and mode.
REPS = {("cpu", False): 10, ("cpu", True): 5, ("accel", False): 20, ("accel", True): 10}

#: Nominal figures for what one device cannot measure (each written with a "not measured:" note).
_NOMINAL_SCALEOUT_BW = 12.5e9  # 100 Gb/s Ethernet
_NOMINAL_DISK_BW = 2e9  # one NVMe SSD's sequential read, PCIe Gen3/Gen4 class
_NOMINAL_CPU_W_PER_CORE = 10.0
_NOMINAL_ACCEL_W = 700.0  # a datacenter accelerator board (H100 / H200 SXM TDP class)


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------

def best_time(fn: Callable, *args, reps: int = 5) -> float:
    """Minimum wall time of ``fn(*args)`` to ``block_until_ready`` over ``reps`` calls, after one warm-up call."""
    import jax

    jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def best_time_donated(step: Callable, x, *, reps: int = 5):
    """``(seconds, x)``: the minimum time of ``x = step(x)`` (``step`` donates its argument, so the output reuses
    the input's buffer) over ``reps`` calls after one warm-up call, and the final array."""
    x = step(x)
    x.block_until_ready()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        x = step(x)
        x.block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return best, x


def donated_increment():
    """A jitted ``x + 1`` that donates ``x``: an elementwise copy that reads and writes each byte once."""
    import jax

    return jax.jit(lambda x: x + 1, donate_argnums=0)


@contextlib.contextmanager
def quiet_donation():
    """Silence the 'donated buffers were not usable' warning of backends that cannot alias."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        yield


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------

def _gemm_variants(accel: bool) -> list[tuple[str, str, object, object, object]]:
    """``(label, descriptor precision, input dtype, preferred_element_type, precision)`` per matmul to try."""
    import jax
    import jax.numpy as jnp

    hi, lo = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT
    # 16-bit inputs both with a 16-bit result and with fp32 accumulation (what a model's GEMMs ask for): the
    # backend may take a faster path for either, and the peak is the faster
    out = [("bf16", "bf16", jnp.bfloat16, None, None), ("bf16", "bf16", jnp.bfloat16, jnp.float32, None),
           ("fp16", "bf16", jnp.float16, None, None), ("fp16", "bf16", jnp.float16, jnp.float32, None),
           ("fp32", "fp32", jnp.float32, None, hi)]
    if accel:
        out.append(("tf32", "tf32", jnp.float32, None, lo))
    out += [("fp8", "fp8", jnp.float8_e4m3fn, jnp.float32, None), ("int8", "int8", jnp.int8, jnp.int32, None)]
    return out


def _operand(rows: int, cols: int, dtype, cache: dict):
    """A uniform(-1, 1) ``(rows, cols)`` matrix of ``dtype`` on the default device; the fp32 draw is kept in
    ``cache`` and shared by every dtype (int8 is the draw x 127)."""
    import jax
    import jax.numpy as jnp

    if (rows, cols) not in cache:
        key = jax.random.PRNGKey(rows * 65537 + cols)
        cache[rows, cols] = jax.random.uniform(key, (rows, cols), jnp.float32, -1.0, 1.0)
    base = cache[rows, cols]
    return (base * 127).astype(dtype) if jnp.issubdtype(dtype, jnp.integer) else base.astype(dtype)


def gemm_peak(dtype, shapes, *, reps: int, out_dtype=None, precision=None, cache: Optional[dict] = None
              ) -> Optional[dict]:
    """Best achieved rate (FLOP/s, 2mkn per matmul) of a jitted matmul of ``dtype`` over ``(m, k, n)`` shapes.

    Returns ``{"rate", "shape", "shapes"}`` (the best shape, how many shapes ran) or ``None`` when no shape
    runs (the dtype raises on this device); a failing shape is skipped. ``cache`` shares the random operands
    between calls (one fp32 draw per matrix shape).
    """
    import jax
    import jax.numpy as jnp

    mm = jax.jit(lambda a, b: jnp.matmul(a, b, precision=precision, preferred_element_type=out_dtype))
    cache = {} if cache is None else cache
    best, ran = None, 0
    for m, k, n in shapes:
        try:
            a, b = _operand(m, k, dtype, cache), _operand(k, n, dtype, cache)
            rate = 2.0 * m * k * n / best_time(mm, a, b, reps=reps)
        except Exception:  # noqa: BLE001 - an unsupported dtype raises backend-specific errors
            continue
        ran += 1
        if best is None or rate > best["rate"]:
            best = {"rate": rate, "shape": (m, k, n)}
    return None if best is None else {**best, "shapes": ran}


def copy_bandwidth(nbytes: int, *, reps: int) -> float:
    """Best B/s (read + write) of a donated ``x + 1`` over ``nbytes`` of fp32."""
    import jax.numpy as jnp

    x = jnp.zeros((nbytes // 4,), jnp.float32)
    with quiet_donation():
        seconds, x = best_time_donated(donated_increment(), x, reps=reps)
    del x
    return 2.0 * (nbytes // 4) * 4 / seconds


def exp_kernel(fan: int):
    """A jitted kernel with ``fan`` independent exponentials per element, summed pairwise (one fused loop)."""
    import jax
    import jax.numpy as jnp

    def body(x):
        terms = [jnp.exp(x - 0.01 * i) for i in range(fan)]
        while len(terms) > 1:
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
        return terms[0]

    return jax.jit(body)


def exp_throughput(n: int, fans: tuple[int, int], *, reps: int) -> dict:
    """Best exponentials/s over two fan-outs on ``n`` fp32 elements, and the ratio of their best times (about the
    fan ratio when XLA fused the kernel and it is compute-bound). The two kernels alternate, so a busy spell on
    the machine slows both alike."""
    import jax
    import jax.numpy as jnp

    x = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    kernels = {f: exp_kernel(f) for f in fans}
    best = {}
    for f, kernel in kernels.items():
        jax.block_until_ready(kernel(x))
        best[f] = math.inf
    for _ in range(reps):
        for f, kernel in kernels.items():
            t0 = time.perf_counter()
            jax.block_until_ready(kernel(x))
            best[f] = min(best[f], time.perf_counter() - t0)
    rate = max(f * n / s for f, s in best.items())
    return {"rate": rate, "ratio": best[fans[1]] / best[fans[0]], "seconds": best}


def transfer_bandwidth(nbytes: int, target, *, reps: int, source=None) -> float:
    """Best B/s of ``jax.device_put`` of ``nbytes`` to ``target``: from a host NumPy array, or from an array on
    the ``source`` device."""
    import jax

    data = np.ones(nbytes // 4, np.float32)
    if source is not None:
        data = jax.device_put(data, source)
    return nbytes // 4 * 4 / best_time(lambda: jax.device_put(data, target), reps=reps)


# --------------------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------------------

def physical_memory() -> Optional[int]:
    """Bytes of physical memory (POSIX ``sysconf``), or ``None`` where unavailable."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def last_level_cache() -> Optional[int]:
    """Bytes of CPU 0's largest cache level (Linux sysfs), or ``None`` where unknown."""
    best = None
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(root)
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "size"), encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if m:
            size = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
            best = max(best or 0, size)
    return best


def _sig(x: float, digits: int = 4) -> float:
    """A rate ``x`` rounded *up* to ``digits`` significant figures: readable, round-trips, and — every figure
    being a speed-of-light rate — never below what was measured."""
    if x == 0 or not math.isfinite(x):
        return x
    scale = 10.0 ** (digits - 1 - int(math.floor(math.log10(abs(x)))))
    return math.ceil(x * scale) / scale


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _mib(nbytes: float) -> str:
    """``1 GiB``, ``1200 MiB``, ``23.59 GiB``: whole GiB or MiB where exact, else GiB to 4 figures."""
    if nbytes % GiB == 0:
        return f"{nbytes // GiB:g} GiB"
    return f"{nbytes / MiB:g} MiB" if nbytes % MiB == 0 and nbytes < 64 * GiB else f"{nbytes / GiB:.4g} GiB"


# --------------------------------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------------------------------

def probe(name: str = "local", *, quick: bool = False, log: Optional[Callable[[str], None]] = None) -> dict:
    """Measure ``jax.devices()[0]`` and return descriptor fields (the TOML's keys; ``peak_flops`` and ``sources``
    nested dicts) for :func:`to_toml`. ``quick`` uses fewer sizes and repetitions; ``log`` gets one line per
    figure as it is measured."""
    import jax
    import jaxlib

    from .env import environment

    dev = jax.devices()[0]
    env = environment(name)
    accel = dev.platform != "cpu"
    ctx = _Context(
        dev=dev, accel=accel, quick=quick, reps=REPS[("accel" if accel else "cpu", quick)],
        stamp=(f"measured by graphsim hw probe {env['collected']} on {env['device_name']}, jax {jax.__version__}, "
               f"jaxlib {jaxlib.__version__}"),
        log=log or (lambda _msg: None))
    ctx.log(f"probing {dev.platform}: {env['device_name']}, jax {jax.__version__}{' (quick)' if quick else ''}")
    desc: dict = {"name": name, "sources": {}}
    desc["description"] = (f"local {dev.platform}: {env['device_name']}, probed {env['collected']} "
                           f"(graphsim hw probe{' --quick' if quick else ''})" + _busy_note(ctx.log))
    with jax.default_device(dev):
        _probe_gemm(ctx, desc)
        _probe_memory(ctx, desc)
        _probe_exp(ctx, desc)
        _probe_links(ctx, desc)
    _fill_unmeasured(ctx, desc)
    return {k: desc[k] for k in _FIELD_ORDER}


def _busy_note(log: Callable[[str], None]) -> str:
    """``"; machine busy: ..."`` when the 1-minute load average at the start exceeds half the cores (other work
    lowers every figure, so the result is then no bound), else ``""``."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    cores = os.cpu_count() or 1
    if load <= 0.5 * cores:
        return ""
    log(f"warning: load average {load:.2f} on {cores} cores: other work may lower the figures; probe when idle")
    return f"; machine busy (load average {load:.2f} on {cores} cores at start): figures may be low"


class _Context:
    """What every measurement step needs: the device, the mode, the note prefix and the progress logger."""

    def __init__(self, *, dev, accel: bool, quick: bool, reps: int, stamp: str, log: Callable[[str], None]):
        self.dev, self.accel, self.quick, self.reps, self.stamp, self.log = dev, accel, quick, reps, stamp, log
        self.kind = ("accel" if accel else "cpu", quick)


def _probe_gemm(ctx: _Context, desc: dict) -> None:
    """``peak_flops``: the best matmul rate per precision (fp16 counts toward bf16; tf32 = fp32 on a CPU)."""
    shapes = GEMM_SHAPES[ctx.kind]
    largest = max(shapes, key=lambda s: s[0] * s[1] * s[2])
    span = f"{len(shapes)} shapes {_shape_text(shapes[0])}..{_shape_text(largest)}"
    peaks: dict[str, float] = {}
    notes: dict[str, str] = {}
    operands: dict = {}
    for label, prec, dtype, out, precision in _gemm_variants(ctx.accel):
        what = (f"{label} matmuls" + (f" -> {np.dtype(out).name}" if out is not None else "")
                + (f" at Precision.{precision.name}" if precision is not None else ""))
        got = gemm_peak(dtype, shapes, reps=ctx.reps, out_dtype=out, precision=precision, cache=operands)
        if got is None:
            ctx.log(f"peak_flops.{prec}: {what} do not run here")
            notes.setdefault(f"skip.{prec}", f"{what} raised on this device")
            continue
        rate = _si(got["rate"], "OP/s" if prec == "int8" else "FLOP/s")
        ctx.log(f"peak_flops.{prec}: {what} {rate} (best at {_shape_text(got['shape'])})")
        if got["rate"] > peaks.get(prec, 0.0):
            peaks[prec] = got["rate"]
            notes[prec] = (f"{ctx.stamp}: {what}, best of {ctx.reps} reps (min time after a warm-up) over "
                           f"{got['shapes']} of {span} = {rate} at {_shape_text(got['shape'])}")
    if "bf16" in notes:
        notes["bf16"] += " (the better of bf16 and fp16: the descriptor's 16-bit float class)"
    if not ctx.accel and "fp32" in peaks:
        peaks["tf32"] = peaks["fp32"]
        notes["tf32"] = "= fp32: a CPU has no TF32 mode (XLA runs fp32 matmuls at full precision); see peak_flops.fp32"
    desc["peak_flops"] = {p: _sig(peaks[p]) for p in PRECISIONS if p in peaks}
    src = desc["sources"]
    src["peak_flops"] = (f"{ctx.stamp}: per dtype, the best rate (2*m*k*n / min time) of jitted matmuls over {span}, "
                         f"{ctx.reps} reps after a warm-up; absent precisions fall back (fp4/int8 -> fp8 -> bf16)")
    for prec in PRECISIONS:
        if prec in notes:
            src[f"peak_flops.{prec}"] = notes[prec]
        else:
            why = notes.get(f"skip.{prec}", "JAX has no fp4 matmul" if prec == "fp4" else "no matmul tried")
            src[f"peak_flops.{prec}"] = f"not measured: {why}; the loader falls back to the next precision"


def copy_sizes(accel: bool, capacity: Optional[int], llc: Optional[int]) -> tuple[int, int, str]:
    """``(bytes, cache-resident bytes, why)`` of the copy-bandwidth arrays: well beyond the last-level cache
    (a CPU: >= 512 MiB and >= 4x the LLC, at most capacity / 8; an accelerator: 1 GiB, >= 4x any current GPU
    L2) and one that stays in cache."""
    if accel:
        big = GiB if capacity is None else max(256 * MiB, min(GiB, capacity // 8))
        return big, 8 * MiB, "1 GiB, >= 4x any current GPU L2" if big == GiB else "device capacity / 8"
    big = -(-max(512 * MiB, 4 * (llc or 0)) // (64 * MiB)) * 64 * MiB
    if capacity:
        big = min(big, max(128 * MiB, capacity // 8))
    small = min(64 * MiB, max(MiB, (llc or 4 * MiB) // 4))
    return big, small, f">= 512 MiB and >= 4x the {_mib(llc)} last-level cache" if llc else ">= 512 MiB"


def _memory_stats(dev) -> dict:
    """The device's ``memory_stats()`` (``{}`` where the backend has none)."""
    try:
        return dev.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without the call raise their own errors
        return {}


def _probe_memory(ctx: _Context, desc: dict) -> None:
    """``hbm_bw`` (a copy beyond the caches), ``hbm_capacity_bytes`` and ``host_mem_bytes``."""
    phys = physical_memory()
    stats = _memory_stats(ctx.dev) if ctx.accel else {}
    capacity = stats.get("bytes_limit") or (None if ctx.accel else phys)
    src = desc["sources"]
    if capacity:
        desc["hbm_capacity_bytes"] = int(capacity)
        src["hbm_capacity_bytes"] = (f"{ctx.stamp}: device memory_stats()['bytes_limit']" if ctx.accel else
                                     f"{ctx.stamp}: physical memory (sysconf pages x page size); a CPU's device "
                                     "memory is host memory")
    else:
        desc["hbm_capacity_bytes"] = 16 * GiB
        src["hbm_capacity_bytes"] = "not measured: the device reports no memory limit; nominal 16 GiB"
    ctx.log(f"hbm_capacity_bytes: {_mib(desc['hbm_capacity_bytes'])}")
    desc["host_mem_bytes"] = phys or 16 * GiB
    src["host_mem_bytes"] = (f"{ctx.stamp}: physical memory (sysconf pages x page size)" if phys else
                             "not measured: sysconf has no physical-memory figure here; nominal 16 GiB")

    big, small, why = copy_sizes(ctx.accel, capacity, None if ctx.accel else last_level_cache())
    reps = ctx.reps
    hbm = copy_bandwidth(big, reps=reps)
    ctx.log(f"hbm_bw: x+1 over {_mib(big)} {_si(hbm, 'B/s')}")
    cached = copy_bandwidth(small, reps=ctx.reps)
    ctx.log(f"  (cache-resident x+1 over {_mib(small)}: {_si(cached, 'B/s')}, not used)")
    desc["hbm_bw"] = _sig(hbm)
    src["hbm_bw"] = (f"{ctx.stamp}: jitted donated fp32 x+1 over {_mib(big)} ({why}), bytes = read + write, best of "
                     f"{reps} reps = {_si(hbm, 'B/s')}; cache-resident {_mib(small)}: {_si(cached, 'B/s')} "
                     "(same reps; not used)")


def _probe_exp(ctx: _Context, desc: dict) -> None:
    """``exp_rate``: a fused kernel of independent exponentials over a cache-resident array."""
    n, fans = (1 << 22, (64, 128)) if ctx.accel else (1 << 18, (16, 32))  # 16 MiB / 1 MiB: in L2
    if ctx.quick:
        fans = (fans[0] // 2, fans[0])
    reps = 3 * ctx.reps  # milliseconds each: cheap, and the fusion check wants a clean minimum
    ex = exp_throughput(n, fans, reps=reps)
    fused = 1.5 <= ex["ratio"] <= 2.6
    check = f"time x{ex['ratio']:.2f} for x2 exps " + ("(fused, compute-bound)" if fused else
                                                       "(NOT linear: fusion or a busy machine suspect)")
    ctx.log(f"exp_rate: {_si(ex['rate'], 'exp/s')}; {check}")
    desc["exp_rate"] = _sig(ex["rate"])
    desc["sources"]["exp_rate"] = (
        f"{ctx.stamp}: one jitted fused kernel summing {fans[0]} and {fans[1]} independent exp(x - c) per element "
        f"over {n} fp32 elements ({_mib(n * 4)}), alternating, best of {reps} reps = {_si(ex['rate'], 'exp/s')}; "
        f"{check}")


def _probe_links(ctx: _Context, desc: dict) -> None:
    """``host_bw`` / ``c2c_bw`` (host -> device, or the copy on a CPU), ``nvlink_bw`` / ``nvlink_domain``."""
    import jax

    src, reps = desc["sources"], max(3, ctx.reps // 2)
    nbytes = 64 * MiB if ctx.quick else 256 * MiB
    if ctx.accel:
        h2d = transfer_bandwidth(nbytes, ctx.dev, reps=reps)
        ctx.log(f"host_bw / c2c_bw: device_put {_mib(nbytes)} host -> device {_si(h2d, 'B/s')}")
        note = (f"{ctx.stamp}: jax.device_put of a {_mib(nbytes)} NumPy array (pageable memory) host -> device, "
                f"best of {reps} = {_si(h2d, 'B/s')}")
        desc["host_bw"], desc["c2c_bw"] = _sig(h2d), _sig(h2d)
        src["host_bw"] = note + "; the host's own DRAM bandwidth is not measured"
        src["c2c_bw"] = note
    else:
        desc["host_bw"], desc["c2c_bw"] = desc["hbm_bw"], desc["hbm_bw"]
        src["host_bw"] = "= hbm_bw: on a CPU host memory is the device memory (see hbm_bw)"
        src["c2c_bw"] = "= hbm_bw: on a CPU there is no host <-> device link; a transfer is a memory copy"
        ctx.log(f"host_bw / c2c_bw: = hbm_bw {_si(desc['hbm_bw'], 'B/s')}")

    peers = [d for d in jax.devices(ctx.dev.platform) if d != ctx.dev]
    desc["nvlink_domain"] = 1 + len(peers)
    src["nvlink_domain"] = f"not measured: the number of {ctx.dev.platform} devices JAX sees ({1 + len(peers)})"
    if peers:
        p2p = transfer_bandwidth(nbytes, peers[0], reps=reps, source=ctx.dev)
        desc["nvlink_bw"] = _sig(p2p)
        src["nvlink_bw"] = (f"{ctx.stamp}: jax.device_put of {_mib(nbytes)} from device {ctx.dev.id} to "
                            f"{peers[0].id}, best of {reps} = {_si(p2p, 'B/s')}")
        ctx.log(f"nvlink_bw: device {ctx.dev.id} -> {peers[0].id} {_si(p2p, 'B/s')}")
    else:
        desc["nvlink_bw"] = desc["hbm_bw"]
        src["nvlink_bw"] = "not measured: one device, no peer link; set to the copy bandwidth (hbm_bw)"


def _fill_unmeasured(ctx: _Context, desc: dict) -> None:
    """Nominal values, each with a ``not measured:`` note, for what one device cannot measure."""
    src = desc["sources"]
    desc["scaleout_bw"] = _NOMINAL_SCALEOUT_BW
    src["scaleout_bw"] = "not measured: the probe runs no network test; nominal 100 Gb/s Ethernet = 12.5 GB/s"
    desc["disk_bw"] = _NOMINAL_DISK_BW
    src["disk_bw"] = ("not measured: a true disk read needs a file larger than the page cache; nominal 2 GB/s "
                      "(one NVMe SSD)")
    desc["nvlink_latency_s"] = 0.0
    src["nvlink_latency_s"] = ("not measured: one device, no peer hops; 0" if desc["nvlink_domain"] == 1 else
                               "not measured: peer transfer latency is not timed; 0 (a lower bound)")
    for f in ("nvlink_ll_latency_s", "nvlink_simple_latency_s"):  # the other protocols' steps: the same
        desc[f] = 0.0
        src[f] = src["nvlink_latency_s"]
    desc["nvls_bw"] = 0.0
    src["nvls_bw"] = "not measured: in-switch reduction is not probed; 0 (none: collectives run without it)"
    desc["scaleout_latency_s"] = 0.0
    src["scaleout_latency_s"] = "not measured: the probe runs no network test; 0 (a lower bound)"
    desc["l2_bytes"] = 0.0
    src["l2_bytes"] = "not measured: JAX exposes no cache size; 0 (unknown: no measured row is treated as L2-resident)"
    if ctx.accel:
        desc["power_w"] = _NOMINAL_ACCEL_W
        src["power_w"] = "not measured: JAX exposes no power reading; nominal 700 W (datacenter GPU board TDP class)"
    else:
        cores = os.cpu_count() or 1
        desc["power_w"] = _NOMINAL_CPU_W_PER_CORE * cores
        src["power_w"] = (f"not measured: JAX exposes no power reading; nominal {_NOMINAL_CPU_W_PER_CORE:g} W per "
                          f"core x {cores} cores")
    ctx.log("not measured (nominal): scaleout_bw, disk_bw, nvlink_latency_s, scaleout_latency_s, power_w")


def _shape_text(shape: tuple[int, int, int]) -> str:
    m, k, n = shape
    return f"{m}x{k}x{n}"


#: The TOML's key order: HardwareSpec's field order.
_FIELD_ORDER = ("name", "description", "peak_flops", "hbm_capacity_bytes", "hbm_bw", "nvlink_bw", "nvlink_domain",
                "scaleout_bw", "host_mem_bytes", "host_bw", "c2c_bw", "exp_rate", "disk_bw", "nvlink_latency_s",
                "scaleout_latency_s", "power_w", "nvlink_ll_latency_s", "nvlink_simple_latency_s", "nvls_bw", "l2_bytes", "sources")
_UNITS = {"hbm_capacity_bytes": "B", "hbm_bw": "B/s", "nvlink_bw": "B/s", "scaleout_bw": "B/s",
          "host_mem_bytes": "B", "host_bw": "B/s", "c2c_bw": "B/s", "exp_rate": "exp/s", "disk_bw": "B/s",
          "nvlink_latency_s": "s", "scaleout_latency_s": "s", "power_w": "W", "nvlink_ll_latency_s": "s",
          "nvlink_simple_latency_s": "s", "nvls_bw": "B/s", "l2_bytes": "B"}


# --------------------------------------------------------------------------------------------------
# TOML
# --------------------------------------------------------------------------------------------------

def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escaping (quotes, backslashes, control characters) plus DEL, which TOML
    also forbids raw."""
    return json.dumps(str(text), ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_key(key: str) -> str:
    """A bare key where TOML allows one, else a quoted key (``"peak_flops.bf16"`` is one key, not a table)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return repr(value)  # the shortest text that reads back as the same float
    return _toml_string(value)


def to_toml(desc: dict) -> str:
    """The descriptor TOML for ``desc`` (as :func:`probe` returns it): a header comment, top-level scalars,
    ``[peak_flops]`` and ``[sources]``; loads with :func:`graphsim.hw.load_hw`."""
    lines = [
        f"# {_toml_string(desc.get('name', 'local'))}: probed by `graphsim hw probe` (jitted JAX kernels on the default "
        "device).",
        "# Every figure is the best achieved over sizes and repetitions (a speed of light, never a mean);",
        "# figures a single device cannot measure are nominal and their [sources] note says \"not measured\".",
        "# Per device, SI units, decimal bandwidths (1 GB/s = 1e9 B/s).",
    ]
    tables = {k: v for k, v in desc.items() if isinstance(v, dict)}
    for key, value in desc.items():
        if key in tables:
            continue
        line = f"{_toml_key(key)} = {_toml_value(value)}"
        if key in _UNITS and isinstance(value, (int, float)):
            line += f"  # {_si(float(value), _UNITS[key])}"
        lines.append(line)
    for table, entries in tables.items():
        lines += ["", f"[{_toml_key(table)}]"]
        for key, value in entries.items():
            line = f"{_toml_key(key)} = {_toml_value(value)}"
            if table == "peak_flops":
                line += f"  # {_si(float(value), 'OP/s' if key == 'int8' else 'FLOP/s')}"
            lines.append(line)
    return "\n".join(lines) + "\n"
