"""examples/validate_serving.py on the shipped fixture: the harness runs every published setup, labels where each
prediction comes from, and holds the invariants (SOL above every measurement, a prediction never above its SOL)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import validate_serving as vs  # noqa: E402

FIX = str(ROOT / "tests" / "data" / "measured")  # GB200 + H200 TRT-LLM tables (NOTICE.md)


def test_every_published_setup_with_its_bound_and_labelled_prediction():
    rows = vs.validate(measured=FIX)
    assert [r.case for r in rows] == list(vs.SERVING)
    for r in rows:
        assert r.sol >= r.measured  # SOL is a bound on every published run
        assert 0 < r.predicted <= r.sol * (1 + 1e-9)  # a prediction never beats its bound
    by = {r.case.case.hw: r.source for r in rows}
    assert by["h200"] == "hybrid view (trtllm@1.3.0rc20 tables)"  # the fixture holds H200 TRT-LLM tables
    assert by["h800"] == by["h100"] == "practitioner profile"  # none for these: the profile, said so
    text = vs.table(rows)
    assert text.count("\n") == len(rows) + 1 and "measured / prediction" in text


def test_aiconfigurator_output_is_read_per_mode(tmp_path):
    """The CLI's printed summary (aiconfigurator 0.12) -> tokens/s in the case's unit; a refusal is a note."""
    fake = tmp_path / "aic"
    fake.write_text("#!/bin/sh\necho '  TTFT:             4077.099 ms'\necho '  TPOT:     69.857 ms'\n"
                    "echo '  tokens/s/gpu:     1,824.52'\n")
    fake.chmod(0o755)
    pre = next(sc for sc in vs.SERVING if sc.aic and sc.aic[2] == "static_ctx" and sc.aic[3]["isl"] == 1024)
    got, note = vs.aiconfigurator_estimate(pre, str(fake))
    assert note == "" and abs(got - 16 * 1024 / 4.077099 * 8) < 1e-6  # 16 prompts x 1,024 per GPU, per node
    agg = next(sc for sc in vs.SERVING if sc.aic and sc.aic[2] == "agg")
    assert vs.aiconfigurator_estimate(agg, str(fake)) == (1824.52, "")
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho 'Error: Cross-node EP requires DeepEP A2A data, but no data' >&2\n")
    bad.chmod(0o755)
    got, note = vs.aiconfigurator_estimate(agg, str(bad))
    assert got is None and note.startswith("Cross-node EP requires DeepEP A2A data")
