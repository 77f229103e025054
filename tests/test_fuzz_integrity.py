"""The issue-26 fuzz families in the suite at a small budget (GRAPHSIM_FUZZ_EXAMPLES scales it; the isolated
campaign is tests/fuzz/campaign.py): FPM model files, FPM samples, measured tables, collect ops, plot and search
(argv, length files, seeded cache entries) end in a sane result or one line naming a field — never a traceback,
a write outside the output, a forward below its SOL, a table row that fits with a non-finite time or a cache
entry written without its checksum."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from fuzz import strategies as S
from fuzz import targets as T

EXAMPLES = max(2, int(os.environ.get("GRAPHSIM_FUZZ_EXAMPLES", "8")) // 3)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
GOOD = ("ok", "error")


@FUZZ
@given(S.fpm_model_text())
def test_fuzz_fpm_model(text):
    outcome, detail = T.run_fpm_model(text)
    assert outcome in GOOD, (text[:300], detail)


@FUZZ
@given(S.fpm_samples_case())
def test_fuzz_fpm_samples(case):
    outcome, detail = T.run_fpm_samples(case)
    assert outcome in GOOD, (case, detail)


@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(S.measured_case())
def test_fuzz_measured(case):
    outcome, detail = T.run_measured(case)
    assert outcome in GOOD, (case, detail)


@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(S.collect_case())
def test_fuzz_collect(case):
    outcome, detail = T.run_collect(case)
    assert outcome in GOOD, (case, detail)


@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(S.plot_case())
def test_fuzz_plot(case):
    outcome, detail = T.run_plot(case)
    assert outcome in GOOD, (case, detail)


@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))
@given(S.search_case())
def test_fuzz_search(case):
    outcome, detail = T.run_search(case)
    assert outcome in GOOD, (case, detail)
