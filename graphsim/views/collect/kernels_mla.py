"""Executor kernels of the DeepSeek-V3 family (DeepSeek-V3/R1, V3.2 with DeepSeek Sparse Attention): the op
kinds of :mod:`graphsim.models.deepseek_v3`'s graph, registered with :func:`graphsim.views.collect.execute.kernel`
for ``family="deepseek_v3"`` so they bind before the generic (Llama / Qwen) kernels.

The graph's data edges are a chain in program order (``wq_b -> wkv_a -> kv_norm -> ...``), so the value that
flows along an edge is a :class:`Flow`: the op's output ``x`` and a ``carry`` of the layer's live values (the
residual stream, the normalised input, Q, the up-projected K/V, the Top-K selection). An op reads only what
its incoming edges bring, so deleting an edge fails the forward (no input) or drops a branch from a sum.

What each op computes (everything in fp32; the rounding the model has is emulated where it happens):

* ``gemm`` / ``indexer`` GEMMs on FP8 block-quantized weights (``fp8_b128x128``: e4m3 values, one fp32 scale per
  128x128 block) quantize their input per token and 128 columns to e4m3 (DeepSeek-V3's dynamic activation
  scheme), then multiply the dequantized operands; BF16 weights multiply as they are.
* ``norm``: RMSNorm; at the model width it first adds the branch outputs to the carried residual. ``kv_norm``
  normalises the compressed KV and applies RoPE to the shared key part (``q_norm`` the query latent).
* RoPE: interleaved pairs (DeepSeek's ``apply_rotary_emb``), at each row's absolute position (past + i), on
  Q's rope part (in ``wq_b``), the latent's rope key (``kv_norm``) and the indexer's Q/K rope parts.
* ``cache_write``: the latent row [c_kv | k_pe] into the layer's cache (the cache's storage dtype).
* MLA prefill: ``wkv_b`` up-projects every visible latent to per-head K_nope and V; ``attention`` (mla_mha)
  is causal softmax attention with the shared RoPE key, scale 1/sqrt(nope + rope).
* MLA decode (absorbed): ``q_absorb`` folds W_UK into Q (per head, nope -> kv_lora); ``attention`` (mla) over
  the latent cache; ``o_absorb`` applies W_UV (per head, kv_lora -> v).
* ``router`` (V3 ``noaux_tc``): sigmoid scores, + the score-correction bias for the choice only, the best
  ``topk_group`` groups by the sum of their two best biased scores, top-k experts in them; weights are the
  unbiased scores, normalised, times ``routed_scaling_factor``. ``moe_experts``: a grouped GEMM
  (``jax.lax.ragged_dot`` over slots sorted by expert), SiLU-gated, combined per token.
* DSA (V3.2): ``indexer`` index Q (from the query latent) and K (LayerNorm of ``wk``), RoPE on their first
  ``qk_rope_head_dim`` dims, a Walsh-Hadamard rotation, FP8 e4m3 with one scale per 128 (the key cache holds
  FP8 + scale); scores ``sum_j w_j relu(q_j . k)``; ``topk`` keeps the best ``index_topk`` visible positions
  per query; both MLA paths attend over those only.

``lower_to_jax(..., numerics="exact")`` skips the dynamic roundings (activations, index Q/K) and keeps the
caches in fp32 — the weights keep their FP8 values — so a reference check is not decided by a last-bit flip.
GEMMs run at ``Precision.HIGHEST`` (fp32; on a GPU that is not the BF16 / FP8 tensor-core path a serving
engine takes: the timings are this emulation's).

Not executed (``Unsupported``, a row with its category): MTP drafting, FP8 / FP4 latent caches, weight formats
other than BF16 / FP32 / FP8, rope scaling (YaRN) — the tiny configs carry none.
"""
from __future__ import annotations

import zlib

import attrs
import numpy as np

from .registry import FAMILY_INITS, Act, Unsupported, kernel

FAMILY = "deepseek_v3"
BLOCK = 128  #: FP8 block (weights 128x128, activations 1x128)
E4M3_MAX = 448.0


@attrs.frozen(eq=False)
class Flow(Act):
    """A value on a data edge: ``x`` over the rows of ``ts`` and the layer's live values (name -> Act)."""

    carry: dict = attrs.field(factory=dict)


def _carry(inputs) -> dict:
    out: dict = {}
    for a in inputs:
        out.update(getattr(a, "carry", {}))
    return out


def _local(op) -> str:
    p = f"layers.{op.layer}."
    if op.layer is not None and op.name.startswith(p):
        return op.name[len(p):]
    if op.layer is None and op.name in ("embed", "final_norm", "head"):
        return op.name
    raise Unsupported(op, "MTP drafting ops (the executor runs the trunk)")


def _prefix(op) -> str:
    return f"layers.{op.layer}."


# ---- numerics shared by the kernels ----------------------------------------------------------------------

def _mm(a, b):
    import jax
    import jax.numpy as jnp

    return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def _rms(x, gamma, eps=1e-6):
    import jax.numpy as jnp

    return x * jnp.reciprocal(jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)) * gamma


def quant_e4m3(x, block: int = BLOCK):
    """Dynamic FP8 e4m3 quantization of the last axis in groups of ``block`` (one fp32 scale = amax / 448 per
    group), returned dequantized: the values a block-scaled FP8 GEMM multiplies."""
    import jax.numpy as jnp

    n = x.shape[-1]
    pad = -n % block
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x
    g = xp.reshape(*x.shape[:-1], -1, block)
    s = jnp.maximum(jnp.max(jnp.abs(g), axis=-1, keepdims=True), 1e-12) / E4M3_MAX
    q = (g / s).astype(jnp.float8_e4m3fn).astype(jnp.float32) * s
    return q.reshape(*x.shape[:-1], -1)[..., :n]


def dense(params, name):
    """A weight in fp32: BF16 / FP32 as stored, FP8 values times their 128x128 block scales."""
    import jax.numpy as jnp

    w = params[name].astype(jnp.float32)
    s = params.get(name + ".scale")
    if s is None:
        return w
    k, n = w.shape[-2:]
    full = jnp.repeat(jnp.repeat(s, BLOCK, axis=-2), BLOCK, axis=-1)[..., :k, :n]
    return w * full


def _q(ctx, x):
    """Activations into an FP8 GEMM: e4m3 per 1x128 (``numerics="exact"``: as they are)."""
    return quant_e4m3(x) if ctx.numerics == "emulate" else x


def _linear(ctx, x, params, name):
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    if name + ".scale" in params:
        x = _q(ctx, x)
    return _mm(x, dense(params, name))


def rope(x, pos, theta: float):
    """Interleaved-pair RoPE of ``x`` [T, ..., d] at positions ``pos`` [T]."""
    import jax.numpy as jnp

    d = x.shape[-1]
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (d // 2,)
    cos = jnp.asarray(np.cos(ang).reshape(shape), jnp.float32)
    sin = jnp.asarray(np.sin(ang).reshape(shape), jnp.float32)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)


def hadamard(d: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of order ``d`` (a power of two)."""
    if d & (d - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two width, got {d}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


# ---- layout helpers ------------------------------------------------------------------------------------

def _positions(ctx, ts: str) -> np.ndarray:
    """Absolute position (past + i) of each row of token set ``ts``."""
    allpos = np.concatenate([np.tile(g.past + np.arange(g.new), g.count) for g in ctx.layout.groups])
    return allpos[ctx.rows[ts]]


def _groups(ctx, op, ts: str):
    """(group index, group, start, stop) of each group with rows in ``ts``: slices of the ts-ordered rows; a
    group is in or out whole."""
    rows, out, o = ctx.rows[ts], [], 0
    for gi, (g, off) in enumerate(zip(ctx.layout.groups, ctx.layout.offsets())):
        n = g.count * g.new
        if o < len(rows) and rows[o] == off:
            if not np.array_equal(rows[o:o + n], off + np.arange(n)):
                raise Unsupported(op, f"token set {ts!r} covers part of a request group")
            out.append((gi, g, o, o + n))
            o += n
    if o != len(rows):
        raise Unsupported(op, f"token set {ts!r} is not whole request groups")
    return out


def _assemble(ctx, op, parts, ts: str):
    """One array over the rows of ``ts`` from Acts over disjoint subsets that cover it."""
    import jax.numpy as jnp

    want = ctx.rows[ts]
    have = np.sort(np.concatenate([ctx.rows[p.ts] for p in parts])) if parts else np.zeros(0, np.int64)
    if not np.array_equal(have, want):
        raise Unsupported(op, f"the attention outputs do not cover token set {ts!r}")
    out = jnp.zeros((len(want), parts[0].x.shape[1]), jnp.float32)
    for p in parts:
        out = out.at[jnp.asarray(np.searchsorted(want, ctx.rows[p.ts]))].set(p.x)
    return out


def _flow(op, x, carry) -> Flow:
    return Flow(x, op.token_set, carry)


def _x(ctx, op, inputs):
    import jax.numpy as jnp

    if len(inputs) != 1:
        raise Unsupported(op, f"{len(inputs)} data inputs (one expected)")
    return ctx.select(inputs[0], op.token_set).astype(jnp.float32)


# ---- kernels -----------------------------------------------------------------------------------------

@kernel("embedding", family=FAMILY)
def _embedding(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    ids = jnp.take(state["ids"], jnp.asarray(ctx.rows[op.token_set]), axis=0)
    return _flow(op, jnp.take(params[op.reads[0]], ids, axis=0).astype(jnp.float32), {})


@kernel("norm", family=FAMILY)
def _norm(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    c, name, carry = ctx.cfg, _local(op), _carry(inputs)
    gamma = params[f"{op.name}.gamma"]
    if op.info.elems == c.hidden:  # the residual stream: carried residual + every branch output, then RMSNorm
        resid = ctx.select(carry["resid"], op.token_set) if "resid" in carry else 0.0
        for a in inputs:
            resid = resid + ctx.select(a, op.token_set).astype(jnp.float32)
        h = _rms(resid, gamma)
        return _flow(op, h, {"resid": Act(resid, op.token_set), "h": Act(h, op.token_set)})
    x = _x(ctx, op, inputs)
    if name == "q_norm":
        cq = _rms(x, gamma)
        return _flow(op, cq, {**carry, "cq": Act(cq, op.token_set)})
    if name == "kv_norm":  # [c_kv | k_pe] -> [RMSNorm(c_kv) | RoPE(k_pe)]: the latent cache row
        r = c.kv_lora
        lat = jnp.concatenate([_rms(x[:, :r], gamma), rope(x[:, r:], _positions(ctx, op.token_set), c.rope_theta)],
                              axis=1)
        return _flow(op, lat, carry)
    raise Unsupported(op, f"a {op.info.elems}-wide norm {name!r}")


def _plain(op, ctx, inputs, state, params):
    return _flow(op, _linear(ctx, _x(ctx, op, inputs), params, op.reads[0]), _carry(inputs))


def _wq_b(op, ctx, inputs, state, params):
    c = ctx.cfg
    q = _linear(ctx, _x(ctx, op, inputs), params, op.reads[0]).reshape(-1, c.heads, c.qk_dim)
    q = q.at[..., c.nope:].set(rope(q[..., c.nope:], _positions(ctx, op.token_set), c.rope_theta))
    q = q.reshape(-1, c.heads * c.qk_dim)
    return _flow(op, q, {**_carry(inputs), "q": Act(q, op.token_set)})


def _wkv_a(op, ctx, inputs, state, params):  # reads the layer's normalised input, not the edge's Q
    carry = _carry(inputs)
    if "h" not in carry:
        raise Unsupported(op, "no normalised layer input on its data edge")
    return _flow(op, _linear(ctx, ctx.select(carry["h"], op.token_set), params, op.reads[0]), carry)


def _wkv_b(op, ctx, inputs, state, params):
    """MLA prefill: every visible latent of each prefill group up-projected to per-head K_nope and V."""
    c, carry = ctx.cfg, _carry(inputs)
    caches = state["caches"][op.reads[1]]
    w = dense(params, op.reads[0])
    up = {}
    for gi, g, _, _ in _groups(ctx, op, op.token_set):
        lat = caches[gi].astype("float32")  # [b, S, kv_lora + rope]
        c_kv = lat[..., :c.kv_lora]
        if op.reads[0] + ".scale" in params:
            c_kv = _q(ctx, c_kv)
        kv = _mm(c_kv, w).reshape(g.count, g.past + g.new, c.heads, c.nope + c.v_dim)
        up[gi] = (kv[..., :c.nope], kv[..., c.nope:], lat[..., c.kv_lora:])
    q = ctx.select(carry["q"], op.token_set)
    return _flow(op, q, {**carry, "kv_up": up})


def _w_uk_uv(ctx, params, name):
    c = ctx.cfg
    w = dense(params, name).reshape(c.kv_lora, c.heads, c.nope + c.v_dim)
    return w[..., :c.nope], w[..., c.nope:]


def _q_absorb(op, ctx, inputs, state, params):
    """Absorbed decode: q_lat[h] = q_nope[h] W_UK[h]^T (nope -> kv_lora per head)."""
    import jax
    import jax.numpy as jnp

    c, carry = ctx.cfg, _carry(inputs)
    if "q" not in carry:
        raise Unsupported(op, "no query on its data edge")
    q = ctx.select(carry["q"], op.token_set).reshape(-1, c.heads, c.qk_dim)
    w_uk, _ = _w_uk_uv(ctx, params, op.reads[0])
    q_lat = jnp.einsum("thn,chn->thc", q[..., :c.nope], w_uk, precision=jax.lax.Precision.HIGHEST)
    return _flow(op, q_lat.reshape(q.shape[0], -1), {**carry, "q_pe": Act(q[..., c.nope:].reshape(q.shape[0], -1),
                                                                             op.token_set)})


def _o_absorb(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    c, carry = ctx.cfg, _carry(inputs)
    o_lat = _x(ctx, op, inputs).reshape(-1, c.heads, c.kv_lora)
    _, w_uv = _w_uk_uv(ctx, params, op.reads[0])
    o = jnp.einsum("thc,chv->thv", o_lat, w_uv, precision=jax.lax.Precision.HIGHEST).reshape(o_lat.shape[0], -1)
    return _flow(op, o, {**carry, "o_dec": Act(o, op.token_set)})


def _wo(op, ctx, inputs, state, params):
    carry = _carry(inputs)
    parts = [carry[k] for k in ("o_pf", "o_dec") if k in carry]
    if not parts:
        raise Unsupported(op, "no attention output on its data edge")
    o = _assemble(ctx, op, parts, op.token_set)
    return _flow(op, _linear(ctx, o, params, op.reads[0]), {"resid": carry["resid"]})


def _router_logits(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    x = _x(ctx, op, inputs)
    logits = _mm(x, params[op.reads[0]].astype(jnp.float32))
    return _flow(op, logits, {**_carry(inputs), "moe_in": Act(x, op.token_set)})


GEMMS = {"wq_a": _plain, "wq_b": _wq_b, "wkv_a": _wkv_a, "wkv_b": _wkv_b, "q_absorb": _q_absorb,
         "o_absorb": _o_absorb, "wo": _wo, "mlp.gate_up": _plain, "mlp.down": _plain, "moe.shared.gate_up": _plain,
         "moe.shared.down": _plain, "router": _router_logits, "head": _plain}


@kernel("gemm", family=FAMILY)
def _gemm(op, ctx, inputs, state, params):
    fn = GEMMS.get(_local(op))
    if fn is None:
        raise Unsupported(op, f"a GEMM {_local(op)!r} the MLA executor does not know")
    return fn(op, ctx, inputs, state, params)


@kernel("activation", family=FAMILY)
def _activation(op, ctx, inputs, state, params):
    import jax

    x = _x(ctx, op, inputs)
    e = x.shape[1] // 2
    return _flow(op, jax.nn.silu(x[:, :e]) * x[:, e:], _carry(inputs))


@kernel("cache_write", family=FAMILY)
def _cache_write(op, ctx, inputs, state, params):
    lat = _x(ctx, op, inputs)
    caches = state["caches"][op.writes[0]]
    for gi, g, a, b in _groups(ctx, op, op.token_set):
        kc = caches[gi]
        caches[gi] = kc.at[:, g.past:g.past + g.new].set(lat[a:b].reshape(g.count, g.new, -1).astype(kc.dtype))
    return _flow(op, lat, _carry(inputs))


def _sel_mask(carry, gi, g):
    """Positions each query of group ``gi`` may attend: causal, and the DSA Top-K selection when there is one."""
    qpos = g.past + np.arange(g.new)[:, None]
    causal = np.arange(g.past + g.new)[None, :] <= qpos  # [new, S]
    sel = carry.get("sel")
    if sel is None:
        return causal[None, None]  # [1, 1, new, S]
    return (sel[gi] & causal[None])[:, None]  # [b, 1, new, S]


@kernel("attention", family=FAMILY)
def _attention(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    c, carry = ctx.cfg, _carry(inputs)
    hp = jax.lax.Precision.HIGHEST
    scale = 1.0 / np.sqrt(c.qk_dim)
    outs = []
    if op.info.attn == "mla_mha":  # prefill: per-head K = [k_nope | k_pe], V up-projected by wkv_b
        q = _x(ctx, op, inputs).reshape(-1, c.heads, c.qk_dim)
        for gi, g, a, b in _groups(ctx, op, op.token_set):
            k_nope, v, k_pe = carry["kv_up"][gi]
            qg = q[a:b].reshape(g.count, g.new, c.heads, c.qk_dim)
            s = (jnp.einsum("bqhd,bkhd->bhqk", qg[..., :c.nope], k_nope, precision=hp)
                 + jnp.einsum("bqhd,bkd->bhqk", qg[..., c.nope:], k_pe, precision=hp)) * scale
            p = jax.nn.softmax(jnp.where(jnp.asarray(_sel_mask(carry, gi, g)), s, -jnp.inf), axis=-1)
            outs.append(jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=hp).reshape(b - a, c.heads * c.v_dim))
        o = jnp.concatenate(outs, axis=0)
        return _flow(op, o, {**carry, "o_pf": Act(o, op.token_set)})
    if op.info.attn == "mla":  # absorbed decode over the latent cache
        q_lat = _x(ctx, op, inputs).reshape(-1, c.heads, c.kv_lora)
        q_pe = ctx.select(carry["q_pe"], op.token_set).reshape(-1, c.heads, c.rope)
        caches = state["caches"][op.reads[0]]
        for gi, g, a, b in _groups(ctx, op, op.token_set):
            lat = caches[gi].astype(jnp.float32)
            ql = q_lat[a:b].reshape(g.count, g.new, c.heads, c.kv_lora)
            qp = q_pe[a:b].reshape(g.count, g.new, c.heads, c.rope)
            s = (jnp.einsum("bqhc,bkc->bhqk", ql, lat[..., :c.kv_lora], precision=hp)
                 + jnp.einsum("bqhr,bkr->bhqk", qp, lat[..., c.kv_lora:], precision=hp)) * scale
            p = jax.nn.softmax(jnp.where(jnp.asarray(_sel_mask(carry, gi, g)), s, -jnp.inf), axis=-1)
            outs.append(jnp.einsum("bhqk,bkc->bqhc", p, lat[..., :c.kv_lora], precision=hp)
                        .reshape(b - a, c.heads * c.kv_lora))
        return _flow(op, jnp.concatenate(outs, axis=0), carry)
    raise Unsupported(op, f"{op.info.attn or 'unknown'} attention in an MLA model")


@kernel("router", family=FAMILY)
def _router(op, ctx, inputs, state, params):
    """DeepSeek-V3 routing (noaux_tc): grouped top-k on bias-corrected sigmoid scores."""
    import jax
    import jax.numpy as jnp

    c = ctx.cfg
    logits = _x(ctx, op, inputs)
    scores = jax.nn.sigmoid(logits)
    biased = scores + params[f"{_prefix(op)}moe.router_bias"].astype(jnp.float32)
    T, E = biased.shape
    if c.n_group > 1:
        grouped = biased.reshape(T, c.n_group, E // c.n_group)
        group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
        _, keep = jax.lax.top_k(group_score, c.topk_group)
        gmask = jnp.sum(jax.nn.one_hot(keep, c.n_group, dtype=jnp.float32), axis=1) > 0
        biased = jnp.where(jnp.repeat(gmask, E // c.n_group, axis=1), biased, -jnp.inf)
    _, ids = jax.lax.top_k(biased, c.top_k)
    w = jnp.take_along_axis(scores, ids, axis=1)
    if c.norm_topk:
        w = w / (jnp.sum(w, axis=1, keepdims=True) + 1e-20)
    return _flow(op, w * c.routed_scale, {**_carry(inputs), "expert_ids": Act(ids, op.token_set)})


@kernel("moe_experts", family=FAMILY)
def _moe_experts(op, ctx, inputs, state, params):
    """Routed experts as a grouped GEMM: the T·k slots sorted by expert, ``ragged_dot`` per expert group."""
    import jax
    import jax.numpy as jnp

    carry = _carry(inputs)
    w = _x(ctx, op, inputs)
    ids = ctx.select(carry["expert_ids"], op.token_set)
    x = ctx.select(carry["moe_in"], op.token_set)
    T, k = ids.shape
    name = op.reads[0]
    wu, wd = dense(params, f"{name}.gate_up"), dense(params, f"{name}.down")
    fp8 = f"{name}.gate_up.scale" in params
    E = wu.shape[0]
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=E).astype(jnp.int32)
    token = order // k
    xs = jnp.take(_q(ctx, x) if fp8 else x, token, axis=0)
    hp = jax.lax.Precision.HIGHEST
    h = jax.lax.ragged_dot(xs, wu, counts, precision=hp)
    inter = h.shape[1] // 2
    h = jax.nn.silu(h[:, :inter]) * h[:, inter:]
    y = jax.lax.ragged_dot(_q(ctx, h) if fp8 else h, wd, counts, precision=hp)
    y = y * w.reshape(-1)[order][:, None]
    out = jnp.zeros((T, x.shape[1]), jnp.float32).at[token].add(y)
    return _flow(op, out, {"resid": carry["resid"]})


# ---- DSA: the lightning indexer and Top-K ---------------------------------------------------------------

def _index_qk(x, pos, c):
    """RoPE on the first ``rope`` dims, the Hadamard rotation, FP8 e4m3 per 128 (dequantized)."""
    import jax.numpy as jnp

    x = x.at[..., :c.rope].set(rope(x[..., :c.rope], pos, c.rope_theta))
    x = _mm(x, jnp.asarray(hadamard(c.index_dim), jnp.float32))
    return x


@kernel("indexer", family=FAMILY)
def _indexer(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    c, name, carry, ts = ctx.cfg, _local(op), _carry(inputs), op.token_set
    pos = _positions(ctx, ts)
    if name == "indexer.wq_b":
        q = _linear(ctx, ctx.select(carry["cq"], ts), params, op.reads[0]).reshape(-1, c.index_heads, c.index_dim)
        qf = _q(ctx, _index_qk(q, pos, c))
        return _flow(op, qf.reshape(qf.shape[0], -1), {**carry, "iq": Act(qf.reshape(qf.shape[0], -1), ts)})
    if name == "indexer.weights_proj":
        h = ctx.select(carry["h"], ts)
        wts = _mm(h, params[op.reads[0]].astype(jnp.float32)) * (c.index_heads ** -0.5 * c.index_dim ** -0.5)
        return _flow(op, wts, {**carry, "iw": Act(wts, ts)})
    if name == "indexer.k_write":  # k = LayerNorm(h wk), rotated, FP8 + scale into the index-key cache
        k = _linear(ctx, ctx.select(carry["h"], ts), params, op.reads[0])
        mu = jnp.mean(k, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(k - mu), axis=-1, keepdims=True)
        k = (k - mu) / jnp.sqrt(var + 1e-6) * params[f"{op.name}.gamma"] + params[f"{op.name}.beta"]
        k = _index_qk(k, pos, c)
        caches = state["caches"][op.writes[0]]
        if ctx.numerics == "emulate":
            s = jnp.maximum(jnp.max(jnp.abs(k), axis=-1, keepdims=True), 1e-12) / E4M3_MAX
            kq = (k / s).astype(caches[0][0].dtype)
        else:
            s, kq = jnp.ones((k.shape[0], 1), jnp.float32), k
        for gi, g, a, b in _groups(ctx, op, ts):
            kc, sc = caches[gi]
            caches[gi] = (kc.at[:, g.past:g.past + g.new].set(kq[a:b].reshape(g.count, g.new, -1)),
                          sc.at[:, g.past:g.past + g.new].set(s[a:b].reshape(g.count, g.new)))
        return _flow(op, k, carry)
    if name == "indexer.score":  # I[t, s] = sum_j w[t, j] relu(q[t, j] . k[s]), future positions -inf
        q = ctx.select(carry["iq"], ts).reshape(-1, c.index_heads, c.index_dim)
        wts = ctx.select(carry["iw"], ts)
        caches = state["caches"][op.reads[0]]
        scores = {}
        for gi, g, a, b in _groups(ctx, op, ts):
            kc, sc = caches[gi]
            kd = kc.astype(jnp.float32) * sc[..., None]
            dots = jnp.einsum("bqhd,bkd->bqhk", q[a:b].reshape(g.count, g.new, c.index_heads, c.index_dim), kd,
                              precision=jax.lax.Precision.HIGHEST)
            sg = jnp.einsum("bqhk,bqh->bqk", jax.nn.relu(dots), wts[a:b].reshape(g.count, g.new, -1),
                            precision=jax.lax.Precision.HIGHEST)
            causal = np.arange(g.past + g.new)[None, :] <= (g.past + np.arange(g.new))[:, None]
            scores[gi] = jnp.where(jnp.asarray(causal)[None], sg, -jnp.inf)
        return _flow(op, wts, {**carry, "index_scores": scores})
    raise Unsupported(op, f"an indexer op {name!r}")


@kernel("topk", family=FAMILY)
def _topk(op, ctx, inputs, state, params):
    """Each query keeps its ``index_topk`` best-scored visible positions (all of them when fewer)."""
    import jax
    import jax.numpy as jnp

    carry = _carry(inputs)
    if "index_scores" not in carry:
        raise Unsupported(op, "no index scores on its data edge")
    K = ctx.cfg.index_topk
    sel = {}
    for gi, s in carry["index_scores"].items():
        S = s.shape[-1]
        _, idx = jax.lax.top_k(s, min(K, S))
        sel[gi] = jnp.sum(jax.nn.one_hot(idx, S, dtype=jnp.int32), axis=-2) > 0
    return _flow(op, inputs[0].x, {**carry, "sel": sel})


# ---- parameters and caches -------------------------------------------------------------------------------

def _shapes(cfg) -> dict:
    """Weight tensor (name within a layer, or top level) -> its [k, n] (experts: per expert)."""
    c = cfg
    return {"attn.wq_a": (c.hidden, c.q_lora), "attn.wq_b": (c.q_lora, c.heads * c.qk_dim),
            "attn.wkv_a": (c.hidden, c.latent), "attn.wkv_b": (c.kv_lora, c.heads * (c.nope + c.v_dim)),
            "attn.wo": (c.heads * c.v_dim, c.hidden), "mlp.gate_up": (c.hidden, 2 * c.inter),
            "mlp.down": (c.inter, c.hidden), "moe.router": (c.hidden, c.experts),
            "moe.shared.gate_up": (c.hidden, 2 * c.shared * c.moe_inter),
            "moe.shared.down": (c.shared * c.moe_inter, c.hidden),
            "attn.indexer.wq_b": (c.q_lora, c.index_heads * c.index_dim), "attn.indexer.wk": (c.hidden, c.index_dim),
            "attn.indexer.weights_proj": (c.hidden, c.index_heads), "embed": (c.vocab, c.hidden),
            "head": (c.hidden, c.vocab)}


def quantize_blocks(w):
    """FP8 e4m3 values and one fp32 scale (amax / 448) per 128x128 block of the last two axes (NumPy: made once
    per weight, at init)."""
    import ml_dtypes

    w = np.asarray(w, np.float32)
    k, n = w.shape[-2:]
    pk, pn = -k % BLOCK, -n % BLOCK
    wp = np.pad(w, [(0, 0)] * (w.ndim - 2) + [(0, pk), (0, pn)])
    lead = w.shape[:-2]
    blocks = wp.reshape(*lead, (k + pk) // BLOCK, BLOCK, (n + pn) // BLOCK, BLOCK)
    s = (np.maximum(np.abs(blocks).max(axis=(-3, -1)), 1e-12) / E4M3_MAX).astype(np.float32)  # [..., kb, nb]
    full = np.repeat(np.repeat(s, BLOCK, axis=-2), BLOCK, axis=-1)[..., :k, :n]
    return (w / full).astype(ml_dtypes.float8_e4m3fn), s


def _rng(seed: int, name: str) -> np.random.Generator:
    """A generator per (seed, tensor name): the same weights for a tensor whatever the plan."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def init_params(compiled, seed: int = 0) -> dict:
    """Random weights keyed by tensor name (the same weights for every plan of a model): normal / sqrt(fan-in),
    stored in the tensor's format (FP8 block-quantized with their scales, BF16, FP32); norm scales near 1; the
    router's score-correction bias; the indexer key norm's scale and shift. Made in NumPy (one host pass)."""
    import jax.numpy as jnp
    import ml_dtypes

    c, g = compiled.model.cfg, compiled.graph
    shapes = _shapes(c)
    params: dict = {}

    def put(name, shape, fan_in, fmt, op=None):
        w = (_rng(seed, name).standard_normal(shape, np.float32) / np.sqrt(fan_in)).astype(np.float32)
        if fmt == "fp8_b128x128":
            params[name], params[name + ".scale"] = quantize_blocks(w)
        elif fmt == "fp8":  # one scale per tensor: the block grid filled with the tensor's amax / 448
            _, s = quantize_blocks(w)
            s = np.full_like(s, s.max(axis=(-2, -1), keepdims=True))
            params[name], params[name + ".scale"] = (w / np.repeat(np.repeat(s, BLOCK, -2), BLOCK, -1)
                                                     [..., :shape[-2], :shape[-1]]).astype(ml_dtypes.float8_e4m3fn), s
        elif fmt in ("bf16", "fp32"):
            params[name] = w.astype(ml_dtypes.bfloat16 if fmt == "bf16" else np.float32)
        else:
            raise Unsupported(op, f"weights stored as {fmt} (the MLA executor holds bf16 / fp32 / fp8 blocks)")

    def near(name, n, mean=1.0, sd=0.1):
        params[name] = (mean + sd * _rng(seed, name).standard_normal(n, np.float32)).astype(np.float32)

    for op in g.ops:
        if op.kind == "norm":
            near(f"{op.name}.gamma", op.info.elems)
        if op.kind == "indexer" and op.name.endswith("indexer.k_write"):
            near(f"{op.name}.gamma", c.index_dim)
            near(f"{op.name}.beta", c.index_dim, 0.0)
        if op.kind == "router":
            near(f"{_prefix(op)}moe.router_bias", c.experts, 0.0, 0.05)
        for t in op.reads:
            if t in params or g.tensor_map[t].role != "weight":
                continue
            fmt = g.tensor_map[t].format.name
            local = t.split(".", 2)[2] if t.startswith("layers.") else t
            if op.kind == "moe_experts":
                h, i = c.hidden, c.moe_inter
                put(f"{t}.gate_up", (c.experts, h, 2 * i), h, fmt, op)
                put(f"{t}.down", (c.experts, i, h), i, fmt, op)
                params[t] = True  # marks the tensor as made
                continue
            if local not in shapes:
                raise Unsupported(op, f"no shape for weight {t!r}")
            k, n = shapes[local]
            put(t, (k, n), 1.0 if op.kind == "embedding" else k, fmt, op)
    return {k: jnp.asarray(v) for k, v in params.items() if v is not True}


def init_caches(ex, seed: int = 1) -> dict:
    """Per layer and request group: the latent cache [b, past + new, kv_lora + rope] in its storage dtype and,
    with DSA, the index keys (FP8 [b, S, index_dim] + fp32 scale [b, S]), random in every position (the new
    ones are overwritten by the forward). ``numerics="exact"``: both in fp32 (scales 1)."""
    import jax.numpy as jnp
    import ml_dtypes

    c, g = ex.compiled.model.cfg, ex.compiled.graph
    out = {}
    for op in g.ops:
        is_kv = op.kind == "cache_write"
        is_ik = op.kind == "indexer" and op.name.endswith("indexer.k_write")
        if not (is_kv or is_ik):
            continue
        name = op.writes[0]
        per = []
        for gi, grp in enumerate(ex.layout.groups):
            rng = _rng(seed, f"{name}/{gi}")
            S = grp.past + grp.new
            if is_kv:
                fmt = g.tensor_map[name].format.name
                dt = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}.get(fmt)
                if dt is None:
                    raise Unsupported(op, f"a latent cache stored as {fmt} (the MLA executor holds bf16 / fp16)")
                dt = np.float32 if ex.numerics == "exact" else dt
                per.append(jnp.asarray(rng.standard_normal((grp.count, S, c.latent), np.float32).astype(dt)))
                continue
            k = rng.standard_normal((grp.count, S, c.index_dim), np.float32)
            if ex.numerics == "exact":
                per.append((jnp.asarray(k), jnp.ones((grp.count, S), jnp.float32)))
                continue
            s = (np.abs(k).max(axis=-1) / E4M3_MAX).astype(np.float32)
            per.append((jnp.asarray((k / s[..., None]).astype(ml_dtypes.float8_e4m3fn)), jnp.asarray(s)))
        out[name] = tuple(per)
    return out


FAMILY_INITS[FAMILY] = {"params": init_params, "caches": init_caches}
