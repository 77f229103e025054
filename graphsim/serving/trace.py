"""Request traces for the serving simulator (issue 27): when each request arrives, how long its prompt and output
are, and which KV blocks its prompt is made of, so a prefix cache can be priced.

A :class:`Trace` is columnar (NumPy arrays, one entry per request, in arrival order); the prompt's block ids are
one flat array cut by ``offsets``. It comes from a file (:func:`load_trace`: Mooncake JSONL, or CSV / Parquet with
the same columns) or from :func:`synthetic` (Poisson or gamma arrivals, lengths from small distribution records,
multi-turn agent sessions whose prompts extend each other).

Block ids follow Mooncake's ``hash_ids``: block ``j`` of a prompt covers tokens ``[j * block_tokens, (j + 1) *
block_tokens)`` (the last block may be partial), and two requests whose leading ids agree share that prefix.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import attrs
import numpy as np

from ..core.errors import GraphsimError, require
from ..core.limits import MAX_CONTEXT, MAX_REQUESTS

#: file formats :func:`load_trace` reads, by suffix
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
#: seconds per unit of a file's ``timestamp``
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
ARRIVALS = ("poisson", "gamma")
_I64_MAX = 2 ** 63 - 1
#: the latest arrival a trace may hold, in seconds from its start (about 136 years): a simulator's float clock
#: resolves a microsecond step below it (one ulp of 2^32 s is 2^-20 s); beyond it a step no longer moves the clock
MAX_ARRIVAL_S = float(2 ** 32)


def _i64(a):
    return np.asarray(a, dtype=np.int64)


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _gather(offsets, idx):
    """Offsets and flat block positions of the requests ``idx`` (in that order), vectorized."""
    counts = offsets[1:][idx] - offsets[:-1][idx]
    new = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(counts, out=new[1:])
    pos = np.arange(new[-1], dtype=np.int64) + np.repeat(offsets[:-1][idx] - new[:-1], counts)
    return new, pos


@attrs.frozen(eq=False)
class Trace:
    """Requests in arrival order, one entry per request in each array (``offsets`` has ``n + 1``).

    ``block_ids[offsets[i]:offsets[i + 1]]`` are request ``i``'s prompt blocks of ``block_tokens`` tokens (the last
    may be partial); ``session`` is -1 for a request outside any multi-turn session, and ``turn`` its 0-based turn.
    The arrays are not copied: do not write to them.
    """

    arrival_s: np.ndarray = attrs.field(converter=_f64)  #: seconds from the trace start, non-decreasing
    input_len: np.ndarray = attrs.field(converter=_i64)  #: prompt tokens, >= 1
    output_len: np.ndarray = attrs.field(converter=_i64)  #: output tokens, >= 1
    block_ids: np.ndarray = attrs.field(converter=_i64)  #: flat prompt block ids
    offsets: np.ndarray = attrs.field(converter=_i64)  #: n + 1 cuts into block_ids
    session: np.ndarray = attrs.field(converter=_i64)  #: -1 = none
    turn: np.ndarray = attrs.field(converter=_i64)  #: 0-based turn within the session (0 when none)
    block_tokens: int = 512
    source: str = ""

    def __attrs_post_init__(self):
        n = len(self.arrival_s)
        for name in ("input_len", "output_len", "session", "turn"):
            require(getattr(self, name).shape == (n,), f"trace.{name}", f"must have one entry per request ({n})")
        require(self.offsets.shape == (n + 1,) and (n + 1 == 0 or self.offsets[0] == 0), "trace.offsets",
                f"must have n + 1 = {n + 1} entries starting at 0")
        require(int(self.offsets[-1]) == len(self.block_ids), "trace.offsets",
                f"must end at len(block_ids) = {len(self.block_ids)}")
        require(isinstance(self.block_tokens, int) and self.block_tokens >= 1, "trace.block_tokens",
                f"must be a whole number >= 1, got {self.block_tokens!r}")
        counts = np.diff(self.offsets)
        require(bool(np.all(counts >= 0)), "trace.offsets", "must be non-decreasing")
        require(bool(np.all(np.isfinite(self.arrival_s))) and bool(np.all(np.diff(self.arrival_s) >= 0)),
                "trace.arrival_s", "must be finite and non-decreasing")
        top = float(np.max(np.abs(self.arrival_s), initial=0.0))
        require(top <= MAX_ARRIVAL_S, "trace.arrival_s", f"must lie within {MAX_ARRIVAL_S:.4g} s (2^32, about 136 "
                f"years) of the trace start, where a simulated step still moves the clock; got {top:.4g} s")
        require(bool(np.all(self.input_len >= 1)), "trace.input_len", "must be >= 1")
        require(bool(np.all(self.output_len >= 1)), "trace.output_len", "must be >= 1")
        require(bool(np.all(counts <= -(-self.input_len // self.block_tokens))), "trace.block_ids",
                "a request has more blocks than ceil(input_len / block_tokens)")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def blocks(self, i) -> np.ndarray:
        """Request ``i``'s prompt block ids."""
        return self.block_ids[self.offsets[i]:self.offsets[i + 1]]

    def prefix_hits(self) -> np.ndarray:
        """Per request, the prompt tokens an infinite prefix cache serves, in arrival order:
        ``min(L * block_tokens, input_len - 1)`` where ``L`` is the leading run of the request's block ids that
        appeared in any earlier request (ties in arrival: file order). The last token is always computed.
        One sort of the block ids (``np.unique``), no per-block Python: ~9 s for 31 M blocks."""
        n = len(self)
        ids, off = self.block_ids, self.offsets
        if n == 0 or len(ids) == 0:
            return np.zeros(n, dtype=np.int64)
        counts = np.diff(off)
        owner = np.repeat(np.arange(n, dtype=np.int64), counts)
        # the flat array is in request order, so an id's first flat position is its first request
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        seen = owner[first][inverse.ravel()] < owner
        local = np.arange(len(ids), dtype=np.int64) - np.repeat(off[:-1], counts)
        miss_at = np.where(seen, _I64_MAX, local)  # a block not seen before ends the leading run
        run = np.zeros(n, dtype=np.int64)
        has = counts > 0
        run[has] = np.minimum(np.minimum.reduceat(miss_at, off[:-1][has]), counts[has])
        return np.minimum(run * self.block_tokens, self.input_len - 1)

    def prefix_reuse(self) -> float:
        """The fraction of all prompt tokens an infinite prefix cache serves."""
        total = int(self.input_len.sum())
        return float(self.prefix_hits().sum()) / total if total else 0.0

    def _take(self, idx, *, shift_s: float = 0.0, source: str | None = None) -> Trace:
        idx = np.asarray(idx, dtype=np.int64)
        off, pos = _gather(self.offsets, idx)
        return Trace(self.arrival_s[idx] - shift_s, self.input_len[idx], self.output_len[idx], self.block_ids[pos],
                     off, self.session[idx], self.turn[idx], self.block_tokens,
                     self.source if source is None else source)

    def head(self, n: int) -> Trace:
        """The first ``n`` requests."""
        require(isinstance(n, int) and n >= 0, "trace.head", f"must be a whole number >= 0, got {n!r}")
        return self._take(np.arange(min(n, len(self))), source=f"{self.source} head({n})")

    def window(self, t0_s: float, t1_s: float) -> Trace:
        """The requests arriving in ``[t0_s, t1_s)``, their times rebased to ``t0_s`` (the sub-trace's start).
        Its prefix hits count only its own requests (a cold cache at ``t0_s``)."""
        require(math.isfinite(t0_s) and t1_s >= t0_s, "trace.window", f"needs finite t0_s <= t1_s, got "
                f"{t0_s!r}, {t1_s!r}")
        lo, hi = np.searchsorted(self.arrival_s, [t0_s, t1_s], side="left")
        return self._take(np.arange(lo, hi), shift_s=t0_s, source=f"{self.source} window({t0_s}, {t1_s})")

    def scale_rate(self, factor: float) -> Trace:
        """The same requests ``factor`` times as fast: arrival times divided by ``factor``."""
        require(isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0, "trace.scale_rate",
                f"must be a finite number > 0, got {factor!r}")
        return attrs.evolve(self, arrival_s=self.arrival_s / factor, source=f"{self.source} scale_rate({factor})")

    # -- writers: the Mooncake columns (timestamp in ms), plus session_id and turn when any request has a session
    def _records(self):
        ms = self.arrival_s * 1e3
        whole = bool(np.all(ms == np.round(ms)))
        sessions = bool(np.any(self.session >= 0))
        ts = ms.astype(np.int64).tolist() if whole else ms.tolist()
        inp, out, off = self.input_len.tolist(), self.output_len.tolist(), self.offsets.tolist()
        ses, turn = self.session.tolist(), self.turn.tolist()
        for i in range(len(self)):
            r = {"timestamp": ts[i], "input_length": inp[i], "output_length": out[i],
                 "hash_ids": self.block_ids[off[i]:off[i + 1]].tolist()}
            if sessions:
                r["session_id"], r["turn"] = ses[i], turn[i]
            yield r

    def to_jsonl(self, path) -> None:
        with open(path, "w") as f:
            for r in self._records():
                f.write(json.dumps(r) + "\n")

    def to_csv(self, path) -> None:
        with open(path, "w", newline="") as f:
            w = None
            for r in self._records():
                r["hash_ids"] = " ".join(map(str, r["hash_ids"]))
                if w is None:
                    w = csv.DictWriter(f, fieldnames=list(r))
                    w.writeheader()
                w.writerow(r)
            if w is None:
                f.write("timestamp,input_length,output_length,hash_ids\n")

    def to_parquet(self, path) -> None:
        pa, pq = _pyarrow()
        ms = self.arrival_s * 1e3
        cols = {"timestamp": pa.array(ms.astype(np.int64) if np.all(ms == np.round(ms)) else ms),
                "input_length": pa.array(self.input_len), "output_length": pa.array(self.output_len),
                "hash_ids": pa.LargeListArray.from_arrays(pa.array(self.offsets), pa.array(self.block_ids))}
        if np.any(self.session >= 0):
            cols["session_id"], cols["turn"] = pa.array(self.session), pa.array(self.turn)
        pq.write_table(pa.table(cols), path)


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise GraphsimError("trace.format", "parquet needs pyarrow: pip install 'graphsim[parquet]'") from None
    return pa, pq


# -- loading --------------------------------------------------------------------------------------------------------
def _number(v):
    """A CSV cell as a number where it reads as one (else unchanged, for the error message)."""
    if isinstance(v, str):
        for conv in (int, float):
            try:
                return conv(v)
            except ValueError:
                pass
    return v


def _whole(v, field, where, lo):
    v = _number(v)
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer())
            or not lo <= v <= _I64_MAX):
        raise GraphsimError(f"trace.{field}", f"{where}: must be a whole number >= {lo}, got {v!r}")
    return int(v)


def _from_records(rows, *, block_tokens, time_unit, source):
    """A trace from ``(where, record)`` pairs in file order (``where``: "line 17" / "row 3" for errors)."""
    ts, inp, out, ses, turn, ids, given = [], [], [], [], [], [], []
    for where, r in rows:
        if not isinstance(r, dict):
            raise GraphsimError("trace", f"{where}: must be an object with timestamp, input_length, output_length, "
                                f"hash_ids, got {type(r).__name__}")
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if r.get(key) is None:
                raise GraphsimError(f"trace.{key}", f"{where}: missing")
        t = _number(r["timestamp"])
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise GraphsimError("trace.timestamp", f"{where}: must be a finite number >= 0, got {t!r}")
        n_in = _whole(r["input_length"], "input_length", where, 1)
        n_out = _whole(r["output_length"], "output_length", where, 1)
        h = r["hash_ids"]
        if isinstance(h, str):  # CSV: space-separated ("[1, 2]" is read too)
            h = h.strip().strip("[]").replace(",", " ").split()
        if not isinstance(h, (list, tuple)):
            raise GraphsimError("trace.hash_ids", f"{where}: must be a list of whole numbers >= 0, got {h!r}")
        h = [_whole(x, "hash_ids", where, 0) for x in h]
        most = -(-n_in // block_tokens)
        if len(h) > most:
            raise GraphsimError("trace.hash_ids", f"{where}: {len(h)} blocks for input_length {n_in} is more than "
                                f"ceil({n_in} / {block_tokens}) = {most}")
        s = r.get("session_id")
        s = -1 if s is None or s == "" else _whole(s, "session_id", where, -1)
        k = r.get("turn")
        k = 0 if k is None or k == "" else _whole(k, "turn", where, 0)
        ts.append(t)
        inp.append(n_in)
        out.append(n_out)
        ses.append(s)
        turn.append(k)
        ids.extend(h)
        given.append(len(h))
    n = len(ts)
    inp_a, given_a = np.array(inp, dtype=np.int64), np.array(given, dtype=np.int64)
    need = -(-inp_a // block_tokens)
    # a short hash_ids list carries no prefix information for the rest: fresh ids, above every id, never hit
    fresh = need - given_a
    flat = np.empty(int(need.sum()), dtype=np.int64)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(need, out=off[1:])
    local = np.arange(len(flat), dtype=np.int64) - np.repeat(off[:-1], need)
    known = local < np.repeat(given_a, need)
    flat[known] = np.array(ids, dtype=np.int64)
    start = max(ids, default=-1) + 1
    flat[~known] = start + np.arange(int(fresh.sum()), dtype=np.int64)
    arrival = np.array(ts, dtype=np.float64) * TIME_UNITS[time_unit]
    order = np.argsort(arrival, kind="stable")  # unsorted timestamps: sorted, ties kept in file order
    new_off, pos = _gather(off, order)
    return Trace(arrival[order], inp_a[order], _i64(out)[order], flat[pos], new_off, _i64(ses)[order],
                 _i64(turn)[order], block_tokens, source)


def _jsonl_rows(path):
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield f"line {no}", json.loads(line)
                except json.JSONDecodeError as e:
                    raise GraphsimError("trace", f"line {no}: not JSON ({e.msg})") from None


def _csv_rows(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for r in reader:
            yield f"line {reader.line_num}", r


def _parquet_rows(path):
    pa, pq = _pyarrow()
    try:
        table = pq.read_table(path)
    except pa.ArrowException as e:
        raise GraphsimError("trace", f"{path.name}: not a Parquet file ({str(e).strip().splitlines()[0]})") from None
    for no, r in enumerate(table.to_pylist(), 1):
        yield f"row {no}", r


def _rows(fmt, path):
    """The file's ``(where, record)`` pairs; a file that cannot be read (missing, a folder, not UTF-8) is one line."""
    try:
        yield from {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[fmt](path)
    except OSError as e:
        raise GraphsimError("trace", f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise GraphsimError("trace", f"{path.name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise GraphsimError("trace", f"{path.name}: not CSV ({e})") from None


def load_trace(path, *, format=None, block_tokens=512, time_unit="ms") -> Trace:
    """A trace from a file: Mooncake JSONL (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``, one
    object a line), or CSV / Parquet with the same columns (CSV ``hash_ids`` space-separated); optional
    ``session_id`` and ``turn`` columns. ``format`` defaults from the suffix; ``time_unit`` is the timestamp's
    (Mooncake: ms). Requests are sorted stably by arrival. A ``hash_ids`` list shorter than the prompt's blocks
    gets fresh ids for the rest (they never hit); a longer one is an error."""
    path = Path(path)
    fmt = format if format is not None else FORMATS.get(path.suffix.lower())
    require(fmt in ("jsonl", "csv", "parquet"), "trace.format",
            f"must be one of jsonl, csv, parquet (or a path ending {', '.join(FORMATS)}), got "
            f"{format if format is not None else path.suffix!r}")
    require(time_unit in TIME_UNITS, "trace.time_unit", f"must be one of {', '.join(TIME_UNITS)}, got {time_unit!r}")
    require(isinstance(block_tokens, int) and not isinstance(block_tokens, bool) and 1 <= block_tokens <= MAX_CONTEXT,
            "trace.block_tokens", f"must be a whole number >= 1 (at most {MAX_CONTEXT:,}), got {block_tokens!r}")
    return _from_records(_rows(fmt, path), block_tokens=block_tokens, time_unit=time_unit, source=path.name)


# -- synthetic traces -----------------------------------------------------------------------------------------------
#: the fields each distribution takes (``max``: an optional upper clip)
DISTS = {"const": ("value",), "uniform": ("low", "high"), "lognormal": ("mean", "cv")}
#: the largest parameter a distribution takes (whole numbers stay exact in a float; draws stay in int64)
DIST_MAX = float(2 ** 53)


@attrs.frozen
class Dist:
    """A small length / time distribution: ``const`` (value), ``uniform`` (low..high, inclusive for whole
    numbers) or ``lognormal`` (mean, coefficient of variation cv); ``max`` optionally clips from above."""

    dist: str
    params: tuple = ()  #: (name, value) pairs, in DISTS order
    max: float | None = None

    @classmethod
    def of(cls, spec, field: str) -> Dist:
        """A :class:`Dist` from a record, a dict ``{"dist": ..., ...}`` or a bare number (const), every field
        checked."""
        if isinstance(spec, Dist):
            return spec
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = {"dist": "const", "value": spec}
        require(isinstance(spec, dict), field, f"must be a number or a dict like {{'dist': 'lognormal', 'mean': "
                f"2000, 'cv': 1.0}}, got {spec!r}")
        kind = spec.get("dist")
        require(kind in DISTS, f"{field}.dist", f"must be one of {', '.join(DISTS)}, got {kind!r}")
        allowed = DISTS[kind] + ("max",)
        extra = sorted(set(spec) - set(allowed) - {"dist"}) + [None]
        require(extra[0] is None, field, f"unknown field {extra[0]!r} for {kind} (allowed: {', '.join(allowed)})")
        params = []
        for name in DISTS[kind]:
            v = spec.get(name)
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= DIST_MAX,
                    f"{field}.{name}", f"must be a finite number in [0, 2^53], got {v!r}")
            params.append((name, v))
        p = dict(params)
        if kind == "uniform":
            require(p["low"] <= p["high"], f"{field}.high", f"must be >= low ({p['low']}), got {p['high']}")
        if kind == "lognormal":
            require(p["mean"] > 0, f"{field}.mean", f"must be > 0, got {p['mean']}")
        m = spec.get("max")
        require(m is None or (isinstance(m, (int, float)) and not isinstance(m, bool) and m >= 0), f"{field}.max",
                f"must be a number >= 0, got {m!r}")
        return cls(kind, tuple(params), m)

    def spec(self) -> dict:
        """The dict :meth:`of` reads back."""
        return {"dist": self.dist, **dict(self.params), **({} if self.max is None else {"max": self.max})}

    def mean(self) -> float:
        """The mean before clipping (for sizing)."""
        p = dict(self.params)
        return float(p["value"] if self.dist == "const" else (p["low"] + p["high"]) / 2 if self.dist == "uniform"
                     else p["mean"])

    def sample(self, rng, n: int, *, whole: bool, lo: float = 0):
        """``n`` draws (whole numbers rounded when ``whole``), clipped to ``[lo, max]``."""
        p = dict(self.params)
        if self.dist == "const":
            x = np.full(n, float(p["value"]))
        elif self.dist == "uniform":
            x = (rng.integers(math.ceil(p["low"]), math.floor(p["high"]) + 1, n).astype(np.float64) if whole
                 else rng.uniform(p["low"], p["high"], n))
        else:
            s2 = math.log1p(p["cv"] ** 2)
            x = rng.lognormal(math.log(p["mean"]) - s2 / 2, math.sqrt(s2), n)
        if whole:
            x = np.minimum(np.round(x), DIST_MAX)  # a lognormal's tail beyond int64 (callers bound what they take)
        x = np.clip(x, lo, np.inf if self.max is None else self.max)
        return x.astype(np.int64) if whole else x


#: a session record's fields and their defaults (``turns`` has none)
SESSION_FIELDS = {"turns": None, "think_s": 10.0, "tool_tokens": 0, "system_tokens": 0}

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(a, b):
    """A deterministic 63-bit hash of the pairs (a, b) (splitmix64 finalizer over a combined word)."""
    with np.errstate(over="ignore"):
        x = a.astype(np.uint64) * _GOLD ^ (b.astype(np.uint64) + _GOLD)
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(1)).astype(np.int64)


def _gaps(rng, n, rate, arrival, cv):
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, n)
    k = 1.0 / cv ** 2
    return rng.gamma(k, 1.0 / (rate * k), n)


#: :func:`synthetic`'s default prompt and output lengths
DEFAULT_INPUT = Dist("lognormal", (("mean", 2048), ("cv", 1.0)))
DEFAULT_OUTPUT = Dist("lognormal", (("mean", 256), ("cv", 1.0)))


def synthetic(*, requests=None, duration_s=None, rate, arrival="poisson", cv=1.0, input=DEFAULT_INPUT,
              output=DEFAULT_OUTPUT, sessions=None, seed=0, block_tokens=512) -> Trace:
    """A synthetic trace, deterministic under ``seed``: ``requests`` requests, or those arriving in ``duration_s``.

    Arrivals: a Poisson process at ``rate`` per second (exponential gaps), or ``arrival="gamma"`` with gaps of
    coefficient of variation ``cv`` (bursty above 1). ``input`` / ``output``: token-length distributions (see
    :class:`Dist`: ``{"dist": "lognormal", "mean": 2000, "cv": 1.0}``, ``{"dist": "const", "value": 512}``,
    ``{"dist": "uniform", "low": 1, "high": 4096}``, or a bare number). Without sessions every prompt is unique.

    ``sessions={"turns": dist, "think_s": dist, "tool_tokens": dist, "system_tokens": N}`` makes multi-turn agent
    sessions: each session starts at an arrival of the process above (``rate`` is then sessions per second);
    turn 0's prompt is ``system_tokens`` of system prompt (shared by every session) plus an ``input`` draw; turn
    ``k + 1`` arrives ``think_s`` after turn ``k``'s *arrival* and its prompt is turn ``k``'s prompt + turn ``k``'s
    output + a ``tool_tokens`` draw, so its block ids extend turn ``k``'s. The trace is open-loop: a simulator
    replaying it does not feed completion times back into arrivals (a slow server does not delay the next turn).
    Block ids are chain hashes of (parent id, block content id): a full block keeps its id across the session's
    turns; a partial last block is content only that turn has.
    """
    require((requests is None) != (duration_s is None), "synthetic", "give exactly one of requests, duration_s")
    if requests is not None:
        require(isinstance(requests, int) and not isinstance(requests, bool) and 0 <= requests <= MAX_REQUESTS,
                "synthetic.requests", f"must be a whole number >= 0 (at most {MAX_REQUESTS:,}), got {requests!r}")
    else:
        require(isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s >= 0,
                "synthetic.duration_s", f"must be a finite number >= 0, got {duration_s!r}")
    require(isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0, "synthetic.rate",
            f"must be a finite number > 0 (per second), got {rate!r}")
    if duration_s is not None:
        require(rate * duration_s <= MAX_REQUESTS, "synthetic.duration_s", f"{duration_s} s at {rate}/s is over "
                f"{MAX_REQUESTS:,} arrivals")
    require(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= _I64_MAX, "synthetic.seed",
            f"must be a whole number >= 0, got {seed!r}")
    require(arrival in ARRIVALS, "synthetic.arrival", f"must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    require(isinstance(cv, (int, float)) and math.isfinite(cv) and cv > 0, "synthetic.cv",
            f"must be a finite number > 0, got {cv!r}")
    require(isinstance(block_tokens, int) and not isinstance(block_tokens, bool) and 1 <= block_tokens <= MAX_CONTEXT,
            "synthetic.block_tokens", f"must be a whole number >= 1 (at most {MAX_CONTEXT:,}), got {block_tokens!r}")
    d_in, d_out = Dist.of(input, "synthetic.input"), Dist.of(output, "synthetic.output")
    if sessions is None:
        spec = {"turns": Dist("const", (("value", 1),)), "think_s": Dist("const", (("value", 0),)),
                "tool_tokens": Dist("const", (("value", 0),)), "system_tokens": 0}
    else:
        require(isinstance(sessions, dict), "synthetic.sessions", f"must be a dict with {', '.join(SESSION_FIELDS)}")
        extra = sorted(set(sessions) - set(SESSION_FIELDS)) + [None]
        require(extra[0] is None, "synthetic.sessions", f"unknown field {extra[0]!r} (allowed: "
                f"{', '.join(SESSION_FIELDS)})")
        require("turns" in sessions, "synthetic.sessions.turns", "missing (a distribution of turns per session)")
        spec = {**SESSION_FIELDS, **sessions}
        for name in ("turns", "think_s", "tool_tokens"):
            spec[name] = Dist.of(spec[name], f"synthetic.sessions.{name}")
        s = spec["system_tokens"]
        require(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_CONTEXT,
                "synthetic.sessions.system_tokens", f"must be a whole number >= 0 (at most {MAX_CONTEXT:,}), got {s!r}")
    rng = np.random.default_rng(seed)

    # session starts: enough that no later session could reach the kept requests (checked below, doubled if not)
    turns = max(1.0, spec["turns"].mean())
    want = requests / turns if requests is not None else rate * duration_s
    n_s = 1.05 * want + rate * spec["think_s"].mean() * turns + 6 * math.sqrt(want) + 16
    # never more sessions than requests (each has a turn) or than start within duration_s (the loop extends)
    n_s = int(min(n_s, requests + 16 if requests is not None else 1.05 * want + 6 * math.sqrt(want) + 16))
    starts = np.cumsum(_gaps(rng, n_s, rate, arrival, cv))
    while True:
        req = _sessions(rng, starts, spec, d_in, d_out, block_tokens)
        t = req[0]
        if requests is not None:
            # no session not yet drawn may arrive before the requests-th arrival
            enough = not requests or (len(t) >= requests and starts[-1] > np.partition(t, requests - 1)[requests - 1])
        else:
            enough = starts[-1] >= duration_s
        if enough:
            break
        starts = np.concatenate([starts, starts[-1] + np.cumsum(_gaps(rng, len(starts), rate, arrival, cv))])
    t, s_id, k, p_len, o_len, block_ids, off = req
    order = np.argsort(t, kind="stable")  # ties: session, then turn order
    order = order[:requests] if requests is not None else order[: np.searchsorted(t[order], duration_s)]
    new_off, pos = _gather(off, order)
    src = json.dumps({"synthetic": {"requests": requests, "duration_s": duration_s, "rate": rate, "arrival": arrival,
                                    "cv": cv, "input": input, "output": output, "sessions": sessions, "seed": seed}},
                     default=lambda d: d.spec() if isinstance(d, Dist) else repr(d), sort_keys=True)
    return Trace(t[order], p_len[order], o_len[order], block_ids[pos], new_off,
                 s_id[order] if sessions is not None else np.full(len(order), -1, dtype=np.int64), k[order],
                 block_tokens, src)


def _sessions(rng, starts, spec, d_in, d_out, bt):
    """Every turn of sessions starting at ``starts``, in (session, turn) order: arrival, session, turn, prompt and
    output lengths, flat block ids and offsets. A fresh child generator per call keeps a retry deterministic."""
    rng = np.random.default_rng(rng.integers(2 ** 63))
    n_s = len(starts)
    turns = spec["turns"].sample(rng, n_s, whole=True, lo=1)
    n = float(turns.sum(dtype=np.float64))  # (a float: int64 sums of 2^53 draws wrap)
    require(n <= 4 * MAX_REQUESTS, "synthetic.sessions.turns", f"{n_s:,} sessions draw {n:,.0f} turns; at most "
            f"{4 * MAX_REQUESTS:,}")
    n = int(n)
    sess = np.repeat(np.arange(n_s, dtype=np.int64), turns)
    first = np.zeros(n_s + 1, dtype=np.int64)
    np.cumsum(turns, out=first[1:])
    k = np.arange(n, dtype=np.int64) - np.repeat(first[:-1], turns)
    head = k == 0
    think = spec["think_s"].sample(rng, n, whole=False)
    think[head] = 0.0
    t = np.repeat(starts, turns) + _segsum(think, first)
    out = d_out.sample(rng, n, whole=True, lo=1)
    tool = spec["tool_tokens"].sample(rng, n, whole=True)
    user = d_in.sample(rng, n_s, whole=True, lo=1)
    # prompt_{k+1} = prompt_k + out_k + tool_k, prompt_0 = system + user
    grow = np.zeros(n, dtype=np.int64)
    grow[~head] = (out + tool)[np.flatnonzero(~head) - 1]
    prompt = np.repeat(spec["system_tokens"] + user, turns) + _segsum(grow, first)
    # before the block streams: a prompt beyond graphsim's context limit is no request any model runs (each term
    # checked first, so their sums stay far inside int64)
    for field, x in (("input", user), ("output", out), ("sessions.tool_tokens", tool), ("input", prompt)):
        top = int(x.max(initial=0))
        require(top <= MAX_CONTEXT, f"synthetic.{field}", f"draws {top:,} tokens, over graphsim's limit of "
                f"{MAX_CONTEXT:,} (a prompt: system + input + earlier turns' outputs and tools): lower the mean or "
                "give a max")
    # each session's token stream: full blocks of its longest (last) prompt, chain-hashed position by position
    last = prompt[first[1:] - 1]
    full = last // bt
    s_off = np.zeros(n_s + 1, dtype=np.int64)
    np.cumsum(full, out=s_off[1:])
    stream = np.empty(int(s_off[-1]), dtype=np.int64)
    n_sys = spec["system_tokens"] // bt
    key = np.arange(n_s, dtype=np.int64) + 1  # content namespace: 0 = the shared system prompt
    parent = np.zeros(n_s, dtype=np.int64)
    for j in range(int(full.max(initial=0))):
        live = np.flatnonzero(full > j)
        content = _mix(np.zeros(len(live), np.int64) if j < n_sys else key[live], np.full(len(live), j, np.int64))
        parent[live] = _mix(parent[live], content)
        stream[s_off[live] + j] = parent[live]
    # a request's blocks: the stream's first prompt // bt blocks, then a partial block only it has
    nf = prompt // bt
    part = prompt % bt > 0
    cnt = nf + part
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt, out=off[1:])
    local = np.arange(int(off[-1]), dtype=np.int64) - np.repeat(off[:-1], cnt)
    in_stream = local < np.repeat(nf, cnt)
    ids = np.empty(len(local), dtype=np.int64)
    ids[in_stream] = stream[np.repeat(s_off[:-1][sess], cnt)[in_stream] + local[in_stream]]
    pr = np.flatnonzero(part)
    par = np.zeros(len(pr), dtype=np.int64)  # the parent: the last full block, or the root
    deep = nf[pr] > 0
    par[deep] = stream[s_off[:-1][sess[pr[deep]]] + nf[pr[deep]] - 1]
    ids[off[1:][pr] - 1] = _mix(par, _mix(key[sess[pr]], -1 - prompt[pr]))  # content: (session, its length)
    return t, sess, k, prompt, out, ids, off


def _segsum(x, first):
    """Inclusive running sums of ``x`` restarted at each segment start ``first[:-1]``."""
    c = np.cumsum(x)
    before = np.repeat(np.concatenate([[0], c])[first[:-1]], np.diff(first))
    return c - before
