"""Sweeps: a spec of axes -> one table row per what-if point.

*Structural* axes (model, hw, profile, mapping, policies, request structure) each need their own program:
one ``compile_plan`` per structural point. *Continuous* axes (lengths, batch counts, cached prefix, hardware
figures, efficiency fractions) are workload arrays and per-point unit-time rows, evaluated by one vectorized
``Compiled.evaluate`` per chunk of points — the grid is built chunk by chunk too, so memory stays bounded.

A spec (TOML, YAML or a dict)::

    name = "v3-decode"
    zip = [["decode.count", "decode.context"]]    # optional: axes that vary together
    outputs = ["stages", "kinds"]                  # optional extras: kinds, traffic
    [structure]
    model = "deepseek-v3"
    hw = ["gb200", "gb300"]
    profile = ["sol", "practitioner"]
    mapping = [{tp = 4, ep = 4}, "tp1-dp8-ep8"]
    requests = ["decode", "prefill+decode"]       # request structures (group kinds)
    [structure.policies]
    fusion = ["unfused", "two-pass"]
    [axes]
    "decode.count" = [8, 64, 256]                  # list, scalar, or a range table:
    "decode.context" = {start = 1024, stop = 131072, num = 8, scale = "log"}
    "prefill.prompt" = 8192
    "hw.hbm_bw" = [8e12, 12e12]                    # any rate field of HardwareSpec (peak_flops.fp8 too)
    "profile.hbm" = [0.8, 1.0]                     # EfficiencyProfile fields

Group axes are ``<kind>.<field>`` (every group of that kind) or ``g<i>.<field>`` (group i, which wins).
Prefill fields: count, prompt, cached, image, patches, swa_cached; decode: count, context, new.

A bad point never stops a sweep: a structural error (TP not dividing heads, an unknown model) gives one row
with ``error``; a bad continuous value (negative length, HBM bandwidth <= 0) gives an error row for that
point only, naming the axis. Rows carry the full identity (model, hw, mapping, every policy, profile,
request structure, graphsim version) and ``struct_id``, the key for resuming.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import attrs
import numpy as np

from .errors import GraphsimError, require
from .ir import COMPONENTS, REQUEST_KINDS

#: Fields of a request group per kind, their defaults (None = required) and whether they are integers.
GROUP_FIELDS = {
    "prefill": {"count": 1.0, "prompt": None, "cached": 0.0, "image": 0.0, "patches": 0.0, "swa_cached": 1.0},
    "decode": {"count": 1.0, "context": None, "new": 1.0},
}
#: Hardware figures a continuous axis may set: the ones that change rates or capacity, not the graph
#: (``nvlink_domain`` changes collectives, so it is structural: give another hw file).
HW_AXES = ("hbm_bw", "nvlink_bw", "scaleout_bw", "c2c_bw", "nvlink_latency_s", "scaleout_latency_s",
           "hbm_capacity_bytes")
PROFILE_AXES = ("compute", "hbm", "nvlink", "scaleout", "c2c", "op_overhead_s")
STRUCT_KEYS = ("model", "hw", "profile", "mapping", "requests", "policies")
SPEC_KEYS = ("name", "structure", "axes", "zip", "outputs", "chunk")
EXTRA_OUTPUTS = ("stages", "kinds", "traffic")
IDENTITY_HEAD = ("struct_id", "sweep", "graphsim_version", "model", "hw", "profile", "mapping")
TOKEN_COLUMNS = ("prefill_tokens", "decode_tokens", "decode_requests", "ttft_s", "itl_s", "tokens_per_s",
                 "tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user")
MEMORY_COLUMNS = ("weights_gib", "kv_gib", "workspace_gib", "total_gib", "capacity_gib", "headroom_gib", "fits")


def _policy_fields() -> dict:
    from .pipeline import Policies

    return {a.name: a.default for a in attrs.fields(Policies)}


def _mapping_fields() -> tuple:
    from .plan import ParallelMapping

    return tuple(a.name for a in attrs.fields(ParallelMapping))


def identity_columns() -> tuple:
    """Identity columns in table order: head, mapping axes, gpus, request structure, every policy."""
    return (*IDENTITY_HEAD, *_mapping_fields(), "gpus", "requests", *_policy_fields())


def _hashable(v):
    """Spec values as hashable, canonical values (a table such as ``algorithms`` -> sorted pairs)."""
    if isinstance(v, Mapping):
        return tuple(sorted((str(k), _hashable(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v


# ---------------------------------------------------------------------------------------------------
# Spec
# ---------------------------------------------------------------------------------------------------

@attrs.frozen
class Axis:
    """A continuous axis: a name (``decode.context``, ``hw.hbm_bw``…) and its values."""

    name: str
    values: tuple = attrs.field(converter=tuple)

    @property
    def scope(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def field(self) -> str:
        return self.name.split(".", 1)[1]


def _values(name: str, v: Any) -> tuple:
    """A list, a scalar, or a range table {start, stop, num[, scale=lin|log]} / {start, stop, step}."""
    if isinstance(v, Mapping):
        keys = set(v)
        require(keys <= {"start", "stop", "num", "step", "scale"} and {"start", "stop"} <= keys, f"axes.{name}",
                "a range needs start, stop and num (scale = lin|log) or step")
        lo, hi = float(v["start"]), float(v["stop"])
        if "step" in v:
            step = float(v["step"])
            require(step > 0, f"axes.{name}.step", f"must be > 0, got {step}")
            out = np.arange(lo, hi + step / 2, step)
        else:
            num = v.get("num")
            require(isinstance(num, int) and num >= 1, f"axes.{name}.num", f"must be an integer >= 1, got {num!r}")
            scale = v.get("scale", "lin")
            require(scale in ("lin", "log"), f"axes.{name}.scale", f"must be lin or log, got {scale!r}")
            if scale == "log":
                require(lo > 0 and hi > 0, f"axes.{name}", "a log range needs positive start and stop")
                out = np.geomspace(lo, hi, num)
            else:
                out = np.linspace(lo, hi, num)
            out = np.round(out) if float(lo).is_integer() and float(hi).is_integer() else out
        return tuple(float(x) for x in out)
    seq = v if isinstance(v, (list, tuple)) else [v]
    require(len(seq) > 0, f"axes.{name}", "needs at least one value")
    out = []
    for x in seq:
        ok = isinstance(x, (int, float, bool)) or (isinstance(x, str) and _is_number(x))
        require(ok, f"axes.{name}", f"values must be numbers (or true/false), got {x!r}")
        out.append(float(x))
    return tuple(out)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _listify(v: Any) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _parse_mapping(v: Any) -> tuple:
    """``{tp=4, ep=4}`` or ``"tp4-ep4"`` -> ((axis, value), ...) for every ParallelMapping axis (unvalidated:
    a mapping the model cannot take is a structural error row, not a spec error)."""
    axes = _mapping_fields()
    if isinstance(v, str):
        alt = "|".join(axes)
        parts = re.findall(rf"({alt})(\d+)", v)
        rest = re.sub(rf"({alt})\d+|[-_,\s]", "", v)
        require(bool(parts) and not rest, "structure.mapping", f"{v!r} is not like 'tp4-dp2-ep8'")
        v = {k: int(n) for k, n in parts}
    require(isinstance(v, Mapping), "structure.mapping", f"a mapping is a table or a string like 'tp4-ep4', got {v!r}")
    bad = set(v) - set(axes)
    require(not bad, "structure.mapping", f"unknown keys {sorted(bad)}; allowed {', '.join(axes)}")
    for k, n in v.items():
        require(isinstance(n, int) and not isinstance(n, bool), f"structure.mapping.{k}", f"must be an integer, got {n!r}")
    return tuple((k, v.get(k, 1)) for k in axes)


def _typed(default, value):
    """A policy value as its column type: the default's type (str, int, float), JSON text for structured ones;
    None where a bad value cannot take that type (the point's error row says why)."""
    if isinstance(default, str):
        return str(value)
    if isinstance(default, bool):
        return value if isinstance(value, bool) else None
    if isinstance(default, int):
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(default, float):
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return json.dumps(value, default=str)


def _parse_structure(v: Any) -> tuple:
    kinds = tuple(v.split("+")) if isinstance(v, str) else tuple(v)
    require(len(kinds) > 0, "structure.requests", "a request structure needs at least one group")
    for k in kinds:
        require(k in REQUEST_KINDS, "structure.requests", f"unknown request kind {k!r}; allowed {REQUEST_KINDS}")
    return kinds


@attrs.frozen
class SweepSpec:
    """A parsed sweep spec; :meth:`load` reads TOML/YAML/JSON, :meth:`from_dict` a dict."""

    name: str
    models: tuple
    hws: tuple
    profiles: tuple
    mappings: tuple
    policies: tuple  #: one ((field, value), ...) per policy combination
    structures: tuple
    axes: tuple  #: Axis objects
    zips: tuple = ()
    outputs: tuple = ("stages",)
    #: points per vectorized call: bounds memory (the kernel holds a (chunk, classes x 6) slot tensor) and is
    #: big enough that per-chunk Python work is small next to the evaluation
    chunk: int = 16384

    @staticmethod
    def load(path: str | Path) -> "SweepSpec":
        p = Path(path)
        require(p.is_file(), "spec", f"no such file {str(p)!r}")
        text = p.read_text()
        if p.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise GraphsimError("spec", "YAML specs need pyyaml (pip install pyyaml); TOML needs nothing") from None
            data = yaml.safe_load(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise GraphsimError("spec", f"cannot parse {p}: {e}") from None
        data.setdefault("name", p.stem)
        return SweepSpec.from_dict(data)

    @staticmethod
    def from_dict(d: Mapping) -> "SweepSpec":
        bad = set(d) - set(SPEC_KEYS)
        require(not bad, "spec", f"unknown keys {sorted(bad)}; allowed {SPEC_KEYS}")
        s = dict(d.get("structure", {}))
        bad = set(s) - set(STRUCT_KEYS)
        require(not bad, "structure", f"unknown keys {sorted(bad)}; allowed {STRUCT_KEYS}")
        require("model" in s, "structure.model", "name at least one model")
        pol_fields = _policy_fields()
        pol = dict(s.get("policies", {}))
        bad = set(pol) - set(pol_fields)
        require(not bad, "structure.policies", f"unknown policies {sorted(bad)}; known {sorted(pol_fields)}")
        names = list(pol)
        # A list gives alternatives; a table (e.g. algorithms = {all_reduce = "tree"}) is one value.
        combos = [tuple(zip(names, (_hashable(x) for x in c)))
                  for c in itertools.product(*(_listify(pol[n]) for n in names))]
        axes = tuple(Axis(str(k), _values(str(k), v)) for k, v in dict(d.get("axes", {})).items())
        outputs = tuple(d.get("outputs", ("stages",)))
        bad = set(outputs) - set(EXTRA_OUTPUTS)
        require(not bad, "outputs", f"unknown outputs {sorted(bad)}; allowed {EXTRA_OUTPUTS}")
        chunk = d.get("chunk", 16384)
        require(isinstance(chunk, int) and chunk >= 1, "chunk", f"must be an integer >= 1, got {chunk!r}")
        spec = SweepSpec(
            name=str(d.get("name", "sweep")),
            models=tuple(str(m) for m in _listify(s["model"])),
            hws=tuple(str(h) for h in _listify(s.get("hw", "gb200"))),
            profiles=tuple("SOL" if p is None or str(p).lower() in ("sol", "none") else str(p)
                           for p in _listify(s.get("profile", "SOL"))),
            mappings=tuple(_parse_mapping(m) for m in _listify(s.get("mapping", {}))),
            policies=tuple(combos),
            structures=tuple(_parse_structure(r) for r in _listify(s.get("requests", "decode"))),
            axes=axes,
            zips=tuple(tuple(z) for z in d.get("zip", ())),
            outputs=outputs,
            chunk=chunk,
        )
        spec._check_axes()
        return spec

    def _check_axes(self) -> None:
        names = [a.name for a in self.axes]
        require(len(set(names)) == len(names), "axes", "axis names must be unique")
        n_groups = max(len(k) for k in self.structures)
        for a in self.axes:
            scope, _, field = a.name.partition(".")
            if scope == "hw":
                ok = field in HW_AXES or (field.startswith("peak_flops.") and field.count(".") == 1)
                require(ok, f"axes.{a.name}", f"hardware axes: {', '.join(HW_AXES)}, peak_flops.<precision>")
            elif scope == "profile":
                ok = field in PROFILE_AXES or (field.startswith("compute_overrides.") and field.count(".") == 1)
                require(ok, f"axes.{a.name}", f"profile axes: {', '.join(PROFILE_AXES)}, compute_overrides.<precision>")
            elif scope in GROUP_FIELDS:
                require(field in GROUP_FIELDS[scope], f"axes.{a.name}",
                        f"{scope} fields: {', '.join(GROUP_FIELDS[scope])}")
            elif re.fullmatch(r"g\d+", scope):
                i = int(scope[1:])
                require(i < n_groups, f"axes.{a.name}", f"no request structure has a group {i}")
                kinds = {k[i] for k in self.structures if len(k) > i}
                ok = any(field in GROUP_FIELDS[k] for k in kinds)
                require(ok, f"axes.{a.name}", f"group {i} is {'/'.join(sorted(kinds))}: fields "
                        + ", ".join(sorted(set().union(*(GROUP_FIELDS[k] for k in kinds)))))
            else:
                require(False, f"axes.{a.name}", "an axis is <kind>.<field>, g<i>.<field>, hw.<field> or profile.<field>")
        seen: set = set()
        by_name = {a.name: a for a in self.axes}
        for z in self.zips:
            for n in z:
                require(n in by_name, "zip", f"{n!r} is not an axis")
                require(n not in seen, "zip", f"{n!r} is in two zip groups")
                seen.add(n)
            require(len({len(by_name[n].values) for n in z}) == 1, "zip", f"zipped axes {list(z)} need equal lengths")
        for kinds in self.structures:
            for i, k in enumerate(kinds):
                for f, default in GROUP_FIELDS[k].items():
                    if default is None:
                        require(f"g{i}.{f}" in by_name or f"{k}.{f}" in by_name, "axes",
                                f"request structure {'+'.join(kinds)} needs axis {k}.{f} (or g{i}.{f})")

    # ---- enumeration --------------------------------------------------------------------------------
    def structural_points(self) -> list["StructuralPoint"]:
        """Every structural combination; profile varies fastest so consecutive points share a program."""
        return [StructuralPoint(m, h, mp, pol, kinds, prof)
                for m, h, mp, pol, kinds, prof in itertools.product(
                    self.models, self.hws, self.mappings, self.policies, self.structures, self.profiles)]

    def grid(self, kinds: tuple) -> "Grid":
        """The continuous grid for one request structure (axes that apply to none of its groups drop out)."""
        relevant = [a for a in self.axes if _applies(a, kinds)]
        names = {a.name for a in relevant}
        dims, zipped = [], set()
        for z in self.zips:
            members = tuple(a for a in relevant if a.name in z)
            if members:
                dims.append(members)
                zipped |= {a.name for a in members}
        dims += [(a,) for a in relevant if a.name not in zipped]
        return Grid(tuple(dims), tuple(sorted(names)))

    def signature(self) -> str:
        """What the continuous part of the spec asks for (part of every struct_id)."""
        return json.dumps({"axes": [(a.name, a.values) for a in self.axes], "zip": self.zips,
                           "outputs": self.outputs}, sort_keys=True)

    def size(self) -> int:
        return sum(self.grid(sp.kinds).size for sp in self.structural_points())


def _applies(axis: Axis, kinds: tuple) -> bool:
    scope = axis.scope
    if scope in ("hw", "profile"):
        return True
    if scope in GROUP_FIELDS:
        return scope in kinds
    i = int(scope[1:])
    return i < len(kinds) and axis.field in GROUP_FIELDS[kinds[i]]


@attrs.frozen
class Grid:
    """A cartesian product of dims (a dim is one axis or a zip of equal-length axes)."""

    dims: tuple
    names: tuple

    @property
    def shape(self) -> tuple:
        return tuple(len(d[0].values) for d in self.dims)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.dims else 1

    def take(self, lo: int, hi: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Points [lo, hi): per axis, (value index, value) arrays."""
        if not self.dims:
            return {}
        idx = np.unravel_index(np.arange(lo, hi, dtype=np.int64), self.shape)
        out = {}
        for d, ix in zip(self.dims, idx):
            for a in d:
                out[a.name] = (ix, np.asarray(a.values, dtype=np.float64)[ix])
        return out


@attrs.frozen
class StructuralPoint:
    """One program: model, hw, mapping, policies, request structure (+ the profile it is evaluated under)."""

    model: str
    hw: str
    mapping: tuple
    policies: tuple
    kinds: tuple
    profile: str = "SOL"

    def identity(self) -> dict:
        """Identity columns (policies completed with their defaults)."""
        from . import __version__

        from .pipeline import Policies
        from .plan import ParallelMapping

        m = dict(self.mapping)
        defaults = _policy_fields()
        raw = {**defaults, **dict(self.policies)}
        try:  # canonical values where they are valid (e.g. algorithms as sorted pairs)
            raw = Policies(**dict(self.policies)).identity()
        except Exception:  # noqa: BLE001 - an invalid policy is reported by the point's error row
            pass
        # Keep each policy column one type across points (a bad value is this point's error, not a new type).
        pol = {k: _typed(defaults[k], raw.get(k)) for k in defaults}
        try:
            pm = ParallelMapping(**m)
            mapping, gpus = str(pm), pm.gpus
        except Exception:  # noqa: BLE001 - an impossible mapping is this point's error row
            mapping, gpus = "-".join(f"{k}{v}" for k, v in self.mapping), None
        out = {"graphsim_version": __version__, "model": self.model, "hw": self.hw, "profile": self.profile,
               "mapping": mapping, **m, "gpus": gpus, "requests": "+".join(self.kinds)}
        out.update(pol)
        return out

    def key(self, spec: SweepSpec) -> str:
        """struct_id: a hash of the identity, the continuous spec and the graphsim version."""
        ident = json.dumps([self.identity(), spec.signature()], sort_keys=True, default=str)
        return hashlib.sha1(ident.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------
# Evaluating one structural point
# ---------------------------------------------------------------------------------------------------

class _Programs:
    """Compiled programs and models kept between structural points (a program does not depend on the
    profile, so points that differ only in profile share one)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.compiled: dict = {}
        self.models: dict = {}
        self.kv: dict = {}

    def get(self, sp: StructuralPoint, requests: tuple):
        from . import ParallelMapping, Plan, Policies, compile_plan, load_model
        from .metrics import KVTable

        key = (sp.model, sp.hw, sp.mapping, sp.policies, requests)
        if key not in self.compiled:
            if sp.model not in self.models:
                self.models[sp.model] = load_model(sp.model)
            mapping = ParallelMapping(**dict(sp.mapping))
            try:
                policies = Policies(**dict(sp.policies))
            except GraphsimError:
                raise
            except (TypeError, ValueError) as e:  # attrs validators name the attribute, not the section
                name = getattr(e.args[1], "name", "?") if len(e.args) > 1 else "?"
                raise GraphsimError(f"policies.{name}", str(e.args[0])) from None
            c = compile_plan(self.models[sp.model], Plan(requests, mapping, policies), sp.hw)
            while len(self.compiled) >= self.keep:
                self.compiled.pop(next(iter(self.compiled)))
            self.compiled[key] = c
        plan = self.compiled[key].plan
        kv_key = (sp.model, plan.policies.dspark, plan.mapping)  # DSpark's draft blocks hold SWA caches too
        if kv_key not in self.kv:
            self.kv[kv_key] = KVTable(self.models[sp.model], plan.policies, plan.mapping)
        return self.compiled[key], self.kv[kv_key]


_PROGRAMS = _Programs()


def representative_requests(spec: SweepSpec, kinds: tuple) -> tuple:
    """The requests a structural point's program is built for: one per group, from the first valid value of
    each axis (the largest count). The program's *costs* are exact for every grid point — lengths, counts
    and hardware figures are workload arrays — but a rule a model or pass applies to the plan's request
    values at build time (e.g. pipeline micro-batches <= requests) sees these values only."""
    from .plan import Request

    by_name = {a.name: a for a in spec.axes}

    def whole(lo):
        return lambda v: math.isfinite(v) and v >= lo and v == int(v)

    out = []
    for i, k in enumerate(kinds):
        def pick(f, ok, largest=False):
            a = by_name.get(f"g{i}.{f}") or by_name.get(f"{k}.{f}")
            good = [v for v in (a.values if a else (GROUP_FIELDS[k][f],)) if v is not None and ok(v)]
            return int(max(good) if largest else good[0]) if good else None

        count = pick("count", whole(1), largest=True) or 1
        if k == "prefill":
            prompt = pick("prompt", whole(1)) or 1
            cached = pick("cached", lambda v: whole(0)(v) and v < prompt) or 0
            # images are structural (they add the vision stage): build it when any point carries patches
            patches = pick("patches", lambda v: whole(1)(v), largest=True) or 0
            image = min(pick("image", whole(1)) or 1, prompt - cached) if patches else 0
            out.append(Request("prefill", prompt, count, cached, image_tokens=image, image_patches=patches))
        else:
            out.append(Request("decode", pick("context", whole(1)) or 1, count, new=pick("new", whole(1)) or 1))
    return tuple(out)


def _error_of(e: Exception) -> tuple[str, str]:
    field = getattr(e, "field", None)
    return str(e) if field else f"{type(e).__name__}: {e}", field or ""


class _Rates:
    """Unit-time rows per distinct (hw figures, profile fractions) combination, validated once each."""

    def __init__(self, hw, profile, hw_axes: list, prof_axes: list):
        from .hw.descriptor import SOL

        self.hw, self.profile = hw, profile if profile is not None else SOL
        self.hw_axes, self.prof_axes = hw_axes, prof_axes
        self.memo: dict = {}

    def row(self, values: tuple):
        got = self.memo.get(values)
        if got is None:
            got = self.memo[values] = self._build(values)
        return got

    def _build(self, values: tuple):
        from .lowering.evaluate import unit_time

        hv, pv = values[: len(self.hw_axes)], values[len(self.hw_axes):]
        try:
            over: dict = {}
            for name, v in zip(self.hw_axes, hv):
                f = name[3:]
                if f.startswith("peak_flops."):
                    over.setdefault("peak_flops", {})[f[len("peak_flops."):]] = v
                else:
                    over[f] = v
            hw = self.hw.with_overrides(**over) if over else self.hw
        except GraphsimError as e:
            return None, 0.0, 0.0, f"hw.{e}", f"hw.{e.field}"
        try:
            over = {}
            for name, v in zip(self.prof_axes, pv):
                f = name[len("profile."):]
                if f.startswith("compute_overrides."):
                    over.setdefault("compute_overrides", dict(self.profile.compute_overrides))[f[18:]] = v
                else:
                    over[f] = v
            prof = attrs.evolve(self.profile, **over) if over else self.profile
        except GraphsimError as e:
            return None, 0.0, 0.0, f"profile.{e}", f"profile.{e.field}"
        return unit_time(hw.rates(prof)), prof.op_overhead_s, hw.hbm_capacity_bytes, None, ""


def _group_values(kinds: tuple, cols: dict, n: int) -> list[dict]:
    """Per group, field -> (values (n,), source axis name or '' for a default)."""
    out = []
    for i, k in enumerate(kinds):
        g = {}
        for f, default in GROUP_FIELDS[k].items():
            for name in (f"g{i}.{f}", f"{k}.{f}"):
                if name in cols:
                    g[f] = (cols[name], name)
                    break
            else:
                g[f] = (np.full(n, default), "")
        out.append(g)
    return out


def _check_groups(groups: list[dict], n: int, speculative: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-point validation (first failure wins): error message and field arrays ('' where valid).
    Without speculative decoding a decode step emits one position (``new`` = 1)."""
    msg = np.full(n, "", dtype=object)
    fld = np.full(n, "", dtype=object)

    def flag(bad, name, text):
        bad = bad & (msg == "")
        for i in np.flatnonzero(bad):
            v = values_of[name][i] if name in values_of else np.nan
            msg[i] = f"{name}: {text}, got {v:g}"
            fld[i] = name

    values_of = {}
    for g in groups:
        for f, (v, name) in g.items():
            if name:
                values_of[name] = v
    for g in groups:
        for f, (v, name) in g.items():
            finite = np.isfinite(v)
            if f == "count":
                flag(~finite | (v < 1) | (v != np.floor(v)), name, "must be an integer >= 1")
            elif f == "swa_cached":
                flag(~np.isin(v, (0.0, 1.0)), name, "must be true/false (1/0)")
            else:
                lo = 1.0 if f in ("prompt", "context", "new") else 0.0
                flag(~finite | (v < lo) | (v != np.floor(v)), name, f"must be an integer >= {lo:g}")
        if "context" in g and not speculative:
            flag(g["new"][0] > 1, g["new"][1] or "decode.new", "verifying drafts needs policies.dspark='on'")
        if "prompt" in g:
            p, c, im = g["prompt"][0], g["cached"][0], g["image"][0]
            flag(c >= p, g["cached"][1] or "prefill.cached", "cached prefix must be shorter than the prompt")
            flag(im > p - c, g["image"][1] or "prefill.image", "image tokens must fit in the uncached prompt")
    return msg, fld


def _workload_arrays(kinds: tuple, groups: list[dict], policies: Mapping) -> dict[str, np.ndarray]:
    """(n, G) workload fields, with ``Plan.workload`` semantics (both use plan.prefill_positions)."""
    from .plan import prefill_positions
    from .workload import FIELDS

    cols: dict[str, list] = {f: [] for f in FIELDS}
    for k, g in zip(kinds, groups):
        v = {f: g[f][0] for f in g}
        zero = np.zeros_like(v["count"])
        if k == "prefill":
            new, past, replay = prefill_positions(
                v["prompt"], v["cached"], v["swa_cached"] != 0, replay_window=int(policies.get("replay_window", 128)),
                encoder_replay=policies.get("encoder_replay", "on") == "on")
            parts = {"count": v["count"], "new": new, "past": past, "image": v["image"], "patches": v["patches"],
                     "replay": replay}
        else:
            parts = {"count": v["count"], "new": v["new"], "past": v["context"], "image": zero, "patches": zero,
                     "replay": zero}
        for f in FIELDS:
            cols[f].append(parts[f])
    return {f: np.stack(c, axis=1) for f, c in cols.items()}


def _table(columns: dict):
    import pyarrow as pa

    arrays, names = [], []
    for k, v in columns.items():
        names.append(k)
        if isinstance(v, pa.Array):
            arrays.append(v)
        else:
            arrays.append(pa.array(v))
    return pa.table(arrays, names=names)


def _const(value, n: int):
    import pyarrow as pa

    if value is None:  # typed when parts are unified (the other parts say what the column holds)
        return pa.nulls(n)
    if isinstance(value, bool):
        return pa.array(np.full(n, value))
    if isinstance(value, int):
        return pa.array(np.full(n, value, dtype=np.int64))
    if isinstance(value, float):
        return pa.array(np.full(n, value, dtype=np.float64))
    return pa.array([str(value)] * n, pa.string())


def structural_tables(spec: SweepSpec, sp: StructuralPoint, programs: _Programs | None = None,
                      progress: Callable[[int], None] | None = None) -> Iterator:
    """pyarrow Tables (one per chunk) of every point of one structural point, in point order."""
    import pyarrow as pa

    from .hw import load_profile

    programs = programs or _PROGRAMS
    struct_id = sp.key(spec)
    ident = {"struct_id": struct_id, "sweep": spec.name, **sp.identity()}
    pol = {**_policy_fields(), **dict(sp.policies)}
    grid = spec.grid(sp.kinds)
    try:
        compiled, kv = programs.get(sp, representative_requests(spec, sp.kinds))
        profile = None if sp.profile == "SOL" else load_profile(sp.profile)
    except Exception as e:  # noqa: BLE001 - any failure to build this program is this point's error row
        msg, field = _error_of(e)
        cols = {k: _const(v, 1) for k, v in ident.items()}
        cols.update(point=pa.nulls(1, pa.int64()), error=_const(msg, 1), error_field=_const(field, 1))
        if progress:
            progress(grid.size)
        yield _table(cols)
        return
    yield from _point_tables(spec, sp, compiled, kv, profile, ident, pol, grid, progress)


def _point_tables(spec, sp, compiled, kv, profile, ident, pol, grid, progress):
    import pyarrow as pa

    from .lowering.evaluate import op_kinds
    from .metrics import kv_bytes_per_device, memory_metrics, token_metrics, weight_bytes
    from .workload import FIELDS, Workload

    mapping, kinds = compiled.plan.mapping, sp.kinds
    hw_axes = [a for a in grid.names if a.startswith("hw.")]
    prof_axes = [a for a in grid.names if a.startswith("profile.")]
    rates = _Rates(compiled.hw, profile, hw_axes, prof_axes)
    weights = weight_bytes(compiled)
    split = 1  # the KV table already gives one request's bytes on one device
    want = ("forward", "stages", "workspace") + (("kinds",) if "kinds" in spec.outputs else ()) \
        + (("components",) if "traffic" in spec.outputs else ())
    stage_names, kind_names = compiled.program.stages, op_kinds(compiled.program)
    combo_names = hw_axes + prof_axes
    axis_values = {a: grid_values(grid, a) for a in combo_names}
    size = min(spec.chunk, grid.size)  # every kernel call gets exactly `size` points: one compilation
    ident_cols = {k: _const(v, size) for k, v in ident.items()}  # built once, sliced per chunk
    for lo in range(0, grid.size, size):
        hi = min(lo + size, grid.size)
        n = hi - lo
        taken = grid.take(lo, hi)
        cols_in = {k: v for k, (_, v) in taken.items()}
        groups = _group_values(kinds, cols_in, n)
        msg, fld = _check_groups(groups, n, compiled.plan.policies.dspark == "on")
        # unit times per distinct hw/profile combination
        if combo_names:
            shape = tuple(len(axis_values[a]) for a in combo_names)
            code = np.ravel_multi_index(tuple(taken[a][0] for a in combo_names), shape)
            uniq, inv = np.unique(code, return_inverse=True)
            rows = [rates.row(tuple(float(axis_values[a][j]) for a, j in zip(combo_names, np.unravel_index(u, shape))))
                    for u in uniq]
        else:
            inv = np.zeros(n, dtype=np.int64)
            rows = [rates.row(())]
        for j, (ut_row, _, _, err, efield) in enumerate(rows):
            if err:
                bad = (inv == j) & (msg == "")
                msg[bad], fld[bad] = err, efield
        ok = msg == ""
        idx = np.flatnonzero(ok)
        good_rows = [r if r[0] is not None else (np.zeros(len(COMPONENTS)), 0.0, 0.0, None, "") for r in rows]
        ut = np.stack([r[0] for r in good_rows])[inv]
        overhead = np.array([r[1] for r in good_rows])[inv]
        capacity = np.array([r[2] for r in good_rows])[inv]
        wl = _workload_arrays(kinds, groups, pol)
        res = {}
        if idx.size:
            sel = np.concatenate([idx, np.repeat(idx[-1:], size - idx.size)])  # pad: one compiled shape
            workload = Workload(kinds, **{f: wl[f][sel] for f in FIELDS})
            out = compiled.evaluate(workload, ut[sel], overhead[sel], want)
            res = {k: np.asarray(v)[: idx.size] for k, v in out.items()}

        def full(x, width=None):
            a = np.full((n,) if width is None else (n, width), np.nan)
            if idx.size:
                a[idx] = x
            return a

        forward = full(res.get("forward"))
        cols = {k: v.slice(0, n) for k, v in ident_cols.items()}
        cols["point"] = pa.array(np.arange(lo, hi, dtype=np.int64))
        for name in grid.names:
            cols[name] = pa.array(cols_in[name])
        cols["forward_s"] = pa.array(forward)
        if "stages" in spec.outputs:
            st = full(res.get("stages"), len(stage_names))
            for j, s in enumerate(stage_names):
                cols[f"stage_s.{s}"] = pa.array(st[:, j])
        if "kinds" in spec.outputs:
            km = full(res.get("kinds"), len(kind_names))
            for j, k in enumerate(kind_names):
                cols[f"kind_s.{k}"] = pa.array(km[:, j])
        tok = token_metrics(kinds, wl["count"], wl["new"], forward, mapping.gpus, compiled.plan.policies)
        for k in TOKEN_COLUMNS:
            cols[k] = pa.array(tok[k], mask=~ok)
        kvb = np.where(ok, kv_bytes_per_device(kv, np.where(ok[:, None], wl["count"], 0.0),
                                               np.where(ok[:, None], wl["new"], 0.0),
                                               np.where(ok[:, None], wl["past"], 0.0), split), np.nan)
        mem = memory_metrics(weights, kvb, full(res.get("workspace")), capacity)
        for k in MEMORY_COLUMNS:
            cols[k] = pa.array(np.asarray(mem[k]), mask=~ok)
        if "traffic" in spec.outputs:
            comp = full(res.get("components"), len(COMPONENTS))
            for j, c in enumerate(COMPONENTS):
                cols[f"traffic.{c}"] = pa.array(comp[:, j])
        cols["error"] = pa.array(np.where(ok, None, msg).tolist(), pa.string())
        cols["error_field"] = pa.array(np.where(ok, None, fld).tolist(), pa.string())
        if progress:
            progress(n)
        yield _table(cols)


def grid_values(grid: Grid, name: str) -> np.ndarray:
    for d in grid.dims:
        for a in d:
            if a.name == name:
                return np.asarray(a.values, dtype=np.float64)
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------------
# Running a whole spec: executors, output parts, resume
# ---------------------------------------------------------------------------------------------------

def _column_rank(name: str, axes: list) -> tuple:
    fixed = [*identity_columns(), "point"]
    if name in fixed:
        return (0, fixed.index(name))
    if name in axes:
        return (1, axes.index(name))
    if name == "forward_s":
        return (2, 0)
    for i, pre in enumerate(("stage_s.", "kind_s.")):
        if name.startswith(pre):
            return (3 + i, 0)
    for i, group in enumerate((TOKEN_COLUMNS, MEMORY_COLUMNS)):
        if name in group:
            return (5 + i, group.index(name))
    if name.startswith("traffic."):
        return (7, 0)
    return (8, ("error", "error_field").index(name) if name in ("error", "error_field") else 9)


def unify(tables: list, axes: list):
    """One table from parts whose columns differ (absent columns become nulls); canonical column order."""
    import pyarrow as pa

    fields: dict = {}
    for t in tables:
        for f in t.schema:
            if f.name not in fields or pa.types.is_null(fields[f.name].type):
                fields[f.name] = f
    order = sorted(fields, key=lambda n: (_column_rank(n, axes), list(fields).index(n)))
    schema = pa.schema([fields[n] for n in order])
    return schema, [_align(t, schema) for t in tables]


def _align(t, schema):
    import pyarrow as pa

    cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(len(t), f.type)
            for f in schema]
    return pa.table(cols, schema=schema)


@attrs.frozen
class SweepResult:
    """What a run did: ``table`` (pyarrow) in memory, or ``path`` when written to a file."""

    path: str | None
    table: Any
    rows: int
    structural_points: int
    skipped: int
    structural_errors: int
    point_errors: int
    seconds: float

    def to_pandas(self):
        if self.table is not None:
            return self.table.to_pandas()
        return read_results(self.path)


def read_results(path: str | Path, columns: list | None = None):
    """A results file (Parquet or CSV) as a pandas DataFrame."""
    p = str(path)
    if p.endswith(".csv"):
        import pandas as pd

        return pd.read_csv(p, usecols=columns)
    import pyarrow.parquet as pq

    return pq.read_table(p, columns=columns).to_pandas()


def _done_ids(parts: Path) -> set:
    return {p.name[: -len(".parquet")] for p in parts.glob("*.parquet")} if parts.is_dir() else set()


def run(spec: SweepSpec | Mapping | str | Path, output: str | Path | None = None, *, executor: str = "local",
        address: str | None = None, progress: bool | Callable[[int, int], None] = False,
        resume: bool = True) -> SweepResult:
    """Run a sweep. Without ``output`` the rows come back in memory; with it (``.parquet`` or ``.csv``) each
    structural point is written to ``<output>.parts/<struct_id>.parquet`` once complete, and the parts of
    this spec are merged into ``output`` at the end. The parts stay: re-running skips every structural point
    whose part exists (an interrupted run resumes; a grown spec computes only what is new);
    ``resume=False`` deletes them and starts over."""
    import pyarrow.parquet as pq

    if not isinstance(spec, SweepSpec):
        spec = SweepSpec.from_dict(spec) if isinstance(spec, Mapping) else SweepSpec.load(spec)
    require(executor in ("local", "ray"), "executor", f"must be local or ray, got {executor!r}")
    t0 = time.perf_counter()
    points = spec.structural_points()
    keys = [sp.key(spec) for sp in points]
    out = Path(output) if output is not None else None
    if out is not None:
        require(out.suffix in (".parquet", ".csv"), "output", f"must end in .parquet or .csv, got {str(out)!r}")
        parts = out.with_name(out.name + ".parts")
        if not resume:
            shutil.rmtree(parts, ignore_errors=True)
            if out.exists():
                out.unlink()
        done = _done_ids(parts)
        parts.mkdir(parents=True, exist_ok=True)
    else:
        parts, done = None, set()
    todo = [(sp, k) for k, sp in dict(zip(keys, points)).items() if k not in done]  # identical points run once
    skipped = len(points) - len(todo)
    total = sum(spec.grid(sp.kinds).size for sp, _ in todo)
    bar = _progress_bar(progress, total)
    memory_tables: dict = {}  # key -> tables; assembled in spec order (executors may finish out of order)

    def collect(key: str, tables: Iterable) -> None:
        if parts is None:
            memory_tables[key] = list(tables)
            return
        tmp = parts / f"{key}.parquet.tmp"
        writer = None
        try:
            for t in tables:
                if writer is None:
                    writer = pq.ParquetWriter(tmp, t.schema)
                writer.write_table(t.cast(writer.schema))
        finally:
            if writer is not None:
                writer.close()
        os.replace(tmp, parts / f"{key}.parquet")  # a part exists only once complete

    try:
        if executor == "ray":
            _run_ray(spec, todo, address, collect, bar)
        else:
            for sp, key in todo:
                collect(key, structural_tables(spec, sp, progress=bar))
    finally:
        if hasattr(bar, "close"):
            bar.close()
    axes = [a.name for a in spec.axes]
    if parts is None:
        import pyarrow as pa

        schema, aligned = unify([t for k in keys if k in memory_tables for t in memory_tables[k]], axes)
        table = pa.concat_tables(aligned) if aligned else pa.table({})
        counts = _counts([table]) if aligned else (0, 0, 0)
        return SweepResult(None, table, counts[0], len(points), skipped, counts[1], counts[2], time.perf_counter() - t0)
    counts = _merge(out, parts, keys, axes)
    return SweepResult(str(out), None, counts[0], len(points), skipped, counts[1], counts[2], time.perf_counter() - t0)


def _counts(tables: Iterable) -> tuple[int, int, int]:
    """(rows, structural error rows, point error rows): a structural error row has no point index."""
    rows = struct = errs = 0
    for t in tables:
        rows += t.num_rows
        errs += t.num_rows - t.column("error").null_count
        struct += t.column("point").null_count
    return rows, struct, errs - struct


def _merge(out: Path, parts: Path, keys: list, axes: list) -> tuple[int, int, int]:
    """Stream this spec's parts, in spec order, into ``out`` (one row group at a time: bounded memory);
    returns the row counts (:func:`_counts`)."""
    import pyarrow.parquet as pq

    files = [parts / f"{k}.parquet" for k in dict.fromkeys(keys)]
    files = [f for f in files if f.is_file()]
    schema, _ = unify([pq.read_schema(f).empty_table() for f in files], axes)
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".csv":
        import pyarrow.csv as pcsv

        writer = pcsv.CSVWriter(str(tmp), schema)
    else:
        writer = pq.ParquetWriter(tmp, schema)
    counts = [0, 0, 0]
    try:
        for p in files:
            f = pq.ParquetFile(p)
            for i in range(f.num_row_groups):
                t = _align(f.read_row_group(i), schema)
                writer.write_table(t)
                counts = [a + b for a, b in zip(counts, _counts([t]))]
    finally:
        writer.close()
    os.replace(tmp, out)
    return tuple(counts)


def _run_ray(spec: SweepSpec, todo: list, address: str | None, collect, bar) -> None:
    """One Ray task per structural point; the driver writes results as tasks finish (same tables as local)."""
    try:
        import ray
    except ImportError:
        raise GraphsimError("executor", "--executor ray needs ray (pip install 'graphsim[ray]')") from None
    if not ray.is_initialized():
        import warnings

        with warnings.catch_warnings():  # Ray starts its processes by fork+exec: JAX's fork warning does not apply
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called")
            if address:
                ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
            else:
                ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
    task = ray.remote(_ray_task)
    pending = {task.remote(spec, sp): (sp, key) for sp, key in todo}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            sp, key = pending.pop(ref)
            collect(key, ray.get(ref))
            if bar:
                bar(spec.grid(sp.kinds).size)


def _ray_task(spec: SweepSpec, sp: StructuralPoint) -> list:
    return list(structural_tables(spec, sp))


def _progress_bar(progress, total: int):
    """A callback advancing by n points: rich on stderr when asked for, a user callable, or nothing."""
    if callable(progress):
        done = [0]

        def cb(n):
            done[0] += n
            progress(done[0], total)

        return cb
    if not progress:
        return None
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    except ImportError:  # pragma: no cover - rich is a dependency
        return _PlainBar(total)
    prog = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=False)
    prog.start()
    task = prog.add_task("sweep", total=total)

    class _Rich:
        def __call__(self, n):
            prog.advance(task, n)

        def close(self):
            prog.stop()

    return _Rich()


class _PlainBar:
    def __init__(self, total: int):
        self.total, self.done = max(total, 1), 0

    def __call__(self, n):
        import sys

        self.done += n
        frac = self.done / self.total
        sys.stderr.write(f"\rsweep [{'#' * int(30 * frac):<30}] {self.done:,}/{self.total:,}")
        sys.stderr.flush()

    def close(self):
        import sys

        sys.stderr.write("\n")


__all__ = ["Axis", "SweepSpec", "Grid", "StructuralPoint", "SweepResult", "run", "structural_tables",
           "read_results", "unify"]
