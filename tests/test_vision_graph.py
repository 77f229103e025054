"""The vision path: request strings -> image tokens and patches, the `vision` stage, and how image tokens
cross the trunk (all layers, never Engram, never per decode step)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENT_INDEX, Feature
from graphsim.lowering.features import feature_matrix
from graphsim.core.plan import Request
from graphsim.core.vision import parse_image_suffix

MODEL = gs.load_model("deepseek-v4.1-flash")
V = MODEL.cfg.vision

# (size, image tokens, ViT patches): see tests/test_vision_rules.py for the processor arithmetic
SIZES = [("224x224", 169, 1521), ("544x544", 169, 1521), ("1024x768", 475, 4070), ("4096x4096", 1024, 9216)]


def compile_(requests, policies=gs.Policies(), mapping=gs.ParallelMapping()):
    return gs.compile_plan(MODEL, gs.Plan(requests, mapping, policies), "gb200")


def feature(compiled, kind, ts, params=()):
    g, wl = compiled.graph, compiled.plan.workload()
    return float(feature_matrix([Feature(kind, ts, params)], g.token_set_map, wl.kinds, wl.arrays(), np)[0, 0])


def stage_busy(compiled, stage):
    return compiled.report().stages.get(stage, {"busy_s": 0.0})["busy_s"]


# ---- request strings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("size,tokens,patches", SIZES)
def test_image_tokens_through_the_plan(size, tokens, patches):
    r = Request.parse(f"prefill:2000+img:{size}")
    assert (r.image_tokens, r.image_patches) == (tokens, patches)
    assert r.length == r.new_tokens == 2000 + tokens  # LEN counts text; image tokens come on top
    wl = gs.Plan([r]).workload()
    assert (wl.new[0, 0], wl.image[0, 0], wl.patches[0, 0]) == (2000 + tokens, tokens, patches)
    assert Request.parse(str(r)) == r  # str() writes the explicit tok/patches form


def test_several_images_and_counts():
    r = Request.parse("prefill:100x3@40+img:1024x768+img:224x224")
    assert (r.count, r.cached, r.image_tokens, r.image_patches) == (3, 40, 475 + 169, 4070 + 1521)
    assert r.length == 100 + 644 and r.new_tokens == 100 + 644 - 40
    assert parse_image_suffix("+img:7tok/50patches", "x") == {"image_tokens": 7, "image_patches": 50}


@pytest.mark.parametrize("spec,field", [
    ("prefill:100+img:10", "request.image"),
    ("prefill:100+img:0x10", "request.image"),
    ("prefill:100+vid:10x10", "request.image"),
    ("decode:4096+img:1024x768", "request.image"),
])
def test_bad_image_requests(spec, field):
    with pytest.raises(GraphsimError) as e:
        Request.parse(spec)
    assert e.value.field == field


def test_image_tokens_and_patches_come_together():
    with pytest.raises(GraphsimError) as e:
        Request("prefill", 100, image_patches=1800)  # patches always make image tokens
    assert e.value.field == "request.image_patches"
    assert Request("prefill", 100, cached=50, image_tokens=10).image_patches == 0  # encoded by an earlier chunk
    with pytest.raises(GraphsimError) as e:
        Request("prefill", 100, image_tokens=200, image_patches=1800)
    assert e.value.field == "request.image_tokens"  # image tokens are part of the prompt's positions


def test_cli_estimate_with_an_image(capsys):
    rc = main(["estimate", "--model", "deepseek-v4.1-flash", "--request", "prefill:2000+img:1024x768", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["tokens"]["prefill_tokens"] == 2475
    assert {s["stage"]: s["busy_s"] for s in d["stages"]}["vision"] > 0
    assert d["identity"]["requests"] == ["prefill:2000+img:475tok/4070patches"]


# ---- the vision stage -----------------------------------------------------------------------------------


def test_prefill_with_image_costs_vision_plus_trunk():
    c = compile_(["prefill:2000+img:1024x768"])
    assert c.graph.stages[0] == "vision"
    assert stage_busy(c, "vision") > 0 and stage_busy(c, "encoder") > 0 and stage_busy(c, "decoder") > 0
    # image tokens cross every trunk layer; the tower and aligner see patches and image tokens
    assert feature(c, "tokens", "q_enc") == feature(c, "tokens", "q_dec") == 2475
    assert feature(c, "tokens", "vis_patches") == 4070 and feature(c, "tokens", "vis_image") == 475
    # the trunk's embedding waits for the aligner
    s = c.schedule()
    g = c.graph
    vis_end = max(s.finish[0, i] for i, o in enumerate(g.ops) if o.stage == "vision")
    assert s.start[0, g.op_index["embed"]] >= vis_end
    assert s.forward[0] == pytest.approx(c.report().forward_s)
    text = compile_(["prefill:2000"])
    assert "vision" not in text.graph.stages and c.report().forward_s > text.report().forward_s + stage_busy(c, "vision") * 0.9


def test_engram_excludes_image_tokens():
    c = compile_(["prefill:2000+img:1024x768", "prefill:300"])
    for q in ("q_enc", "q_dkv", "q_dec"):
        assert feature(c, "tokens", q) == 2475 + 300
        assert feature(c, "tokens", f"eng_{q}") == 2000 + 300
    lookups = [o for o in c.graph.ops if o.name.endswith("engram.lookup")]
    assert len(lookups) == len(MODEL.cfg.engram_layer_ids)
    assert {o.token_set for o in lookups} <= {"eng_q_enc", "eng_q_dkv", "eng_q_dec"}


def test_decode_after_an_image_costs_no_vision():
    dec = compile_(["decode:2475x8"])
    assert "vision" not in dec.graph.stages and not any(o.name.startswith("vision.") for o in dec.graph.ops)
    # in a mixed batch, decode groups add nothing to the vision stage
    alone = compile_(["prefill:2000+img:1024x768"])
    mixed = compile_(["prefill:2000+img:1024x768", "decode:2475x64"])
    assert stage_busy(mixed, "vision") == pytest.approx(stage_busy(alone, "vision"), rel=1e-12)
    assert feature(mixed, "tokens", "vis_patches") == 4070


def test_vision_flops_closed_form():
    """Tensor-core FLOPs of the tower at tp=1: patch embed, 32 x (qkv, attention over n² pairs, wo, SwiGLU),
    aligner — all bf16 (the ViT's weights are bf16); norms, RoPE and activations are fp32 elementwise."""
    c = compile_(["prefill:500+img:1024x768"])
    s = c.schedule()
    k = COMPONENT_INDEX["flops_bf16"]
    vis = [i for i, o in enumerate(c.graph.ops) if o.stage == "vision"]
    got = s.components[0, vis, k].sum()
    h, f, n, t, d = V.hidden_size, V.intermediate_size, 4070, 475, MODEL.cfg.hidden_size
    per_block = 2 * n * (3 * h * h + h * h + 3 * h * f) + 4 * h * n * n
    want = 2 * n * V.patch_dim * h + V.num_hidden_layers * per_block + 2 * t * (9 * h * d + d * d)
    assert got == pytest.approx(want, rel=1e-12)
    # every vision GEMM weight is read once per forward, whatever the patch count: the whole vision
    # inventory but its (2 per block + final) bf16 RMSNorm weights, which ride with their norms
    w = COMPONENT_INDEX["bytes_weight"]
    norms = (2 * V.num_hidden_layers + 1) * h * 2.0
    assert s.components[0, vis, w].sum() == pytest.approx(c.graph.weight_bytes("vision") - norms, rel=1e-12)
