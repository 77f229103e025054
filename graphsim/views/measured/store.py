"""A measured-table store: a folder of Parquet files in graphsim's format (graphsim.views.measured.schema).

Rows are grouped into **partitions** by their full identity; a lookup reads exactly one partition. The
backend a user names (``sglang@0.5.14``) is resolved per table family by explicit, reported rules:

1. the named framework and version on the device;
2. ``fill="older"`` (the default): a family the named version did not collect is served by the newest
   *older* version of the same framework on the same device that has it (a backward fill — never a newer
   version, never another framework), and every op it serves says so;
3. a collective the framework does not implement itself (all-gather, reduce-scatter, all-to-all in most
   runtimes) runs on NCCL: the newest ``nccl`` partition on the device serves it, reported as such.

Nothing else is filled in: a family without a partition after these rules is uncovered.
"""
from __future__ import annotations

import re
from pathlib import Path

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError, require

from .schema import FAMILIES, LATENCY, check_frame, identity_columns

FILLS = ("older", "none")


def version_key(v: str) -> tuple:
    """Order versions like 0.5.9 < 0.5.14 < 1.3.0rc11 < 1.3.0rc20 < 1.3.0 (a pre-release sorts before its
    release)."""
    parts = re.findall(r"\d+|[a-zA-Z]+", str(v))
    key = []
    for p in parts:
        key.append((1, int(p), "") if p.isdigit() else (0, 0, p.lower()))
    return tuple(key) + ((2, 0, ""),)


@attrs.frozen(eq=False)
class Partition:
    """One identity: its rows' coordinates (N, d) and latencies (N,) in seconds."""

    family: str
    identity: dict
    coords: tuple  # coordinate names
    x: np.ndarray
    t: np.ndarray

    @property
    def key(self) -> str:
        i = self.identity
        parts = [i["family"], i["op"], i["framework"] + "@" + i["version"], i["kernel_source"], i["dtype"]]
        parts += [i["kv_dtype"]] if i["kv_dtype"] else []
        parts += [f"{k}={i[k]}" for k in FAMILIES[self.family].identity if i.get(k)]
        return "/".join(str(p) for p in parts)

    def ranges(self) -> dict:
        return {c: (int(self.x[:, j].min()), int(self.x[:, j].max())) for j, c in enumerate(self.coords)}


@attrs.frozen
class Backend:
    """``framework[@version]`` as a user names it."""

    framework: str
    version: str = ""

    @staticmethod
    def parse(text: str) -> "Backend":
        require(isinstance(text, str) and bool(text.strip()), "backend", "give FRAMEWORK[@VERSION], e.g. sglang@0.5.14")
        fw, _, ver = text.strip().partition("@")
        require(bool(re.fullmatch(r"[\w.+\-]+", fw)) and (not ver or bool(re.fullmatch(r"[\w.+\-]+", ver))),
                "backend", f"expected FRAMEWORK[@VERSION] (letters, digits, . + -), got {text!r}")
        return Backend(fw.lower(), ver)

    def __str__(self) -> str:
        return f"{self.framework}@{self.version}" if self.version else self.framework


class Store:
    """A folder of measured tables. Files are read once, on first use: in the importer's layout
    ``<device>/<family>/<framework>@<version>/`` only those of the device and family a lookup asks for;
    files anywhere else whenever their device is asked for."""

    def __init__(self, root):
        self.root = Path(root)
        require(self.root.is_dir(), "measured", f"{root} is not a folder of measured tables (see docs/measured.md)")
        self.files = sorted(p for p in self.root.rglob("*.parquet") if p.is_file())
        require(bool(self.files), "measured", f"{root} holds no .parquet tables (import some: `graphsim measured "
                "import aiconfigurator -o DIR`)")
        self._read: dict[Path, list[Partition]] = {}
        self._hints: dict[Path, tuple | None] = {}
        self._selected: dict[tuple, list[Partition]] = {}  # (device, family, frameworks) -> partitions
        #: curves built on this store's partitions, keyed by (partition, rule, fixed, varying): a search binds
        #: the same lookups in every program (a curve is a frozen value of its partition's rows)
        self.curves: dict = {}
        #: graphsim.views.measured.check's per-store memos: (device, family, framework, version) -> efficiency curve,
        #: and the MoE shapes some partition times with a non-gated kernel (None until asked)
        self.efficiency: dict = {}
        self.nongated: frozenset | None = None
        #: selections by (device, backend, fill) and (framework, version) pairs by device: the files are this
        #: store's for good (a changed folder is another Store: graphsim.views.measured.view._open)
        self._selections: dict = {}
        self._identities: dict = {}

    def _load(self, files) -> list[Partition]:
        out = []
        for f in files:
            if f not in self._read:
                self._read[f] = read_partitions(f, self.root)
            out.extend(self._read[f])
        return out

    def hint(self, f: Path) -> tuple | None:
        """(device, family, framework, version) from an importer-layout path, else None."""
        if f in self._hints:
            return self._hints[f]
        parts = f.relative_to(self.root).parts
        h = None
        if len(parts) == 4 and parts[1] in FAMILIES and "@" in parts[2]:
            fw, _, ver = parts[2].partition("@")
            h = parts[0].lower(), parts[1], fw, ver
        self._hints[f] = h
        return h

    def partitions(self, device: str | None = None, family: str | None = None,
                   frameworks: tuple | None = None) -> list[Partition]:
        """Every partition (of one device / family / framework: files whose layout says so, and any file
        elsewhere)."""
        if device is None:
            parts = self._load(self.files)
            return [p for p in parts if family is None or p.family == family]
        dev = device.lower()
        key = (dev, family, frameworks)
        if key in self._selected:
            return self._selected[key]
        files = []
        for f in self.files:
            h = self.hint(f)
            if h is None or (h[0] == dev and (family is None or h[1] == family)
                             and (frameworks is None or h[2] in frameworks)):
                files.append(f)
        out = [p for p in self._load(files) if p.identity["device"].lower() == dev
               and (family is None or p.family == family)
               and (frameworks is None or p.identity["framework"] in frameworks)]
        self._selected[key] = out
        return out

    def identities(self, device: str) -> set:
        """(framework, version) pairs on a device, from paths where the layout gives them."""
        dev = device.lower()
        if dev in self._identities:
            return set(self._identities[dev])
        out = set()
        unhinted = []
        for f in self.files:
            h = self.hint(f)
            if h is None:
                unhinted.append(f)
            elif h[0] == dev:
                out.add((h[2], h[3]))
        out |= {(p.identity["framework"], p.identity["version"]) for p in self._load(unhinted)
                if p.identity["device"].lower() == dev}
        self._identities[dev] = frozenset(out)
        return out

    def _device_dirs(self) -> set:
        return {f.relative_to(self.root).parts[0].lower() for f in self.files if len(f.relative_to(self.root).parts) > 1}

    def devices(self) -> list[str]:
        return sorted({p.identity["device"] for p in self.partitions()})

    def select(self, device: str, backend: Backend, fill: str = "older") -> "Selection":
        require(fill in FILLS, "fill", f"must be one of {', '.join(FILLS)}, got {fill!r}")
        device = device.lower()
        key = (device, backend, fill)
        if key not in self._selections:  # one per search, not one per program it binds
            self._selections[key] = self._select(device, backend, fill)
        return self._selections[key]

    def _select(self, device: str, backend: Backend, fill: str) -> "Selection":
        ids = self.identities(device)
        if not ids:
            raise GraphsimError("measured", f"no tables for device {device!r} in {self.root}; device "
                                f"folders there: {', '.join(sorted(self._device_dirs())) or 'none'}")
        fws = sorted({fw for fw, _ in ids})
        require(backend.framework in fws, "backend", f"no {backend.framework!r} tables for {device}; frameworks "
                f"there: {', '.join(fws)}")
        versions = sorted({v for fw, v in ids if fw == backend.framework}, key=version_key)
        version = backend.version
        if not version:
            require(len(versions) == 1, "backend", f"{backend.framework} has several versions for {device}: "
                    f"{', '.join(versions)}; name one, e.g. {backend.framework}@{versions[-1]}")
            version = versions[0]
        require(version in versions, "backend", f"no {backend.framework}@{version} tables for {device}; versions "
                f"there: {', '.join(versions)}")
        return Selection(device, Backend(backend.framework, version), self, fill)


class Selection:
    """The partitions one backend on one device may draw on, with the rule that admits each."""

    def __init__(self, device: str, backend: Backend, store: Store, fill: str):
        self.device, self.backend, self.fill = device, backend, fill
        self.store = store  #: the store it selects from (curves built on it are memoized there)
        self._has: dict = {}
        self._candidates: dict = {}

    def has(self, family: str) -> bool:
        """Whether the rules admit any partition of ``family`` at all (the named version, a backfill, NCCL)."""
        if family not in self._has:
            ops = {p.identity["op"] for p in self._family(family)}
            self._has[family] = any(self.candidates(family, o, {}) for o in ops)
        return self._has[family]

    def _family(self, family: str) -> list[Partition]:
        fws = (self.backend.framework, "nccl") if family == "collective" else (self.backend.framework,)
        return self.store.partitions(self.device, family, fws)

    def candidates(self, family: str, op: str, where: dict) -> list[tuple[Partition, str]]:
        """Partitions of ``family``/``op`` whose identity matches ``where`` (column -> allowed values), with
        the rule that admitted them: "" (the named version), "backfill from V" or "NCCL (V)". The
        first rule that yields anything wins (memoized: a search asks the same questions of every program)."""
        key = (family, op, tuple(sorted((k, tuple(v)) for k, v in where.items())))
        got = self._candidates.get(key)
        if got is None:
            got = self._candidates[key] = self._candidates_of(family, op, where)
        return list(got)

    def _candidates_of(self, family: str, op: str, where: dict) -> list[tuple[Partition, str]]:
        def match(p: Partition) -> bool:
            i = p.identity
            return i["family"] == family and i["op"] == op and all(i.get(k) in v for k, v in where.items())

        fw, ver = self.backend.framework, self.backend.version
        parts = self._family(family)
        own = [p for p in parts if p.identity["framework"] == fw and match(p)]
        exact = [(p, "") for p in own if p.identity["version"] == ver]
        if exact:
            return exact
        if self.fill == "older":
            older = sorted({p.identity["version"] for p in own if version_key(p.identity["version"]) < version_key(ver)},
                           key=version_key)
            if older:
                v = older[-1]
                return [(p, f"backfill from {fw}@{v}") for p in own if p.identity["version"] == v]
        if family == "collective":
            nccl = [p for p in parts if p.identity["framework"] == "nccl" and match(p)]
            if nccl:
                v = max({p.identity["version"] for p in nccl}, key=version_key)
                return [(p, f"NCCL {v}") for p in nccl if p.identity["version"] == v]
        return []

    def what_exists(self, family: str) -> str:
        keys = sorted({p.key for p in self._family(family)}) if family else []
        return "; ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "") if keys else "none"


def read_partitions(path: Path, root: Path | None = None) -> list[Partition]:
    """Read one Parquet file of graphsim's format into its partitions (validated)."""
    import pyarrow.parquet as pq

    where = str(path.relative_to(root)) if root else str(path)
    try:
        df = pq.read_table(path).to_pandas()
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file is the user's input
        raise GraphsimError("measured", f"{where}: not a readable Parquet table ({type(e).__name__})") from None
    if not len(df):
        return []
    check_frame(df, where)
    fam = FAMILIES[str(df["family"].iloc[0])]
    ids = list(identity_columns(fam.name))
    for c in ids:
        df[c] = df[c].fillna("").astype(str)
    # one sort by partition, then slices (a groupby gathering every column per group is slow on large files)
    code = df.groupby(ids, sort=True, dropna=False).ngroup().to_numpy()
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(int(code.max()) + 2))
    x = df[list(fam.coords)].to_numpy(np.int64)[order]
    t = df[LATENCY].to_numpy(np.float64)[order]
    heads = df[ids].iloc[order[bounds[:-1]]].to_numpy(dtype=object)
    return [Partition(fam.name, dict(zip(ids, (str(v) for v in head))), fam.coords, x[lo:hi], t[lo:hi])
            for head, lo, hi in zip(heads, bounds[:-1], bounds[1:])]
