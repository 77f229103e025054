"""FPM fits: measured forward time / SOL forward time, inside one partition, over SOL-normalised coordinates.

For each partition (every identity field equal, :data:`graphsim.views.fpm.schema.IDENTITY`) and each request mix
present in it (decode-only, prefill-only, mixed — different code paths, never pooled), the model is

    log(measured / SOL) = b0 + Σ_j [ a_j·z_j + Σ_k c_jk·max(0, z_j − κ_jk) ],   z_j = log(1 + x_j)

a piecewise-linear function of each coordinate in log space (knots κ at interior training values), fitted
by least squares with a small ridge on the hinge terms. The coordinates x_j of a mix are per-request means
and counts (requests, new tokens per request, cached positions per request). It is read as "how far
this backend stays from the speed of light, as a function of the shape": SOL carries the physics (what
scales with weights, KV, FLOPs), the fit carries the implementation's efficiency.

A query inside every coordinate's training range is **in domain** (interpolated); outside, each
coordinate is clamped to its range — the ratio to SOL is held at the edge, i.e. the forward is assumed to
scale like SOL beyond the data — and the answer is marked **extrapolated** with the coordinates that left
the range. A query whose identity matches no partition, or whose request mix the partition never sampled,
is refused.
"""
from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError, require

from .schema import COORDS, IDENTITY, STATUSES, read_samples

FORMAT = "graphsim-fpm"
SCHEMA_VERSION = 1
MIXES = ("decode", "prefill", "mixed")
#: the coordinates of each mix (derived from the sample sums; "per request" = sum / requests of that kind)
MIX_COORDS = {
    "decode": ("decode_requests", "decode_new", "decode_ctx"),
    "prefill": ("prefill_requests", "prefill_len", "prefill_cached"),
    "mixed": ("prefill_requests", "prefill_len", "prefill_cached", "decode_requests", "decode_new", "decode_ctx"),
}
#: every per-request coordinate, in the order of an ``outside`` mask's columns
COORD_NAMES = ("prefill_requests", "prefill_len", "prefill_cached", "decode_requests", "decode_new", "decode_ctx")
MAX_KNOTS = 4
RIDGE = 1e-6  # conditioning only: collinear knots stay solvable without biasing the fit


def derived(cols: dict) -> dict:
    """Per-request coordinates from the sample sums (arrays or scalars)."""
    def per(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), 0.0)

    return {
        "prefill_requests": np.asarray(cols["prefill_requests"], np.float64),
        "prefill_len": per(cols["prefill_tokens"], cols["prefill_requests"]),
        "prefill_cached": per(cols["prefill_past"], cols["prefill_requests"]),
        "decode_requests": np.asarray(cols["decode_requests"], np.float64),
        "decode_new": per(cols["decode_tokens"], cols["decode_requests"]),
        "decode_ctx": per(cols["decode_past"], cols["decode_requests"]),
    }


def mix_of(cols: dict) -> np.ndarray:
    p = np.asarray(cols["prefill_requests"]) > 0
    d = np.asarray(cols["decode_requests"]) > 0
    return np.where(p & d, "mixed", np.where(p, "prefill", np.where(d, "decode", "")))


@attrs.frozen
class Curve:
    """One mix of one partition: log(measured/SOL) as a sum of piecewise-linear terms in z = log(1 + x)."""

    mix: str
    coords: tuple  # coordinates that vary in the training data
    fixed: tuple  # ((coordinate, value), ...): constant in the training data
    lo: tuple
    hi: tuple
    knots: tuple  # per varying coordinate, its interior knots (in z)
    coef: tuple  # b0, then per coordinate: a_j, c_j1..c_jK
    n: int
    train_err: tuple  # median, p90, worst relative error on the training rows

    def _basis(self, z: np.ndarray) -> np.ndarray:
        cols = [np.ones(z.shape[0])]
        for j, ks in enumerate(self.knots):
            cols.append(z[:, j])
            cols.extend(np.maximum(0.0, z[:, j] - k) for k in ks)
        return np.stack(cols, axis=1)

    def log_ratio(self, x: dict) -> tuple[np.ndarray, np.ndarray]:
        """(log(measured/SOL), outside) for P points: ``outside`` [P, len(COORD_NAMES)] flags the coordinates
        outside the training range (varying ones beyond [lo, hi], fixed ones at another value)."""
        P = len(next(iter(x.values())))
        z = np.zeros((P, len(self.coords)))
        out = np.zeros((P, len(COORD_NAMES)), bool)
        for j, c in enumerate(self.coords):
            raw = np.log1p(np.asarray(x[c], np.float64))
            out[:, COORD_NAMES.index(c)] = (raw < self.lo[j] - 1e-9) | (raw > self.hi[j] + 1e-9)
            z[:, j] = np.clip(raw, self.lo[j], self.hi[j])
        for c, v in self.fixed:
            out[:, COORD_NAMES.index(c)] = np.abs(np.asarray(x[c], np.float64) - v) > 1e-9 * max(1.0, abs(v))
        return self._basis(z) @ np.asarray(self.coef), out

    def max_log_ratio(self) -> float:
        """The largest log(t/SOL) over the curve's domain (each coordinate in [lo, hi]): the terms are
        separable and piecewise linear, so each one's maximum is at lo, hi or a knot inside."""
        top = self.coef[0]
        i = 1
        for j, ks in enumerate(self.knots):
            cand = [self.lo[j], self.hi[j], *(k for k in ks if self.lo[j] <= k <= self.hi[j])]
            a, cs = self.coef[i], self.coef[i + 1: i + 1 + len(ks)]
            top += max(a * z + sum(c * max(0.0, z - k) for c, k in zip(cs, ks)) for z in cand)
            i += 1 + len(ks)
        return top

    def describe(self) -> str:
        parts = [f"log(t/SOL) = {self.coef[0]:+.3f}"]
        i = 1
        for c, ks in zip(self.coords, self.knots):
            parts.append(f"{self.coef[i]:+.3f}·z({c})")
            i += 1
            for k in ks:
                parts.append(f"{self.coef[i]:+.3f}·max(0, z({c}) - {k:.2f})")
                i += 1
        return " ".join(parts) + "   [z = log(1 + x)]"


def fit_curve(mix: str, x: dict, ratio: np.ndarray) -> Curve:
    """Least squares of log(ratio) on the piecewise-linear basis of the mix's varying coordinates."""
    names = MIX_COORDS[mix]
    n = len(ratio)
    coords, fixed, lo, hi, knots = [], [], [], [], []
    for c in names:
        v = np.asarray(x[c], np.float64)
        if np.ptp(v) == 0:
            fixed.append((c, float(v[0])))
            continue
        z = np.log1p(v)
        coords.append(c)
        lo.append(float(z.min()))
        hi.append(float(z.max()))
        uniq = np.unique(z)[1:-1]
        if len(uniq) > MAX_KNOTS:
            uniq = np.unique(np.quantile(z, np.linspace(0, 1, MAX_KNOTS + 2)[1:-1]))
        knots.append(tuple(float(k) for k in uniq))
    # never more parameters than rows: drop knots, then coordinates, from the last
    def size():
        return 1 + sum(1 + len(k) for k in knots)
    while size() > max(1, n - 1) and any(knots):
        j = max(range(len(knots)), key=lambda i: len(knots[i]))
        knots[j] = knots[j][:-1]
    while size() > max(1, n) and coords:
        c = coords.pop()
        lo.pop(), hi.pop(), knots.pop()
        fixed.append((c, float(np.median(np.asarray(x[c], np.float64)))))
    cur = Curve(mix, tuple(coords), tuple(fixed), tuple(lo), tuple(hi), tuple(knots), (0.0,), n, (0.0, 0.0, 0.0))
    z = np.stack([np.log1p(np.asarray(x[c], np.float64)) for c in coords], axis=1) if coords else np.zeros((n, 0))
    A = cur._basis(z)
    y = np.log(ratio)
    reg = np.full(A.shape[1], RIDGE)
    reg[0] = 0.0
    coef = np.linalg.solve(A.T @ A + np.diag(reg) * n, A.T @ y)
    pred = np.exp(A @ coef)
    err = np.abs(pred - ratio) / ratio
    return attrs.evolve(cur, coef=tuple(float(v) for v in coef),
                        train_err=(float(np.median(err)), float(np.quantile(err, 0.9)), float(err.max())))


@attrs.frozen
class Partition:
    identity: dict
    curves: dict  # mix -> Curve
    failures: dict  # status -> count (the partition's non-ok samples)

    @property
    def key(self) -> str:
        i = self.identity
        return (f"{i['model']}[{i['model_digest'][:8]}]/{i['framework']}@{i['version']}/{i['device']}/"
                f"{i['mapping']}/{i['image_digest'][-8:]}")


@attrs.frozen
class FPMModel:
    partitions: tuple
    created: str = ""
    samples: tuple = ()

    # ---- persistence --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "created": self.created,
                "samples": list(self.samples),
                "partitions": [{"key": p.key, "identity": p.identity, "failures": p.failures,
                                "curves": {m: {**attrs.asdict(c), "formula": c.describe()} for m, c in p.curves.items()}}
                               for p in self.partitions]}

    def save(self, path) -> None:
        """Write the model (checked, locked, atomic: a directory, a device or an unwritable place is one line)."""
        from graphsim.core.outputs import locked_output, write_text

        with locked_output(path) as p:
            write_text(p, json.dumps(self.to_json(), indent=1, default=_json_default, allow_nan=False))

    @staticmethod
    def load(path) -> "FPMModel":
        p = Path(path)
        try:
            found = p.is_file()
        except (OSError, ValueError):
            found = False
        require(found, "fpm", f"{str(path)[:100]}: no such file (fit one: graphsim fpm fit samples.parquet -o model.fpm)")
        try:
            d = json.loads(p.read_text(), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise GraphsimError("fpm", f"{p.name}: not an FPM model (JSON from graphsim fpm fit)") from None
        require(isinstance(d, dict) and d.get("format") == FORMAT, "fpm", f"{p.name}: not a {FORMAT} file")
        require(d.get("schema_version") == SCHEMA_VERSION, "fpm.schema_version",
                f"{p.name} has version {d.get('schema_version')!r}; this graphsim reads {SCHEMA_VERSION} (refit it)")
        try:
            parts = _check_partitions(d.get("partitions"))
            created, samples = d.get("created", ""), d.get("samples", [])
            require(isinstance(created, str), "fpm.created", "must be text")
            require(isinstance(samples, list) and all(isinstance(x, str) for x in samples), "fpm.samples",
                    "must be a list of file names")
        except GraphsimError as e:  # the field, then the file it is in
            raise GraphsimError(e.field, f"{p.name}: {str(e)[len(e.field) + 2:]}") from None
        return FPMModel(tuple(parts), created, tuple(samples))

    # ---- queries ------------------------------------------------------------------------------------
    def find(self, identity: dict, backend: str = "") -> Partition:
        """The one partition whose identity agrees with every field of ``identity`` (and the backend
        FRAMEWORK[@VERSION], when given). Refuses none or several, naming what differs."""
        fw, _, ver = backend.partition("@")
        want = dict(identity)
        if fw:
            want["framework"] = fw
        if ver:
            want["version"] = ver
        match = [p for p in self.partitions if all(str(p.identity.get(k)) == str(v) for k, v in want.items())]
        if len(match) == 1:
            return match[0]
        if not match:
            near = min(self.partitions, key=lambda p: sum(str(p.identity.get(k)) != str(v) for k, v in want.items()),
                       default=None)
            diff = [f"{k}={want[k]!r} (fitted: {near.identity.get(k)!r})" for k in want
                    if near is not None and str(near.identity.get(k)) != str(want[k])]
            raise GraphsimError("fpm", "no FPM partition matches this plan" + (f"; the nearest differs in {', '.join(diff[:4])}"
                                if diff else "") + f" [{len(self.partitions)} partitions: "
                                f"{'; '.join(p.key for p in self.partitions[:4])}]")
        fields = [k for k in IDENTITY if len({str(p.identity.get(k)) for p in match}) > 1]
        raise GraphsimError("fpm", f"{len(match)} FPM partitions match this plan, differing in {', '.join(fields)}; "
                            "name one with --backend FRAMEWORK@VERSION or fit them into separate files")


#: the largest ratio to SOL a curve may reach over its domain (a forward a billion times its SOL is no
#: measurement: a damaged or hand-edited file)
MAX_RATIO = 1e9


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number in a model file")


def _num(v, where: str, lo: float = -math.inf) -> float:
    require(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= lo, where,
            f"must be a finite number{f' >= {lo:g}' if lo > -math.inf else ''}, got {str(v)[:40]!r}")
    return float(v)


def _nums(v, where: str, n: int | None = None) -> tuple:
    require(isinstance(v, list), where, f"must be a list of numbers, got {type(v).__name__}")
    require(n is None or len(v) == n, where, f"must hold {n} numbers, got {len(v)}")
    return tuple(_num(x, f"{where}[{i}]") for i, x in enumerate(v))


def _check_partitions(parts) -> list:
    """Every partition and curve of a model file, field by field (type, range, finiteness): a damaged or
    hand-edited file is a one-line error naming the file and the field, never a KeyError or a 0 s forward."""
    require(isinstance(parts, list) and parts, "fpm.partitions", "must be a non-empty list")
    out = []
    for i, q in enumerate(parts):
        w = f"fpm.partitions[{i}]"
        require(isinstance(q, dict), w, "must be an object")
        ident, fails, curves = q.get("identity"), q.get("failures", {}), q.get("curves")
        require(isinstance(ident, dict), f"{w}.identity", "must be an object")
        for k in IDENTITY:
            v = ident.get(k)
            if k in ("devices", "mtp", "warmup"):
                require(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31, f"{w}.identity.{k}",
                        f"must be an integer >= 0, got {str(v)[:40]!r}")
            else:
                require(isinstance(v, str), f"{w}.identity.{k}", f"must be text, got {str(v)[:40]!r}")
        require(isinstance(fails, dict) and all(k in STATUSES and isinstance(n, int) and not isinstance(n, bool)
                                                and n >= 0 for k, n in fails.items()), f"{w}.failures",
                f"must map failure statuses ({', '.join(STATUSES[1:])}) to counts >= 0")
        require(isinstance(curves, dict), f"{w}.curves", "must be an object of request mix -> curve")
        cs = {}
        for m, c in curves.items():
            require(m in MIXES, f"{w}.curves", f"unknown request mix {str(m)[:30]!r}; allowed: {', '.join(MIXES)}")
            cs[m] = _check_curve(m, c, f"{w}.curves.{m}")
        out.append(Partition(dict(ident), cs, dict(fails)))
    return out


def _check_curve(mix: str, c, w: str) -> Curve:
    require(isinstance(c, dict), w, "must be an object")
    for k in ("mix", "coords", "fixed", "lo", "hi", "knots", "coef", "n", "train_err"):
        require(k in c, f"{w}.{k}", "missing")
    require(c["mix"] == mix, f"{w}.mix", f"must be {mix!r} (its key), got {str(c['mix'])[:30]!r}")
    allowed = MIX_COORDS[mix]
    coords = c["coords"]
    require(isinstance(coords, list) and all(isinstance(x, str) and x in allowed for x in coords)
            and len(set(coords)) == len(coords),
            f"{w}.coords", f"must be distinct coordinates of the {mix} mix ({', '.join(allowed)})")
    fixed = c["fixed"]
    require(isinstance(fixed, list) and all(isinstance(f, list) and len(f) == 2 and f[0] in allowed
                                            and f[0] not in coords for f in fixed), f"{w}.fixed",
            f"must be [coordinate, value] pairs of other coordinates of the {mix} mix")
    fixed = tuple((f[0], _num(f[1], f"{w}.fixed.{f[0]}", 0.0)) for f in fixed)
    k = len(coords)
    lo, hi = _nums(c["lo"], f"{w}.lo", k), _nums(c["hi"], f"{w}.hi", k)
    for j in range(k):
        require(0.0 <= lo[j] <= hi[j], f"{w}.lo[{j}]", "each range is 0 <= lo <= hi (in z = log(1 + x))")
    knots = c["knots"]
    require(isinstance(knots, list) and len(knots) == k, f"{w}.knots", f"must hold one list per coordinate ({k})")
    knots = tuple(_nums(kn, f"{w}.knots[{j}]") for j, kn in enumerate(knots))
    coef = _nums(c["coef"], f"{w}.coef", 1 + sum(1 + len(kn) for kn in knots))
    n = c["n"]
    require(isinstance(n, int) and not isinstance(n, bool) and n >= 1, f"{w}.n", f"must be an integer >= 1, got {n!r}")
    err = _nums(c["train_err"], f"{w}.train_err", 3)
    require(all(e >= 0 for e in err), f"{w}.train_err", "errors are >= 0")
    cur = Curve(mix, tuple(coords), fixed, lo, hi, knots, coef, n, err)
    top = cur.max_log_ratio()
    require(top <= math.log(MAX_RATIO), f"{w}.coef", f"the curve reaches {math.exp(min(top, 700)):.3g} x SOL inside its "
            f"domain (at most {MAX_RATIO:.0e}): a damaged or hand-edited model; refit it")
    return cur


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(type(o).__name__)


def fit(samples, *, sources: tuple = ()) -> FPMModel:
    """Fit every partition of a samples DataFrame (or several files' rows concatenated)."""
    df = samples
    parts = []
    ok_all = df["status"] == "ok"
    require(bool(ok_all.any()), "samples", "no ok samples to fit (every row failed: see its status and error)")
    for key, g in df.groupby(list(IDENTITY), sort=True, dropna=False):
        ident = {k: (int(v) if k in ("devices", "mtp", "warmup") else str(v)) for k, v in zip(IDENTITY, key)}
        fails = {s: int((g["status"] == s).sum()) for s in STATUSES if s != "ok" and (g["status"] == s).any()}
        ok = g[g["status"] == "ok"]
        curves = {}
        if len(ok):
            cols = {c: ok[c].to_numpy() for c in COORDS}
            x = derived(cols)
            mixes = mix_of(cols)
            ratio = ok["latency_s"].to_numpy(np.float64) / ok["sol_s"].to_numpy(np.float64)
            for mix in MIXES:
                sel = mixes == mix
                if sel.any():
                    curves[mix] = fit_curve(mix, {c: v[sel] for c, v in x.items()}, ratio[sel])
        parts.append(Partition(ident, curves, fails))
    return FPMModel(tuple(parts), datetime.datetime.now().isoformat(timespec="seconds"), tuple(sources))


def fit_files(paths, output=None, log=None) -> FPMModel:
    import pandas as pd

    if output:
        from graphsim.core.outputs import output_path

        output_path(output)  # before any work
    frames = [read_samples(p) for p in paths]
    model = fit(pd.concat(frames, ignore_index=True), sources=tuple(str(Path(p).name) for p in paths))
    if output:
        model.save(output)
    if log:
        for p in model.partitions:
            log(f"{p.key}: " + ", ".join(f"{m} n={c.n} train median {100 * c.train_err[0]:.1f} % worst "
                                         f"{100 * c.train_err[2]:.1f} %" for m, c in p.curves.items())
                + (f"; failures {p.failures}" if p.failures else ""))
            for c in p.curves.values():
                log(f"    {c.mix}: {c.describe()}")
        if output:
            log(f"wrote {output} ({len(model.partitions)} partitions)")
    return model


@attrs.frozen(eq=False)
class Prediction:
    """FPM forwards of P points: ``t`` (NaN where the partition has no curve for the point's request mix),
    ``outside`` [P, len(COORD_NAMES)] (coordinates beyond the samples), ``mixes``."""

    t: np.ndarray
    outside: np.ndarray
    mixes: np.ndarray

    @property
    def inside(self) -> np.ndarray:
        return np.isfinite(self.t) & ~self.outside.any(axis=1)

    def outside_names(self, i: int) -> list:
        return [c for c, o in zip(COORD_NAMES, self.outside[i]) if o]


def predict(part: Partition, cols: dict, sol) -> Prediction:
    """Forward times for points of one partition from their sample-sum coordinates ``cols`` (arrays) and
    their SOL forwards: vectorized per request mix."""
    sol = np.asarray(sol, np.float64)
    x = derived(cols)
    mixes = mix_of(cols)
    t = np.full(sol.shape, np.nan)
    outside = np.zeros((len(sol), len(COORD_NAMES)), bool)
    for mix, cur in part.curves.items():
        sel = mixes == mix
        if sel.any():
            lr, out = cur.log_ratio({c: v[sel] for c, v in x.items()})
            # no forward beats its SOL: a fit that dips below 1 x SOL (a negative intercept, noise at an
            # edge) is held at the bound
            t[sel] = sol[sel] * np.exp(np.maximum(lr, 0.0))
            outside[sel] = out
    return Prediction(t, outside, mixes)
