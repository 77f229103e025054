"""The JAX kernels graphsim runs locally — one implementation of each, shared by the op collector
(``graphsim collect ops``, the OP view's tables) and the forward executor (``graphsim collect forward``, the
FPM samples), so an op timed alone and the same op inside a forward are the same code (the seed's rule: the
direct op query and the whole forward call one implementation).

Every kernel computes in fp32 where precision matters (accumulation, norms, softmax) and returns fp32; the
caller casts to the storage dtype the priced op writes.
"""
from __future__ import annotations

import numpy as np

#: graphsim compute precision -> the JAX dtype a kernel's inputs are cast to
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32", "fp8": "float8_e4m3fn"}


def matmul(x, w, dtype):
    """``x @ w`` with both operands in ``dtype`` and fp32 accumulation (what a model's linear layers ask of
    the backend; on a CPU with matrix units this is also the fast bf16 path)."""
    import jax.numpy as jnp

    return jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def rmsnorm(x, gamma, eps: float = 1e-6):
    """RMSNorm over the last axis in fp32, scaled by ``gamma``."""
    import jax.numpy as jnp

    xf = x.astype(jnp.float32)
    r = jnp.reciprocal(jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps))
    return xf * r * gamma.astype(jnp.float32)


#: activation name -> the elementwise function of a gated MLP's gate
GATES = {"silu": "silu", "swigluoai": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}


def activation_fn(act: str):
    import jax

    name = GATES.get(act)
    if name is None:
        return None
    return {"silu": jax.nn.silu, "gelu": lambda v: jax.nn.gelu(v, approximate=False),
            "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True)}[name]


def gated(gu, act: str = "silu"):
    """``act(gate) * up`` of a gate|up row [..., 2e] -> [..., e], in fp32."""
    import jax.numpy as jnp

    e = gu.shape[-1] // 2
    f = gu.astype(jnp.float32)
    return activation_fn(act)(f[..., :e]) * f[..., e:]


def gqa_attention(q, kc, vc, past: int, new: int, window: int = 0):
    """Causal (optionally sliding-window) GQA of one request group: ``q`` [b, new, H, d] over the cache
    ``kc``/``vc`` [b, past + new, Hkv, d] whose last ``new`` positions are this forward's keys; query i sits
    at position past + i. Softmax in fp32; returns [b, new, H, dv] in fp32.

    Only keys some query can see are read: with a window W the cache is read from position past + 1 − W on
    (a decode step reads its last W positions), and a prompt without a prefix longer than 2W is computed in
    query blocks of W against their own and the previous key block (the visible band), not as a full score
    matrix."""
    import jax
    import jax.numpy as jnp

    b, _, H, d = q.shape
    Hkv = kc.shape[2]
    G = H // Hkv
    scale = 1.0 / np.sqrt(d)
    if window and past == 0 and new > 2 * window:
        return _banded(q, kc, vc, window, scale)
    lo = max(0, past + 1 - window) if window else 0
    kc, vc = kc[:, lo:], vc[:, lo:]
    qg = q.reshape(b, new, Hkv, G, d)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qg, kc, preferred_element_type=jnp.float32) * scale
    qpos = past + np.arange(new)[:, None]
    kpos = lo + np.arange(kc.shape[1])[None, :]
    mask = kpos <= qpos
    if window:
        mask &= kpos > qpos - window
    p = jax.nn.softmax(jnp.where(jnp.asarray(mask), s, -jnp.inf), axis=-1)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(vc.dtype), vc, preferred_element_type=jnp.float32)
    return o.reshape(b, new, H, vc.shape[-1])


def _banded(q, k, v, W: int, scale: float):
    """Sliding-window causal attention of a prompt (no prefix) in query blocks of W rows, each against its own
    and the previous key block."""
    import jax
    import jax.numpy as jnp

    b, s, H, d = q.shape
    hk = k.shape[2]
    g = H // hk
    nb = -(-s // W)
    pad = nb * W - s
    qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, nb, W, hk, g, d)

    def blocks(x):  # [b, s, hk, d] -> [b, nb, 2W, hk, d]: the previous and the own key block per query block
        xp = jnp.pad(x, ((0, 0), (W, pad), (0, 0), (0, 0))).reshape(b, nb + 1, W, hk, x.shape[-1])
        return jnp.concatenate([xp[:, :-1], xp[:, 1:]], axis=2)

    kb, vb = blocks(k), blocks(v)
    sc = jnp.einsum("bnqhgd,bnkhd->bnhgqk", qp, kb, preferred_element_type=jnp.float32) * scale
    blk = np.arange(nb)[:, None, None]
    qi = blk * W + np.arange(W)[None, :, None]
    kj = (blk - 1) * W + np.arange(2 * W)[None, None, :]
    mask = (kj <= qi) & (qi - kj < W) & (kj >= 0)  # [nb, W, 2W]
    p = jax.nn.softmax(jnp.where(jnp.asarray(mask)[None, :, None, None], sc, -jnp.inf), axis=-1)
    o = jnp.einsum("bnhgqk,bnkhd->bnqhgd", p.astype(v.dtype), vb, preferred_element_type=jnp.float32)
    return o.reshape(b, nb * W, H, v.shape[-1])[:, :s]


def _block_rows(slots: int, experts: int) -> int:
    """Rows per block of the grouped GEMM: about the mean slots per expert, a power of two in [1, 64]."""
    mean = max(1, -(-slots // experts))
    return int(min(64, 1 << (mean - 1).bit_length()))


def grouped_experts(x, w, ids, wu, wd, act: str = "silu", dtype="bfloat16"):
    """Routed experts as a block-grouped GEMM: ``x`` [T, h], routing weights ``w`` and expert ids ``ids``
    [T, k], stacked weights ``wu`` [E, h, 2i] (gate | up) and ``wd`` [E, i, h]. The T·k slots are sorted
    by expert, each expert's slots padded to whole blocks of B rows, every block multiplied by its expert's
    weights (gathered per block: up to twice the distinct experts' bytes); outputs are weighted and summed
    per token. Returns [T, h] in fp32."""
    import jax.numpy as jnp

    T, k = ids.shape
    E = wu.shape[0]
    S = T * k
    B = _block_rows(S, E)
    nb = -(-S // B) + E  # an upper bound on blocks once each expert's slots are padded to whole blocks
    flat = ids.reshape(-1)
    order = jnp.argsort(flat)
    sorted_e = flat[order]
    counts = jnp.bincount(flat, length=E)
    padded = (counts + B - 1) // B * B
    start = jnp.cumsum(padded) - padded
    rank = jnp.arange(S) - (jnp.cumsum(counts) - counts)[sorted_e]
    dest = start[sorted_e] + rank  # row of each sorted slot in the padded layout
    token = order // k
    xb = jnp.zeros((nb * B, x.shape[1]), x.dtype).at[dest].set(jnp.take(x, token, axis=0))
    block_e = jnp.clip(jnp.searchsorted(jnp.cumsum(padded), jnp.arange(nb) * B, side="right"), 0, E - 1)
    h = jnp.einsum("nbk,nkf->nbf", xb.reshape(nb, B, -1).astype(dtype), jnp.take(wu, block_e, axis=0).astype(dtype),
                   preferred_element_type=jnp.float32)
    h = gated(h, act).astype(dtype)
    y = jnp.einsum("nbf,nfk->nbk", h, jnp.take(wd, block_e, axis=0).astype(dtype), preferred_element_type=jnp.float32)
    y = y.reshape(nb * B, -1)[dest] * w.reshape(-1)[order][:, None]
    return jnp.zeros((T, x.shape[1]), jnp.float32).at[token].add(y)
