"""`graphsim hw probe`: a quick probe of the local JAX device writes a descriptor that loads, notes every figure's
source, prices a model through the CLI, and bounds kernels it did not time (a SOL no real run beats)."""
from __future__ import annotations

import contextlib
import io
import math
import re

import attrs
import pytest

from graphsim.cli import main
from graphsim.views.collect import probe as pr
from graphsim.hw import REQUIRED_PRECISIONS, HardwareSpec, load_hw

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

MEASURED = ("hbm_bw", "exp_rate", "hbm_capacity_bytes", "host_mem_bytes")
UNMEASURED = ("scaleout_bw", "disk_bw", "nvlink_latency_s", "scaleout_latency_s", "power_w", "nvlink_domain")


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """One quick probe through the CLI: ``(path of the TOML, the progress log it printed)``."""
    path = tmp_path_factory.mktemp("probe") / "local.toml"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["hw", "probe", "--quick", "-o", str(path)])
    assert rc == 0, err.getvalue()
    assert "wrote" in out.getvalue()
    return path, err.getvalue()


@pytest.fixture(scope="module")
def spec(probed) -> HardwareSpec:
    return load_hw(probed[0])


def test_probed_descriptor_loads_with_every_required_precision(spec):
    peaks = dict(spec.peak_flops)
    assert set(REQUIRED_PRECISIONS) <= set(peaks)
    assert peaks["fp32"] > 0 and spec.hbm_bw > 0 and spec.exp_rate > 0
    assert spec.name == "local"
    assert spec.description.startswith("local ") and "graphsim hw probe" in spec.description
    # every precision resolves (absent ones fall back to a measured one)
    assert all(spec.peak(p) > 0 for p in ("fp4", "fp8", "bf16", "tf32", "fp32", "int8"))


def test_sources_note_every_field_measured_or_not(spec, probed):
    import jax

    fields = [a.name for a in attrs.fields(HardwareSpec) if a.name not in ("name", "description", "sources")]
    for field in fields:
        assert spec.source(field), f"{field} has no source note"
    date = re.search(r"probed (\d{4}-\d\d-\d\d)", spec.description).group(1)  # the probe's own date
    cpu = jax.devices()[0].platform == "cpu"
    measured = list(MEASURED) + [f"peak_flops.{p}" for p, _ in spec.peak_flops if not (cpu and p == "tf32")]
    for field in measured:
        note = spec.source(field)
        assert note.startswith(f"measured by graphsim hw probe {date} on "), (field, note)
        assert f"jax {jax.__version__}" in note, (field, note)
        if field not in ("hbm_capacity_bytes", "host_mem_bytes"):
            assert "best of" in note, (field, note)
    if cpu:
        assert spec.source("peak_flops.tf32").startswith("= fp32")
    for field in UNMEASURED:
        assert spec.source(field).startswith("not measured:"), (field, spec.source(field))
    if spec.nvlink_domain == 1:
        assert spec.source("nvlink_bw").startswith("not measured:")
    # progress: one line per figure
    log = probed[1]
    for field in ("peak_flops.fp32", "hbm_bw", "exp_rate", "hbm_capacity_bytes"):
        assert field in log


def test_cli_estimate_runs_on_the_probed_descriptor(probed, capsys):
    assert main(["estimate", "--model", "llama-3.1-70b", "--hw", str(probed[0]), "--request", "decode:1024x1"]) == 0
    capsys.readouterr()


def test_to_toml_round_trips_strings_and_numbers():
    odd = 'a "quoted" \\ back\nslash\ttab \x7f del \x01 ctl, µ and 😀'
    desc = {"name": odd, "description": "d", "hbm_bw": 0.1 + 0.2, "exp_rate": 1.2345678901234567e-300,
            "nvlink_domain": 72, "peak_flops": {"bf16": 123456789.123, "fp32": 5e15},
            "sources": {"peak_flops.bf16": odd, "hbm_bw": "x = y [z]"}}
    back = tomllib.loads(pr.to_toml(desc))
    assert back == desc
    assert "peak_flops.bf16" in back["sources"]  # one quoted key, not a nested table


def _fp32_matmul_rate(m: int, k: int, n: int, reps: int) -> float:
    import jax
    import jax.numpy as jnp

    a = jnp.ones((m, k), jnp.float32)
    b = jnp.ones((k, n), jnp.float32)
    mm = jax.jit(lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
    return 2.0 * m * k * n / pr.best_time(mm, a, b, reps=reps)


def _bounded(measure, reference: float, remeasure, tries: int = 4) -> tuple[float, float]:
    """``(best of the unseen kernel, the probe's best)`` after up to ``tries`` rounds. Another process on the
    machine can slow the probe's moment more than the test's, so while the bound looks broken each round runs
    both again and keeps each one's best: the probe's figure is itself a best-of, and more of its runs only
    sharpen it, while a real violation (a size the probe's method cannot reach) persists."""
    seen = 0.0
    for _ in range(tries):
        seen = max(seen, measure())
        if seen <= 1.1 * reference:
            break
        reference = max(reference, remeasure())
    return seen, reference


def test_probed_fp32_peak_bounds_a_matmul_it_did_not_time(spec):
    import jax
    import jax.numpy as jnp

    accel = jax.devices()[0].platform != "cpu"
    kind = ("accel" if accel else "cpu", True)
    shapes = pr.GEMM_SHAPES[kind]
    # inside the quick probe's size range: a bigger matmul may run faster than any shape a quick probe tried
    unseen = (2048, 2048, 2048) if accel else (768, 768, 768)
    assert unseen not in shapes
    reps = pr.REPS[kind]

    def remeasure():
        return pr.gemm_peak(jnp.float32, shapes, reps=reps, precision=jax.lax.Precision.HIGHEST)["rate"]

    seen, peak = _bounded(lambda: _fp32_matmul_rate(*unseen, reps=reps), spec.peak("fp32"), remeasure)
    assert seen <= 1.1 * peak, f"{unseen} fp32 matmul {seen:.4g} FLOP/s beats the probed SOL {peak:.4g}"


def test_probed_hbm_bw_bounds_a_copy_it_did_not_time(spec):
    import jax
    import jax.numpy as jnp

    dev = jax.devices()[0]
    accel = dev.platform != "cpu"
    big = pr.copy_sizes(accel, None if accel else pr.physical_memory(), pr.last_level_cache())[0]
    nbytes = big + 128 * pr.MiB  # a size the probe did not use, no more cache-friendly than its own
    reps = pr.REPS[("accel" if accel else "cpu", True)]

    def copy_rate():
        x = jnp.zeros((nbytes // 4,), jnp.float32)
        with pr.quiet_donation():
            seconds, x = pr.best_time_donated(pr.donated_increment(), x, reps=reps)
        return 2.0 * nbytes / seconds

    seen, bw = _bounded(copy_rate, spec.hbm_bw, lambda: pr.copy_bandwidth(big, reps=reps))
    assert math.isfinite(seen) and seen <= 1.1 * bw, f"copy of {nbytes} B at {seen:.4g} B/s beats hbm_bw {bw:.4g}"
