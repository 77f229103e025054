"""Hardware descriptors and efficiency profiles: shipped data, fallbacks, derating, overrides, loading."""
from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import attrs
import pytest

from graphsim.core.errors import GraphsimError
from graphsim.hw import (
    PRECISIONS,
    SOL,
    EfficiencyProfile,
    HardwareSpec,
    list_hw,
    list_profiles,
    load_hw,
    load_profile,
)

GiB = 2**30
T, P = 1e12, 1e15

# Golden per-GPU figures, each from the table in shared/reference/hardware.md.
GOLDEN = {
    "gb200": dict(
        peak_flops={"fp4": 10 * P, "fp8": 5 * P, "bf16": 2.5 * P, "tf32": 1.25 * P,  # shared/reference/hardware.md
                    "fp32": 80 * T, "int8": 5 * P},  # shared/reference/hardware.md (FP32 80 of 80/90/75)
        hbm_capacity_bytes=186 * GiB,  # shared/reference/hardware.md: 186 usable GB, behaves like GiB
        hbm_bw=8e12,  # shared/reference/hardware.md: 8 TB/s
        nvlink_bw=900e9,  # shared/reference/hardware.md: NVLink5 900 GB/s each way
        nvlink_domain=72,  # shared/reference/hardware.md: 18 trays x 4 GPUs
        scaleout_bw=50e9,  # shared/reference/hardware.md: CX-7 400 Gb/s
        host_mem_bytes=480e9 / 2,  # shared/reference/hardware.md: Grace <= 480 GB per 2 GPUs
        host_bw=512e9 / 2,  # shared/reference/hardware.md: Grace <= 512 GB/s per 2 GPUs
        c2c_bw=900e9 / 2 / 2,  # shared/reference/hardware.md: C2C 900 GB/s bidir per Grace, 2 GPUs
        exp_rate=5 * T,  # shared/reference/hardware.md: SFU EX2, Blackwell 5 T exp/s
        disk_bw=4 * 32e9 * 128 / 130 / 8,  # 1 E1.S per GPU (NVL72 tray: 4 per 4 GPUs), PCIe Gen5 x4 ceiling
        power_w=1200,  # shared/reference/hardware.md: 1,200 W
    ),
    "gb300": dict(
        peak_flops={"fp4": 15 * P, "fp8": 5 * P, "bf16": 2.5 * P, "tf32": 1.25 * P,  # shared/reference/hardware.md
                    "fp32": 80 * T, "int8": 0.165 * P},  # shared/reference/hardware.md (INT8 cut on Blackwell Ultra)
        hbm_capacity_bytes=279 * GiB,  # shared/reference/hardware.md: 279 usable GB
        hbm_bw=8e12,  # shared/reference/hardware.md: 8 TB/s
        nvlink_bw=900e9,  # shared/reference/hardware.md: same as GB200
        nvlink_domain=72,  # shared/reference/hardware.md
        scaleout_bw=100e9,  # shared/reference/hardware.md: CX-8 800 Gb/s
        host_mem_bytes=17e12 / 72,  # shared/reference/hardware.md: rack 17 TB LPDDR5X / 72
        host_bw=14e12 / 72,  # shared/reference/hardware.md: rack 14 TB/s / 72
        c2c_bw=900e9 / 2 / 2,  # shared/reference/hardware.md: C2C 900 GB/s bidir per Grace, 2 GPUs
        exp_rate=10.7 * T,  # shared/reference/hardware.md: SFU EX2 2x Blackwell, 10.7 T exp/s
        disk_bw=4 * 32e9 * 128 / 130 / 8,  # 1 E1.S per GPU, PCIe Gen5 x4 ceiling
        power_w=1400,  # shared/reference/hardware.md: 1,400 W
    ),
    "b200": dict(
        peak_flops={"fp4": 9 * P, "fp8": 4.5 * P, "bf16": 2.25 * P, "tf32": 1.1 * P,  # shared/reference/hardware.md
                    "fp32": 75 * T, "int8": 4.5 * P},  # shared/reference/hardware.md
        hbm_capacity_bytes=180 * GiB,  # shared/reference/hardware.md: 180 GiB
        hbm_bw=7.7e12,  # shared/reference/hardware.md: 7.7 TB/s datasheet
        nvlink_bw=900e9,  # shared/reference/hardware.md: NVLink5
        nvlink_domain=8,  # shared/reference/hardware.md
        scaleout_bw=50e9,  # shared/reference/hardware.md: CX-7 400 Gb/s
        c2c_bw=64e9,  # shared/reference/hardware.md: x86 host over PCIe Gen5 (128 GB/s bidir)
        exp_rate=5 * T * 4.5 / 5,  # GB200's die at the clock its FP8 peak implies (4.5 of 5 PF)
        disk_bw=4 * 32e9 * 128 / 130 / 8,  # 1 NVMe U.2 per GPU (DGX B200), PCIe Gen5 x4 ceiling
        power_w=1000,  # shared/reference/hardware.md: 1,000 W
    ),
    **{
        name: dict(
            peak_flops={"fp8": 1979 * T, "bf16": 989 * T, "tf32": 494.5 * T,  # shared/reference/hardware.md
                        "fp32": 67 * T, "int8": 1979 * T},  # shared/reference/hardware.md (no NVFP4)
            hbm_capacity_bytes=cap * GiB,  # shared/reference/hardware.md: 141 / 80 / 80 GiB
            hbm_bw=bw,  # shared/reference/hardware.md: 4.8 / 3.35 / 3.35 TB/s
            nvlink_bw=nvl,  # shared/reference/hardware.md: NVLink4 450 GB/s each way; H800 ~200
            nvlink_domain=8,  # shared/reference/hardware.md
            scaleout_bw=50e9,  # shared/reference/hardware.md: CX-7 400 Gb/s
            c2c_bw=64e9,  # shared/reference/hardware.md: PCIe Gen5 128 GB/s bidir
            exp_rate=132 * 16 * 1.83e9,  # GH100: 132 SMs x 16 MUFU.EX2/clk at the 1.83 GHz of 989 TF BF16
            disk_bw=4 * 16e9 * 128 / 130 / 8,  # 1 NVMe U.2 per GPU (DGX H100), PCIe Gen4 x4 ceiling
            power_w=700,  # shared/reference/hardware.md: 700 W
        )
        for name, cap, bw, nvl in (("h200", 141, 4.8e12, 450e9), ("h100", 80, 3.35e12, 450e9),
                                   ("h800", 80, 3.35e12, 200e9))
    },
}


def _spec(**changes) -> HardwareSpec:
    """A small valid spec for unit tests of the class itself."""
    base = dict(
        name="toy", description="toy", peak_flops={"bf16": 100.0, "tf32": 50.0, "fp32": 10.0},
        hbm_capacity_bytes=1e9, hbm_bw=1e12, nvlink_bw=1e11, nvlink_domain=8, scaleout_bw=1e10,
        host_mem_bytes=1e11, host_bw=1e11, c2c_bw=6.4e10, exp_rate=1e12, disk_bw=1e10, nvlink_latency_s=2e-6,
        scaleout_latency_s=1e-5,
        power_w=700,
    )
    return HardwareSpec(**{**base, **changes})


# --------------------------------------------------------------------------------------------------
# Shipped descriptors
# --------------------------------------------------------------------------------------------------

def test_exp_rate_blackwell_ultra_doubles_blackwell():
    """The SFU figure is the one where GB300 doubles GB200 (hardware.md: 10.7 vs 5 T exp/s); every GPU's
    softmax pays it (it joins the roofline max as its own unit)."""
    ratio = load_hw("gb300").exp_rate / load_hw("gb200").exp_rate
    assert 2.0 <= ratio <= 2.2
    for name in list_hw():
        hw = load_hw(name)
        assert hw.rates()["exps"] == hw.exp_rate
        assert any(row[0] == "exp_rate" and "exp/s" in row[1] for row in hw.describe())


def test_list_hw_is_the_six_systems():
    assert list_hw() == ("b200", "gb200", "gb300", "h100", "h200", "h800")


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_descriptor_matches_reference_table(name):
    hw = load_hw(name)
    golden = GOLDEN[name]
    assert dict(hw.peak_flops) == pytest.approx(golden["peak_flops"])
    assert set(dict(hw.peak_flops)) == set(golden["peak_flops"])  # absent precisions stay absent
    for field, value in golden.items():
        if field != "peak_flops":
            assert getattr(hw, field) == pytest.approx(value, rel=1e-3), field
    assert hw.scaleout_latency_s == 10e-6  # shared/reference/hardware.md: configurator p2p constant 10 us
    assert 1e-6 <= hw.nvlink_latency_s <= 2e-6  # NVLink per-hop latency, 1-2 us (NCCL tuning model)


@pytest.mark.parametrize("name", list_hw())
def test_every_figure_has_a_source(name):
    hw = load_hw(name)
    numeric = [a.name for a in attrs.fields(HardwareSpec) if a.name not in ("name", "description", "sources")]
    for field in numeric:
        assert hw.source(field), f"{name}: no source for {field}"
    # ... and every figure line of the data file carries a "# source:" comment.
    text = (files("graphsim.hw") / "data" / f"{name}.toml").read_text()
    in_sources = False
    for line in text.splitlines():
        if line.startswith("["):
            in_sources = line.startswith("[sources]")
        elif re.match(r"^\w+ = [\d.]", line) and not in_sources:
            assert "# source:" in line, f"{name}: {line}"


@pytest.mark.parametrize("name", list_hw())
def test_rates_keys_match_ir_components(name):
    from graphsim.core.ir import COMPONENTS

    rates = load_hw(name).rates()
    assert tuple(rates) == COMPONENTS
    assert all(v > 0 for v in rates.values())


def test_names_are_case_insensitive():
    assert load_hw("GB300") == load_hw("gb300") == load_hw("Gb300")


def test_unknown_name_lists_known():
    with pytest.raises(GraphsimError, match=r"unknown hardware 'x'; known: b200, gb200") as err:
        load_hw("x")
    assert err.value.field == "hw"


# --------------------------------------------------------------------------------------------------
# Precision fallback
# --------------------------------------------------------------------------------------------------

def test_hopper_fp4_runs_at_fp8():
    h100 = load_hw("h100")
    assert h100.resolve_precision("fp4") == "fp8"
    assert h100.peak("fp4") == h100.peak("fp8") == 1979e12  # shared/reference/hardware.md


def test_present_precision_never_falls_back():
    gb300 = load_hw("gb300")
    assert gb300.peak("int8") == 0.165e15  # shared/reference/hardware.md: INT8 cut on Blackwell Ultra
    assert gb300.peak("fp4") == 15e15  # shared/reference/hardware.md


def test_fallback_chains_end_at_bf16():
    toy = _spec()  # only bf16, tf32, fp32
    assert toy.resolve_precision("fp4") == toy.resolve_precision("int8") == toy.resolve_precision("fp8") == "bf16"
    assert toy.peak("int8") == toy.peak("fp4") == 100.0
    assert toy.peak("tf32") == 50.0


def test_unknown_precision_rejected():
    with pytest.raises(GraphsimError, match="precision"):
        _spec().peak("fp16")


def test_required_precision_missing_rejected():
    with pytest.raises(GraphsimError, match="must include bf16, tf32, fp32") as err:
        _spec(peak_flops={"bf16": 1.0, "fp32": 1.0})
    assert err.value.field == "peak_flops"


def test_bad_peak_value_names_precision():
    with pytest.raises(GraphsimError) as err:
        _spec(peak_flops={"bf16": -1.0, "tf32": 1.0, "fp32": 1.0})
    assert err.value.field == "peak_flops.bf16"
    with pytest.raises(GraphsimError) as err:
        _spec(peak_flops={"bf16": 1.0, "tf32": 1.0, "fp32": 1.0, "fp6": 1.0})
    assert err.value.field == "peak_flops.fp6"


# --------------------------------------------------------------------------------------------------
# Efficiency profiles
# --------------------------------------------------------------------------------------------------

def test_sol_rates_are_the_raw_figures():
    hw = load_hw("gb200")
    rates = hw.rates()
    assert rates == hw.rates(SOL)
    assert rates["flops_fp4"] == 10e15 and rates["flops_int8"] == 5e15
    assert rates["bytes_weight"] == rates["bytes_kv"] == rates["bytes_act"] == 8e12
    assert rates["bytes_nvlink"] == 900e9 and rates["bytes_scaleout"] == 50e9 and rates["bytes_c2c"] == 225e9
    assert rates["hops_nvlink"] == hw.nvlink_latency_s and rates["hops_scaleout"] == 10e-6


def test_profile_applies_multiplicatively():
    hw = load_hw("h800")
    prof = EfficiencyProfile(name="t", compute=0.5, compute_overrides={"fp8": 0.75, "fp4": 0.1},
                             hbm=0.8, nvlink=0.9, scaleout=0.85, c2c=0.6, op_overhead_s=3e-6)
    r = hw.rates(prof)
    assert r["flops_fp8"] == pytest.approx(0.75 * 1979e12)
    # FP4 runs as FP8 on Hopper, so it takes FP8's fraction, not the fp4 override.
    assert r["flops_fp4"] == r["flops_fp8"]
    assert r["flops_int8"] == pytest.approx(0.5 * 1979e12)  # int8 present on H800: default fraction
    assert r["flops_bf16"] == pytest.approx(0.5 * 989e12)
    assert r["bytes_weight"] == r["bytes_kv"] == r["bytes_act"] == pytest.approx(0.8 * 3.35e12)
    assert r["bytes_nvlink"] == pytest.approx(0.9 * 200e9)
    assert r["bytes_scaleout"] == pytest.approx(0.85 * 50e9)
    assert r["bytes_c2c"] == pytest.approx(0.6 * 64e9)
    # Latencies are not derated.
    assert (r["hops_nvlink"], r["hops_scaleout"]) == (hw.nvlink_latency_s, hw.scaleout_latency_s)
    # On a chip with FP4 the fp4 override applies.
    assert load_hw("gb200").rates(prof)["flops_fp4"] == pytest.approx(0.1 * 10e15)


def test_practitioner_profile_matches_reference():
    assert "practitioner" in list_profiles()
    prof = load_profile("Practitioner")
    assert prof.compute_fraction("fp8") == 0.78  # shared/reference/hardware.md: DeepGEMM FP8 GEMM ~0.78
    assert prof.compute_fraction("bf16") == 0.67  # shared/reference/hardware.md: FlashMLA BF16 ~0.67
    assert prof.hbm == 0.80 and prof.op_overhead_s == 3e-6  # shared/reference/hardware.md: 0.8 x bw + 3 us
    assert prof.nvlink == 0.80  # shared/reference/hardware.md: EP over NVLink, B200 EP8 ~0.8
    assert prof.scaleout == 0.85  # shared/reference/hardware.md: EP over RDMA 0.85-1.0
    assert prof.c2c == 1.0


@pytest.mark.parametrize("field, value", [("compute", 0.0), ("hbm", 1.5), ("nvlink", -0.1),
                                          ("op_overhead_s", -1e-6), ("scaleout", "fast")])
def test_profile_validation_names_field(field, value):
    with pytest.raises(GraphsimError) as err:
        EfficiencyProfile(name="bad", **{field: value})
    assert err.value.field == field


def test_profile_override_validation():
    with pytest.raises(GraphsimError) as err:
        EfficiencyProfile(name="bad", compute_overrides={"bf16": 2.0})
    assert err.value.field == "compute_overrides.bf16"


# --------------------------------------------------------------------------------------------------
# What-if overrides
# --------------------------------------------------------------------------------------------------

def test_with_overrides_evolves_and_keeps_original():
    gb200 = load_hw("gb200")
    fast = gb200.with_overrides(hbm_bw=10e12, nvlink_domain=144)
    assert fast.hbm_bw == 10e12 and fast.rates()["bytes_kv"] == 10e12 and fast.nvlink_domain == 144
    assert gb200.hbm_bw == 8e12
    assert fast.source("hbm_bw") == "override (what-if)"
    assert fast.source("nvlink_bw") == gb200.source("nvlink_bw")


def test_with_overrides_merges_peaks():
    h100 = load_hw("h100").with_overrides(peak_flops={"fp4": 4e15})
    assert h100.peak("fp4") == 4e15 and h100.peak("fp8") == 1979e12
    assert h100.source("peak_flops.fp4") == "override (what-if)"
    assert "datasheet" in h100.source("peak_flops.fp8")  # untouched precisions keep their source
    with pytest.raises(GraphsimError) as err:
        load_hw("h100").with_overrides(peak_flops={"fp8": -1.0})
    assert err.value.field == "peak_flops.fp8"


@pytest.mark.parametrize("field, value", [("hbm_bw", -1.0), ("nvlink_bw", 0), ("scaleout_bw", float("inf")),
                                          ("nvlink_domain", 0), ("nvlink_domain", 8.5), ("power_w", "700"),
                                          ("scaleout_latency_s", -1e-6), ("hbm_capacity_bytes", True)])
def test_bad_override_rejected_naming_field(field, value):
    with pytest.raises(GraphsimError) as err:
        load_hw("b200").with_overrides(**{field: value})
    assert err.value.field == field
    assert field in str(err.value)


def test_negative_bandwidth_message_states_range():
    with pytest.raises(GraphsimError, match=r"hbm_bw: must be a number in \(0, inf\) B/s, got -1.0"):
        load_hw("gb300").with_overrides(hbm_bw=-1)


def test_unknown_override_field_rejected():
    with pytest.raises(GraphsimError) as err:
        load_hw("h200").with_overrides(hbm_bandwidth=1e12)
    assert err.value.field == "hbm_bandwidth"


# --------------------------------------------------------------------------------------------------
# Loading from a path; describe
# --------------------------------------------------------------------------------------------------

def _custom_toml(hbm_bw: str = "5e12") -> str:
    text = (files("graphsim.hw") / "data" / "h100.toml").read_text()
    text = text.replace('name = "H100"', 'name = "H100-custom"')
    return re.sub(r"(?m)^hbm_bw = \S+", f"hbm_bw = {hbm_bw}", text, count=1)  # the figure, not [sources]


def test_load_from_path(tmp_path: Path):
    path = tmp_path / "custom.toml"
    path.write_text(_custom_toml())
    for arg in (path, str(path)):
        hw = load_hw(arg)
        assert hw.name == "H100-custom" and hw.hbm_bw == 5e12
        assert hw.peak("bf16") == 989e12


def test_path_errors(tmp_path: Path):
    with pytest.raises(GraphsimError, match="no such file"):
        load_hw(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text(_custom_toml("-5e12"))
    with pytest.raises(GraphsimError) as err:
        load_hw(bad)
    assert err.value.field == "hbm_bw"
    extra = tmp_path / "extra.toml"
    extra.write_text("hbm_speed = 1\n" + _custom_toml())
    with pytest.raises(GraphsimError) as err:
        load_hw(extra)
    assert err.value.field == "hbm_speed"
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(GraphsimError, match="cannot parse") as err:
        load_hw(broken)
    assert err.value.field == "hw"
    missing = tmp_path / "missing_field.toml"
    missing.write_text(re.sub(r"(?m)^power_w = .*$", "", _custom_toml()))
    with pytest.raises(GraphsimError) as err:
        load_hw(missing)
    assert err.value.field == "power_w"


def test_load_profile_from_path(tmp_path: Path):
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nhbm = 0.9\n[compute_overrides]\nfp8 = 0.7\n')
    prof = load_profile(path)
    assert prof.hbm == 0.9 and prof.compute_fraction("fp8") == 0.7 and prof.compute_fraction("bf16") == 1.0
    with pytest.raises(GraphsimError, match="unknown profile 'nope'; known: practitioner"):
        load_profile("nope")


def test_describe_rows():
    rows = load_hw("h100").describe()
    assert all(len(r) == 3 and all(isinstance(x, str) for x in r) for r in rows)
    table = {field: (value, source) for field, value, source in rows}
    assert table["peak_flops.bf16"][0] == "989 TFLOP/s"
    assert table["peak_flops.fp4"] == ("absent -> fp8", "fallback")
    assert table["hbm_capacity_bytes"][0] == "80 GiB (85.9 GB)"
    assert table["hbm_bw"][0] == "3.35 TB/s"
    assert table["scaleout_latency_s"][0] == "10 µs"
    assert table["nvlink_domain"][0] == "8 GPUs"
    assert set(table) >= {f"peak_flops.{p}" for p in PRECISIONS}


def test_specs_are_hashable_values():
    assert len({load_hw("h100"), load_hw("H100"), load_hw("h800")}) == 2
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        load_hw("h100").hbm_bw = 1.0
