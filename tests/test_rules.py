"""Every cost rule of graphsim.rules against its closed form (the formulas its registry entry states)."""
from __future__ import annotations

import pytest

from graphsim.builder import GraphBuilder
from graphsim.errors import GraphsimError
from graphsim.ir import Feature, fmt
from graphsim.rules import (
    RULES,
    AttentionShape,
    MoEShape,
    RecurrentShape,
    dsa_indexer,
    gqa_attention,
    linear,
    mlp,
    moe,
    recurrent_mixer,
)


def builder():
    b = GraphBuilder("t")
    b.token_set("all")
    return b


def ops(b):
    return {o.name: o for o in b.build().ops}


def coef(op, component, kind=None):
    return sum(v for f, v in op.cost.component(component) if kind is None or f.kind == kind)


def test_every_rule_is_registered_with_a_formula():
    assert {"linear", "rmsnorm", "mlp", "gqa_attention", "recurrent_mixer", "moe", "dsa_indexer"} <= set(RULES)
    assert all(r.formula for r in RULES.values())


@pytest.mark.parametrize("wf,prec,act", [("bf16", "bf16", 2.0), ("fp8", "fp8", 1.0), ("nvfp4", "fp4", 0.5625),
                                         ("mxfp4", "fp8", 1.0), ("w4a16_g128", "bf16", 2.0)])
def test_linear_rate_follows_the_weight_format(wf, prec, act):
    b = builder()
    b.weight("w", 512 * 256, wf)
    with b.stage("s"):
        linear(b, "x", "all", 512, 256, "w")
    op = ops(b)["x"]
    assert op.precision == prec
    assert coef(op, f"flops_{prec}", "tokens") == 2 * 512 * 256  # 2kn per token
    assert coef(op, "bytes_weight", "active") == fmt(wf).nbytes(512 * 256)
    assert coef(op, "bytes_act", "tokens") == act * 512 + 2.0 * 256


@pytest.mark.parametrize("shape,pairs,read", [
    (AttentionShape(8, 2, 64), "causal_pairs", "kv_len"),
    (AttentionShape(8, 2, 64, window=128, sinks=True), "window_pairs", "window_read"),
    (AttentionShape(8, 2, 64, chunk=8192, qk_norm=True), "chunk_pairs", "chunk_read"),
])
def test_gqa_attention_closed_form(shape, pairs, read):
    b = builder()
    h, q, kv = 1024, 8 * 64, 2 * 64
    b.weight("wqkv", h * (q + 2 * kv), "bf16")
    b.weight("wo", q * h, "bf16")
    cache = b.tensor("kv", "kv_cache", "fp8", elems_per_token=2 * kv)
    with b.stage("s"):
        gqa_attention(b, "", "all", h, shape, weights=("wqkv", "wo"), cache=cache, kv_format="fp8",
                      precision="bf16", act_bytes=2.0)
    o = ops(b)
    core = o["attn"]
    assert coef(core, "flops_bf16", pairs) == 2 * 8 * (64 + 64)  # QK^T and PV per pair, all heads
    assert coef(core, "exps", pairs) == 8  # one exponential per score
    assert coef(core, "exps", "tokens") == (8 if shape.sinks else 0)  # a sink logit per query and head
    assert coef(core, "bytes_kv", read) == 2 * kv * 1.0  # K and V of the KV heads, FP8
    assert coef(o["wqkv"], "flops_bf16", "tokens") == 2 * h * (q + 2 * kv)
    assert ("qk_norm" in o) == shape.qk_norm
    assert {f.params for f in core.cost.features() if f.kind == pairs} == ({()} if pairs == "causal_pairs" else
                                                                          {(shape.window or shape.chunk,)})


def test_out_gate_doubles_the_query_projection():
    b = builder()
    a = AttentionShape(4, 4, 32, out_gate=True)
    b.weight("wqkv", 256 * (2 * 128 + 256), "bf16")
    b.weight("wo", 128 * 256, "bf16")
    cache = b.tensor("kv", "kv_cache", "bf16", elems_per_token=256)
    with b.stage("s"):
        gqa_attention(b, "", "all", 256, a, weights=("wqkv", "wo"), cache=cache, kv_format="bf16",
                      precision="bf16", act_bytes=2.0)
    o = ops(b)
    assert coef(o["wqkv"], "flops_bf16", "tokens") == 2 * 256 * (2 * 128 + 256)
    assert coef(o["out_gate"], "exps", "tokens") == 128  # sigmoid gate per output element


@pytest.mark.parametrize("r,per_elem", [(RecurrentShape("gated_delta_net", 48, 16, 128, 128, 4), 7.0),
                                        (RecurrentShape("mamba2", 64, 8, 128, 64, 4), 5.0)])
def test_recurrent_mixer_state_per_request(r, per_elem):
    b = builder()
    h = 2048
    b.weight("in", h * r.in_proj, "bf16")
    b.weight("out", r.inner * h, "bf16")
    state = b.tensor("state", "state", "fp32")
    with b.stage("s"):
        recurrent_mixer(b, "", "all", h, r, weights=("in", "out"), state=state)
    rec = ops(b)["recurrence"]
    assert coef(rec, "flops_fp32", "tokens") == per_elem * r.heads * r.k_dim * r.v_dim
    sb = r.heads * r.k_dim * r.v_dim * 4.0 + (r.conv - 1) * r.conv_dim * 2.0
    assert r.state_bytes() == sb
    assert coef(rec, "bytes_kv", "requests") == 2 * sb  # read + write once per request per forward
    if r.kind == "gated_delta_net":  # q, k (key heads) and v (value heads) through the conv
        assert r.conv_dim == 2 * 16 * 128 + 48 * 128
        assert r.in_proj == r.conv_dim + 48 * 128 + 2 * 48  # + z gate, a and b per value head
    else:  # x, B, C through the conv; in_proj adds z and dt
        assert r.conv_dim == 64 * 64 + 2 * 8 * 128
        assert r.in_proj == 2 * 64 * 64 + 2 * 8 * 128 + 64


@pytest.mark.parametrize("latent,act,mats", [(0, "silu", 3), (1024, "relu2", 2)])
def test_moe_closed_form(latent, act, mats):
    b = builder()
    h, e, k, i = 4096, 64, 6, 512
    w = latent or h
    s = MoEShape(e, k, i, 2 * i, act, redundant=16, latent=latent)
    b.weight("router", h * e, "bf16")
    b.weight("experts", s.slots * mats * w * i, "fp8")
    b.weight("sh_up", (mats - 1) * h * 2 * i, "fp8")
    b.weight("sh_down", 2 * i * h, "fp8")
    lat = None
    if latent:
        b.weight("ld", h * w, "bf16")
        b.weight("lu", w * h, "bf16")
        lat = ("ld", "lu")
    with b.stage("s"):
        moe(b, "", "all", h, s, experts="experts", router="router", shared=("sh_up", "sh_down"), latent=lat)
    o = ops(b)
    ex = o["moe.experts"]
    assert coef(ex, "flops_fp8", "tokens") == 2 * mats * w * i * k
    # weights of the distinct experts touched, each slot's bytes (redundant copies hold memory only)
    assert coef(ex, "bytes_weight", "experts_touched") == fmt("fp8").nbytes(mats * w * i)
    assert {f.params for f in ex.cost.features() if f.kind == "experts_touched"} == {(e, k)}
    dispatch = next(c for c in ex.comm if "dispatch" in c.note)
    assert sum(v for _, _, v in dispatch.payload.terms) == k * w * 1.0  # FP8 (w-wide) per (token, expert)
    assert coef(ex, "exps", "tokens") == (k * i if act == "silu" else 0)
    assert ("moe.latent_down" in o) == bool(latent)
    assert coef(o["router"], "flops_bf16", "tokens") == 2 * h * e


def test_mlp_gated_and_relu2():
    for act, mats in (("silu", 3), ("relu2", 2)):
        b = builder()
        b.weight("up", (mats - 1) * 256 * 1024, "bf16")
        b.weight("down", 1024 * 256, "bf16")
        with b.stage("s"):
            mlp(b, "", "all", 256, 1024, weights=("up", "down"), act=act)
        o = ops(b)
        total = sum(coef(op, "flops_bf16", "tokens") for n, op in o.items() if n in ("gate_up", "up", "down"))
        assert total == 2 * mats * 256 * 1024
    with pytest.raises(GraphsimError, match="config.hidden_act: unknown activation 'tanhh'"):
        mlp(builder(), "", "all", 8, 8, weights=("a", "b"), act="tanhh")


def test_dsa_indexer_closed_form():
    b = builder()
    h, ql, H, D = 7168, 1536, 64, 128
    b.weight("wq", ql * H * D, "fp8_b128x128")
    b.weight("wk", h * D, "fp8_b128x128")
    b.weight("wp", h * H, "bf16")
    keys = b.tensor("keys", "index_cache", "fp8_s128", elems_per_token=D)
    with b.stage("s"):
        dsa_indexer(b, "l.", "all", hidden=h, q_in=ql, heads=H, dim=D, topk=2048, wq="wq", wk="wk", wproj="wp",
                    key_format="fp8_s128", key_cache=keys)
    o = ops(b)
    score = o["indexer.score"]
    assert coef(score, "flops_fp8", "causal_pairs") == 2 * H * D + 3 * H  # q·k per head, ReLU, weight, sum
    assert coef(score, "exps") == 0  # ReLU scores: no exponentials
    assert coef(score, "bytes_kv", "kv_len") == 128 + 4  # FP8 key + fp32 scale, read once per request
    assert {f.params for f in o["indexer.topk"].cost.features() if f.kind == "topk_pairs"} == {(1, 2048)}
    assert Feature("topk_pairs", "all", (1, 2048)) in o["indexer.topk"].cost.features()
