"""Every cost rule of graphsim.core.rules against its closed form (the formulas its registry entry states)."""
from __future__ import annotations

import pytest

from graphsim.core.builder import GraphBuilder
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import Feature, fmt
from graphsim.core.rules import (
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
    assert coef(rec, "flops_bf16", "tokens") == per_elem * r.heads * r.k_dim * r.v_dim  # tensor-core rate
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


# ---- the generic rules the model files share -------------------------------------------------------------
def test_embedding_head_restore_and_mla_up():
    from graphsim.core.rules import RESTORE_LINKS, embedding, lm_head, mla_kv_up, restore_copy

    b = builder()
    b.token_set("cached_host", prefill="cached@host", decode="none")
    b.token_set("cached_disk", prefill="cached@disk", decode="none")
    b.weight("emb", 1000 * 64, "bf16")
    b.weight("head", 64 * 1000, "bf16")
    b.weight("wkv_b", 512 * 4096, "fp8_b128x128")
    cache = b.tensor("kv", "kv_cache", "bf16", elems_per_token=576)
    with b.stage("s"):
        embedding(b, "embed", "all", 64, "emb", streams=4, deps=())
        restore_copy(b, lambda tier: [(Feature("tokens", f"cached_{tier}"), 1152.0)])
        mla_kv_up(b, "wkv_b", "all", rank=512, up=4096, weight="wkv_b", cache=cache, latent_bytes=1152.0, out_bytes=2.0)
        lm_head(b, "all", 64, 1000, "head")
    o = ops(b)
    assert coef(o["embed"], "bytes_act", "tokens") == 64 * 2 * 2 + 4 * 64 * 2  # row read+write, 4 streams
    r = o["restore"]
    assert coef(r, "bytes_c2c") == 2 * 1152.0 and coef(r, "bytes_disk") == 1152.0  # host: C2C; disk: NVMe + C2C
    assert set(RESTORE_LINKS) == {"host", "disk"} and r.stream == "host_copy"
    up = o["wkv_b"]
    assert up.precision == "fp8" and coef(up, "flops_fp8", "kv_len") == 2 * 512 * 4096
    assert coef(up, "bytes_kv", "kv_len") == 1152.0 and coef(up, "bytes_act", "kv_len") == 2.0 * 4096
    head = o["head"]
    assert coef(head, "flops_bf16", "tokens") == 2 * 64 * 1000
    assert sum(v for _, _, v in head.comm[0].payload.terms) == 4.0 * 1000  # fp32 logits all-gathered


# ---- the DeepSeek-V4 family's rules (graphsim.core.rules_v4) ----------------------------------------------------
class _Cfg:
    """The V4.1 config fields the rules read (V41_FACTS §2, §5, §6 sizes)."""
    hidden_size, hc_mult, sliding_window, index_topk = 4096, 4, 128, 512
    num_attention_heads, num_key_value_heads, head_dim = 64, 1, 512
    index_n_heads, index_head_dim, q_lora_rank, index_k_format = 64, 128, 1024, "mxfp4"
    candidate_topk_blocks, candidate_block_size, candidate_source_layer_id = 16, 64, 3
    engram_lookup_rows, engram_max_ngram_size, engram_lookup_dim, engram_head_dim = 8, 3, 6144, 768


class _Sem:
    @staticmethod
    def swa_entry_bytes(c):
        return 584.0

    @staticmethod
    def index_k_entry_bytes(c):
        return 68.0

    @staticmethod
    def engram_lookup_bytes_per_token(c):
        return 8 * (768 + 24)


def test_v4_rules_closed_forms():
    from graphsim.core.rules_v4 import (compressor_pool, dspark_commit_caches, engram_lookup, entry_write,
                                   ep_dispatch_combine, hash_route, hierarchical_indexer, mhc_coeff,
                                   swa_sparse_attention)

    c, sem = _Cfg, _Sem
    b = builder()
    b.token_set("kv")
    d, n = c.hidden_size, c.hc_mult
    b.weight("fn", (2 + n) * n * n * d, "fp32")
    b.weight("table", 10**6, "fp8_e8m0_32", group="engram")
    b.weight("layers.0.attn.indexer.wq_b", c.q_lora_rank * 64 * 128, "fp8")
    b.weight("layers.0.attn.indexer.weights_proj", d * 64, "bf16")
    b.weight("wk", 512 * 128, "bf16")
    b.weight("tid2eid", 10**5, "int8")
    kv = b.tensor("kv", "kv_cache", "fp4_e2m1_e4m3_16", elems_per_token=512)
    idx = b.tensor("layers.0.index_k", "index_cache", "mxfp4", elems_per_token=128)
    with b.stage("s"):
        mhc_coeff(b, "hc", "all", d=d, n=n, rows=(2 + n) * n, iters=20, fn="fn", fp32_gemm="tf32")
        engram_lookup(b, "all", c=c, sem=sem, table="table", shard="tp")
        entries = compressor_pool(b, "pool", m=4, width=512, planes=2, state=1024.0)
        entry_write(b, "kv.write", "cache_write", entries, in_bytes=4.0, width=512, entry_bytes=288.0, cache=kv)
        entry_write(b, "k.write", "indexer", entries, in_bytes=4.0, width=512, entry_bytes=68.0, cache=idx,
                    weight="wk", flops_bf16=2.0 * 512 * 128)
        hierarchical_indexer(b, "all", c=c, sem=sem, layer=0, owner=0, m=4, candidate_limited=False,
                             candidate_source=False)
        swa_sparse_attention(b, "all", c=c, sem=sem, layer=0, prec="bf16", owner=0, m=4, main_entry_bytes=288.0)
        hash_route(b, "all", experts=256, top_k=6, table="tid2eid")
        dspark_commit_caches(b, "all", layers=43, swa_bytes=584.0, owners=20, state_bytes=1024.0)
    o = ops(b)
    k, rows = n * d, (2 + n) * n
    assert coef(o["hc.coeff"], "flops_tf32", "tokens") == 2 * k * rows  # fn projection, FP32 GEMM rate
    assert coef(o["hc.sinkhorn"], "flops_fp32") == 20 * 4 * n * n and coef(o["hc.sinkhorn"], "exps") == n * n + 2 * n
    assert coef(o["engram.lookup"], "bytes_weight", "tokens") == 8 * (768 + 24)
    pool = o["pool"]  # two overlapping planes of 512 channels, one exp each per position
    assert coef(pool, "exps", "tokens") == 2 * 512 and coef(pool, "bytes_act", "new_groups") == 4.0 * 512
    assert coef(pool, "bytes_act", "requests") == 2 * 1024.0
    assert coef(o["kv.write"], "bytes_kv", "new_groups") == 288.0
    assert coef(o["k.write"], "flops_bf16", "new_groups") == 2 * 512 * 128
    score = o["indexer.score"]  # ReLU scoring at the index-K format's (FP4) rate, no exps
    assert score.precision == "fp4" and coef(score, "flops_fp4", "compressed_pairs") == 2 * 64 * 128 + 3 * 64
    assert coef(score, "bytes_kv", "compressed") == 68.0 and coef(score, "exps") == 0
    att = o["attn.sparse"]
    per_pair = 2 * 64 * 2 * 512
    assert coef(att, "flops_bf16", "window_pairs") == per_pair and coef(att, "flops_bf16", "topk_pairs") == per_pair
    assert coef(att, "exps", "tokens") == 64  # each head's sink logit
    assert coef(att, "bytes_kv", "window_read") == 584.0 and coef(att, "bytes_kv", "sparse_read") == 288.0
    dispatch, combine, reduce = ep_dispatch_combine("all", d=d, top_k=6)
    assert sum(v for *_, v in dispatch.payload.terms) == 6 * d * (1 + 1 / 32)  # FP8 + a ue8m0 scale per 32
    assert sum(v for *_, v in combine.payload.terms) == 6 * d * 2
    assert coef(o["ffn.route"], "bytes_weight", "tokens") == 4.0 * 6
    assert coef(o["commit.swa"], "bytes_kv", "tokens") == 2 * 43 * 584.0
    assert coef(o["commit.compressor_state"], "bytes_kv", "requests") == 2 * 20 * 1024.0


def test_vit_attention_and_residual_closed_forms():
    from graphsim.core.rules import residual, vit_attention

    b = builder()
    h, heads = 64, 4
    b.weight("v.attn.qkv", h * 3 * h, "bf16")
    b.weight("v.attn.proj", h * h, "bf16")
    b.weight("v.norms", 2 * h, "bf16")
    with b.stage("s"):
        vit_attention(b, "all", h, heads, "bf16", prefix="v", norm="norms", qkv="qkv", out="proj", note="t")
        residual(b, "r", "all", h)
    o = ops(b)
    flops = lambda op: sum(v for c, terms in ((c, op.cost.component(c)) for c in ("flops_bf16", "flops_fp32"))  # noqa
                           for _, v in terms)
    assert flops(o["attn.qkv"]) == 2 * h * 3 * h  # 2·k·n per token
    assert flops(o["attn.core"]) == 4.0 * h  # 4h per (query, key) pair: QK and PV over all heads
    assert flops(o["attn.rope2d"]) == 4 * 2 * h  # 2-D RoPE: 4 FLOPs per element of q and k
    assert coef(o["r"], "bytes_act") == 3 * 2 * h  # two BF16 vectors read, one written
    assert o["attn.proj"].comm and [n for n in o] == ["norm1", "attn.qkv", "attn.rope2d", "attn.core", "attn.proj",
                                                      "attn.residual", "r"]
    assert [f.kind for f, _ in o["attn.core"].cost.component("flops_bf16")] == ["full_pairs"]
    # fixed tiles (Llama 4: 577 positions a tile): 4h FLOPs and one exp per head for each pair within a tile;
    # Gemma 4's extras (per-head q/k/v norms, a norm before the residual) and SigLIP's missing RoPE
    b = builder()
    for name, n in (("v.attn.qkv", 3 * h * h), ("v.attn.proj", h * h), ("v.norms", 2 * h), ("v.qk", 2 * h)):
        b.weight(name, n, "bf16")
    with b.stage("s"):
        vit_attention(b, "all", h, heads, "bf16", prefix="v", norm="norms", qkv="qkv", out="proj", note="t", block=577,
                      rope=False, qkv_norm="qk", post_norm="norms")
    o = ops(b)
    (f, v), = o["attn.core"].cost.component("flops_bf16")
    assert (f.kind, f.params, v) == ("block_pairs", (577,), 4.0 * h) and coef(o["attn.core"], "exps", "block_pairs") == heads
    assert [n for n in o] == ["norm1", "attn.qkv", "attn.qkv_norm", "attn.core", "attn.proj", "attn.post_norm",
                              "attn.residual"]
    assert coef(o["attn.qkv_norm"], "bytes_act") == 3 * h * (2 + 2)  # RMSNorm over q, k and v: 2+2 B per element


def test_every_registered_rule_is_tested_here():
    import inspect
    import sys

    src = inspect.getsource(sys.modules[__name__])
    fns = {r.fn.__name__ for r in RULES.values()}
    untested = sorted(f for f in fns if f not in src)
    assert not untested, untested
