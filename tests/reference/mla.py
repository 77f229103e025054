"""An independent DeepSeek-V3 / V3.2 forward in plain NumPy (ml_dtypes for e4m3 and bf16), written from the
model's description and the HF config — it imports nothing from graphsim, and compiles nothing. ``with
array_api(jax.numpy):`` runs the same code on JAX's arrays (eagerly): where the FP8 roundings are emulated, a
last-bit difference between two matmul libraries flips a rounding (then a router or Top-K choice), so the
emulated comparison runs the reference on the executor's backend, XLA. One request at a time: ``past`` cached positions (their latent
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

import contextlib

import ml_dtypes
import numpy as np

F32 = np.float32
xp = np  # the array namespace of the arithmetic (index bookkeeping stays in NumPy)


@contextlib.contextmanager
def array_api(module):
    """Run the reference on ``module``'s arrays (``numpy`` or ``jax.numpy``)."""
    global xp
    saved, xp = xp, module
    try:
        yield
    finally:
        xp = saved


def _put(a, idx, val):
    """``a`` with ``a[idx] = val``, for NumPy and JAX arrays alike."""
    if hasattr(a, "at"):
        return a.at[idx].set(val)
    a = a.copy()
    a[idx] = val
    return a


def _argsort_desc(x):
    """Indices sorting the last axis in descending order, ties to the lower index."""
    return xp.argsort(-x, axis=-1, stable=True)


def _sigmoid(x):
    if xp is not np:
        import jax
        return jax.nn.sigmoid(x)
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # the tanh form: no overflow for large |x|


def _softmax(x, axis=-1):
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def dequant(w):
    """A weight as fp32: a pair (values, block scales) is values x the scale of its 128x128 block."""
    if not isinstance(w, tuple):
        return xp.asarray(w, F32)
    vals, scales = w
    vals = xp.asarray(vals).astype(F32)
    r, c = vals.shape[-2:]
    rows = np.arange(r) // 128
    cols = np.arange(c) // 128
    return vals * xp.asarray(scales, F32)[..., rows, :][..., :, cols]


def fp8_tiles(x):
    """Round x to e4m3 in tiles of 128 along the last axis (scale = tile amax / 448), back to fp32."""
    x = xp.asarray(x, F32)
    pieces = []
    for start in range(0, x.shape[-1], 128):
        t = x[..., start:start + 128]
        s = xp.max(xp.abs(t), axis=-1, keepdims=True) / 448.0
        s = xp.where(s > 0, s, 1e-12 / 448.0)
        pieces.append((t / s).astype(ml_dtypes.float8_e4m3fn).astype(F32) * s)
    return xp.concatenate(pieces, axis=-1)


def linear(x, w, q8=True):
    """y = x W; an FP8 weight (a pair) multiplies FP8-rounded activations (the dynamic 1x128 scheme; ``q8``
    false: the activations as they are)."""
    x = xp.asarray(x, F32)
    if isinstance(w, tuple) and q8:
        x = fp8_tiles(x)
    return xp.matmul(x, dequant(w))


def rms_norm(x, g, eps=1e-6):
    return x / xp.sqrt(xp.mean(xp.square(x), axis=-1, keepdims=True) + eps) * xp.asarray(g, F32)


def layer_norm(x, g, b, eps=1e-6):
    mu = xp.mean(x, axis=-1, keepdims=True)
    return (x - mu) / xp.sqrt(xp.mean(xp.square(x - mu), axis=-1, keepdims=True) + eps) * g + b


def rotary(x, positions, theta):
    """RoPE as complex rotation of consecutive pairs (x[2i] + i x[2i+1]) by position * theta^(-2i/d)."""
    d = x.shape[-1]
    freqs = np.outer(np.asarray(positions, np.float64), theta ** (-np.arange(0, d, 2) / d))
    rot = np.exp(1j * freqs).astype(np.complex64)  # [n, d/2]
    rot = rot.reshape(rot.shape[:1] + (1,) * (x.ndim - 2) + rot.shape[1:])
    z = (x[..., 0::2] + 1j * x[..., 1::2]).astype(np.complex64) * rot
    return xp.stack([z.real, z.imag], axis=-1).reshape(x.shape)


def walsh_hadamard(x):
    """The normalised fast Walsh-Hadamard transform along the last axis."""
    d = x.shape[-1]
    h = 1
    y = x
    while h < d:
        y = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = xp.stack([a + b, a - b], axis=-2).reshape(*x.shape[:-1], d)
        h *= 2
    return y / math.sqrt(d)


def route(x, L, cfg):
    """DeepSeek-V3 gate: sigmoid affinities, bias only for choosing, best ``topk_group`` groups (by the sum of
    their two best biased scores), top-k experts in them; gate values normalised x routed_scaling_factor.
    Returns dense gates [n, E]."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, kg = cfg.get("n_group", 1), cfg.get("topk_group", 1)
    s = _sigmoid(xp.matmul(x, xp.asarray(L["gate"], F32)))
    choice = s + xp.asarray(L["bias"], F32)
    n = x.shape[0]
    per = choice.reshape(n, G, E // G)
    top2 = xp.sort(per, axis=-1)[..., -2:].sum(-1)  # [n, G]
    groups = _argsort_desc(top2)[:, :kg]
    allowed = _put(xp.zeros((n, G), bool), (np.arange(n)[:, None], groups), True)
    choice = xp.where(xp.repeat(allowed, E // G, axis=1), choice, -np.inf)
    picked = _argsort_desc(choice)[:, :k]
    gates = _put(xp.zeros((n, E), F32), (np.arange(n)[:, None], picked), xp.take_along_axis(s, picked, 1))
    if cfg.get("norm_topk_prob", True):
        gates = gates / xp.sum(gates, axis=-1, keepdims=True)
    return gates * cfg.get("routed_scaling_factor", 1.0)


def swiglu_mlp(x, w1w3, w2, q8=True):
    h = linear(x, w1w3, q8)
    i = h.shape[-1] // 2
    return linear(h[:, :i] * _sigmoid(h[:, :i]) * h[:, i:], w2, q8)


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
        v = xp.concatenate([rotary(v[..., :R], positions, theta), v[..., R:]], axis=-1)
        return walsh_hadamard(v)

    q = prep(linear(cq, L["iq"], q8).reshape(n, Hn, D))
    q = fp8_tiles(q) if q8 else q
    k = prep(layer_norm(linear(h, L["ik"], q8), *[xp.asarray(a, F32) for a in L["ik_norm"]]))
    if q8:
        ks = xp.max(xp.abs(k), axis=-1) / 448.0
        kv = (k / ks[:, None]).astype(ml_dtypes.float8_e4m3fn)
    else:
        ks, kv = xp.ones(k.shape[:1], F32), k
    keys = xp.concatenate([past_keys[0].astype(F32) * past_keys[1][:, None], kv.astype(F32) * ks[:, None]])
    w = xp.matmul(h, xp.asarray(L["iw"], F32)) / math.sqrt(Hn) / math.sqrt(D)
    logits = xp.einsum("nhd,sd->nhs", q, keys)
    score = xp.einsum("nhs,nh->ns", xp.maximum(logits, F32(0.0)), w)
    S = keys.shape[0]
    causal = np.arange(S)[None, :] <= np.asarray(positions)[:, None]
    score = xp.where(causal, score, -np.inf)
    top = _argsort_desc(score)[:, :min(cfg["index_topk"], S)]
    sel = _put(xp.zeros((n, S), bool), (np.arange(n)[:, None], top), True)
    return sel & causal, (kv, ks)


def mla(h, positions, L, cfg, past_latent, absorb: bool, past_keys=None, cache_dtype=ml_dtypes.bfloat16, q8=True):
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
    new_rows = xp.concatenate([c_new, kpe_new], axis=-1).astype(cache_dtype)
    latent = xp.concatenate([xp.asarray(past_latent).astype(cache_dtype), new_rows]).astype(F32)
    c_kv, k_pe = latent[:, :r], latent[:, r:]
    S = latent.shape[0]
    mask = np.arange(S)[None, :] <= np.asarray(positions)[:, None]
    new_keys = None
    if cfg.get("index_topk"):
        mask, new_keys = indexer_select(h, cq, positions, L, cfg, past_keys, q8)
    scale = 1.0 / math.sqrt(dn + dr)
    wkv_b = dequant(L["wkv_b"]).reshape(r, H, dn + dv)
    if absorb:  # scores q_nope W_UK . c + q_pe . k_pe over the latent; values c, then W_UV
        q_lat = xp.einsum("nhd,rhd->nhr", q_nope, wkv_b[..., :dn])
        s = (xp.einsum("nhr,sr->nhs", q_lat, c_kv)
             + xp.einsum("nhd,sd->nhs", q_pe, k_pe)) * scale
        p = _softmax(xp.where(mask[:, None, :], s, -np.inf), axis=-1)
        o = xp.einsum("nhr,rhv->nhv", xp.einsum("nhs,sr->nhr", p, c_kv), wkv_b[..., dn:])
    else:  # K/V up-projected per head: k = [c W_UK | k_pe], v = c W_UV
        up = linear(c_kv, L["wkv_b"], q8).reshape(S, H, dn + dv)
        k = xp.concatenate([up[..., :dn], xp.broadcast_to(k_pe[:, None, :], (S, H, dr))], axis=-1)
        s = xp.einsum("nhd,shd->nhs", xp.concatenate([q_nope, q_pe], -1), k) * scale
        p = _softmax(xp.where(mask[:, None, :], s, -np.inf), axis=-1)
        o = xp.einsum("nhs,shv->nhv", p, up[..., dn:])
    return linear(o.reshape(n, H * dv), L["wo"], q8), new_rows, new_keys


def forward(P, cfg, ids, past_latents, *, absorb: bool, past_keys=None, cache_dtype=ml_dtypes.bfloat16, q8=True):
    """Logits [n, V] of the new positions (past = len(past_latents[0])) and the new cache rows per layer
    (stored as ``cache_dtype``: what the cache holds is what every later step reads). ``q8`` false: no FP8
    rounding of activations and index Q/K (FP8 weights still hold their rounded values)."""
    past = int(np.asarray(past_latents[0]).shape[0])
    positions = past + np.arange(len(ids))
    x = xp.take(xp.asarray(P["embed"], F32), xp.asarray(ids), axis=0)
    rows, keys = [], []
    for i, L in enumerate(P["layers"]):
        a, new, nk = mla(rms_norm(x, L["attn_norm"]), positions, L, cfg, past_latents[i], absorb,
                         past_keys[i] if past_keys is not None else None, cache_dtype, q8)
        x = x + a
        rows.append(new)
        keys.append(nk)
        hh = rms_norm(x, L["mlp_norm"])
        x = x + (swiglu_mlp(hh, L["w1w3"], L["w2"], q8) if i < cfg["first_k_dense_replace"] else moe(hh, L, cfg, q8))
    logits = xp.matmul(rms_norm(x, P["final_norm"]), xp.asarray(P["head"], F32))
    return logits, rows, keys
