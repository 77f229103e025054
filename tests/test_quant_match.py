"""Quantization exclusions compiled once (issue 29: GLM-5-FP8's 712 patterns made `graphsim memory` take 19 s): the
compiled matcher answers exactly what matching each pattern in turn answers, on every exclusion pattern of the
bundled public configs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphsim.core.errors import GraphsimError
from graphsim.core.quant import _match, _matcher

HF = Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "hf"


def _patterns() -> list[str]:
    pats = set()
    for f in HF.glob("*config.json"):
        d = json.loads(f.read_text())
        q = d.get("quantization_config") or d.get("quantization") or {}
        for k in ("ignore", "modules_to_not_convert", "exclude_modules", "ignored_layers"):
            v = q.get(k) if isinstance(q, dict) else None
            if isinstance(v, list):
                pats.update(x for x in v if isinstance(x, str))
    return sorted(pats)


NAMES = [f"{p}layers.{i}.{m}" for p in ("", "model.", "model.language_model.", "language_model.model.")
         for i in (0, 3, 61, 92) for m in ("self_attn.q_proj", "self_attn.q_a_proj", "mlp.experts.0.up_proj",
                                           "mlp.gate", "self_attn.kv_a_proj_with_mqa", "mlp.shared_experts.down_proj",
                                           "self_attn.indexer.wk", "mlp.down_proj")] + ["lm_head", "model.embed_tokens"]


def test_the_compiled_matcher_is_the_pattern_by_pattern_rule():
    pats = _patterns()
    assert len(pats) > 1000  # the bundled configs' exclusions (GLM-5-FP8 alone lists hundreds)
    every = _matcher(tuple(pats))
    some = pats[::7]  # one pattern in seven one by one (the slow reference is the cost); all of them together
    for n in NAMES:
        assert every(n) == any(_match(n, p) for p in pats), n
        for p in some:
            assert _matcher((p,))(n) == _match(n, p), (n, p)


@pytest.mark.parametrize("pat,name,hit", [("layers.3.mlp", "layers.3.mlp.gate", True), ("layers.3.mlp", "layers.3.mlpx", False),
                                          ("layers.3.mlp.", "layers.3.mlp.gate", True), ("*.gate", "layers.1.mlp.gate", True),
                                          ("re:.*q_a.*", "layers.0.self_attn.q_a_proj", True), ("lm_head", "lm_head", True)])
def test_closed_cases(pat, name, hit):
    assert _matcher((pat,))(name) is hit and _match(name, pat) is hit


def test_a_broken_regular_expression_names_its_field():
    with pytest.raises(GraphsimError, match="quantization_config.ignore"):
        _matcher(("re:(",))
