"""Issue 27: request traces for the serving simulator (graphsim.serving.trace) — the loaders round-trip each format,
bad input names its field and line, prefix hits follow their closed forms, and the synthetic generator is seeded
and its agent sessions hit exactly the blocks their earlier turns wrote."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from graphsim.core.errors import GraphsimError
from graphsim.serving import Trace, load_trace, synthetic

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
EXCERPT = Path(__file__).resolve().parent / "data" / "traces" / "mooncake_synthetic_trace_head300.jsonl"

AGENT = {"turns": {"dist": "uniform", "low": 1, "high": 6}, "think_s": {"dist": "lognormal", "mean": 5, "cv": 1},
         "tool_tokens": {"dist": "lognormal", "mean": 300, "cv": 1}, "system_tokens": 3000}


def _hand(block_ids, input_len, bt=4):
    """A trace at 1 request/s with the given blocks per request (output 1, no sessions)."""
    off = np.cumsum([0] + [len(b) for b in block_ids])
    n = len(block_ids)
    return Trace(np.arange(n, dtype=float), input_len, np.ones(n, int), [x for b in block_ids for x in b], off,
                 np.full(n, -1), np.zeros(n, int), bt)


def _reference_hits(tr):
    """prefix_hits written the slow, obvious way: a set of every block id seen so far."""
    seen, hits = set(), []
    for i in range(len(tr)):
        b = tr.blocks(i).tolist()
        run = 0
        while run < len(b) and b[run] in seen:
            run += 1
        hits.append(min(run * tr.block_tokens, int(tr.input_len[i]) - 1))
        seen.update(b)
    return np.array(hits)


def _same(a, b):
    assert len(a) == len(b)
    np.testing.assert_allclose(a.arrival_s, b.arrival_s, rtol=1e-12, atol=1e-12)
    for f in ("input_len", "output_len", "block_ids", "offsets", "session", "turn"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.block_tokens == b.block_tokens


def test_prefix_hits_hand_built_closed_form():
    bt = 4
    tr = _hand([[1, 2, 3], [1, 2, 9], [1, 2], [5, 1, 2], [5, 7, 8], [], [7, 7], [11, 11]],
               [10, 12, 8, 9, 9, 4, 8, 8], bt)
    # req 1: ids 1, 2 seen -> 2 blocks; req 2: 2 blocks = its whole prompt, the last token is computed -> 8 - 1;
    # req 3 starts with unseen 5 -> 0 though 1, 2 were seen; req 4: 5 seen in req 3 -> 1 block; req 5: no blocks;
    # req 6: 7 seen in req 4, twice -> min(2 * 4, 8 - 1); req 7: 11 repeats within itself only -> 0
    expect = np.array([0, 2 * bt, 8 - 1, 0, 1 * bt, 0, 8 - 1, 0])
    np.testing.assert_array_equal(tr.prefix_hits(), expect)
    np.testing.assert_array_equal(_reference_hits(tr), expect)
    assert tr.prefix_reuse() == pytest.approx(expect.sum() / (10 + 12 + 8 + 9 + 9 + 4 + 8 + 8))
    np.testing.assert_array_equal(tr.blocks(3), [5, 1, 2])


def test_session_hits_are_the_earlier_turns_full_blocks():
    bt = 512
    tr = synthetic(requests=2000, rate=2.0, sessions=AGENT, seed=7)
    assert len(tr) == 2000 and tr.turn.max() >= 3 and (tr.session >= 0).all()
    hits = tr.prefix_hits()
    # closed form: turn k > 0 reuses turn k-1's full blocks (its prompt extends turn k-1's, the partial last block
    # is content only that turn has); a turn 0 reuses the shared system prompt's full blocks, except the first
    prev, prev_blocks, expect = {}, {}, []
    for i in range(len(tr)):
        s, k = int(tr.session[i]), int(tr.turn[i])
        if k == 0:
            expect.append(0 if i == 0 else AGENT["system_tokens"] // bt * bt)
        else:
            p = prev[s]
            expect.append(p // bt * bt)
            np.testing.assert_array_equal(tr.blocks(i)[:p // bt], prev_blocks[s][:p // bt])
            assert tr.input_len[i] > p
        assert k == 0 or s in prev
        prev[s], prev_blocks[s] = int(tr.input_len[i]), tr.blocks(i)
    np.testing.assert_array_equal(hits, expect)
    assert tr.prefix_reuse() == pytest.approx(sum(expect) / tr.input_len.sum())
    np.testing.assert_array_equal(_reference_hits(tr), hits)


def test_sessions_start_on_the_arrival_process_and_turns_follow_by_think_time():
    tr = synthetic(requests=300, rate=2.0, sessions={"turns": 3, "think_s": 2.5}, seed=4)
    plain = synthetic(requests=100, rate=2.0, seed=4)
    starts = {int(s): t for s, t in zip(tr.session[tr.turn == 0], tr.arrival_s[tr.turn == 0])}
    # the sessions start at the arrivals a plain trace at the same rate and seed has (beyond its 100th: ours)
    np.testing.assert_array_equal([starts[s] for s in sorted(starts)][:90], plain.arrival_s[:90])
    # turn k arrives k think times after turn 0's arrival (open loop: no completion feedback)
    np.testing.assert_allclose(tr.arrival_s, [starts[int(s)] + 2.5 * k for s, k in zip(tr.session, tr.turn)])
    assert (plain.session == -1).all() and (plain.turn == 0).all()


def test_poisson_mean_gap_within_three_sigma():
    rate, n = 5.0, 20000
    gaps = np.diff(synthetic(requests=n, rate=rate, seed=11).arrival_s, prepend=0.0)
    # exponential gaps: mean 1 / rate, standard deviation 1 / rate, so the mean of n has sigma 1 / (rate sqrt(n))
    assert abs(gaps.mean() - 1 / rate) < 3 / (rate * math.sqrt(n))
    bursty = np.diff(synthetic(requests=n, rate=rate, arrival="gamma", cv=2.0, seed=11).arrival_s, prepend=0.0)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)
    tr = synthetic(duration_s=100.0, rate=rate, seed=3)
    assert tr.arrival_s.max() < 100.0 and abs(len(tr) - 500) < 3 * math.sqrt(500)


def test_lengths_follow_their_specs():
    tr = synthetic(requests=5000, rate=1.0, input={"dist": "uniform", "low": 10, "high": 20}, output=7, seed=1)
    assert tr.input_len.min() == 10 and tr.input_len.max() == 20 and (tr.output_len == 7).all()
    assert tr.prefix_reuse() == 0.0  # no sessions: every prompt unique
    ln = synthetic(requests=20000, rate=1.0, input={"dist": "lognormal", "mean": 2000, "cv": 1.0, "max": 50000},
                   seed=1).input_len
    assert ln.mean() == pytest.approx(2000, rel=0.05) and ln.max() <= 50000


def test_same_seed_same_arrays():
    a, b = (synthetic(requests=500, rate=3.0, sessions=AGENT, seed=5) for _ in range(2))
    _same(a, b)
    assert a.source == b.source
    c = synthetic(requests=500, rate=3.0, sessions=AGENT, seed=6)
    assert not np.array_equal(a.input_len, c.input_len)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_each_format_round_trips(tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow", reason="parquet needs pyarrow")
    for tr in (synthetic(requests=300, rate=4.0, sessions=AGENT, seed=2),
               synthetic(requests=50, rate=4.0, seed=2, block_tokens=64).scale_rate(3.0)):
        path = tmp_path / f"t.{fmt}"
        getattr(tr, f"to_{fmt}")(path)
        back = load_trace(path, block_tokens=tr.block_tokens)
        _same(back, tr)
        assert back.source == path.name
        np.testing.assert_array_equal(back.prefix_hits(), tr.prefix_hits())


def test_unsorted_timestamps_are_sorted_stably_and_short_hash_ids_never_hit(tmp_path):
    rows = [(5, [1, 2]), (0, [1, 2]), (5, [1]), (0, [4, 2])]
    p = tmp_path / "u.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 8, "output_length": i + 1, "hash_ids": h}) + "\n"
                         for i, (t, h) in enumerate(rows)))
    tr = load_trace(p, block_tokens=4)
    np.testing.assert_array_equal(tr.output_len, [2, 4, 1, 3])  # file order within equal timestamps
    np.testing.assert_array_equal(tr.arrival_s, [0, 0, 0.005, 0.005])
    # file row 3 gave 1 of its 2 blocks: the second gets a fresh id, above every id in the file (4), never a hit
    np.testing.assert_array_equal(tr.blocks(3), [1, 5])
    # [1 2]: cold; [4 2]: 4 unseen; [1 2]: whole prompt, last token computed -> 8 - 1; [1 fresh]: 1 block
    np.testing.assert_array_equal(tr.prefix_hits(), [0, 0, 7, 4])


@pytest.mark.parametrize("text, message", [
    ('{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": []}',
     "trace.input_length: line 17: must be a whole number >= 1, got -3"),
    ('{"timestamp": 0, "input_length": 2.5, "output_length": 1, "hash_ids": []}',
     "trace.input_length: line 17: must be a whole number >= 1, got 2.5"),
    ('{"timestamp": -1, "input_length": 3, "output_length": 1, "hash_ids": []}',
     "trace.timestamp: line 17: must be a finite number >= 0, got -1"),
    ('{"timestamp": 0, "input_length": 3, "hash_ids": []}', "trace.output_length: line 17: missing"),
    ('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2, 3]}',
     "trace.hash_ids: line 17: 3 blocks for input_length 1024 is more than ceil(1024 / 512) = 2"),
    ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1, "x"]}',
     "trace.hash_ids: line 17: must be a whole number >= 0, got 'x'"),
    ('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [], "turn": -1}',
     "trace.turn: line 17: must be a whole number >= 0, got -1"),
    ('{"timestamp": 0,', "trace: line 17: not JSON"),
])
def test_errors_name_field_and_line(tmp_path, text, message):
    good = json.dumps({"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]})
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join([good] * 15 + [""] + [text]) + "\n")  # a blank line 16 still counts
    with pytest.raises(GraphsimError) as e:
        load_trace(p)
    assert str(e.value).startswith(message)
    assert e.value.field == message.split(":")[0]


def test_csv_and_parquet_errors_name_their_line_or_row(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text('timestamp,input_length,output_length,hash_ids\n0,1024,1,"[4, 5]"\n0.5,1024,2,4 7\n')
    np.testing.assert_array_equal(load_trace(p).prefix_hits(), [0, 512])  # a JSON-style list reads too
    p.write_text("timestamp,input_length,output_length,hash_ids\n0,3,1,0\n0,3,0,0\n")
    with pytest.raises(GraphsimError, match=r"^trace.output_length: line 3: must be a whole number >= 1, got 0$"):
        load_trace(p)
    pa = pytest.importorskip("pyarrow", reason="parquet needs pyarrow")
    import pyarrow.parquet as pq

    q = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"timestamp": [0, 1], "input_length": [3, 3], "output_length": [1, 1],
                             "hash_ids": [[0], [0, 1]]}), q)
    with pytest.raises(GraphsimError, match=r"^trace.hash_ids: row 2: 2 blocks for input_length 3"):
        load_trace(q)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "pyarrow", None)  # as if it were not installed: one line, no traceback of imports
        with pytest.raises(GraphsimError, match=r"^trace.format: parquet needs pyarrow: pip install '\S+\[parquet\]'$"):
            load_trace(q)
    with pytest.raises(GraphsimError, match=r"^trace.format: must be one of jsonl, csv, parquet"):
        load_trace(tmp_path / "t.txt")
    with pytest.raises(GraphsimError, match=r"^trace.time_unit: must be one of s, ms, us, got 'min'"):
        load_trace(p, time_unit="min")


@pytest.mark.parametrize("kwargs, message", [
    ({"input": {"dist": "normal", "mean": 1}}, "synthetic.input.dist: must be one of const, uniform, lognormal"),
    ({"input": {"dist": "lognormal", "mean": 1, "sd": 1}}, "synthetic.input: unknown field 'sd' for lognormal"),
    ({"output": {"dist": "uniform", "low": 9, "high": 3}}, "synthetic.output.high: must be >= low (9), got 3"),
    ({"output": {"dist": "lognormal", "mean": 0, "cv": 1}}, "synthetic.output.mean: must be > 0, got 0"),
    ({"sessions": {"think_s": 1}}, "synthetic.sessions.turns: missing"),
    ({"sessions": {"turns": 2, "tools": 1}}, "synthetic.sessions: unknown field 'tools'"),
    ({"sessions": {"turns": 2, "system_tokens": -1}}, "synthetic.sessions.system_tokens: must be a whole number >= 0"),
    ({"arrival": "uniform"}, "synthetic.arrival: must be one of poisson, gamma, got 'uniform'"),
    ({"rate": 0}, "synthetic.rate: must be a finite number > 0"),
    ({"duration_s": 5.0}, "synthetic: give exactly one of requests, duration_s"),
])
def test_synthetic_checks_every_field(kwargs, message):
    with pytest.raises(GraphsimError) as e:
        synthetic(**{"requests": 10, "rate": 1.0, **kwargs})
    assert str(e.value).startswith(message)


def test_sub_traces():
    tr = synthetic(requests=400, rate=4.0, sessions=AGENT, seed=9)
    h = tr.head(10)
    _same(h, tr._take(np.arange(10)))
    np.testing.assert_array_equal(h.blocks(9), tr.blocks(9))
    w = tr.window(20.0, 40.0)
    keep = (tr.arrival_s >= 20.0) & (tr.arrival_s < 40.0)
    np.testing.assert_allclose(w.arrival_s, tr.arrival_s[keep] - 20.0)  # rebased to the window's start
    np.testing.assert_array_equal(w.input_len, tr.input_len[keep])
    np.testing.assert_array_equal(w.blocks(len(w) - 1), tr.blocks(int(np.flatnonzero(keep)[-1])))
    np.testing.assert_array_equal(w.prefix_hits(), _reference_hits(w))  # a cold cache at the window's start
    f = tr.scale_rate(2.0)
    np.testing.assert_allclose(f.arrival_s, tr.arrival_s / 2.0)
    np.testing.assert_array_equal(f.prefix_hits(), tr.prefix_hits())
    with pytest.raises(GraphsimError, match="^trace.scale_rate: must be a finite number > 0, got 0"):
        tr.scale_rate(0)


def test_excerpt_of_the_mooncake_trace():
    tr = load_trace(EXCERPT)
    assert len(tr) == 300 and tr.block_tokens == 512
    first = json.loads(EXCERPT.read_text().splitlines()[0])
    assert (tr.input_len[0], tr.output_len[0]) == (first["input_length"], first["output_length"]) == (40160, 6)
    np.testing.assert_array_equal(tr.blocks(0), first["hash_ids"])
    np.testing.assert_array_equal(tr.prefix_hits(), _reference_hits(tr))
    assert 0 < tr.prefix_reuse() < 1


@pytest.mark.skipif(not (SHARED / "mooncake_synthetic_trace.jsonl").exists(),
                    reason=f"the shipped Mooncake trace is not here ({SHARED}); tests/data/traces has its excerpt")
def test_shipped_mooncake_trace_count_and_means():
    tr = load_trace(SHARED / "mooncake_synthetic_trace.jsonl")
    # NOTICE.md: 3,993 requests over about 17 minutes; mean prompt 15,325 tokens, mean output 149 tokens
    assert len(tr) == 3993
    assert tr.input_len.mean() == pytest.approx(15325, abs=0.5)
    assert tr.output_len.mean() == pytest.approx(149, abs=0.5)
    assert 16 * 60 < tr.arrival_s[-1] < 18 * 60
    np.testing.assert_array_equal(tr.offsets, np.concatenate([[0], np.cumsum(-(-tr.input_len // 512))]))
