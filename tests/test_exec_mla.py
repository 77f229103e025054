"""DeepSeek-V3 / V3.2 graphs executed op for op (graphsim.views.collect.kernels_mla) equal an independent forward
(tests/reference/mla.py: plain NumPy from the papers' equations, no graphsim code) in fp32: prefill, decode, a
mixed batch, a chunked prefill and a prefix hit; the new latent-cache rows equal the reference's; and deleting
a data edge of the graph makes the forward fail or diverge."""
from __future__ import annotations

import json

import attrs
import jax
import numpy as np
import pytest

from conftest import FULL

import graphsim as gs
from graphsim.views.collect.execute import Unsupported, lower_to_jax
from graphsim.views.collect.kernels_mla import dense, quant_e4m3, quantize_blocks
from graphsim.models.deepseek_v3 import DeepSeekV3
from reference.mla import array_api, dequant, fp8_tiles, forward

#: the whole set of execution checks compiles many ~650-op programs (minutes on 2 cores); the suite runs the core
#: equalities and the edge deletion, GRAPHSIM_FULL=1 the policy and format variants too (tests/conftest.py)
FULL_ONLY = pytest.mark.full
pytestmark = pytest.mark.heavy  # long tests: scheduled first (tests/conftest.py)

V3 = "examples/configs/tiny-v3.json"
V32 = "examples/configs/tiny-v32.json"
RTOL = ATOL = 2e-4  # fp32 both sides; what differs is summation order (absorbed vs up-projected MLA, grouped GEMM)


def _cfg(path, fp8: bool = True) -> dict:
    """The tiny config; without its quantization_config (BF16 weights) when ``fp8`` is false."""
    cfg = json.load(open(path))
    if not fp8:
        cfg.pop("quantization_config")
    return cfg


def _model(cfg):
    return DeepSeekV3(cfg, "tiny")


def ref_params(params, cfg):
    """graphsim's parameter names -> the reference's (FP8 weights as (values, block scales) pairs)."""
    def w(name):
        return (params[name], params[name + ".scale"]) if name + ".scale" in params else params[name]

    P = {"embed": params["embed"], "head": w("head"), "final_norm": params["final_norm.gamma"], "layers": []}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        L = {"attn_norm": params[p + "attn_norm.gamma"], "q_norm": params[p + "q_norm.gamma"],
             "kv_norm": params[p + "kv_norm.gamma"], "mlp_norm": params[p + "mlp_norm.gamma"],
             "wq_a": w(p + "attn.wq_a"), "wq_b": w(p + "attn.wq_b"), "wkv_a": w(p + "attn.wkv_a"),
             "wkv_b": w(p + "attn.wkv_b"), "wo": w(p + "attn.wo")}
        if i < cfg["first_k_dense_replace"]:
            L.update(w1w3=w(p + "mlp.gate_up"), w2=w(p + "mlp.down"))
        else:
            L.update(gate=params[p + "moe.router"], bias=params[p + "moe.router_bias"],
                     experts_w1w3=w(p + "moe.experts.gate_up"), experts_w2=w(p + "moe.experts.down"),
                     shared_w1w3=w(p + "moe.shared.gate_up"), shared_w2=w(p + "moe.shared.down"))
        if cfg.get("index_topk"):
            L.update(iq=w(p + "attn.indexer.wq_b"), ik=w(p + "attn.indexer.wk"),
                     iw=params[p + "attn.indexer.weights_proj"],
                     ik_norm=(params[p + "indexer.k_write.gamma"], params[p + "indexer.k_write.beta"]))
        P["layers"].append(L)
    return P


def execute(cfg, reqs, seed=0, history=None, numerics="exact"):
    """Run the compiled graph; returns (layout, params, ids, the caches before, logits, caches after)."""
    c = gs.compile_plan(_model(cfg), gs.Plan(reqs), "gb200")
    ex = lower_to_jax(c, numerics=numerics)
    params, caches, ids = ex.init(seed)
    if history is not None:
        caches = history(caches)
    before = jax.tree.map(np.array, caches)  # copies: the forward donates (and may reuse) the cache buffers
    logits, after = ex.fn(params, caches, ids)
    return ex.layout, params, np.asarray(ids), before, np.asarray(logits), jax.tree.map(np.asarray, after)


def reference(cfg, layout, params, ids, before, numerics="exact"):
    """The reference per request of every group: (last-position logits rows in the executor's order, new
    latent rows per (group, request))."""
    P = ref_params(params, cfg)
    n_layers = cfg["num_hidden_layers"]
    rows, latents = [], {}
    for gi, (g, off) in enumerate(zip(layout.groups, layout.offsets())):
        for r in range(g.count):
            tok = ids[off + r * g.new: off + (r + 1) * g.new]
            past = [before[f"layers.{i}.kv"][gi][r, :g.past] for i in range(n_layers)]
            keys = None
            if cfg.get("index_topk"):
                keys = [tuple(a[r, :g.past] for a in before[f"layers.{i}.index_k"][gi]) for i in range(n_layers)]
            # exact numerics in NumPy (nothing to compile); emulated FP8 on XLA, the executor's backend (see
            # test_emulated_fp8_equals_the_reference)
            with array_api(jax.numpy if numerics == "emulate" else np):
                logits, new, _ = forward(P, cfg, tok, past, absorb=g.kind == "decode", past_keys=keys,
                                         cache_dtype=np.float32 if numerics == "exact" else jax.numpy.bfloat16,
                                         q8=numerics == "emulate")
            rows.append(np.asarray(logits)[-1:] if g.kind == "prefill" else np.asarray(logits))
            latents[gi, r] = new
    return np.concatenate(rows), latents


def _check(cfg, reqs, seed=0, numerics="exact"):
    layout, params, ids, before, got, after = execute(cfg, reqs, seed, numerics=numerics)
    want, latents = reference(cfg, layout, params, ids, before, numerics)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())
    for (gi, r), new in latents.items():  # the latent rows the forward wrote = the reference's
        g = layout.groups[gi]
        for i, row in enumerate(new):
            np.testing.assert_allclose(after[f"layers.{i}.kv"][gi][r, g.past:g.past + g.new].astype(np.float32),
                                       np.asarray(row, np.float32), rtol=RTOL, atol=ATOL)
    return got


@pytest.mark.parametrize("model", [V3, V32])
@pytest.mark.parametrize("reqs", [pytest.param(["prefill:40x2"], marks=FULL_ONLY),
                                  pytest.param(["decode:100", "decode:90x2"], marks=FULL_ONLY),
                                  ["prefill:104x2@80:hbm", "decode:96x2"]],
                         ids=["prefill", "decode", "mixed-prefix-hit"])
def test_executed_graph_equals_the_reference(model, reqs):
    # the suite runs the mixed batch (a prefill with a prefix hit beside decodes: both paths, the restore and
    # DSA's selection in one program); GRAPHSIM_FULL=1 also the pure prefill and pure decode batches
    """In exact numerics (activations and caches in fp32; the FP8 weights hold their rounded values), with
    V3.2's Top-K selecting 64 of up to 104 positions."""
    _check(_cfg(model), reqs)


@FULL_ONLY
@pytest.mark.parametrize("model", [V3, V32])
def test_bf16_checkpoints_execute_too(model):
    """Without a quantization_config the weights are BF16 and no GEMM quantizes its input."""
    cfg = _cfg(model, fp8=False)
    _check(cfg, ["prefill:72@64:hbm", "decode:100"])
    params = execute(cfg, ["decode:8"])[1]
    assert not any(k.endswith(".scale") for k in params)


@pytest.mark.parametrize("model, reqs", [pytest.param(V3, ["prefill:16x2"], marks=FULL_ONLY),
                                         pytest.param(V3, ["decode:100x3"], marks=FULL_ONLY),
                                         (V32, ["decode:100x2"])])
def test_emulated_fp8_equals_the_reference(model, reqs):
    """The timed numerics (FP8 activations per 1x128, FP8 index Q/K, BF16 latent cache) against the reference
    doing the same roundings. Such a check is sensitive by nature: a last-bit difference upstream (XLA's fused
    order vs the reference's) can flip one FP8 rounding, hence a router or DSA Top-K choice, and move a logit
    by ~1e-2 (a mixed prefill + decode batch here does). So the reference runs on XLA here too (in NumPy, a
    different BLAS summation order flips a rounding at prefill:16x2); these shapes have no flip on XLA's CPU
    backend; if one fails after an XLA upgrade while the exact-numerics tests pass, suspect a flip before a
    kernel. The suite runs a V3.2 decode (MLA + DSA); GRAPHSIM_FULL=1 a V3 prefill and decode too."""
    _check(_cfg(model), reqs, numerics="emulate")


def test_dsa_selects_fewer_positions_than_it_sees():
    """V3.2 at 100 positions of context (Top-K 64) differs from dense V3 with the same weights (and equals its
    own reference above): the selection is not a no-op."""
    a = execute(_cfg(V3), ["decode:100x2"])[4]
    b = execute(_cfg(V32), ["decode:100x2"])[4]
    assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()
    c = execute(_cfg(V3), ["decode:60x2"])[4]  # 60 visible < 64: V3.2 selects everything, = V3
    d = execute(_cfg(V32), ["decode:60x2"])[4]
    np.testing.assert_allclose(c, d, rtol=RTOL, atol=ATOL * np.abs(c).max())


@FULL_ONLY
@pytest.mark.parametrize("model", [V3, V32])
def test_chunked_prefill_equals_one_pass(model):
    """A 96-token prompt run as two chunks of 48 (the second reading the first's caches) gives the logits the
    reference gets in one pass."""
    cfg = _cfg(model)
    _, params, ids1, _, _, after1 = execute(cfg, ["prefill:48"])

    def history(caches):
        out = {}
        for name, per in caches.items():
            first = after1[name][0]
            if isinstance(per[0], tuple):  # index keys: (values, scales)
                out[name] = ((per[0][0].at[:, :48].set(first[0]), per[0][1].at[:, :48].set(first[1])),)
            else:
                out[name] = (per[0].at[:, :48].set(first),)
        return out

    layout, params2, ids2, _, got, _ = execute(cfg, ["prefill:96@48:hbm"], history=history)
    n = cfg["num_hidden_layers"]
    empty = [np.zeros((0, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]), np.float32)] * n
    keys = [(np.zeros((0, cfg["index_head_dim"]), np.float32), np.zeros((0,), np.float32))] * n \
        if cfg.get("index_topk") else None
    want, _, _ = forward(ref_params(params2, cfg), cfg, np.concatenate([ids1, ids2]), empty, absorb=False,
                         past_keys=keys, cache_dtype=np.float32, q8=False)
    want = np.asarray(want)[-1:]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.abs(want).max())


def test_fp8_emulation_matches_the_formats_closed_form():
    """Block scales are amax/448 per 128x128 block; values round-trip within e4m3's half-ulp; the executor's
    and the reference's activation rounding agree bit for bit."""
    w = jax.random.normal(jax.random.PRNGKey(0), (200, 300)) * 3.0
    q, s = quantize_blocks(w)
    assert s.shape == (2, 3)
    np.testing.assert_allclose(s[1, 2], np.abs(np.asarray(w)[128:, 256:]).max() / 448.0, rtol=1e-6)
    d = np.asarray(dense({"w": q, "w.scale": s}, "w"))
    np.testing.assert_array_equal(d, np.asarray(dequant((q, s))))
    # half an ulp: 2^-4 relative for normals, 2^-10 x scale below e4m3's smallest normal (2^-6 x scale)
    assert np.all(np.abs(d - np.asarray(w)) <= np.abs(np.asarray(w)) * 2.0 ** -4 + 2.0 ** -10 * np.asarray(s).max())
    x = jax.random.normal(jax.random.PRNGKey(1), (7, 200))
    with array_api(jax.numpy):
        np.testing.assert_array_equal(np.asarray(quant_e4m3(x)), np.asarray(fp8_tiles(x)))
    assert not np.array_equal(np.asarray(quant_e4m3(x)), np.asarray(x))


def _without(c, edge):
    g = attrs.evolve(c.graph, edges=tuple(e for e in c.graph.edges if e is not edge))
    return attrs.evolve(c, graph=g)


def test_deleting_a_data_edge_fails_or_diverges():
    c = gs.compile_plan(V32, gs.Plan(["prefill:40@16:hbm", "decode:80x2"]), "gb200")
    ex = lower_to_jax(c)
    params, caches, ids = ex.init(0)
    base = np.asarray(ex.fn(params, jax.tree.map(lambda a: a.copy(), caches), ids)[0])
    data = [e for e in c.graph.edges if e.kind == "data"]
    indeg = {}
    for e in data:
        indeg[e.dst] = indeg.get(e.dst, 0) + 1
    joins = [e for e in data if indeg[e.dst] > 1]  # deleting one drops a branch from a sum
    rng = np.random.default_rng(28)
    # a sample of the joins and of the single-input edges (GRAPHSIM_FULL=1: every join, more single edges)
    chain = [data[i] for i in rng.choice(len(data), 6 if FULL else 3, replace=False) if indeg[data[i].dst] == 1]
    if not FULL:
        joins = [joins[i] for i in sorted(rng.choice(len(joins), min(2, len(joins)), replace=False))]
    assert joins and chain
    for e in joins + chain:
        try:
            ex2 = lower_to_jax(_without(c, e))
            out = np.asarray(ex2.fn(params, jax.tree.map(lambda a: a.copy(), caches), ids)[0])
        except (Unsupported, KeyError) as err:
            assert str(err)
            continue
        assert np.abs(out - base).max() > 1e-3 * np.abs(base).max(), f"deleting {e.src} -> {e.dst} changed nothing"


@pytest.mark.parametrize("model", [pytest.param(V3, marks=FULL_ONLY), V32])  # V3.2: V3's ops and DSA's
def test_collect_forward_runs_every_mix(model, tmp_path):
    """`graphsim collect forward` on the tiny models: every mix (decode, prefill, mixed with a prefix hit) is an
    ok sample, none unsupported; an FP8 latent cache is an unsupported row, not a crash."""
    from graphsim import Policies
    from graphsim.views.collect.forward import collect_forward, parse_grid

    # the suite: one mix holding every kind (a prefill with a prefix hit beside a decode); FULL: pure ones too
    mixes = parse_grid("decode:96x1,2;prefill:80x1@16+decode:70x1" if FULL else "prefill:80x1@16+decode:70x1")
    df = collect_forward(model, mixes, "gb200", tmp_path / "s.parquet", warmup=0, reps=1)
    assert list(df["status"]) == ["ok"] * len(mixes), df["error"].tolist()
    df = collect_forward(model, [["decode:64x1"]], "gb200", tmp_path / "f.parquet", warmup=0, reps=1,
                         policies=Policies(attention_precision="fp8"))
    assert list(df["status"]) == ["unsupported"] and "fp8" in df["error"][0]
