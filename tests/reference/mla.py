"""An independent DeepSeek-V3 / V3.2 forward in plain JAX, written from the model's description and the HF
config — it imports nothing from graphsim. One request at a time: ``past`` cached positions (their latent
cache rows and, for V3.2, index keys given), ``ids`` the new positions' tokens.

Sources: DeepSeek-V3 technical report §2.1 (MLA: eqs. 1-11, DeepSeekMoE with auxiliary-loss-free bias, node-
limited = grouped routing), its inference code's two attention modes ("naive": K/V up-projected; "absorb": W_UK
and W_UV folded into the query and output), FP8 training/inference recipe §3.3 (1x128 activation tiles, 128x128
weight blocks, e4m3); DeepSeek-V3.2-Exp report §2.1 (lightning indexer I = sum_j w_j ReLU(q_j . k), top-k token
selection) and its inference code (indexer Q/K: RoPE on the first rope dims, Hadamard rotation, FP8 per 128;
keys LayerNorm'd).

Parameters (``P``): ``embed`` [V, h]; ``head`` [h, V]; ``final_norm`` [h]; ``layers[i]``: a dict with
``attn_norm, q_norm, kv_norm, mlp_norm`` (norm scales), ``wq_a, wq_b, wkv_a, wkv_b, wo`` and the MLP
(``w1w3, w2`` dense; MoE: ``gate`` [h, E], ``bias`` [E], ``experts_w1w3`` [E, h, 2i], ``experts_w2`` [E, i, h],
``shared_w1w3, shared_w2``), V3.2 ``iq`` [q_lora, HI*D], ``ik`` [h, D], ``iw`` [h, HI], ``ik_norm`` (gamma,
beta). A weight is either an array (used as it is) or a pair (e4m3 values, fp32 scale per 128x128 block).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

HI = jax.lax.Precision.HIGHEST
F32 = jnp.float32


def dequant(w):
    """A weight as fp32: a pair (values, block scales) is values x the scale of its 128x128 block."""
    if not isinstance(w, tuple):
        return jnp.asarray(w, F32)
    vals, scales = w
    vals = jnp.asarray(vals).astype(F32)
    r, c = vals.shape[-2:]
    rows = np.arange(r) // 128
    cols = np.arange(c) // 128
    return vals * jnp.asarray(scales, F32)[..., rows, :][..., :, cols]


def fp8_tiles(x):
    """Round x to e4m3 in tiles of 128 along the last axis (scale = tile amax / 448), back to fp32."""
    pieces = []
    for start in range(0, x.shape[-1], 128):
        t = x[..., start:start + 128]
        s = jnp.max(jnp.abs(t), axis=-1, keepdims=True) / 448.0
        s = jnp.where(s > 0, s, 1e-12 / 448.0)
        pieces.append((t / s).astype(jnp.float8_e4m3fn).astype(F32) * s)
    return jnp.concatenate(pieces, axis=-1)


def linear(x, w, q8=True):
    """y = x W; an FP8 weight (a pair) multiplies FP8-rounded activations (the dynamic 1x128 scheme; ``q8``
    false: the activations as they are)."""
    x = jnp.asarray(x, F32)
    if isinstance(w, tuple) and q8:
        x = fp8_tiles(x)
    return jnp.matmul(x, dequant(w), precision=HI)


def rms_norm(x, g, eps=1e-6):
    return x / jnp.sqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * jnp.asarray(g, F32)


def layer_norm(x, g, b, eps=1e-6):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True) + eps) * g + b


def rotary(x, positions, theta):
    """RoPE as complex rotation of consecutive pairs (x[2i] + i x[2i+1]) by position * theta^(-2i/d)."""
    d = x.shape[-1]
    freqs = np.outer(np.asarray(positions, np.float64), theta ** (-np.arange(0, d, 2) / d))
    rot = jnp.asarray(np.exp(1j * freqs), jnp.complex64)  # [n, d/2]
    rot = rot.reshape(rot.shape[:1] + (1,) * (x.ndim - 2) + rot.shape[1:])
    z = jax.lax.complex(x[..., 0::2], x[..., 1::2]) * rot
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).reshape(x.shape)


def walsh_hadamard(x):
    """The normalised fast Walsh-Hadamard transform along the last axis."""
    d = x.shape[-1]
    h = 1
    y = x
    while h < d:
        y = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = jnp.stack([a + b, a - b], axis=-2).reshape(*x.shape[:-1], d)
        h *= 2
    return y / math.sqrt(d)


def route(x, L, cfg):
    """DeepSeek-V3 gate: sigmoid affinities, bias only for choosing, best ``topk_group`` groups (by the sum of
    their two best biased scores), top-k experts in them; gate values normalised x routed_scaling_factor.
    Returns dense gates [n, E]."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, kg = cfg.get("n_group", 1), cfg.get("topk_group", 1)
    s = jax.nn.sigmoid(jnp.matmul(x, jnp.asarray(L["gate"], F32), precision=HI))
    choice = s + jnp.asarray(L["bias"], F32)
    n = x.shape[0]
    per = choice.reshape(n, G, E // G)
    top2 = jnp.sort(per, axis=-1)[..., -2:].sum(-1)  # [n, G]
    groups = jnp.argsort(-top2, axis=-1, stable=True)[:, :kg]
    allowed = jnp.zeros((n, G), bool).at[jnp.arange(n)[:, None], groups].set(True)
    choice = jnp.where(jnp.repeat(allowed, E // G, axis=1), choice, -jnp.inf)
    picked = jnp.argsort(-choice, axis=-1, stable=True)[:, :k]
    gates = jnp.zeros((n, E), F32).at[jnp.arange(n)[:, None], picked].set(jnp.take_along_axis(s, picked, 1))
    if cfg.get("norm_topk_prob", True):
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return gates * cfg.get("routed_scaling_factor", 1.0)


def swiglu_mlp(x, w1w3, w2, q8=True):
    h = linear(x, w1w3, q8)
    i = h.shape[-1] // 2
    return linear(jax.nn.silu(h[:, :i]) * h[:, i:], w2, q8)


def moe(x, L, cfg, q8=True):
    """Every expert on every token, weighted by the (sparse) gates, + the shared expert."""
    gates = route(x, L, cfg)
    out = swiglu_mlp(x, L["shared_w1w3"], L["shared_w2"], q8)
    def expert(w, e):  # expert e's slice of a stacked weight (FP8 pairs: values and scales)
        return (w[0][e], w[1][e]) if isinstance(w, tuple) else w[e]

    for e in range(cfg["n_routed_experts"]):
        y = swiglu_mlp(x, expert(L["experts_w1w3"], e), expert(L["experts_w2"], e), q8)
        out = out + gates[:, e:e + 1] * y
    return out


def indexer_select(h, cq, positions, L, cfg, past_keys, q8=True):
    """V3.2 lightning indexer for the new queries: returns (the selection mask [n, S], new key values/scales)."""
    Hn, D, R = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    theta = cfg.get("rope_theta", 10000.0)
    n = h.shape[0]

    def prep(v):  # RoPE on the first R dims, Hadamard rotation
        v = jnp.concatenate([rotary(v[..., :R], positions, theta), v[..., R:]], axis=-1)
        return walsh_hadamard(v)

    q = prep(linear(cq, L["iq"], q8).reshape(n, Hn, D))
    q = fp8_tiles(q) if q8 else q
    k = prep(layer_norm(linear(h, L["ik"], q8), *[jnp.asarray(a, F32) for a in L["ik_norm"]]))
    if q8:
        ks = jnp.max(jnp.abs(k), axis=-1) / 448.0
        kv = (k / ks[:, None]).astype(jnp.float8_e4m3fn)
    else:
        ks, kv = jnp.ones(k.shape[:1], F32), k
    keys = jnp.concatenate([past_keys[0].astype(F32) * past_keys[1][:, None], kv.astype(F32) * ks[:, None]])
    w = jnp.matmul(h, jnp.asarray(L["iw"], F32), precision=HI) / math.sqrt(Hn) / math.sqrt(D)
    logits = jnp.einsum("nhd,sd->nhs", q, keys, precision=HI)
    score = jnp.einsum("nhs,nh->ns", jax.nn.relu(logits), w, precision=HI)
    S = keys.shape[0]
    causal = np.arange(S)[None, :] <= np.asarray(positions)[:, None]
    score = jnp.where(causal, score, -jnp.inf)
    top = jnp.argsort(-score, axis=-1, stable=True)[:, :min(cfg["index_topk"], S)]
    sel = jnp.zeros((n, S), bool).at[jnp.arange(n)[:, None], top].set(True)
    return sel & causal, (kv, ks)


def mla(h, positions, L, cfg, past_latent, absorb: bool, past_keys=None, cache_dtype=jnp.bfloat16, q8=True):
    """Multi-head latent attention of the new positions over past + new latents. Returns (output [n, h],
    the new latent rows as cached, the new index keys)."""
    H, r = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    theta = cfg.get("rope_theta", 10000.0)
    n = h.shape[0]
    cq = rms_norm(linear(h, L["wq_a"], q8), L["q_norm"])
    q = linear(cq, L["wq_b"], q8).reshape(n, H, dn + dr)
    q_nope, q_pe = q[..., :dn], rotary(q[..., dn:], positions, theta)
    kv = linear(h, L["wkv_a"], q8)
    c_new = rms_norm(kv[:, :r], L["kv_norm"])
    kpe_new = rotary(kv[:, r:], positions, theta)
    new_rows = jnp.concatenate([c_new, kpe_new], axis=-1).astype(cache_dtype)
    latent = jnp.concatenate([jnp.asarray(past_latent).astype(cache_dtype), new_rows]).astype(F32)
    c_kv, k_pe = latent[:, :r], latent[:, r:]
    S = latent.shape[0]
    mask = np.arange(S)[None, :] <= np.asarray(positions)[:, None]
    new_keys = None
    if cfg.get("index_topk"):
        mask, new_keys = indexer_select(h, cq, positions, L, cfg, past_keys, q8)
    scale = 1.0 / math.sqrt(dn + dr)
    wkv_b = dequant(L["wkv_b"]).reshape(r, H, dn + dv)
    if absorb:  # scores q_nope W_UK . c + q_pe . k_pe over the latent; values c, then W_UV
        q_lat = jnp.einsum("nhd,rhd->nhr", q_nope, wkv_b[..., :dn], precision=HI)
        s = (jnp.einsum("nhr,sr->nhs", q_lat, c_kv, precision=HI)
             + jnp.einsum("nhd,sd->nhs", q_pe, k_pe, precision=HI)) * scale
        p = jax.nn.softmax(jnp.where(mask[:, None, :], s, -jnp.inf), axis=-1)
        o = jnp.einsum("nhr,rhv->nhv", jnp.einsum("nhs,sr->nhr", p, c_kv, precision=HI), wkv_b[..., dn:],
                       precision=HI)
    else:  # K/V up-projected per head: k = [c W_UK | k_pe], v = c W_UV
        up = linear(c_kv, L["wkv_b"], q8).reshape(S, H, dn + dv)
        k = jnp.concatenate([up[..., :dn], jnp.broadcast_to(k_pe[:, None, :], (S, H, dr))], axis=-1)
        s = jnp.einsum("nhd,shd->nhs", jnp.concatenate([q_nope, q_pe], -1), k, precision=HI) * scale
        p = jax.nn.softmax(jnp.where(mask[:, None, :], s, -jnp.inf), axis=-1)
        o = jnp.einsum("nhs,shv->nhv", p, up[..., dn:], precision=HI)
    return linear(o.reshape(n, H * dv), L["wo"], q8), new_rows, new_keys


def forward(P, cfg, ids, past_latents, *, absorb: bool, past_keys=None, cache_dtype=jnp.bfloat16, q8=True):
    """Logits [n, V] of the new positions (past = len(past_latents[0])) and the new cache rows per layer
    (stored as ``cache_dtype``: what the cache holds is what every later step reads). ``q8`` false: no FP8
    rounding of activations and index Q/K (FP8 weights still hold their rounded values)."""
    past = int(np.asarray(past_latents[0]).shape[0])
    positions = past + np.arange(len(ids))
    x = jnp.take(jnp.asarray(P["embed"], F32), jnp.asarray(ids), axis=0)
    rows, keys = [], []
    for i, L in enumerate(P["layers"]):
        a, new, nk = mla(rms_norm(x, L["attn_norm"]), positions, L, cfg, past_latents[i], absorb,
                         past_keys[i] if past_keys is not None else None, cache_dtype, q8)
        x = x + a
        rows.append(new)
        keys.append(nk)
        hh = rms_norm(x, L["mlp_norm"])
        x = x + (swiglu_mlp(hh, L["w1w3"], L["w2"], q8) if i < cfg["first_k_dense_replace"] else moe(hh, L, cfg, q8))
    logits = jnp.matmul(rms_norm(x, P["final_norm"]), jnp.asarray(P["head"], F32), precision=HI)
    return logits, rows, keys
