"""DeepSeek-V4.1's vision stage executed op for op: the ViT tower and the aligner the ``vision`` stage prices
(:func:`graphsim.models.deepseek_v41_extras.vision_stage`, rule ``vit_attention``), bound by op kind and leaf name
(``vision.blocks.{i}.`` stripped) through :mod:`graphsim.views.collect.kernels_v41`'s dispatch.

Rows: the ``patches`` token set has its own rows (after every position and draft row, request-major, each
request's patches in raster order of its grid); the ``image`` token set is the first ``image`` new positions
of each request (*choice*: the image, then the text), whose embedding the aligner's output replaces.

What each kernel computes (fp32; GEMM inputs rounded to the op's precision when formats are emulated):

* ``gemm`` ``vision.patch_embed``: pixel patches [patches, channels·p²] (the ``pixels`` input) @ W;
  ``attn.wqkv`` / ``attn.wo`` / ``mlp.w1`` / ``mlp.w3`` / ``mlp.w2`` / ``aligner.fc1`` / ``aligner.fc2``: ``x @ W`` on
  the operand :data:`OPERAND` names (found along the data edges).
* ``norm`` ``norm1`` / ``norm2`` / ``vision.norm``: RMSNorm with the op's weight.
* ``elementwise`` ``attn.rope2d``: 2-D RoPE on q and k per head [reconstructed]: the first half of a head's
  channels rotated by the patch's row, the second half by its column (each half as half-split pairs, the
  vision config's ``rope_theta``); v unchanged. ``attn.residual`` / ``mlp.residual``: the block's input + the branch.
* ``attention`` ``attn.core``: bidirectional softmax attention among one request's patches, per head, scale
  (h/heads)^-1/2 (the priced ``full_pairs``: every patch sees every patch of its request).
* ``activation`` ``mlp.swiglu``: silu(w1) · w3; ``aligner.gelu``: GELU (tanh form: one tanh per element, as priced).
* ``data_movement`` ``aligner.unfold``: the patch grid zero-padded to multiples of r, every r×r block one image
  token (token grid in raster order) of r²·h features ordered (row in block, column in block, channel)
  [reconstructed].

The grid of a request's image is not in the plan (a request carries its image tokens and patches): it is
recovered by :func:`image_grid` — the grid with rows·cols = patches and ⌈rows/r⌉·⌈cols/r⌉ = tokens, the
squarest, rows ≤ cols on a tie. That is the processor's grid for one image whose recovery is unambiguous up to
orientation (a landscape or square image); several images per request are summed in the plan and refused
when no single grid fits.
"""
from __future__ import annotations

import math
import re

import numpy as np

from .registry import Act, Unsupported
from .formats_v41 import act_in
from .kernels_v41 import HOOKS, _v, find, groups_of, rms, sel

#: (kind, leaf) -> kernel, leaf = the op name without ``vision.blocks.{i}.`` / ``vision.``
VISION: dict = {}

#: a GEMM's operand: the op of the same block (or the tower) whose output it multiplies
OPERAND = {"attn.wqkv": "norm1", "attn.wo": "attn.core", "mlp.w1": "norm2", "mlp.w3": "norm2",
           "mlp.w2": "mlp.swiglu", "aligner.fc1": "aligner.unfold", "aligner.fc2": "aligner.gelu"}

_BLOCK = re.compile(r"^vision\.(?:blocks\.\d+\.)?")


def _leaf(op) -> str:
    return _BLOCK.sub("", op.name)


def _block(op) -> str:
    """``vision.blocks.{i}.`` (or ``vision.`` for the tower's own ops)."""
    return op.name[:len(op.name) - len(_leaf(op))]


def vis(kind: str, *leaves: str):
    def deco(fn):
        for leaf in leaves:
            VISION[(kind, leaf)] = fn
        return fn
    return deco


def vision_kernel(op):
    fn = VISION.get((op.kind, _leaf(op)))
    if fn is None:
        raise Unsupported(op, f"no vision kernel for {op.kind} op {_leaf(op)!r}")
    return fn


def image_grid(patches: int, tokens: int, r: int) -> tuple[int, int]:
    """(rows, cols) of a request's patch grid from its patch and image-token counts (see the module doc)."""
    fits = [(a, patches // a) for a in range(1, patches + 1)
            if patches % a == 0 and -(-a // r) * -(-(patches // a) // r) == tokens]
    if not fits:
        raise Unsupported(None, f"no single image grid has {patches} patches and {tokens} image tokens "
                          "(several images in one request)")
    return min(fits, key=lambda g: (abs(g[0] - g[1]), g[0] > g[1]))


def _operand(ctx, op, name: str):
    return sel(ctx, find(ctx, op, _block(op) + name), op.token_set)


def _vcfg(ctx):
    v = ctx.cfg.vision
    if v is None:
        raise Unsupported(None, "a vision stage on a config without vision_config")
    return v


# ---- GEMMs, norms, residuals ------------------------------------------------------------------------

@vis("gemm", "patch_embed")
def _patch_embed(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    pix = state["caches"].get("pixels")
    if pix is None:
        raise Unsupported(op, "no pixel patches among the inputs")
    x = jnp.concatenate([pix[gi][jnp.asarray(b), jnp.asarray(pos)] for gi, s, b, pos in groups_of(ctx, op.token_set)])
    return Act(act_in(x, op.precision) @ params[op.reads[0]].astype(jnp.float32), op.token_set)


@vis("gemm", *OPERAND)
def _gemm(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    x = _operand(ctx, op, OPERAND[_leaf(op)])
    return Act(act_in(x, op.precision) @ params[op.reads[0]].astype(jnp.float32), op.token_set)


@vis("norm", "norm1", "norm2", "norm")
def _norm(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(rms(sel(ctx, a, op.token_set), params[op.reads[0]], _v(ctx).eps), op.token_set)


@vis("elementwise", "attn.residual", "mlp.residual")
def _residual(op, ctx, inputs, state, params):
    """The sub-block's input (what its norm read) + the branch output (``attn.wo`` / ``mlp.w2``)."""
    norm = _block(op) + ("norm1" if _leaf(op) == "attn.residual" else "norm2")
    branch = "attn.wo" if _leaf(op) == "attn.residual" else "mlp.w2"
    src = ctx.preds[norm]
    if not src:
        raise Unsupported(op, f"{norm} has no input")
    return Act(sel(ctx, find(ctx, op, src[0]), op.token_set) + _operand(ctx, op, branch), op.token_set)


# ---- attention --------------------------------------------------------------------------------------

def _rot(x, pos, theta: float):
    """Half-split RoPE of all of ``x``'s last axis at positions ``pos`` [T] (x [T, H, c])."""
    import jax.numpy as jnp

    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / x.shape[-1]))
    ang = jnp.asarray(np.asarray(pos, np.float64)[:, None] * inv[None, :], jnp.float32)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * jnp.cos(ang) - b * jnp.sin(ang), a * jnp.sin(ang) + b * jnp.cos(ang)], axis=-1)


def rope2d(x, rows, cols, theta: float):
    """2-D RoPE of x [T, H, hd]: the first hd/2 channels by the row, the last hd/2 by the column."""
    import jax.numpy as jnp

    h = x.shape[-1] // 2
    return jnp.concatenate([_rot(x[..., :h], rows, theta), _rot(x[..., h:], cols, theta)], axis=-1)


def _grid_pos(ctx, gi: int, pos: np.ndarray):
    g = ctx.layout.groups[gi]
    _, cols = image_grid(g.patches, g.image, _vcfg(ctx).downsample_ratio)
    return pos // cols, pos % cols


@vis("elementwise", "attn.rope2d")
def _rope2d(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    (a,) = inputs
    x = sel(ctx, a, op.token_set)
    v = _vcfg(ctx)
    h, H = v.hidden_size, v.num_attention_heads
    theta = float(ctx.c.model.raw.get("vision_config", {}).get("rope_theta", 10000.0))
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        rows, cols = _grid_pos(ctx, gi, pos)
        xs = x[s]
        q, k = (rope2d(xs[:, i * h:(i + 1) * h].reshape(-1, H, h // H), rows, cols, theta).reshape(-1, h)
                for i in (0, 1))
        out.append(jnp.concatenate([q, k, xs[:, 2 * h:]], axis=1))
    return Act(jnp.concatenate(out, axis=0), op.token_set)


@vis("attention", "attn.core")
def _core(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    (a,) = inputs
    x = sel(ctx, a, op.token_set)
    v = _vcfg(ctx)
    h, H = v.hidden_size, v.num_attention_heads
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        g = ctx.layout.groups[gi]
        qkv = x[s].reshape(g.count, g.patches, 3, H, h // H)
        lg = jnp.einsum("bqhd,bkhd->bhqk", qkv[:, :, 0], qkv[:, :, 1]) / math.sqrt(h // H)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(lg, axis=-1), qkv[:, :, 2])
        out.append(o.reshape(g.count * g.patches, h))
    return Act(jnp.concatenate(out, axis=0), op.token_set)


# ---- MLP and aligner ----------------------------------------------------------------------------------

@vis("activation", "mlp.swiglu")
def _swiglu(op, ctx, inputs, state, params):
    import jax

    return Act(jax.nn.silu(_operand(ctx, op, "mlp.w1")) * _operand(ctx, op, "mlp.w3"), op.token_set)


@vis("activation", "aligner.gelu")
def _gelu(op, ctx, inputs, state, params):
    import jax

    (a,) = inputs
    return Act(jax.nn.gelu(sel(ctx, a, op.token_set), approximate=True), op.token_set)


@vis("data_movement", "aligner.unfold")
def _unfold(op, ctx, inputs, state, params):
    """Per request: its patch features on the grid, zero-padded to multiples of r, r×r blocks -> image tokens."""
    import jax.numpy as jnp

    (a,) = inputs
    r = _vcfg(ctx).downsample_ratio
    feats = {gi: (s, b) for gi, s, b, _ in groups_of(ctx, a.ts)}
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        g = ctx.layout.groups[gi]
        if gi not in feats:
            raise Unsupported(op, "image tokens without their patches")
        gh, gw = image_grid(g.patches, g.image, r)
        x = a.x[feats[gi][0]]
        hd = x.shape[-1]
        x = x.reshape(g.count, gh, gw, hd)
        th, tw = -(-gh // r), -(-gw // r)
        x = jnp.pad(x, ((0, 0), (0, th * r - gh), (0, tw * r - gw), (0, 0)))
        x = x.reshape(g.count, th, r, tw, r, hd).transpose(0, 1, 3, 2, 4, 5)
        out.append(x.reshape(g.count * th * tw, r * r * hd))
    return Act(jnp.concatenate(out, axis=0), op.token_set)


HOOKS["vision"] = vision_kernel
