"""Hardware descriptors (one frozen spec per GPU system) and optional efficiency profiles.

All figures are per GPU, dense (no 2:4 sparsity), in SI units: FLOP/s, bytes, B/s (decimal), seconds, watts.
SOL uses a spec as it is; an :class:`EfficiencyProfile` derates it only when one is passed explicitly.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import attrs

try:
    import tomllib
except ImportError:  # Python 3.10: the tomli backport (a dependency there)
    import tomli as tomllib

from ..core.errors import GraphsimError, require

PRECISIONS = ("fp4", "fp8", "bf16", "tf32", "fp32", "int8")
#: Every chip runs these natively; the others may be absent and fall back (see ``HardwareSpec.peak``).
REQUIRED_PRECISIONS = ("bf16", "tf32", "fp32")
#: Where an absent precision runs instead: weights are upcast to the next precision the tensor cores support.
FALLBACK = {"fp4": "fp8", "int8": "fp8", "fp8": "bf16"}

#: The shipped descriptors (package data next to this module; a plain path: importlib.resources costs a few ms
#: of imports that `graphsim hw list` does not need)
_DATA = Path(__file__).parent / "data"


# --------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------

def _as_float(value: Any) -> Any:
    """Convert real numbers to float; leave anything else for the validator to reject by name."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _number(lo: float, hi: float = math.inf, *, lo_open: bool = True, unit: str = ""):
    """attrs validator: a finite number in the interval, else GraphsimError naming the field and range."""
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi == math.inf else ']'}"

    def check(_inst, attr, value):
        ok = isinstance(value, float) and math.isfinite(value)
        ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
        require(ok, attr.name, f"must be a number in {interval}{' ' + unit if unit else ''}, got {value!r}")

    return check


def _count(_inst, attr, value):
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    require(ok, attr.name, f"must be an integer >= 1, got {value!r}")


def _precision_pairs(value: Any) -> Any:
    """Accept a mapping or (precision, number) pairs; store canonical-order pairs so specs stay hashable."""
    if isinstance(value, Mapping):
        value = tuple(value.items())
    try:
        pairs = {str(k).lower(): _as_float(v) for k, v in value}
    except (TypeError, ValueError):
        return value  # rejected by the validator with the field name
    return tuple(sorted(pairs.items(), key=lambda kv: PRECISIONS.index(kv[0]) if kv[0] in PRECISIONS else 99))


def _per_precision(lo: float, hi: float, unit: str, required: tuple[str, ...] = ()):
    """attrs validator for (precision, number) pairs with each number in (lo, hi]."""

    def check(_inst, attr, value):
        require(isinstance(value, tuple), attr.name, f"must map precision -> {unit}, got {value!r}")
        for prec, num in value:
            field = f"{attr.name}.{prec}"
            require(prec in PRECISIONS, field, f"unknown precision; allowed: {', '.join(PRECISIONS)}")
            ok = isinstance(num, float) and math.isfinite(num) and lo < num <= hi
            interval = f"({lo:g}, {hi:g}{')' if hi == math.inf else ']'}"
            require(ok, field, f"must be a number in {interval} {unit}, got {num!r}")
        missing = [p for p in required if p not in dict(value)]
        require(not missing, attr.name, f"must include {', '.join(required)}; missing {', '.join(missing)}")

    return check


def _text(_inst, attr, value):
    require(isinstance(value, str), attr.name, f"must be a string, got {value!r}")


def _source_pairs(_inst, attr, value):
    ok = isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value)
    require(ok, attr.name, f"must be a table of field = \"source note\", got {value!r}")


def _sources(value: Any) -> Any:
    if isinstance(value, Mapping):
        value = value.items()
    try:
        return tuple((str(k), str(v)) for k, v in value)
    except (TypeError, ValueError):
        return value


def _fraction():
    return attrs.field(default=1.0, converter=_as_float, validator=_number(0.0, 1.0))


# --------------------------------------------------------------------------------------------------
# Efficiency profile
# --------------------------------------------------------------------------------------------------

@attrs.frozen
class EfficiencyProfile:
    """Achievable fractions of peak (each in (0, 1]) plus a fixed per-op overhead; absent profile = SOL."""

    name: str = attrs.field(validator=_text)
    description: str = attrs.field(default="", validator=_text)
    compute: float = _fraction()
    #: per-precision compute fractions that replace ``compute`` for that precision
    compute_overrides: tuple[tuple[str, float], ...] = attrs.field(
        default=(), converter=_precision_pairs, validator=_per_precision(0.0, 1.0, "fraction"))
    hbm: float = _fraction()
    nvlink: float = _fraction()
    scaleout: float = _fraction()
    c2c: float = _fraction()
    #: softmax exponentials (SFU / MUFU.EX2) and local-disk reads, as fractions of their peaks
    sfu: float = _fraction()
    disk: float = _fraction()
    #: fixed time added per op (launch, sync, tail effects)
    op_overhead_s: float = attrs.field(
        default=0.0, converter=_as_float, validator=_number(0.0, lo_open=False, unit="s"))

    def compute_fraction(self, precision: str) -> float:
        """Fraction of peak for compute at ``precision`` (the override if given, else ``compute``)."""
        return dict(self.compute_overrides).get(precision, self.compute)


#: No derating: what ``rates()`` uses when no profile is given.
SOL = EfficiencyProfile(name="sol", description="speed of light: peaks as published, no per-op overhead")


# --------------------------------------------------------------------------------------------------
# Hardware spec
# --------------------------------------------------------------------------------------------------

def _bw():
    return attrs.field(converter=_as_float, validator=_number(0.0, unit="B/s"))


@attrs.frozen
class HardwareSpec:
    """One GPU of a system, with the links it sees; every figure per GPU and per direction."""

    name: str = attrs.field(validator=_text)
    description: str = attrs.field(validator=_text)
    peak_flops: tuple[tuple[str, float], ...] = attrs.field(
        converter=_precision_pairs, validator=_per_precision(0.0, math.inf, "FLOP/s", REQUIRED_PRECISIONS))
    hbm_capacity_bytes: float = attrs.field(converter=_as_float, validator=_number(0.0, unit="bytes"))
    hbm_bw: float = _bw()
    nvlink_bw: float = _bw()
    nvlink_domain: int = attrs.field(validator=_count)
    scaleout_bw: float = _bw()
    host_mem_bytes: float = attrs.field(converter=_as_float, validator=_number(0.0, unit="bytes"))
    host_bw: float = _bw()
    c2c_bw: float = _bw()
    #: exponentials per second of the special-function units (MUFU.EX2): the softmax's roofline term
    exp_rate: float = attrs.field(converter=_as_float, validator=_number(0.0, unit="exp/s"))
    #: local NVMe read bandwidth per GPU: where a prefix-cache hit on the disk tier is read from
    disk_bw: float = _bw()
    nvlink_latency_s: float = attrs.field(converter=_as_float, validator=_number(0.0, 1.0, lo_open=False, unit="s"))
    scaleout_latency_s: float = attrs.field(converter=_as_float, validator=_number(0.0, 1.0, lo_open=False, unit="s"))
    power_w: float = attrs.field(converter=_as_float, validator=_number(0.0, unit="W"))
    sources: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_sources, validator=_source_pairs)
    #: per-step NVLink latency of the LL and Simple protocols (``nvlink_latency_s`` is LL128's): a collective runs
    #: each algorithm at whichever protocol is fastest for its message (LL carries 8 B of data per 16 B on the
    #: wire, LL128 120 of 128 B, Simple all). Absent: LL128's (no faster protocol known).
    nvlink_ll_latency_s: float = attrs.field(default=attrs.Factory(lambda s: s.nvlink_latency_s, takes_self=True),
                                             converter=_as_float, validator=_number(0.0, 1.0, lo_open=False, unit="s"))
    nvlink_simple_latency_s: float = attrs.field(
        default=attrs.Factory(lambda s: s.nvlink_latency_s, takes_self=True), converter=_as_float,
        validator=_number(0.0, 1.0, lo_open=False, unit="s"))
    #: bandwidth per GPU and direction of the NVLink switch's in-network reduction (NVLink SHARP / NVLS: multimem
    #: loads that reduce in the switch, stores it replicates); 0 = the switch has none. Sharding prices NVLS bytes
    #: as nvlink_bw / nvls_bw NVLink bytes each (fixed when the graph is built: a sweep of nvlink_bw keeps it)
    nvls_bw: float = attrs.field(default=0.0, converter=_as_float, validator=_number(0.0, lo_open=False, unit="B/s"))
    #: last-level (L2) cache per GPU. Not a term of the SOL of a forward (a layer's weights and KV are read from
    #: HBM once per step); it is the data identity of a measured table's row: a collector replays one op on the
    #: same operands, which stay in L2 when they fit (graphsim.views.measured.check). 0 = unknown
    l2_bytes: float = attrs.field(default=0.0, converter=_as_float, validator=_number(0.0, lo_open=False, unit="bytes"))

    def resolve_precision(self, precision: str) -> str:
        """The precision that actually runs for ``precision`` on this chip (itself, or its fallback)."""
        require(precision in PRECISIONS, "precision", f"unknown {precision!r}; allowed: {', '.join(PRECISIONS)}")
        present = {p for p, _ in self.peak_flops}
        while precision not in present:
            precision = FALLBACK[precision]  # terminates: bf16 is always present
        return precision

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s at ``precision``; an absent precision falls back fp4 -> fp8 -> bf16, int8 -> fp8.

        A chip without FP4/INT8 (or FP8) tensor cores runs such weights upcast to the next supported precision.
        """
        return dict(self.peak_flops)[self.resolve_precision(precision)]

    def rates(self, profile: EfficiencyProfile | None = None) -> dict[str, float]:
        """Rate per cost component: FLOP/s, B/s, and seconds per hop (latencies are never derated)."""
        prof = profile or SOL
        out = {}
        for p in PRECISIONS:
            # Derate by the fraction of the precision that actually runs (an FP4 GEMM on Hopper is an FP8 GEMM).
            out[f"flops_{p}"] = self.peak(p) * prof.compute_fraction(self.resolve_precision(p))
        out["exps"] = self.exp_rate * prof.sfu
        hbm = self.hbm_bw * prof.hbm
        out.update(bytes_weight=hbm, bytes_kv=hbm, bytes_act=hbm)
        out.update(
            bytes_nvlink=self.nvlink_bw * prof.nvlink,
            bytes_scaleout=self.scaleout_bw * prof.scaleout,
            bytes_c2c=self.c2c_bw * prof.c2c,
            bytes_disk=self.disk_bw * prof.disk,
            hops_nvlink=self.nvlink_latency_s,
            hops_scaleout=self.scaleout_latency_s,
            hops_nvlink_ll=self.nvlink_ll_latency_s,
            hops_nvlink_simple=self.nvlink_simple_latency_s,
        )
        return out

    def with_overrides(self, **fields: Any) -> HardwareSpec:
        """A validated copy with ``fields`` replaced (what-if sweeps); ``peak_flops`` merges per precision."""
        known = {a.name for a in attrs.fields(HardwareSpec)}
        for key in fields:
            require(key in known, key, f"unknown hardware field; known: {', '.join(sorted(known))}")
        changed = set(fields) - {"name", "description", "peak_flops"}
        if "peak_flops" in fields:
            new = _precision_pairs(fields["peak_flops"])
            if isinstance(new, tuple):  # else the validator rejects it by name
                changed |= {f"peak_flops.{p}" for p, _ in new}
                fields["peak_flops"] = {**dict(self.peak_flops), **dict(new)}
        if "sources" not in fields:
            # Keep describe() honest: an overridden figure no longer has its datasheet source.
            kept = [(f, s) for f, s in self.sources if f not in changed]
            fields["sources"] = (*kept, *((f, "override (what-if)") for f in sorted(changed)))
        return attrs.evolve(self, **fields)

    def source(self, field: str) -> str:
        """Source note for ``field`` (``peak_flops.fp8`` falls back to the note for ``peak_flops``)."""
        notes = dict(self.sources)
        return notes.get(field) or notes.get(field.split(".")[0], "")

    def describe(self) -> list[tuple[str, str, str]]:
        """Rows ``(field, value with units, source)`` for a CLI table."""
        rows = [(f"peak_flops.{p}", _si(v, "OP/s" if p == "int8" else "FLOP/s"), self.source(f"peak_flops.{p}"))
                for p, v in self.peak_flops]
        rows += [(f"peak_flops.{p}", f"absent -> {self.resolve_precision(p)}", "fallback")
                 for p in PRECISIONS if p not in dict(self.peak_flops)]
        for field, unit in _UNITS.items():
            value = getattr(self, field)
            if unit == "bytes":
                text = f"{value / 2**30:.4g} GiB ({_si(value, 'B')})"
            elif unit == "GPUs":
                text = f"{value} GPUs"
            else:
                text = _si(value, unit)
            rows.append((field, text, self.source(field)))
        return rows


_UNITS = {
    "hbm_capacity_bytes": "bytes", "hbm_bw": "B/s", "nvlink_bw": "B/s", "nvlink_domain": "GPUs",
    "scaleout_bw": "B/s", "host_mem_bytes": "bytes", "host_bw": "B/s", "c2c_bw": "B/s", "exp_rate": "exp/s",
    "disk_bw": "B/s",
    "nvlink_latency_s": "s", "nvlink_ll_latency_s": "s", "nvlink_simple_latency_s": "s", "nvls_bw": "B/s",
    "scaleout_latency_s": "s", "power_w": "W", "l2_bytes": "bytes",
}


def _si(value: float, unit: str) -> str:
    """``5e15, 'FLOP/s'`` -> ``'5 PFLOP/s'``; ``1.9e-6, 's'`` -> ``'1.9 µs'``."""
    if value == 0:
        return f"0 {unit}"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"),
                          (1e-6, "µ"), (1e-9, "n")):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------

def _read_toml(text: str, origin: str, kind: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GraphsimError(kind, f"cannot parse {origin}: {exc}") from None


def _build(cls, data: dict, origin: str):
    known = {a.name for a in attrs.fields(cls)}
    for key in data:
        require(key in known, key, f"unknown key in {origin}; allowed: {', '.join(sorted(known))}")
    for a in attrs.fields(cls):
        require(a.default is not attrs.NOTHING or a.name in data, a.name, f"missing from {origin}")
    return cls(**data)


def _resolve(name_or_path: str | Path, folder, kind: str, known: tuple[str, ...]) -> tuple[str, str]:
    """(TOML text, origin) for a shipped name (case-insensitive) or a path to a TOML file."""
    require(isinstance(name_or_path, (str, Path)), kind, f"must be a name or a TOML path, got {type(name_or_path).__name__}")
    text = str(name_or_path)
    short = text if len(text) <= 80 else text[:77] + "..."
    if isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text or "\\" in text:
        path = Path(text)
        try:
            found = path.is_file()
        except (OSError, ValueError):  # a name too long for a path, NUL bytes...
            found = False
        require(found, kind, f"no such file {short!r}")
        try:
            return path.read_bytes().decode("utf-8"), str(path)
        except UnicodeDecodeError as e:
            raise GraphsimError(kind, f"{path.name} is not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise GraphsimError(kind, f"cannot read {short}: {e.strerror}") from None
    key = text.lower()
    noun = "hardware" if kind == "hw" else "profile"
    require(key in known, kind, f"unknown {noun} {short!r}; known: {', '.join(known)}")
    return (folder / f"{key}.toml").read_text(encoding="utf-8"), f"{key}.toml"


def _names(folder) -> tuple[str, ...]:
    return tuple(sorted(f.name[:-5] for f in folder.iterdir() if f.name.endswith(".toml")))


def list_hw() -> tuple[str, ...]:
    """Names of the shipped hardware descriptors."""
    return _names(_DATA)


def list_profiles() -> tuple[str, ...]:
    """Names of the shipped efficiency profiles."""
    return _names(_DATA / "profiles")


def load_hw(name_or_path: str | Path) -> HardwareSpec:
    """A shipped descriptor by name ('gb200', 'GB300', ...) or a TOML file by path."""
    text, origin = _resolve(name_or_path, _DATA, "hw", list_hw())
    return _build(HardwareSpec, _read_toml(text, origin, "hw"), origin)


def load_profile(name_or_path: str | Path) -> EfficiencyProfile:
    """A shipped efficiency profile by name ('practitioner') or a TOML file by path."""
    text, origin = _resolve(name_or_path, _DATA / "profiles", "profile", list_profiles())
    return _build(EfficiencyProfile, _read_toml(text, origin, "profile"), origin)
