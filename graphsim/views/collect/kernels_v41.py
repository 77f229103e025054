"""DeepSeek-V4.1-Flash executed op for op: the kernels :mod:`graphsim.views.collect.execute` binds to the op kinds of
a V4.1 graph (mHC, Engram, the CSA2 compressors and entry writers, the hierarchical indexer, Top-K, SWA +
sparse attention with sinks, MoE, quantizers, RoPE, the per-layer prefix restores from host / disk memory),
registered with its ``@kernel`` decorator.

Every kind is dispatched on the model: a V4.1 graph's op goes to its kernel here (chosen by the op's leaf
name, e.g. ``attn.wq_a`` of ``layers.7.attn.wq_a``; a ``vision.`` op to :mod:`graphsim.views.collect.kernels_vision`),
any other model's op to the kernel the kind had before (Llama / Qwen3-MoE are unchanged).

What flows along the graph's data edges is what the op computes. The V4.1 graph is priced as a chain
(``wkv`` follows ``wq_b`` in program order, it does not read it), so each kernel finds its real operand by
walking the op's data predecessors back to the producer it needs (``attn.wkv`` reads the nearest
``hc_attn.prenorm`` of its layer); caches and Top-K indices another layer wrote are read only when their
writer is an ancestor along some edge. A missing edge therefore raises :class:`Unsupported` (the
edge-deletion test of ``tests/test_exec_v41.py``), it never silently reads a stale value.

Numerics (the formats in :mod:`graphsim.views.collect.formats_v41`, DSpark's kernels in
:mod:`graphsim.views.collect.kernels_dspark`): everything computes in fp32; formats are *emulated* by rounding to the format's grid
(``EMULATE``, on by default): FP8 E4M3 with a UE8M0 (power-of-two) scale per 32 elements for activations
entering FP8 GEMMs, 32x32 weight blocks for dense FP8 weights, FP4 E2M1 + UE8M0 per 32 for routed experts,
FP4 E2M1 + E4M3 scale per 16 for the main KV, MXFP4 (E2M1 + E8M0 per 32) for index K and index Q, FP8 per 32
for the SWA KV and Engram tables, bf16 rounding for bf16 GEMM inputs and weights. [reconstructed] choices
(the public description does not fix them; the independent reference ``tests/reference/v41.py`` makes the same
ones, written separately): Engram hashes (compressed id = id mod compressed vocab; multiplicative uint32 hash
per order/head/offset); mHC logits = RMS-normalised streams @ fn, scaled per group and biased; the final
pre-mix is the mean of the streams; RoPE on the last ``qk_rope_head_dim`` channels (plain, no YaRN); a
compressed entry sits at its group's first position (``compress_rope_theta``); index scores scaled by
(Hi·Di)^-1/2; no inverse RoPE on the attention output.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import FAMILY_INITS, FAMILY_RUNS, KERNELS, Act, Unsupported, kernel
from .formats_v41 import act_in, bf16, formats, fp4_e4m3_16, fp8_block, mxfp4, np_format, swa_format, weight_format

__all__ = ["formats", "init_params", "init_caches", "carry_caches", "V41"]

# ---- small math -----------------------------------------------------------------------------------

def rms(x, w=None, eps: float = 1e-6):
    import jax.numpy as jnp

    y = x * (1.0 / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps))
    return y if w is None else y * w


def rope(x, pos, rd: int, theta: float):
    """Rotate the last ``rd`` channels of ``x`` [T, ..., D] at positions ``pos`` [T] (half-split pairs)."""
    import jax.numpy as jnp

    half = rd // 2
    inv = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / rd))
    ang = jnp.asarray(pos, jnp.float32)[:, None] * jnp.asarray(inv, jnp.float32)[None, :]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (half,)
    c, s = jnp.cos(ang).reshape(shape), jnp.sin(ang).reshape(shape)
    a, b = x[..., -rd:-half], x[..., -half:]
    return jnp.concatenate([x[..., :-rd], a * c - b * s, a * s + b * c], axis=-1)


def swiglu(a, b, limit: float):
    import jax
    import jax.numpy as jnp

    if limit:
        a, b = jnp.minimum(a, limit), jnp.clip(b, -limit, limit)
    return jax.nn.silu(a) * b


def sinkhorn(m, iters: int):
    import jax.numpy as jnp

    import jax

    def step(_, p):
        p = p / jnp.sum(p, axis=-1, keepdims=True)
        return p / jnp.sum(p, axis=-2, keepdims=True)

    return jax.lax.fori_loop(0, iters, step, jnp.exp(m - jnp.max(m, axis=(-2, -1), keepdims=True)))


# ---- graph plumbing -------------------------------------------------------------------------------

class _V41:
    """Facts of one lowering, computed once per executor context: row positions, every-edge predecessors."""

    def __init__(self, ctx):
        lay = ctx.layout
        grp, req, pos = [], [], []
        for gi, g in enumerate(lay.groups):
            grp.append(np.full(g.count * g.new, gi))
            req.append(np.repeat(np.arange(g.count), g.new))
            pos.append(np.tile(np.arange(g.past, g.past + g.new), g.count))
        # rows of a draft block (``ahead:A``) follow every new row, group-major (Layout.token_set_rows)
        ahead = [int(r.split(":")[1]) for t in ctx.g.token_sets for r in (t.prefill, t.decode) if r.startswith("ahead:")]
        self.ahead = max(ahead, default=0)
        for gi, g in enumerate(lay.groups if self.ahead else ()):
            grp.append(np.full(g.count * self.ahead, gi))
            req.append(np.repeat(np.arange(g.count), self.ahead))
            pos.append(np.tile(np.arange(g.past + g.new, g.past + g.new + self.ahead), g.count))
        # then the ViT patches (the ``patches`` rule), per request its patch index 0..patches-1
        if lay.patch_base != sum(len(x) for x in grp):
            raise Unsupported(None, f"the layout places patches at row {lay.patch_base}, "
                              f"after {sum(map(len, grp))} rows")
        for gi, g in enumerate(lay.groups):
            grp.append(np.full(g.count * g.patches, gi))
            req.append(np.repeat(np.arange(g.count), g.patches))
            pos.append(np.tile(np.arange(g.patches), g.count))
        cat = (lambda v: np.concatenate(v).astype(np.int64)) if grp else (lambda v: np.zeros(0, np.int64))
        self.grp, self.req, self.pos = cat(grp), cat(req), cat(pos)
        self.all_preds: dict[str, list[str]] = {op.name: [] for op in ctx.g.ops}
        for e in ctx.g.edges:
            self.all_preds[e.dst].append(e.src)
        self.writer = {}
        for op in ctx.g.ops:
            for t in op.writes:
                self.writer.setdefault(t, []).append(op.name)
        raw = ctx.c.model.raw
        text = raw.get("text_config", raw)
        self.theta = float(text.get("rope_theta", 10000.0))
        self.ctheta = float(text.get("compress_rope_theta", self.theta))
        self.eps = float(text.get("rms_norm_eps", 1e-6))
        self.limit = float(text.get("swiglu_limit", 0.0) or 0.0)
        self.layers = {li.layer: li for li in ctx.c.model.layers}


def _v(ctx) -> _V41:
    if not hasattr(ctx, "_v41"):
        ctx._v41 = _V41(ctx)
    return ctx._v41


def is_v41(ctx) -> bool:
    return getattr(ctx.c.model, "family", "") == "deepseek_v41"


def _split(op) -> int:
    """How many leading parts of the op's name name its block: ``layers.7.`` or ``dspark.blocks.0.``."""
    parts = op.name.split(".")
    if parts[0] == "layers":
        return 2
    return 3 if parts[:2] == ["dspark", "blocks"] else 0


def _leaf(op) -> str:
    return ".".join(op.name.split(".")[_split(op):])


def _prefix(op) -> str:
    k = _split(op)
    return ".".join(op.name.split(".")[:k]) + "." if k else ""


def _nearest(ctx, op, take, why: str):
    """The output of the nearest data-edge ancestor of ``op`` (breadth first) for which ``take(name, output)`` holds;
    :class:`Unsupported` naming ``why`` when none does — a kernel never reads a value no edge brings."""
    from collections import deque

    seen, todo = {op.name}, deque(ctx.preds[op.name])
    out = ctx._state["out"]
    while todo:
        p = todo.popleft()
        if p in seen:
            continue
        seen.add(p)
        o = out.get(p)
        if o is not None and take(p, o):
            return o
        todo.extend(ctx.preds[p])
    raise Unsupported(op, f"{why} (a missing dependency edge)")


def find(ctx, op, name: str):
    """The output of the nearest data-edge ancestor of ``op`` called ``name`` (raises if none)."""
    return _nearest(ctx, op, lambda p, o: p == name, f"no data path from {name}")


def _reaches(ctx, op, target: str) -> bool:
    from collections import deque

    preds = _v(ctx).all_preds
    seen, todo = {op.name}, deque(preds[op.name])
    while todo:
        p = todo.popleft()
        if p == target:
            return True
        if p not in seen:
            seen.add(p)
            todo.extend(preds[p])
    return False


def read_tensor(ctx, op, tensor: str, where: str = "caches"):
    """A cache / transient tensor another op wrote, only if a writer of it is an ancestor of ``op`` — and, when a
    restore copied the cached prefix of it in from host / disk memory, only if that copy is an ancestor too."""
    writers = _v(ctx).writer.get(tensor, [])
    if not any(_reaches(ctx, op, w) for w in writers):
        raise Unsupported(op, f"reads {tensor} but no writer of it is an ancestor (a missing dependency edge)")
    _restored_before(ctx, op, tensor)
    return ctx._state[where][tensor]


def _restored_before(ctx, op, tensor: str, *also: str) -> None:
    """Refuse a read of ``tensor``'s restored prefix unless the restore that copied it reaches ``op`` (or one of
    ``also``) along the graph's edges."""
    copy = ctx._state.get("restored", {}).get(tensor)
    if copy is not None and not any(_reaches(ctx, ctx.g.op(n), copy) for n in (op.name,) + also):
        raise Unsupported(op, f"reads the restored prefix of {tensor} but its copy {copy} is not an ancestor "
                          "(a missing dependency edge)")


def sel(ctx, a: Act, ts: str):
    """``a`` restricted to the rows of token set ``ts`` (arrays and tuples of arrays)."""
    import jax

    if a.ts == ts:
        return a.x
    return jax.tree.map(lambda x: ctx.select(Act(x, a.ts), ts), a.x)


def groups_of(ctx, ts: str):
    """Per request group with rows in ``ts``: (group index, slice of the set's rows, request ids, positions)."""
    v = _v(ctx)
    rows = ctx.rows[ts]
    out = []
    for gi in range(len(ctx.layout.groups)):
        idx = np.nonzero(v.grp[rows] == gi)[0]
        if len(idx):
            out.append((gi, slice(int(idx[0]), int(idx[-1]) + 1), v.req[rows[idx]], v.pos[rows[idx]]))
    return out


#: a producer name -> what stands for it in fused graphs (single-pass mHC, fused q norm + quant)
ALIASES = {"hc_attn.prenorm": ("hc_attn.fused", "hc_attn.pre"), "hc_ffn.prenorm": ("hc_ffn.fused", "hc_ffn.pre"),
           "attn.q_quant": ("attn.q_norm+quant",)}


def find_any(ctx, op, names):
    """The output of the nearest data-edge ancestor whose name is one of ``names``."""
    want = set(names)
    return _nearest(ctx, op, lambda p, o: p in want, f"no data path from {sorted(want)}")


def find_mix(ctx, op):
    """The nearest ancestor's mHC mixing (streams and their pre/post/res coefficients)."""
    return _nearest(ctx, op, lambda p, o: isinstance(o.x, dict) and "res" in o.x, "no mHC mixing among its ancestors")


def find_streams(ctx, op):
    """The nearest ancestor output that is the residual streams [rows, n, d]."""
    return _nearest(ctx, op, lambda p, o: not isinstance(o.x, (dict, tuple)) and getattr(o.x, "ndim", 0) == 3,
                    "no residual streams among its ancestors")


def _operand(ctx, op, name):
    pre = _prefix(op)
    a = find_any(ctx, op, [pre + n for n in (name,) + ALIASES.get(name, ())])
    x = sel(ctx, a, op.token_set)
    return x["h"] if isinstance(x, dict) and "h" in x else x


# ---- dispatch -------------------------------------------------------------------------------------

V41: dict[str, dict] = {}  #: op kind -> leaf name (or '*') -> kernel


def v41(kind: str, *leaves: str):
    def deco(fn):
        for leaf in leaves or ("*",):
            V41.setdefault(kind, {})[leaf] = fn
        return fn
    return deco


def _dispatch(kind: str):
    base = KERNELS.get(kind)

    def run(op, ctx, inputs, state, params):
        if not is_v41(ctx):
            if base is None:
                raise Unsupported(op, f"no executor kernel for {kind} ops")
            return base(op, ctx, inputs, state, params)
        ctx._state = state
        if op.name.startswith("vision."):  # the ViT tower and aligner (kernels_vision registers the hook)
            if "vision" not in HOOKS:
                raise Unsupported(op, "the vision kernels are not registered (import graphsim.views.collect.execute)")
            return HOOKS["vision"](op)(op, ctx, inputs, state, params)
        table = V41.get(kind, {})
        fn = table.get(_leaf(op)) or table.get(op.name) or table.get("*")
        if fn is None:
            raise Unsupported(op, f"no V4.1 kernel for {kind} op {_leaf(op)!r}")
        return fn(op, ctx, inputs, state, params)

    run.__name__ = f"v41_{kind}"
    return run


#: kernels other modules register here because they build on this module's: "draft_attention" (kernels_dspark),
#: "vision" (kernels_vision: op -> its kernel)
HOOKS: dict = {}


def _draft_attention(op, ctx, inputs, state, params):
    if "draft_attention" not in HOOKS:
        raise Unsupported(op, "DSpark's draft attention is not registered (import graphsim.views.collect.execute)")
    return HOOKS["draft_attention"](op, ctx, inputs, state, params)


# ---- embedding, head ------------------------------------------------------------------------------

@v41("embedding", "embed")
def _embed(op, ctx, inputs, state, params):
    """Token rows of the embedding table, spread over the mHC streams; a request's image positions take the
    aligner's image features instead (its data input; the ids there are ``image_token_id``)."""
    import jax.numpy as jnp

    rows = ctx.rows[op.token_set]
    ids = jnp.take(state["ids"], jnp.asarray(rows), axis=0)
    # the token history (Engram's n-grams continue it): this forward's ids at their positions
    toks = state["caches"].get("tokens")
    if toks is not None and len(rows) == ctx.layout.rows:
        out, o = [], 0
        for gi, g in enumerate(ctx.layout.groups):
            n = g.count * g.new
            out.append(toks[gi].at[:, g.past:g.past + g.new].set(state["ids"][o:o + n].reshape(g.count, g.new)))
            o += n
        state["caches"]["tokens"] = out
    e = jnp.take(params[op.reads[0]], ids, axis=0).astype(jnp.float32)
    img = _image_rows(ctx)
    if len(img):
        feats = [a for a in inputs if np.array_equal(ctx.rows[a.ts], img)]
        if not feats:
            raise Unsupported(op, "image positions but no image features among its inputs (a missing dependency edge)")
        at = np.searchsorted(rows, img)
        if at.max() >= len(rows) or not np.array_equal(rows[at], img):
            raise Unsupported(op, f"image positions outside its token set {op.token_set!r}")
        e = e.at[jnp.asarray(at)].set(feats[0].x.astype(jnp.float32))
    n = ctx.cfg.hc_mult
    return Act(jnp.repeat(e[:, None, :], n, axis=1), op.token_set)


@v41("mhc", "hc_final.premix")
def _final_premix(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(_streams(sel(ctx, a, op.token_set)).mean(axis=1), op.token_set)


@v41("norm", "final_norm")
def _final_norm(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(rms(sel(ctx, a, op.token_set), params["norm.weight"], _v(ctx).eps), op.token_set)


def _streams(x):
    return x["x"] if isinstance(x, dict) else x


def positions(ctx, ts: str):
    """Positions of the rows of ``ts``: the layout's, except that a draft block after a verification that
    rejected drafts follows the accepted prefix (``dspark.shift``, per layout row: traced, since how many
    drafts a request keeps is known only when the forward runs)."""
    import jax.numpy as jnp

    rows = ctx.rows[ts]
    pos = _v(ctx).pos[rows]
    shift = ctx._state.get("v41", {}).get("dspark.shift")
    return pos if shift is None else jnp.asarray(pos) + shift[jnp.asarray(rows)]


def _image_set():
    from graphsim.core.ir import TokenSet

    return TokenSet("image", prefill="image", decode="none")


_IMAGE_SET = _image_set()


def _image_rows(ctx) -> np.ndarray:
    """Rows of every request's image positions (the ``image`` rule: the first ``image`` new positions)."""
    return ctx.layout.token_set_rows(_IMAGE_SET)


# ---- GEMMs ----------------------------------------------------------------------------------------

#: a GEMM's real operand (the producer it reads, found along the data edges)
OPERAND = {"attn.wq_a": "hc_attn.prenorm", "attn.wq_b": "attn.q_quant", "attn.wkv": "hc_attn.prenorm",
           "attn.wo_a": "attn.sparse", "attn.wo_b": "attn.wo_a", "ffn.router": "hc_ffn.prenorm",
           "ffn.shared.w1": "hc_ffn.prenorm", "ffn.shared.w3": "hc_ffn.prenorm", "ffn.shared.w2": "ffn.shared.swiglu",
           "compressor.wkv": "hc_attn.prenorm", "compressor.wgate": "hc_attn.prenorm",
           "indexer.wq_b": "attn.q_quant", "indexer.weights_proj": "hc_attn.prenorm", "engram.proj": "engram.lookup",
           "head": "/final_norm", "attn.ctx_wkv": "/dspark.main_proj", "dspark.head": "/dspark.norm",
           "dspark.markov.proj": "/dspark.markov.embed"}


@v41("gemm")
@v41("router", "ffn.router")
@v41("compressor", "compressor.wkv", "compressor.wgate")
@v41("indexer", "indexer.wq_b", "indexer.weights_proj")
@v41("engram", "engram.proj")
def _gemm(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    leaf = _leaf(op)
    src = OPERAND.get(leaf)
    if src is None:
        raise Unsupported(op, f"no operand known for GEMM {leaf!r}")
    if src.startswith("/"):  # a producer outside the op's block
        x = sel(ctx, find(ctx, op, src[1:]), op.token_set)
    else:
        x = _operand(ctx, op, src)
    w = params[op.reads[0]]
    x = act_in(x, op.precision)
    if leaf == "attn.wo_a":  # block-diagonal per output group
        g = w.shape[0]
        y = jnp.einsum("tgk,gkn->tgn", x.reshape(x.shape[0], g, -1), w).reshape(x.shape[0], -1)
    else:
        y = x @ w
    if leaf == "indexer.wq_b":
        y = mxfp4(y)  # index Q is MXFP4 (the indexer's FP4 scoring)
    return Act(y, op.token_set)


@v41("norm", "attn.q_norm", "attn.kv_norm", "attn.ctx_kv_norm")
def _norm(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(rms(sel(ctx, a, op.token_set), params[op.reads[0]], _v(ctx).eps), op.token_set)


@v41("norm", "attn.q_norm+quant")
def _q_norm_quant(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(fp8_block(rms(sel(ctx, a, op.token_set), params[op.reads[0]], _v(ctx).eps)), op.token_set)


@v41("quant", "attn.q_quant")
def _quant(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(fp8_block(sel(ctx, a, op.token_set)), op.token_set)


@v41("activation", "ffn.shared.swiglu")
def _shared_swiglu(op, ctx, inputs, state, params):
    a = _operand(ctx, op, "ffn.shared.w1")
    b = _operand(ctx, op, "ffn.shared.w3")
    return Act(swiglu(a, b, _v(ctx).limit), op.token_set)


# ---- mHC ------------------------------------------------------------------------------------------

def _sub(op) -> str:
    return _leaf(op).split(".")[0]  # hc_attn / hc_ffn


@v41("mhc", "hc_attn.coeff", "hc_ffn.coeff")
def _coeff(op, ctx, inputs, state, params):
    (a,) = inputs  # the streams: the previous residual update, Engram, or the embedding
    if isinstance(a.x, dict):  # a DSpark block: its context-KV ops come first in program order
        a = find_streams(ctx, op)
    x = _streams(sel(ctx, a, op.token_set))
    flat = x.reshape(x.shape[0], -1)
    fn = params[op.reads[0]]
    logits = (flat @ fn.T) / jnp_sqrt_mean_sq(flat)  # fn @ RMSNorm(streams), fn [(2+n)n, n·d]
    return Act({"x": x, "mix": logits}, op.token_set)


def jnp_sqrt_mean_sq(flat, eps: float = 1e-6):
    import jax.numpy as jnp

    return jnp.sqrt(jnp.mean(flat * flat, axis=-1, keepdims=True) + eps)


@v41("mhc", "hc_attn.sinkhorn", "hc_ffn.sinkhorn")
def _sinkhorn(op, ctx, inputs, state, params):
    import jax

    (a,) = inputs
    c = sel(ctx, a, op.token_set)
    n = ctx.cfg.hc_mult
    p = _prefix(op) + _sub(op)
    base, scale = params[f"{p}.base"], params[f"{p}.scale"]
    z = c["mix"]
    pre = jax.nn.sigmoid(z[:, :n] * scale[0] + base[:n])
    post = 2.0 * jax.nn.sigmoid(z[:, n:2 * n] * scale[1] + base[n:2 * n])
    res = sinkhorn((z[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(-1, n, n), dict(op.params)["sinkhorn_iters"])
    return Act({"x": c["x"], "pre": pre, "post": post, "res": res}, op.token_set)


@v41("mhc", "hc_attn.premix", "hc_ffn.premix")
def _premix(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    (a,) = inputs
    c = sel(ctx, a, op.token_set)
    return Act(jnp.einsum("tn,tnd->td", c["pre"], c["x"]), op.token_set)


@v41("mhc", "hc_attn.prenorm", "hc_ffn.prenorm")
def _prenorm(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(fp8_block(rms(sel(ctx, a, op.token_set), params[op.reads[0]], _v(ctx).eps)), op.token_set)


def _mix_of(ctx, op):
    """The coefficients of the sub-block this residual update closes: its own Sinkhorn op (unfused graphs)
    or the nearest fused pre-mix among the ancestors (single-pass graphs)."""
    name = f"{_prefix(op)}{_sub(op)}.sinkhorn"
    if name in ctx.preds:
        return sel(ctx, find(ctx, op, name), op.token_set)
    return sel(ctx, find_mix(ctx, op), op.token_set)


def _update(c, y):
    import jax.numpy as jnp

    return jnp.einsum("tij,tjd->tid", c["res"], c["x"]) + c["post"][:, :, None] * y[:, None, :]


@v41("mhc", "hc_attn.residual", "hc_ffn.residual")
def _residual(op, ctx, inputs, state, params):
    c = _mix_of(ctx, op)
    y = sum(sel(ctx, a, op.token_set) for a in inputs)  # the branch output(s): wo_b, or shared + routed
    return Act(_update(c, y), op.token_set)


def _pre_all(op, ctx, x, params):
    """Single-pass mHC pre of a sub-block: coefficients, Sinkhorn, pre-mix and pre-norm in one op."""
    import jax
    import jax.numpy as jnp

    n = ctx.cfg.hc_mult
    fn, norm = op.reads
    p = fn.rsplit(".", 1)[0]
    flat = x.reshape(x.shape[0], -1)
    z = (flat @ params[fn].T) / jnp_sqrt_mean_sq(flat)
    base, scale = params[f"{p}.base"], params[f"{p}.scale"]
    pre = jax.nn.sigmoid(z[:, :n] * scale[0] + base[:n])
    post = 2.0 * jax.nn.sigmoid(z[:, n:2 * n] * scale[1] + base[n:2 * n])
    res = sinkhorn((z[:, 2 * n:] * scale[2] + base[2 * n:]).reshape(-1, n, n), ctx.cfg.hc_sinkhorn_iters)
    h = fp8_block(rms(jnp.einsum("tn,tnd->td", pre, x), params[norm], _v(ctx).eps))
    return {"x": x, "pre": pre, "post": post, "res": res, "h": h}


@v41("mhc", "hc_attn.pre", "hc_ffn.pre")
def _pre_op(op, ctx, inputs, state, params):
    (a,) = inputs  # the streams (embedding, Engram, or a standalone residual update)
    return Act(_pre_all(op, ctx, _streams(sel(ctx, a, op.token_set)), params), op.token_set)


@v41("mhc", "hc_attn.fused", "hc_ffn.fused")
def _fused(op, ctx, inputs, state, params):
    """The previous sub-block's residual update and this sub-block's pre in one pass."""
    c = sel(ctx, find_mix(ctx, op), op.token_set)
    y = sum(sel(ctx, a, op.token_set) for a in inputs)
    return Act(_pre_all(op, ctx, _update(c, y), params), op.token_set)


# ---- Engram ---------------------------------------------------------------------------------------

def engram_multipliers(orders, heads: int, max_order: int) -> np.ndarray:
    """[reconstructed] odd uint32 multipliers per (order, head, offset) of the multiplicative n-gram hash."""
    out = np.zeros((len(orders), heads, max_order), np.uint64)
    for i, o in enumerate(orders):
        for h in range(heads):
            for k in range(max_order):
                out[i, h, k] = ((2654435761 * (1 + 31 * o + 131 * h + 17 * k)) & 0xFFFFFFFF) | 1
    return out.astype(np.uint32)


@v41("engram", "engram.hash")
def _engram_hash(op, ctx, inputs, state, params):
    """Row ids [T, orders·heads] of each token's n-grams (the history before the forward continues them)."""
    import jax.numpy as jnp

    c = ctx.cfg
    raw = ctx.c.model.raw.get("text_config", ctx.c.model.raw)
    pad = int(raw.get("engram_pad_token_id", 0))
    orders, N = c.engram_orders, c.engram_max_ngram_size
    li = c.engram_layer_ids.index(op.layer)
    nrows = c.engram_num_embeddings[li]
    mult = jnp.asarray(engram_multipliers(orders, c.engram_n_heads, N))
    toks = state["caches"].get("tokens")  # the token history: not a graph tensor (the ids are an input)
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        hist = toks[gi] if toks is not None else None
        if hist is None:
            raise Unsupported(op, "no token history cache")
        # ids at positions pos - k (pad before the start)
        cols = []
        for k in range(N):
            p = pos - k
            t = hist[jnp.asarray(b), jnp.asarray(np.maximum(p, 0))]
            cols.append(jnp.where(jnp.asarray(p >= 0), t, pad))
        ids = jnp.stack(cols, axis=1).astype(jnp.uint32) % jnp.uint32(c.engram_compressed_vocab_size)
        keys = []
        for i, o in enumerate(orders):
            for h in range(c.engram_n_heads):
                acc = jnp.zeros(ids.shape[0], jnp.uint32)
                for k in range(o):
                    acc = acc + ids[:, k] * mult[i, h, k]
                keys.append(acc % jnp.uint32(nrows))
        out.append(jnp.stack(keys, axis=1).astype(jnp.int32))
    return Act(jnp.concatenate(out, axis=0), op.token_set)


@v41("engram", "engram.lookup")
def _engram_lookup(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    (a,) = inputs
    rows = sel(ctx, a, op.token_set)
    t = jnp.take(params[op.reads[0]], rows, axis=0)  # [T, orders·heads, hd]
    return Act(t.reshape(t.shape[0], -1), op.token_set)


@v41("engram", "engram.gate")
def _engram_gate(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    (a,) = inputs
    proj = sel(ctx, a, op.token_set)
    # the streams entering the block: what the hash op's predecessor produced
    hash_op = ctx.g.op(_prefix(op) + "engram.hash")
    srcs = ctx.preds[hash_op.name]
    if not srcs or not _reaches(ctx, op, hash_op.name):
        raise Unsupported(op, "no stream input (a missing dependency edge)")
    src = find(ctx, hash_op, srcs[0])
    x = _streams(sel(ctx, src, op.token_set))
    n, d = ctx.cfg.hc_mult, ctx.cfg.hidden_size
    gn = params[op.reads[0]]
    keys, val = proj[:, :n * d].reshape(-1, n, d), proj[:, n * d:]
    eps = _v(ctx).eps
    g = jax.nn.sigmoid(jnp.sum(rms(x, gn[0], eps) * rms(keys, gn[1], eps), axis=-1) / np.sqrt(d))
    y = x + g[:, :, None] * val[:, None, :]
    have, mine = ctx.rows[src.ts], ctx.rows[op.token_set]
    if len(have) != len(mine):  # image positions bypass Engram: the streams pass through there unchanged
        return Act(_streams(src.x).at[jnp.asarray(np.searchsorted(have, mine))].set(y), src.ts)
    return Act(y, op.token_set)


# ---- attention: RoPE, SWA write ---------------------------------------------------------------------

@v41("elementwise", "attn.rope")
def _rope(op, ctx, inputs, state, params):
    c = ctx.cfg
    q = _operand(ctx, op, "attn.wq_b")
    (a,) = inputs
    kv = sel(ctx, a, op.token_set)
    pos = positions(ctx, op.token_set)
    th, rd = _v(ctx).theta, c.qk_rope_head_dim
    q = rope(q.reshape(q.shape[0], c.num_attention_heads, c.head_dim), pos, rd, th)
    return Act({"q": q, "kv": rope(kv, pos, rd, th)}, op.token_set)


@v41("cache_write", "attn.swa_write")
def _swa_write(op, ctx, inputs, state, params):
    (a,) = inputs
    r = sel(ctx, a, op.token_set)
    name = op.writes[0]
    caches = list(state["caches"][name])
    kv = swa_format(r["kv"])
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        caches[gi] = caches[gi].at[b, pos].set(kv[s])
    state["caches"][name] = caches
    return Act(r, op.token_set)


# ---- CSA2 compressor and entry writers ----------------------------------------------------------------

@v41("compressor", "compressor.pool")
def _pool(op, ctx, inputs, state, params):
    """Softmax-gated pooling of non-overlapping groups of m positions, continuing each request's pending
    (incomplete) group; per request group: (first entry index, entries [b, e, D])."""
    import jax
    import jax.numpy as jnp

    li = _v(ctx).layers[op.layer]
    m = li.ratio
    kvp = _operand(ctx, op, "compressor.wkv")
    gp = _operand(ctx, op, "compressor.wgate")
    name = f"layers.{op.layer}.compressor.state"
    # the pool reads the restored pending rows first: the layer's restore must be its own ancestor
    _restored_before(ctx, op, name)
    st = list(state["caches"][name])
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        g = ctx.layout.groups[gi]
        if len(pos) != g.count * g.new:
            raise Unsupported(op, "a compressor over part of a group's new positions")
        P, n = g.past, g.new
        r = P % m
        skv, sg = st[gi]
        kv = jnp.concatenate([skv[:, :r], kvp[s].reshape(g.count, n, -1)], axis=1)
        gt = jnp.concatenate([sg[:, :r], gp[s].reshape(g.count, n, -1)], axis=1)
        e = (P + n) // m - P // m
        D = kv.shape[-1]
        w = jax.nn.softmax(gt[:, :e * m].reshape(g.count, e, m, D), axis=2)
        ent = jnp.sum(w * kv[:, :e * m].reshape(g.count, e, m, D), axis=2)
        left = (P + n) % m
        pad = ((0, 0), (0, m - left), (0, 0))
        st[gi] = (jnp.pad(kv[:, e * m:], pad), jnp.pad(gt[:, e * m:], pad))
        out.append((P // m, ent))
        # the rows this pool saw (pending + new, from position P - r on): a verification that rejects drafts
        # rolls the pending group back to its accepted prefix from them (kernels_dspark's commit)
        state.setdefault("v41", {}).setdefault(f"{name}.rows", {})[gi] = (P - r, kv, gt)
    state["caches"][name] = st
    return Act(tuple(out), op.token_set)


def _entries(op, ctx, inputs, state):
    """The emitted entries of a KV owner: pooled (m>1) or one per position (m=1, the plain projection)."""
    li = _v(ctx).layers[op.layer]
    (a,) = inputs
    if li.ratio > 1:
        return a.x
    x = sel(ctx, a, op.token_set)
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        g = ctx.layout.groups[gi]
        out.append((g.past, x[s].reshape(g.count, g.new, -1)))
    return tuple(out)


@v41("cache_write", "kv.quant_write")
def _kv_write(op, ctx, inputs, state, params):
    """Main KV: RoPE at the entry's first position (compress_rope_theta), FP4 E2M1 + E4M3/16, written."""
    c = ctx.cfg
    v = _v(ctx)
    m = v.layers[op.layer].ratio
    name = op.writes[0]
    caches = list(state["caches"][name])
    out = []
    gis = [gi for gi, *_ in groups_of(ctx, op.token_set)]
    for gi, (j0, ent) in zip(gis, _entries(op, ctx, inputs, state)):
        b, e, D = ent.shape
        if e == 0:
            out.append((j0, ent))
            continue
        pos = np.tile((j0 + np.arange(e)) * m, b)
        q = fp4_e4m3_16(rope(ent.reshape(b * e, D), pos, c.qk_rope_head_dim, v.ctheta)).reshape(b, e, D)
        caches[gi] = caches[gi].at[:, j0:j0 + e].set(q)
        out.append((j0, q))
    state["caches"][name] = caches
    return Act(tuple(out), op.token_set)


@v41("indexer", "indexer.k_write")
def _ik_write(op, ctx, inputs, state, params):
    (a,) = inputs
    p = f"layers.{op.layer}.attn.indexer"
    name = op.writes[0]
    caches = list(state["caches"][name])
    gis = [gi for gi, *_ in groups_of(ctx, op.token_set)]
    for gi, (j0, ent) in zip(gis, a.x):
        b, e, D = ent.shape
        if e == 0:
            continue
        k = mxfp4(rms(bf16(ent) @ params[f"{p}.wk"], params[f"{p}.k_norm"], _v(ctx).eps))
        caches[gi] = caches[gi].at[:, j0:j0 + e].set(k)
    state["caches"][name] = caches
    return Act(a.x, op.token_set)


# ---- the hierarchical indexer ---------------------------------------------------------------------

def _owner(ctx, op):
    li = _v(ctx).layers[op.layer]
    return li.kv_owner, _v(ctx).layers[li.kv_owner].ratio


@v41("indexer", "indexer.score")
def _score(op, ctx, inputs, state, params):
    """Σ_h relu(q_h·k_j)·w_h over the owner's visible entries (−inf elsewhere; candidate-limited layers
    score only the candidate pool). Per request group: [rows, entries]."""
    import jax
    import jax.numpy as jnp

    c = ctx.cfg
    owner, m = _owner(ctx, op)
    qi = _operand(ctx, op, "indexer.wq_b").reshape(-1, c.index_n_heads, c.index_head_dim)
    w = _operand(ctx, op, "indexer.weights_proj")
    ik = read_tensor(ctx, op, f"layers.{owner}.index_k")
    li = _v(ctx).layers[op.layer]
    cand = None
    if li.candidate_limited:
        src = ctx.cfg.candidate_source_layer_id
        cand = _rows_subset(ctx, _v(ctx).cand_ts[src], op.token_set,
                            read_tensor(ctx, op, f"layers.{src}.candidates", "v41"))
    scale = 1.0 / math.sqrt(c.index_n_heads * c.index_head_dim)
    out = []
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        k = ik[gi][jnp.asarray(b)]  # [rows, E, Di]
        sc = jnp.einsum("thd,ted->the", qi[s], k)
        sc = jnp.einsum("the,th->te", jax.nn.relu(sc), w[s]) * scale
        vis = jnp.asarray(np.arange(k.shape[1])[None, :] < ((pos + 1) // m)[:, None])
        if cand is not None:
            vis = vis & cand[len(out)]
        out.append(jnp.where(vis, sc, -jnp.inf))
    return Act(tuple(out), op.token_set)


@v41("indexer", "indexer.block_max")
def _block_max(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    (a,) = inputs
    B = ctx.cfg.candidate_block_size
    out = []
    for sc in a.x:
        E = sc.shape[1]
        nb = -(-E // B)
        pad = jnp.pad(sc, ((0, 0), (0, nb * B - E)), constant_values=-jnp.inf)
        out.append((sc, jnp.max(pad.reshape(sc.shape[0], nb, B), axis=-1)))
    return Act(tuple(out), op.token_set)


@v41("indexer", "indexer.candidates")
def _candidates(op, ctx, inputs, state, params):
    """Keep ≤ candidate_topk_blocks blocks by block max, the newest visible block always; a mask over
    entries per row (written for the Reindex layers)."""
    import jax
    import jax.numpy as jnp

    (a,) = inputs
    c = ctx.cfg
    B, C = c.candidate_block_size, c.candidate_topk_blocks
    _, m = _owner(ctx, op)
    masks, scores = [], []
    for (gi, s, b, pos), (sc, bm) in zip(groups_of(ctx, op.token_set), a.x):
        nb = bm.shape[1]
        newest = jnp.asarray(((pos + 1) // m - 1) // B)  # block of the newest visible entry
        boost = jnp.where(jnp.arange(nb)[None, :] == newest[:, None], jnp.inf, bm)
        k = min(C, nb)
        top, idx = jax.lax.top_k(boost, k)
        keep = jnp.zeros(bm.shape, bool).at[jnp.arange(bm.shape[0])[:, None], idx].set(top > -jnp.inf)
        E = sc.shape[1]
        masks.append(jnp.repeat(keep, B, axis=1)[:, :E])
        scores.append(sc)
    state.setdefault("v41", {})[op.writes[0]] = tuple(masks)
    v = _v(ctx)
    if not hasattr(v, "cand_ts"):
        v.cand_ts = {}
    v.cand_ts[op.layer] = op.token_set
    return Act(tuple(scores), op.token_set)


@v41("topk", "indexer.topk")
def _topk(op, ctx, inputs, state, params):
    """Top-K entries per row among the scored ones (fewer when fewer are visible): (indices, valid)."""
    import jax
    import jax.numpy as jnp

    (a,) = inputs
    K = ctx.cfg.index_topk
    out = []
    for sc in a.x:
        if isinstance(sc, tuple):
            sc = sc[0]
        k = min(K, sc.shape[1])
        top, idx = jax.lax.top_k(sc, k)
        out.append((idx, top > -jnp.inf))
    state.setdefault("v41", {})[op.writes[0]] = tuple(out)
    v = _v(ctx)
    if not hasattr(v, "topk_ts"):
        v.topk_ts = {}
    v.topk_ts[op.layer] = op.token_set
    return Act(tuple(out), op.token_set)


# ---- SWA + sparse attention with sinks -------------------------------------------------------------

def _rows_subset(ctx, have_ts: str, want_ts: str, per_group: tuple):
    """Per-group row arrays of ``have_ts`` restricted to the rows of ``want_ts``."""
    import jax.numpy as jnp

    if have_ts == want_ts:
        return per_group
    have = {gi: (s, ctx.rows[have_ts][s]) for gi, s, *_ in groups_of(ctx, have_ts)}
    out = []
    for gi, s, *_ in groups_of(ctx, want_ts):
        hs, hrows = have[gi]
        want = ctx.rows[want_ts][s]
        pos = np.searchsorted(hrows, want)
        if pos.max(initial=0) >= len(hrows) or not np.array_equal(hrows[pos], want):
            raise Unsupported(None, f"rows of {want_ts!r} are not a subset of {have_ts!r}")
        gidx = [g for g, *_ in groups_of(ctx, have_ts)].index(gi)
        out.append(_tree_take(per_group[gidx], jnp.asarray(pos)))
    return tuple(out)


def _tree_take(x, idx):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda a: jnp.take(a, idx, axis=0), x)


@v41("attention", "attn.sparse")
def _sparse_attention(op, ctx, inputs, state, params):
    """Each query: the last W SWA slots (FP8) + its Top-K compressed entries (FP4, dequantized) of the KV
    owner, MQA (one latent as K and V), scale D^-1/2, a per-head sink in the softmax denominator."""
    import jax
    import jax.numpy as jnp

    if op.name.startswith("dspark."):
        return _draft_attention(op, ctx, inputs, state, params)
    c = ctx.cfg
    v = _v(ctx)
    li = v.layers[op.layer]
    r = _operand(ctx, op, "attn.rope")
    q = r["q"]
    W, H, D = c.sliding_window, c.num_attention_heads, c.head_dim
    swa = read_tensor(ctx, op, op.reads[0])
    sink = params[f"layers.{op.layer}.attn.sink"]
    topk = kvc = None
    if li.kv_owner is not None:
        kvc = read_tensor(ctx, op, f"layers.{li.kv_owner}.kv")
        topk = _rows_subset(ctx, v.topk_ts[li.topk_producer], op.token_set,
                            read_tensor(ctx, op, f"layers.{li.topk_producer}.topk", "v41"))
    start = _swa_start(ctx, op)
    outs = []
    for n_g, (gi, s, b, pos) in enumerate(groups_of(ctx, op.token_set)):
        bj = jnp.asarray(b)
        kp = pos[:, None] - np.arange(W)[None, ::-1]  # [rows, W] positions
        ok = (kp >= np.maximum(0, start[gi])) if start is not None else (kp >= 0)
        ks = swa[gi][bj[:, None], jnp.asarray(np.maximum(kp, 0))]
        keys, valid = [ks], [jnp.asarray(ok)]
        if kvc is not None:
            idx, val = topk[n_g]
            keys.append(kvc[gi][bj[:, None], idx])
            valid.append(val)
        k = jnp.concatenate(keys, axis=1)  # [rows, S, D]
        ok = jnp.concatenate(valid, axis=1)
        lg = jnp.einsum("thd,tsd->ths", q[s], k) / math.sqrt(D)
        lg = jnp.where(ok[:, None, :], lg, -jnp.inf)
        mx = jnp.maximum(jnp.max(lg, axis=-1), sink[None, :])
        p = jnp.exp(lg - mx[..., None])
        den = jnp.sum(p, axis=-1) + jnp.exp(sink[None, :] - mx)
        o = jnp.einsum("ths,tsd->thd", p, k) / den[..., None]
        outs.append(o.reshape(o.shape[0], H * D))
    del jax
    return Act(jnp.concatenate(outs, axis=0) if len(outs) > 1 else outs[0], op.token_set)


def _swa_start(ctx, op):
    """Per group, the first position whose SWA entry a query may read: 0, or the replay tail's start when
    decoder bounded replay truncates the SWA history there (a ``dtail`` token set)."""
    ts = next(t for t in ctx.g.token_sets if t.name == op.token_set)
    out, any_ = [], False
    for g in ctx.layout.groups:
        rule = ts.rule(g.kind).removeprefix("replay+")
        if rule.startswith("dtail:"):
            w = int(rule.split(":")[1])
            out.append(g.past + g.new - min(g.new, w))
            any_ = True
        else:
            out.append(0)
    return out if any_ else None


# ---- MoE --------------------------------------------------------------------------------------------

@v41("router", "ffn.route")
def _route(op, ctx, inputs, state, params):
    """sqrt-softplus scores; top-k on score + correction bias; weights = normalised scores × route scale."""
    import jax
    import jax.numpy as jnp

    (a,) = inputs
    c = ctx.cfg
    logits = sel(ctx, a, op.token_set)
    sc = jnp.sqrt(jax.nn.softplus(logits))
    k = c.dspark_num_experts_per_tok if op.name.startswith("dspark.") else c.num_experts_per_tok
    _, ids = jax.lax.top_k(sc + params[op.reads[0]], k)
    w = jnp.take_along_axis(sc, ids, axis=1)
    w = w / jnp.sum(w, axis=-1, keepdims=True) * c.routed_scaling_factor
    return Act((w, ids), op.token_set)


@v41("moe_experts", "ffn.experts")
def _experts(op, ctx, inputs, state, params):
    """Routed SwiGLU experts (FP4 weights), FP8 block-32 activations, weighted sum over the token's top-k."""
    import jax.numpy as jnp

    (a,) = inputs
    w, ids = sel(ctx, a, op.token_set)
    x = fp8_block(_operand(ctx, op, "hc_ffn.prenorm"))
    w1, w3, w2 = (params[t] for t in op.reads)
    h1 = jnp.einsum("td,tkdf->tkf", x, w1[ids])
    h3 = jnp.einsum("td,tkdf->tkf", x, w3[ids])
    h = fp8_block(swiglu(h1, h3, _v(ctx).limit))
    y = jnp.einsum("tkf,tkfd->tkd", h, w2[ids])
    return Act(jnp.einsum("tk,tkd->td", w, y), op.token_set)


#: the caches key prefix of a tensor's offloaded copy (per request group: the cached prefix a hit in host or disk
#: memory holds; zero positions for groups whose prefix is on the device)
OFFLOADED = "offloaded:"


def restored_tensors(li) -> tuple:
    """The cache tensors of a layer a prefix restore copies (the ``prefix_restore`` rule's terms): its SWA
    window and, on a KV owner, the main KV, the index K and (m > 1) the pending compressor rows."""
    L = li.layer
    out = (f"layers.{L}.swa",)
    if li.kv_source:
        out += (f"layers.{L}.kv", f"layers.{L}.index_k")
        if li.ratio > 1:
            out += (f"layers.{L}.compressor.state",)
    return out


@v41("host_copy")
def _host_copy(op, ctx, inputs, state, params):
    """A layer's prefix restore: for every request group whose hit lives in host or disk memory, copy the kept
    last min(cached, W) SWA entries and, on a KV owner, the cached//m completed main-KV and index-K entries and
    the cached mod m pending compressor rows from the offloaded copy into the device caches (the bytes the
    ``prefix_restore`` rule prices; a disk hit is held like a host one: a program cannot read NVMe). Records
    which op restored each tensor, so a reader that no edge orders after the copy is refused."""
    hits = [gi for gi, g in enumerate(ctx.layout.groups) if g.tier != "hbm" and g.past]
    if not hits:
        return None
    li = _v(ctx).layers[op.layer]
    W, m = ctx.cfg.sliding_window, max(li.ratio, 1)
    for name in restored_tensors(li):
        dev, off = list(state["caches"][name]), state["caches"][OFFLOADED + name]
        for gi in hits:
            P = ctx.layout.groups[gi].past
            if name.endswith(".compressor.state"):  # (kv rows, gate rows): the pending group's first P mod m
                r = P % m
                dev[gi] = tuple(d.at[:, :r].set(o[:, :r]) for d, o in zip(dev[gi], off[gi]))
                continue
            lo, hi = (max(0, P - W), P) if name.endswith(".swa") else (0, P // m)
            dev[gi] = dev[gi].at[:, lo:hi].set(off[gi][:, lo:hi])
        state["caches"][name] = dev
        state.setdefault("restored", {})[name] = op.name
    return None


# ---- params and caches ------------------------------------------------------------------------------

def init_params(compiled, seed: int = 0) -> dict:
    """Every weight of the V4.1 inventory (checkpoint names), random, rounded to its storage format."""
    import jax.numpy as jnp

    from graphsim.models import deepseek_v41 as sem

    cfg = compiled.model.cfg
    rng = np.random.default_rng(seed)
    out = {}
    for sp in sem.weight_specs(cfg):
        name, shape, leaf = sp.name, sp.shape, sp.name.rsplit(".", 1)[1]
        if leaf in ("attn_norm", "ffn_norm", "q_norm", "kv_norm", "k_norm", "gate_norm") or name == "norm.weight" \
                or name.endswith(".norm"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf == "bias":
            w = 0.1 * rng.standard_normal(shape)
        elif leaf == "sink":
            w = rng.standard_normal(shape)
        elif leaf == "base":
            w = 0.5 * rng.standard_normal(shape)
        elif leaf == "scale":
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif leaf == "fn":
            w = rng.standard_normal(shape) / math.sqrt(shape[1])
        elif name in ("embed.weight",) or leaf == "table":
            w = rng.standard_normal(shape)
        elif len(shape) >= 2:
            w = rng.standard_normal(shape) / math.sqrt(shape[-2])
        else:
            w = rng.standard_normal(shape)
        out[name] = jnp.asarray(weight_format(np.asarray(w, np.float32), sp.format))
    return out


def init_caches(exe, seed: int = 1) -> dict:
    """Random history for the cached positions (and room for the new ones), per request group: every
    layer's SWA KV (FP8), each KV owner's main KV (FP4) / index K (MXFP4) / pending compressor rows, and
    the token ids (Engram's n-gram history). A group whose prefix hit lives in host or disk memory holds its
    history in the offloaded copy (``OFFLOADED + name``, what a restore copies in) and other random values on
    the device; every other group's offloaded copy is empty. A group with image patches gets random pixel
    patches [count, patches, channels·p²] (``pixels``: like the ids, an input, not a graph tensor)."""
    import jax
    import jax.numpy as jnp

    c = exe.compiled.model.cfg
    layers = exe.compiled.model.layers
    rng = np.random.default_rng(seed)
    out: dict = {}
    groups = exe.layout.groups

    def per_group(fn):
        return tuple(fn(g) for g in groups)

    def rnd(shape, kind=None):
        x = rng.standard_normal(shape).astype(np.float32)
        return jnp.asarray(np_format(x, kind) if kind else x)

    out["tokens"] = per_group(lambda g: jnp.asarray(rng.integers(0, c.vocab_size, (g.count, g.past + g.new)), jnp.int32))
    D, Di = c.head_dim, c.index_head_dim
    for li in layers:
        L = li.layer
        out[f"layers.{L}.swa"] = per_group(lambda g: rnd((g.count, g.past + g.new, c.kv_dim), "swa"))
        if li.kv_source:
            m = li.ratio
            out[f"layers.{L}.kv"] = per_group(lambda g: rnd((g.count, (g.past + g.new) // m, D), "kv"))
            out[f"layers.{L}.index_k"] = per_group(lambda g: rnd((g.count, (g.past + g.new) // m, Di), "ik"))
            if m > 1:
                out[f"layers.{L}.compressor.state"] = per_group(lambda g: (rnd((g.count, m, D)), rnd((g.count, m, D))))
    for j in range(c.n_dspark_blocks):  # the drafter's SWA-only blocks (written only when DSpark runs)
        out[f"dspark.blocks.{j}.swa"] = per_group(lambda g: rnd((g.count, g.past + g.new, c.kv_dim), "swa"))
    kinds = {"swa": "swa", "kv": "kv", "index_k": "ik", "state": None}
    for li in layers if any(g.tier != "hbm" for g in groups) else ():  # offloaded prefixes: a host / disk
        for name in restored_tensors(li):  # hit's history (empty for the other groups)
            kind = kinds[name.rsplit(".", 1)[1]]
            out[OFFLOADED + name] = tuple(
                jax.tree.map(lambda a: rnd(a.shape, kind) if g.tier != "hbm" else a[:, :0], d)
                for g, d in zip(groups, out[name]))
    if any(g.patches for g in groups):
        v = c.vision
        out["pixels"] = per_group(lambda g: rnd((g.count, g.patches, v.patch_dim)))
    for op in exe.compiled.graph.ops:  # a cache this graph writes that has no layout here
        for t in op.writes:
            if t.endswith((".swa", ".kv", ".index_k")) and t not in out:
                raise Unsupported(op, f"no cache layout for {t}")
    return out


def carry_caches(prev: dict, exe, groups: dict | None = None) -> dict:
    """Caches for ``exe`` whose request groups continue earlier ones (``groups``: new group index -> the
    previous forward's group index; default the same index for every group): the previous contents copied
    in, room for the new positions — a real decode after a real prefill, a prompt's next chunk, a decode
    inside a mixed batch. Groups not listed start from random history. A group whose prefix hit this plan puts
    in host or disk memory gets the previous contents in its offloaded copy (the device caches keep random
    values until its restore copies them in); the token history is the prompt's, carried as it is."""
    import jax.numpy as jnp

    fresh = init_caches(exe, 0)
    groups = {gi: gi for gi in range(len(exe.layout.groups))} if groups is None else groups
    out = dict(fresh)
    for name, per in fresh.items():
        if name.startswith(OFFLOADED) or name == "pixels":  # filled below / a new input
            continue
        off = OFFLOADED + name in fresh
        new, kept = [], list(fresh.get(OFFLOADED + name, ()))
        for gi, arr in enumerate(per):
            if gi not in groups:
                new.append(arr)
                continue
            if off and exe.layout.groups[gi].tier != "hbm":  # the prefix lives offloaded: carry it there
                kept[gi] = _carried(prev[name][groups[gi]], kept[gi])
                new.append(arr)
                continue
            new.append(_carried(prev[name][groups[gi]], arr))
        out[name] = tuple(new)
        if off:
            out[OFFLOADED + name] = tuple(kept)
    return out


def _carried(o, arr):
    """The previous contents ``o`` in a buffer shaped like ``arr`` (room for the new positions)."""
    import jax.numpy as jnp

    if isinstance(arr, tuple):  # compressor pending rows: same shape
        return tuple(jnp.array(x, copy=True) for x in o)  # a copy: two groups may continue one
    n = min(o.shape[1], arr.shape[1])
    return arr.at[:, :n].set(o[:, :n].astype(arr.dtype))


def init_ids(exe, seed: int = 2):
    """Uniform random token ids; a request's image positions hold ``image_token_id`` (HF's placeholder; the
    embedding takes the aligner's features there, Engram's history sees the placeholder)."""
    import jax
    import jax.numpy as jnp

    c = exe.compiled.model.cfg
    ids = jax.random.randint(jax.random.PRNGKey(seed), (exe.layout.rows,), 0, c.vocab_size, jnp.int32)
    img = exe.layout.token_set_rows(_IMAGE_SET)
    if len(img):
        tok = exe.compiled.model.raw.get("image_token_id")
        if tok is None:
            raise Unsupported(None, "an image request on a config without image_token_id")
        ids = ids.at[jnp.asarray(img)].set(int(tok))
    return ids


for _kind in ("embedding", "norm", "gemm", "activation", "router", "moe_experts", "cache_write", "attention",
              "host_copy", "mhc", "engram", "compressor", "indexer", "topk", "quant", "elementwise", "sampling",
              "data_movement"):
    kernel(_kind)(_dispatch(_kind))
FAMILY_INITS["deepseek_v41"] = {"params": init_params, "caches": init_caches, "ids": init_ids}
FAMILY_RUNS["deepseek_v41"] = frozenset({"images", "restores"})

