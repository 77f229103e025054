"""Sweep specs: axis constants, value parsing, SweepSpec, Grid and StructuralPoint."""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np

from ..core.errors import GraphsimError, require
from ..driver.identity import combined
from ..core.ir import REQUEST_KINDS
from ..core.limits import MAX_SWEEP_POINTS

#: Fields of a request group per kind, their defaults (None = required) and whether they are integers.
GROUP_FIELDS = {
    "prefill": {"count": 1.0, "prompt": None, "cached": 0.0, "image": 0.0, "patches": 0.0, "swa_cached": 1.0,
                "tier": 1.0},  # tier: where the cached prefix lives, 0 = hbm, 1 = host, 2 = disk
    "decode": {"count": 1.0, "context": None, "new": 1.0},
}
#: Hardware figures a continuous axis may set: the ones that change rates or capacity, not the graph
#: (``nvlink_domain`` changes collectives, so it is structural: give another hw file).
HW_AXES = ("hbm_bw", "nvlink_bw", "scaleout_bw", "c2c_bw", "disk_bw", "exp_rate", "nvlink_latency_s",
           "nvlink_ll_latency_s", "nvlink_simple_latency_s", "scaleout_latency_s", "hbm_capacity_bytes")
PROFILE_AXES = ("compute", "sfu", "hbm", "nvlink", "scaleout", "c2c", "disk", "op_overhead_s")
STRUCT_KEYS = ("model", "hw", "profile", "mapping", "requests", "policies", "view", "measured", "backend", "fpm")
SPEC_KEYS = ("name", "structure", "axes", "zip", "outputs", "chunk", "precision")
#: evaluation precision: float64 (the reference) or float32 (relative error below 1e-5, faster)
PRECISIONS = ("exact", "fast")
EXTRA_OUTPUTS = ("stages", "kinds", "traffic")
IDENTITY_HEAD = ("struct_id", "sweep", "graphsim_version", "model", "hw", "profile", "view", "backend", "measured",
                 "inputs_digest", "model_digest", "hw_digest", "profile_digest", "view_digest", "mapping")
#: digest columns -> the input each is the content digest of (graphsim.driver.identity.input_digest keys)
DIGEST_COLUMNS = {"model_digest": "model", "hw_digest": "hw", "profile_digest": "profile", "view_digest": "view"}
TOKEN_COLUMNS = ("prefill_tokens", "decode_tokens", "decode_requests", "ttft_s", "itl_s", "tokens_per_s",
                 "tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user", "energy_j",
                 "tokens_per_joule", "output_tokens_per_joule")
MEMORY_COLUMNS = ("weights_gib", "kv_gib", "workspace_gib", "total_gib", "capacity_gib", "headroom_gib", "fits")


def _policy_fields() -> dict:
    from ..driver.pipeline import Policies

    return {a.name: a.default for a in attrs.fields(Policies)}


def _mapping_fields() -> tuple:
    from ..core.plan import ParallelMapping

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


#: Values one axis may take (a range's num or (stop - start) / step): bounds what a spec can allocate.
MAX_AXIS_VALUES = 10_000_000


def _finite(field: str, x: Any) -> float:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool)
    require(ok, field, f"must be a number, got {x!r}")
    try:
        v = float(x)
    except OverflowError:
        v = math.inf
    require(math.isfinite(v), field, f"must be finite, got {x!r}")
    return v


def _values(name: str, v: Any) -> tuple:
    """A list, a scalar, or a range table {start, stop, num[, scale=lin|log]} / {start, stop, step}."""
    if isinstance(v, Mapping):
        keys = set(v)
        require(keys <= {"start", "stop", "num", "step", "scale"} and {"start", "stop"} <= keys, f"axes.{name}",
                "a range needs start, stop and num (scale = lin|log) or step")
        lo, hi = _finite(f"axes.{name}.start", v["start"]), _finite(f"axes.{name}.stop", v["stop"])
        if "step" in v:
            step = _finite(f"axes.{name}.step", v["step"])
            require(step > 0, f"axes.{name}.step", f"must be > 0, got {step}")
            require((hi - lo) / step < MAX_AXIS_VALUES, f"axes.{name}.step",
                    f"gives {(hi - lo) / step:.3g} values; at most {MAX_AXIS_VALUES:,} per axis")
            out = np.arange(lo, hi + step / 2, step)
        else:
            num = v.get("num")
            require(isinstance(num, int) and not isinstance(num, bool) and 1 <= num <= MAX_AXIS_VALUES,
                    f"axes.{name}.num", f"must be an integer in [1, {MAX_AXIS_VALUES:,}], got {num!r}")
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
    require(len(seq) <= MAX_AXIS_VALUES, f"axes.{name}", f"at most {MAX_AXIS_VALUES:,} values per axis")
    out = []
    for x in seq:
        ok = isinstance(x, (int, float, bool)) or (isinstance(x, str) and _is_number(x))
        require(ok, f"axes.{name}", f"values must be numbers (or true/false), got {x!r}")
        try:
            out.append(float(x))
        except OverflowError:
            raise GraphsimError(f"axes.{name}", f"{str(x)[:30]} is too large") from None
    return tuple(out)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _listify(v: Any) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


@attrs.frozen
class ModelRef:
    """A sweep's model: a shipped name, config path or checkpoint directory, with the load options of
    :func:`graphsim.load_model` (``weights`` override, ``redundant_experts``). Its text is the identity column."""

    name: str
    weights: str | None = None
    redundant_experts: int = 0

    def __str__(self) -> str:
        opts = [f"weights={self.weights}"] * (self.weights is not None)
        opts += [f"redundant_experts={self.redundant_experts}"] * bool(self.redundant_experts)
        return self.name + (f"[{','.join(opts)}]" if opts else "")

    def load(self):
        from ..models import load_model

        return load_model(self.name, weights=self.weights, redundant_experts=self.redundant_experts)


def _parse_model(v: Any) -> ModelRef:
    """``"deepseek-v3"`` or ``{name = "deepseek-v3", weights = "nvfp4", redundant_experts = 32}``."""
    if isinstance(v, Mapping):
        bad = set(map(str, v)) - {"name", "weights", "redundant_experts"}
        require(not bad, "structure.model", f"unknown keys {sorted(bad)}; allowed: name, weights, redundant_experts")
        require(isinstance(v.get("name"), str), "structure.model.name", f"must be a model name, got {v.get('name')!r}")
        w, r = v.get("weights"), v.get("redundant_experts", 0)
        require(w is None or isinstance(w, str), "structure.model.weights", f"must be a format name, got {w!r}")
        require(isinstance(r, int) and not isinstance(r, bool), "structure.model.redundant_experts",
                f"must be an integer, got {r!r}")
        return ModelRef(v["name"], w, r)  # unknown formats / bad counts are this point's error rows
    return ModelRef(str(v))


def _check_text(v: Any, where: str, depth: int = 0) -> None:
    """Every string of a spec is encodable Unicode: JSON and YAML admit lone surrogate escapes (``\\udbbe``)
    that no output (Parquet, a terminal) can write."""
    if depth > 64:
        return
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise GraphsimError(where, f"{v.encode('utf-8', 'backslashreplace').decode()[:60]!r} is not valid "
                                "Unicode text (a lone surrogate escape)") from None
    elif isinstance(v, Mapping):
        for k, x in v.items():
            _check_text(k, where, depth + 1)
            _check_text(x, f"{where}.{k}" if isinstance(k, str) and k.isprintable() and k.isascii() else where,
                        depth + 1)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _check_text(x, where, depth + 1)


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
    require(isinstance(v, (str, list, tuple)), "structure.requests",
            f"a request structure is 'decode', 'prefill+decode' or a list of kinds, got {v!r}")
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
    #: (view, measured folder, backend) per view point: ("sol", "", "") or a measured view
    views: tuple = (("sol", "", ""),)
    #: "exact" (float64) or "fast" (float32: relative error below 1e-5 against exact)
    precision: str = "exact"

    @staticmethod
    def load(path: str | Path) -> "SweepSpec":
        """A spec file: ``.toml`` (anything but .yaml/.yml/.json), ``.yaml``/``.yml`` or ``.json``."""
        p = Path(path)
        try:
            found = p.is_file()
        except (OSError, ValueError):
            found = False
        require(found, "spec", f"no such file {str(p)[:120]!r}")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise GraphsimError("spec", f"{p.name} is not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise GraphsimError("spec", f"cannot read {p.name}: {e.strerror}") from None
        if p.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise GraphsimError("spec", "YAML specs need pyyaml (pip install pyyaml); TOML needs nothing") from None
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise GraphsimError("spec", f"cannot parse {p.name}: {' '.join(str(e).split())}") from None
        elif p.suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise GraphsimError("spec", f"cannot parse {p.name}: {e}") from None
        else:
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise GraphsimError("spec", f"cannot parse {p.name}: {e}") from None
        require(isinstance(data, Mapping), "spec", f"{p.name}: the top level must be a table, got {type(data).__name__}")
        data = dict(data)
        data.setdefault("name", p.stem)
        return SweepSpec.from_dict(data)

    @staticmethod
    def from_dict(d: Mapping) -> "SweepSpec":
        require(isinstance(d, Mapping), "spec", f"must be a table, got {type(d).__name__}")
        _check_text(d, "spec")
        bad = set(map(str, d)) - set(SPEC_KEYS)
        require(not bad, "spec", f"unknown keys {sorted(bad)}; allowed {SPEC_KEYS}")
        for key in ("structure", "axes"):
            require(isinstance(d.get(key, {}), Mapping), key, f"must be a table, got {type(d.get(key)).__name__}")
        s = dict(d.get("structure", {}))
        bad = set(map(str, s)) - set(STRUCT_KEYS)
        require(not bad, "structure", f"unknown keys {sorted(bad)}; allowed {STRUCT_KEYS}")
        require("model" in s, "structure.model", "name at least one model")
        require(isinstance(s.get("policies", {}), Mapping), "structure.policies",
                f"must be a table of policy -> value(s), got {s.get('policies')!r}")
        pol_fields = _policy_fields()
        pol = dict(s.get("policies", {}))
        bad = set(pol) - set(pol_fields)
        require(not bad, "structure.policies", f"unknown policies {sorted(bad)}; known {sorted(pol_fields)}")
        for key in ("model", "hw", "profile", "mapping", "requests", "view", "backend"):
            require(not (isinstance(s.get(key), (list, tuple)) and len(s[key]) == 0), f"structure.{key}",
                    "an empty list gives no structural point; name at least one value (or leave the key out)")
        for n, v in pol.items():
            require(not (isinstance(v, (list, tuple)) and len(v) == 0), f"structure.policies.{n}",
                    "an empty list gives no structural point; name at least one value")
        names = list(pol)
        # A list gives alternatives; a table (e.g. algorithms = {all_reduce = "tree"}) is one value.
        combos = [tuple(zip(names, (_hashable(x) for x in c)))
                  for c in itertools.product(*(_listify(pol[n]) for n in names))]
        axes = tuple(Axis(str(k), _values(str(k), v)) for k, v in dict(d.get("axes", {})).items())
        outputs = d.get("outputs", ("stages",))
        require(isinstance(outputs, (list, tuple)) and all(isinstance(o, str) for o in outputs), "outputs",
                f"must be a list of names from {EXTRA_OUTPUTS}, got {outputs!r}")
        outputs = tuple(outputs)
        bad = set(outputs) - set(EXTRA_OUTPUTS)
        require(not bad, "outputs", f"unknown outputs {sorted(bad)}; allowed {EXTRA_OUTPUTS}")
        zips = d.get("zip", ())
        require(isinstance(zips, (list, tuple)) and all(
            isinstance(z, (list, tuple)) and all(isinstance(n, str) for n in z) for z in zips), "zip",
            f"must be a list of lists of axis names, got {zips!r}")
        chunk = d.get("chunk", 16384)
        require(isinstance(chunk, int) and not isinstance(chunk, bool) and 1 <= chunk <= 1 << 22, "chunk",
                f"must be an integer in [1, {1 << 22:,}], got {chunk!r}")
        precision = d.get("precision", "exact")
        require(precision in PRECISIONS, "precision", f"must be one of {PRECISIONS}, got {precision!r}")
        spec = SweepSpec(
            name=str(d.get("name", "sweep")),
            models=tuple(_parse_model(m) for m in _listify(s["model"])),
            hws=tuple(str(h) for h in _listify(s.get("hw", "gb200"))),
            profiles=tuple("SOL" if p is None or str(p).lower() in ("sol", "none") else str(p)
                           for p in _listify(s.get("profile", "SOL"))),
            mappings=tuple(_parse_mapping(m) for m in _listify(s.get("mapping", {}))),
            policies=tuple(combos),
            structures=tuple(_parse_structure(r) for r in _listify(s.get("requests", "decode"))),
            axes=axes,
            zips=tuple(tuple(z) for z in zips),
            outputs=outputs,
            chunk=chunk,
            views=_parse_views(s),
            precision=precision,
        )
        spec._check_axes()
        for kinds in spec.structures:
            size = spec.grid(kinds).size
            require(size <= MAX_SWEEP_POINTS, "axes",
                    f"{size:,} points per structural point; at most {MAX_SWEEP_POINTS:,} (split the sweep)")
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
        return [StructuralPoint(m, h, mp, pol, kinds, prof, view)
                for m, h, mp, pol, kinds, view, prof in itertools.product(
                    self.models, self.hws, self.mappings, self.policies, self.structures, self.views, self.profiles)]

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
        sig = {"axes": [(a.name, a.values) for a in self.axes], "zip": self.zips, "outputs": self.outputs}
        if self.precision != "exact":  # (exact keeps the struct_ids of specs written before precision existed)
            sig["precision"] = self.precision
        return json.dumps(sig, sort_keys=True)

    def size(self) -> int:
        return sum(self.grid(sp.kinds).size for sp in self.structural_points())


def _parse_views(s: Mapping) -> tuple:
    """structure.view (sol / op / hybrid / fpm, one or a list) x structure.backend (one or a list), with one
    structure.measured folder (op / hybrid) and one structure.fpm model file (fpm): the measured views each
    backend is evaluated in. The fpm view's backend is optional (the model file may hold one runtime)."""
    from ..views.measured.view import VIEWS

    views = [str(v) for v in _listify(s.get("view", "sol"))]
    for v in views:
        require(v in VIEWS, "structure.view", f"must be one of {', '.join(VIEWS)}, got {v!r}")
    measured = s.get("measured", "")
    require(isinstance(measured, str), "structure.measured", f"one folder of measured tables, got {measured!r}")
    backends = [str(b) for b in _listify(s.get("backend", ""))]
    out = []
    for v in views:
        if v == "sol":
            out.append(("sol", "", ""))
            continue
        if v == "fpm":
            fpm = s.get("fpm", "")
            require(isinstance(fpm, str) and bool(fpm), "structure.fpm", "the fpm view needs one FPM model file "
                    "(graphsim fpm fit samples.parquet -o model.fpm)")
            for b in backends or [""]:
                out.append(("fpm", fpm, b))
            continue
        require(bool(measured), "structure.measured", f"the {v} view needs a folder of measured tables")
        for b in backends:
            require(bool(b), "structure.backend", f"the {v} view needs a backend, e.g. trtllm@1.3.0rc20")
            out.append((v, measured, b))
    require(bool(out), "structure.view", "name at least one view")
    return tuple(dict.fromkeys(out))


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
        return math.prod(self.shape) if self.dims else 1  # exact (Python ints), however large

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


def _device_of(hw: str) -> str | None:
    """The device name a measured store is searched under (None where the descriptor does not load: that
    point is an error row)."""
    try:
        from ..hw import load_hw

        return load_hw(hw).name
    except Exception:  # noqa: BLE001 - a bad descriptor is this point's error row
        return None


@attrs.frozen
class StructuralPoint:
    """One program: model, hw, mapping, policies, request structure (+ the profile it is evaluated under)."""

    model: ModelRef
    hw: str
    mapping: tuple
    policies: tuple
    kinds: tuple
    profile: str = "SOL"
    view: tuple = ("sol", "", "")  # (view, measured folder, backend)
    #: ((input, content digest), ...) of the files this point reads (:meth:`with_inputs`); not part of
    #: ``key``: a part is found by name and trusted only while its recorded digests equal these
    inputs: tuple = ()

    def input_digests(self, memo: dict | None = None) -> dict:
        """{model, hw, profile, [measured | fpm], graphsim} -> content digest of what this point reads
        (``memo``: digests already computed in this run, per input)."""
        from ..core.version import __version__
        from ..driver.identity import fpm_digest, model_digest, toml_digest
        from ..views.measured.schema import measured_digest

        memo = {} if memo is None else memo

        def once(key, fn):
            if key not in memo:
                memo[key] = fn()
            return memo[key]

        out = {"model": once(("model", str(self.model)), lambda: model_digest(self.model)),
               "hw": once(("hw", self.hw), lambda: toml_digest(self.hw, "hw")),
               "profile": once(("profile", self.profile), lambda: toml_digest(self.profile, "profile")),
               "graphsim": str(__version__)}
        if self.view[0] == "fpm":
            out["fpm"] = once(("fpm", self.view[1]), lambda: fpm_digest(self.view[1]))
        elif self.view[0] != "sol":
            device = once(("device", self.hw), lambda: _device_of(self.hw))
            out["measured"] = once(("measured", self.view[1], device),
                                   lambda: measured_digest(self.view[1], device))
        return out

    def with_inputs(self, memo: dict | None = None) -> "StructuralPoint":
        """This point with the digests of its inputs (``memo``: digests already computed in this run)."""
        return attrs.evolve(self, inputs=tuple(sorted(self.input_digests(memo).items())))

    def identity(self) -> dict:
        """Identity columns (policies completed with their defaults)."""
        from ..core.version import __version__

        from ..driver.pipeline import Policies
        from ..core.plan import ParallelMapping

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
        out = {"graphsim_version": __version__, "model": str(self.model), "hw": self.hw, "profile": self.profile,
               "view": self.view[0], "backend": self.view[2], "measured": self.view[1],
               "mapping": mapping, **m, "gpus": gpus, "requests": "+".join(self.kinds)}
        digests = dict(self.inputs)
        out["inputs_digest"] = combined(digests) if digests else None
        for col, k in DIGEST_COLUMNS.items():
            out[col] = digests.get(k) if k != "view" else digests.get("measured", digests.get("fpm", "sol" if digests else None))
        out.update(pol)
        return out

    def key(self, spec: SweepSpec) -> str:
        """struct_id: a hash of the identity by name (not the input digests: a part keeps its name when a file
        changes, and its sidecar says what changed), the continuous spec and the graphsim version."""
        ident = {k: v for k, v in self.identity().items() if k != "inputs_digest" and k not in DIGEST_COLUMNS}
        ident = json.dumps([ident, spec.signature()], sort_keys=True, default=str)
        return hashlib.sha1(ident.encode()).hexdigest()[:16]


def program_key(sp: StructuralPoint) -> tuple:
    """Structural points with one key share a compiled program (they differ only in profile)."""
    return (sp.model, sp.hw, sp.mapping, sp.policies, sp.kinds, sp.view)
