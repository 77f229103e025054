"""Run graphsim's own compiled graph as a JAX program: the ops the SOL view prices, executed op for op.

:func:`lower_to_jax` walks ``compiled.graph.ops`` in program order and binds each op to a kernel chosen by
its kind and typed facts (``Op.info``) — the same object the cost program priced, so the three views (SOL,
OP, FPM) share one model semantics. Data flows along the graph's data edges; an op's rows are its token
set's positions, computed per request for the plan's request groups (so a prefill's head reads only the
last position of each prompt, as the priced op does). Weights are random (one array per weight tensor of
the graph, shared by every op that reads it), KV caches hold random (initialised, never all-zero) history
for the cached positions, token ids are uniform random.

What each kernel does (the numerics live in :mod:`graphsim.views.collect.kernels`, shared with the op collector;
where they differ from a production kernel is said there and here):

* ``embedding`` gathers rows of the table; ``norm`` of the model width is a fused residual add + RMSNorm
  (the residual stream is carried between layers, vLLM's ``fused_add_rms_norm``); a narrower ``norm`` after
  a QKV projection is the per-head Q/K norm.
* ``gemm``: ``x @ W`` at the op's precision (bf16 / fp16 / fp32 / fp8 inputs, fp32 accumulation).
* ``activation``: gated SiLU/GELU (``act(g) * u``) or ReLU²; ``router``: softmax/sigmoid + top-k.
* ``cache_write`` writes the new K/V rows into the layer's cache at each request's position (in place: the
  caches are donated) and passes Q on; ``attention`` is causal / sliding-window GQA over cache + new keys,
  softmax in fp32 (a reference kernel, not a flash kernel: it materialises the scores).
* ``moe_experts``: a block-grouped GEMM — slots sorted by expert, each expert's slots padded to blocks of
  ``B`` rows, each block multiplied by its expert's weights (gathered per block) — then the weighted combine.
* A ``host_copy`` with no positions (no prefix in host memory) does nothing; a family that keeps its
  offloaded prefixes (:data:`FAMILY_RUNS` ``"restores"``) copies them back into the device caches.

A model family may bring its own kernels and initialisers (``kernel(..., family=)``, :data:`FAMILY_INITS`),
bound before the generic ones: DeepSeek-V3 / V3.2 (MLA, DSA, V3 routing, FP8 blocks) in
:mod:`graphsim.views.collect.kernels_mla`; a DeepSeek-V4.1 graph's ops (mHC, Engram, compressors, indexer, Top-K, sparse
attention, DSpark) in :mod:`graphsim.views.collect.kernels_v41`.

A family runs image requests (its vision stage) and prefix hits in host / disk memory only where it says so in
:data:`FAMILY_RUNS` (DeepSeek-V4.1: both, in :mod:`graphsim.views.collect.kernels_vision` and
:mod:`graphsim.views.collect.kernels_v41`). Anything else — collectives (one device runs mapping 1), other sparse
attention, recurrent mixers, another family's vision — raises :class:`Unsupported` naming the op: the forward
is recorded as an ``unsupported`` sample.
"""
from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from graphsim.core.errors import GraphsimError, require
from graphsim.core.ir import Op

from .registry import (FAMILY_INITS, FAMILY_KERNELS, FAMILY_RUNS, INPUT_OPS, KERNELS, Act, Unsupported,  # noqa: F401
                       kernel)
from .kernels import DTYPES, activation_fn, gated, gqa_attention, grouped_experts, matmul, rmsnorm


# ---- the request layout: which rows each token set covers --------------------------------------------

@attrs.frozen
class Group:
    kind: str  # prefill / decode
    count: int
    new: int  # positions processed per request
    past: int  # positions already cached per request
    image: int = 0  # image tokens per request: the first ``image`` new positions (*choice*: image, then the text)
    patches: int = 0  # ViT patches per request (rows of the ``patches`` token set, after every position row)
    tier: str = "hbm"  # where the cached prefix lives (host / disk: a restore copies it in)


@attrs.frozen(eq=False)
class Layout:
    """The plan's request groups flattened into token rows (group-major, then request, then position)."""

    groups: tuple
    ahead: int = 0  #: the longest draft block (``ahead:A`` rule) of the graph: its rows follow the new positions

    @property
    def rows(self) -> int:
        return sum(g.count * g.new for g in self.groups)

    @property
    def patch_base(self) -> int:
        """First row of the ViT patches: after every new position and every draft-block row."""
        return self.rows + self.ahead * sum(g.count for g in self.groups)

    def offsets(self) -> list[int]:
        out, o = [], 0
        for g in self.groups:
            out.append(o)
            o += g.count * g.new
        return out

    def token_set_rows(self, ts) -> np.ndarray:
        """Row indices (into the 'all new positions' rows) a token set covers, per its rule per kind."""
        idx = []
        for gi, (g, off) in enumerate(zip(self.groups, self.offsets())):
            rule = ts.rule(g.kind)
            if rule.startswith("replay+"):  # a hit with its SWA window replays nothing (hits without it are refused)
                rule = rule[len("replay+"):]
            if rule == "none" or rule.startswith("cached"):
                continue  # cached positions are not new rows: a restore with an HBM prefix copies nothing
            if rule == "all":
                idx.append(off + np.arange(g.count * g.new))
            elif rule in ("text", "image"):  # per request, the first ``image`` new positions are the image's
                j = np.arange(g.new)
                keep = j >= g.image if rule == "text" else j < g.image
                idx.append(off + (np.arange(g.count)[:, None] * g.new + j[keep][None, :]).ravel())
            elif rule == "patches":  # ViT patch rows: their own row range, per request its patches
                base = self.patch_base + sum(h.count * h.patches for h in self.groups[:gi])
                idx.append(base + np.arange(g.count * g.patches))
            elif rule.startswith(("tail:", "dtail:")):  # the last min(new, W) positions of each request
                w = min(g.new, int(rule.split(":")[1]))
                idx.append(off + (np.arange(g.count)[:, None] * g.new + np.arange(g.new - w, g.new)[None, :]).ravel())
            elif rule.startswith("ahead:"):  # a draft block after the new positions: rows after all new ones
                a = int(rule.split(":")[1])
                base = self.rows + a * sum(h.count for h in self.groups[:gi])
                idx.append(base + np.arange(g.count * a))
            elif rule == "one":
                idx.append(off + np.arange(g.count) * g.new + g.new - 1)
            else:
                raise Unsupported(None, f"token set {ts.name!r} rule {rule!r} ({g.kind}) has no executor")
        return np.concatenate(idx).astype(np.int64) if idx else np.zeros(0, np.int64)


def layout_of(plan) -> Layout:
    """The executor's layout of a plan's requests; refuses what one local forward cannot hold."""
    groups = []
    for r in plan.requests:
        if r.image_tokens and not r.image_patches:
            raise Unsupported(None, "image tokens encoded by an earlier chunk (the executor encodes a request's "
                              "image in the forward that carries its patches)")
        tier = r.tier if r.kind == "prefill" and r.cached else "hbm"
        if tier != "hbm" and not r.swa_cached:
            raise Unsupported(None, f"a prefix hit in {tier} memory without its SWA window (encoder replay)")
        groups.append(Group(r.kind, r.count, r.new_tokens, r.past_tokens, r.image_tokens, r.image_patches, tier))
    return Layout(tuple(groups))


# ---- values flowing along data edges -----------------------------------------------------------------

class _Ctx:
    """Static facts the kernels read while the program is traced."""

    def __init__(self, compiled, layout: Layout):
        self.c = compiled
        self.g = compiled.graph
        self.layout = layout
        self.cfg = compiled.model.cfg
        self.rows = {ts.name: layout.token_set_rows(ts) for ts in self.g.token_sets
                     if any(op.token_set == ts.name for op in self.g.ops)}
        self.preds: dict[str, list[str]] = {op.name: [] for op in self.g.ops}
        self.succs: dict[str, list[str]] = {op.name: [] for op in self.g.ops}
        for e in self.g.edges:
            if e.kind == "data":
                self.preds[e.dst].append(e.src)
                self.succs[e.src].append(e.dst)

    def select(self, a: Act, ts: str):
        """``a`` restricted to the rows of ``ts`` (a subset of ``a``'s rows)."""
        import jax.numpy as jnp

        if a.ts == ts:
            return a.x
        have, want = self.rows[a.ts], self.rows[ts]
        pos = np.searchsorted(have, want)
        if len(want) and (pos.max() >= len(have) or not np.array_equal(have[pos], want)):
            raise Unsupported(None, f"rows of token set {ts!r} are not a subset of {a.ts!r}")
        return jnp.take(a.x, jnp.asarray(pos), axis=0)

    def layer(self, op: Op):
        return _layer(op, self.cfg)


def _layer(op: Op, cfg):
    """The layer spec an op belongs to (its shapes: attention heads, MoE, activation)."""
    if op.layer is None or not hasattr(cfg, "layers"):
        raise Unsupported(op, "no layer spec to read its shape from")
    return cfg.layers[op.layer]


# ---- kernels -----------------------------------------------------------------------------------------

def _family(compiled) -> str:
    return getattr(type(compiled.model), "family", "")


@kernel("embedding")
def _embedding(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    table = params[op.reads[0]]
    ids = jnp.take(state["ids"], jnp.asarray(ctx.rows[op.token_set]), axis=0)
    return Act(jnp.take(table, ids, axis=0), op.token_set)


@kernel("norm")
def _norm(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    hidden = ctx.cfg.hidden
    if op.info.elems == hidden:  # the residual stream: add the branch output(s), then normalise
        if len(inputs) == 1 and ctx.g.op(ctx.preds[op.name][0]).kind == "embedding":
            resid = inputs[0].x.astype(jnp.float32)
        else:
            resid = ctx.select(state["resid"], op.token_set).astype(jnp.float32)
            for a in inputs:
                resid = resid + ctx.select(a, op.token_set).astype(jnp.float32)
        state["resid"] = Act(resid, op.token_set)
        return Act(rmsnorm(resid, params[f"{op.name}.gamma"]).astype(jnp.bfloat16), op.token_set)
    # per-head Q/K norm on a fused QKV output: the first ``elems`` columns, head by head
    a = _attn_shape(op, ctx.cfg)
    (x,) = [ctx.select(i, op.token_set) for i in inputs]
    n = op.info.elems
    if n % a.head_dim:
        raise Unsupported(op, f"a {n}-wide norm is neither the model width nor whole heads of {a.head_dim}")
    qk = x[:, :n].reshape(x.shape[0], n // a.head_dim, a.head_dim)
    qk = rmsnorm(qk, params[f"{op.name}.gamma"]).astype(x.dtype).reshape(x.shape[0], n)
    return Act(jnp.concatenate([qk, x[:, n:]], axis=1), op.token_set)


def _gamma_width(op, cfg) -> int:
    return op.info.elems if op.info.elems == cfg.hidden else _attn_shape(op, cfg).head_dim


@kernel("gemm")
def _gemm(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    i = op.info
    if max(i.copies, 1) != 1:
        raise Unsupported(op, "per-head (block-diagonal) GEMMs")
    dt = DTYPES.get(op.precision)
    if dt is None:
        raise Unsupported(op, f"GEMMs at {op.precision!r}")
    x = sum(ctx.select(a, op.token_set).astype(jnp.float32) for a in inputs) if len(inputs) > 1 else \
        ctx.select(inputs[0], op.token_set)
    w = _weight(op, params, i.k, i.n)
    y = matmul(x, w, dt)
    wide = any(ctx.g.op(s).kind == "router" for s in ctx.succs[op.name]) or not ctx.succs[op.name]
    return Act(y if wide else y.astype(jnp.bfloat16), op.token_set)


def _weight(op, params, k, n):
    w = params[op.reads[0]]
    if w.shape == (k, n):
        return w
    if w.shape == (n, k):  # a tied table read transposed (embedding rows = head columns)
        return w.T
    raise Unsupported(op, f"weight {op.reads[0]} is {w.shape}, the op multiplies {k} x {n}")


@kernel("activation")
def _activation(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    (x,) = [ctx.select(a, op.token_set) for a in inputs]
    e = op.info.elems
    act = ctx.layer(op).act
    if x.shape[1] == 2 * e:  # gated: act(gate) * up
        if activation_fn(act) is None:
            raise Unsupported(op, f"gated activation {act!r}")
        return Act(gated(x, act).astype(jnp.bfloat16), op.token_set)
    if x.shape[1] == e and act == "relu2":
        return Act(jnp.square(jax.nn.relu(x.astype(jnp.float32))).astype(jnp.bfloat16), op.token_set)
    raise Unsupported(op, f"activation {act!r} on a {x.shape[1]}-wide input of {e} elements")


def _attn_shape(op, cfg):
    from graphsim.core.rules import AttentionShape

    m = _layer(op, cfg).mixer
    if not isinstance(m, AttentionShape):
        raise Unsupported(op, "a non-softmax-attention mixer")
    if m.sinks or m.out_gate or m.chunk:
        raise Unsupported(op, "attention sinks / output gates / chunked attention")
    return m


@kernel("cache_write")
def _cache_write(op, ctx, inputs, state, params):
    a = _attn_shape(op, ctx.cfg)
    (x,) = [ctx.select(i, op.token_set) for i in inputs]
    q_w, k_w = a.heads * a.head_dim, a.kv_heads * a.head_dim
    if x.shape[1] != q_w + k_w + a.kv_heads * a.vd:
        raise Unsupported(op, f"a {x.shape[1]}-wide QKV input for {a.heads}/{a.kv_heads} heads")
    k_new, v_new = x[:, q_w:q_w + k_w], x[:, q_w + k_w:]
    caches = state["caches"][op.writes[0]]
    rows = ctx.rows[op.token_set]
    out, o = [], 0
    for gi, (g, off) in enumerate(zip(ctx.layout.groups, ctx.layout.offsets())):
        n = g.count * g.new
        if not np.array_equal(rows[o:o + n], off + np.arange(n)):
            raise Unsupported(op, "a cache write over part of a group's new positions")
        kc, vc = caches[gi]
        kg = k_new[o:o + n].reshape(g.count, g.new, a.kv_heads, a.head_dim).astype(kc.dtype)
        vg = v_new[o:o + n].reshape(g.count, g.new, a.kv_heads, a.vd).astype(vc.dtype)
        out.append((kc.at[:, g.past:g.past + g.new].set(kg), vc.at[:, g.past:g.past + g.new].set(vg)))
        o += n
    state["caches"][op.writes[0]] = out
    return Act(x[:, :q_w], op.token_set)


@kernel("attention")
def _attention(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    a = _attn_shape(op, ctx.cfg)
    if op.info.attn not in ("gqa", ""):
        raise Unsupported(op, f"{op.info.attn} attention")
    (q,) = [ctx.select(i, op.token_set) for i in inputs]
    caches = state["caches"][op.reads[0]]
    outs, o = [], 0
    for (kc, vc), g in zip(caches, ctx.layout.groups):
        n = g.count * g.new
        og = gqa_attention(q[o:o + n].reshape(g.count, g.new, a.heads, a.head_dim), kc, vc, g.past, g.new, a.window)
        outs.append(og.reshape(n, a.heads * a.vd).astype(jnp.bfloat16))
        o += n
    return Act(jnp.concatenate(outs, axis=0) if len(outs) > 1 else outs[0], op.token_set)


def _moe_shape(op, ctx):
    from graphsim.core.rules import MoEShape

    f = ctx.layer(op).ffn
    if not isinstance(f, MoEShape) or f.latent:
        raise Unsupported(op, "a routed-expert block other than a plain MoE")
    return f


@kernel("router")
def _router(op, ctx, inputs, state, params):
    import jax
    import jax.numpy as jnp

    f = _moe_shape(op, ctx)
    (logits,) = [ctx.select(i, op.token_set).astype(jnp.float32) for i in inputs]
    probs = jax.nn.sigmoid(logits) if f.scoring == "sigmoid" else jax.nn.softmax(logits, axis=-1)
    w, ids = jax.lax.top_k(probs, f.top_k)
    w = w / jnp.sum(w, axis=-1, keepdims=True)
    return Act((w, ids), op.token_set)


@kernel("moe_experts")
def _moe_experts(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    f = _moe_shape(op, ctx)
    (route,) = inputs
    w, ids = route.x
    # the activations the router read: the router's own input
    topk_op = ctx.g.op(ctx.preds[op.name][0])
    router = ctx.g.op(ctx.preds[topk_op.name][0])
    x = ctx.select(state["out"][ctx.preds[router.name][0]], op.token_set)
    if activation_fn(f.act) is None:
        raise Unsupported(op, f"gated expert activation {f.act!r}")
    out = grouped_experts(x, w, ids, params[f"{op.reads[0]}.gate_up"], params[f"{op.reads[0]}.down"], f.act,
                          DTYPES.get(op.precision, "bfloat16"))
    return Act(out.astype(jnp.bfloat16), op.token_set)


@kernel("host_copy")
def _host_copy(op, ctx, inputs, state, params):
    if all(g.tier == "hbm" for g in ctx.layout.groups):
        return None  # nothing in host memory: the prefix (if any) is already on the device
    raise Unsupported(op, "copies from host memory")


# ---- the program ---------------------------------------------------------------------------------------

@attrs.frozen
class Step:
    """One executed op: the compiled graph's own Op object and the kernel bound to it."""

    op: Op
    kernel: str


@attrs.frozen(eq=False)
class Executable:
    """A compiled plan lowered to a JAX program. ``steps[i].op is compiled.graph.ops[i]``."""

    compiled: object
    layout: Layout
    steps: tuple
    fn: Callable  # jitted (params, caches, ids) -> (logits, caches); caches donated
    numerics: str = "emulate"  #: see lower_to_jax

    def init(self, seed: int = 0):
        """(params, caches, ids): random weights of every weight tensor the graph reads, caches with random
        history in the cached positions, uniform random token ids."""
        return init_params(self.compiled, seed), init_caches(self, seed + 1), init_ids(self, seed + 2)


def lower_to_jax(compiled, layout: Layout | None = None, numerics: str = "emulate") -> Executable:
    """Bind every op of ``compiled.graph`` to a kernel (raises :class:`Unsupported` naming the first op
    that has none) and trace the forward as one jitted function. ``numerics``: "emulate" rounds activations
    and caches to the formats the graph says (what is timed); "exact" keeps them in fp32 where a kernel
    family supports it (weights stay as stored) — for equality checks against a reference, where one
    rounding flipped by a last-bit difference would otherwise decide a Top-K."""
    import jax

    require(numerics in ("emulate", "exact"), "numerics", f"must be 'emulate' or 'exact', got {numerics!r}")
    layout = layout or layout_of(compiled.plan)
    ahead = [int(r.split(":")[1]) for t in compiled.graph.token_sets for r in (t.prefill, t.decode)
             if r.startswith("ahead:")]
    layout = attrs.evolve(layout, ahead=max(ahead, default=0))
    runs = FAMILY_RUNS.get(_family(compiled), frozenset())
    if any(g.patches for g in layout.groups) and "images" not in runs:
        raise Unsupported(None, "image requests (the executor runs this model's text forwards)")
    tiers = sorted({g.tier for g in layout.groups} - {"hbm"})
    if tiers and "restores" not in runs:
        raise Unsupported(None, f"a prefix hit in {tiers[0]} memory (the executor keeps this model's prefix on the "
                          "device: give the request @CACHED:hbm)")
    m = compiled.plan.mapping
    if (m.tp, m.dp, m.ep, m.pp, m.cp) != (1, 1, 1, 1, 1):
        raise Unsupported(None, f"mapping tp{m.tp} dp{m.dp} ep{m.ep} pp{m.pp} cp{m.cp}: the local executor "
                          "runs one device (every degree 1)")
    steps, fns = [], []
    own = FAMILY_KERNELS.get(_family(compiled), {})
    for op in compiled.graph.ops:
        if op.stream == "comm":
            raise Unsupported(op, "collectives (one device)")
        fn = own.get(op.kind) or KERNELS.get(op.kind)
        if fn is None:
            raise Unsupported(op, f"no executor kernel for {op.kind} ops")
        steps.append(Step(op, op.kind))
        fns.append(fn)
    steps = tuple(steps)
    ctx = _Ctx(compiled, layout)
    ctx.numerics = numerics

    def forward(params, caches, ids):
        state = {"ids": ids, "caches": {k: list(v) for k, v in caches.items()}, "out": {}}
        last = None
        for st, fn in zip(steps, fns):
            op = st.op
            inputs = [state["out"][p] for p in ctx.preds[op.name] if p in state["out"]]
            if not inputs and op.kind not in ("embedding", "host_copy") and op.name not in INPUT_OPS:
                raise Unsupported(op, "no data input")
            out = fn(op, ctx, inputs, state, params)
            if out is not None:
                state["out"][op.name] = out
                last = out
        return last.x, {k: tuple(v) for k, v in state["caches"].items()}

    return Executable(compiled, layout, steps, jax.jit(forward, donate_argnums=(1,)), numerics)


def init_params(compiled, seed: int = 0) -> dict:
    """Random weights: normal / sqrt(fan-in) in the tensor's format (bf16 for BF16 checkpoints), one array
    per weight tensor; per-op norm scales; expert weights as [experts, k, n] stacks."""
    import jax
    import jax.numpy as jnp

    if _family(compiled) in FAMILY_INITS:
        return FAMILY_INITS[_family(compiled)]["params"](compiled, seed)
    g = compiled.graph
    key = jax.random.PRNGKey(seed)
    params: dict = {}
    for n_op, op in enumerate(g.ops):
        sub = jax.random.fold_in(key, n_op)
        if op.kind == "norm":
            params[f"{op.name}.gamma"] = 1.0 + 0.01 * jax.random.normal(sub, (_gamma_width(op, compiled.model.cfg),),
                                                                         jnp.float32)
        if not op.reads or g.tensor_map[op.reads[0]].role != "weight":
            continue
        t = g.tensor_map[op.reads[0]]
        dt = _storage_dtype(op, t)
        i = op.info
        if op.kind == "embedding":
            shape = (compiled.model.cfg.vocab, compiled.model.cfg.hidden)
            if t.name not in params:
                params[t.name] = (jax.random.normal(sub, shape, jnp.float32)).astype(dt)
        elif op.kind == "moe_experts":
            gu = (i.experts, i.hidden, 2 * i.inter)
            dn = (i.experts, i.inter, i.hidden)
            k1, k2 = jax.random.split(sub)
            params[f"{t.name}.gate_up"] = (jax.random.normal(k1, gu, jnp.float32) / np.sqrt(i.hidden)).astype(dt)
            params[f"{t.name}.down"] = (jax.random.normal(k2, dn, jnp.float32) / np.sqrt(i.inter)).astype(dt)
        elif op.kind == "gemm" and t.name not in params:
            params[t.name] = (jax.random.normal(sub, (i.k, i.n), jnp.float32) / np.sqrt(i.k)).astype(dt)
    return params


def _storage_dtype(op, t):
    import jax.numpy as jnp

    name = t.format.name
    table = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32, "fp8": jnp.float8_e4m3fn}
    if name not in table:
        raise Unsupported(op, f"weights stored as {name} (the executor holds bf16 / fp16 / fp32 / fp8)")
    return table[name]


def init_caches(ex: Executable, seed: int = 1) -> dict:
    """Per attention layer and request group, K and V of ``past + new`` positions, random (the history of
    a real decode is initialised; zeros would make softmax trivially uniform)."""
    import jax
    import jax.numpy as jnp

    if _family(ex.compiled) in FAMILY_INITS:
        return FAMILY_INITS[_family(ex.compiled)]["caches"](ex, seed)
    g = ex.compiled.graph
    key = jax.random.PRNGKey(seed)
    out = {}
    for n_op, op in enumerate(g.ops):
        if op.kind != "cache_write":
            continue
        a = _attn_shape(op, ex.compiled.model.cfg)
        fmt = g.tensor_map[op.writes[0]].format.name
        dt = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp8": jnp.float8_e4m3fn, "fp32": jnp.float32}.get(fmt)
        if dt is None:
            raise Unsupported(op, f"a KV cache stored as {fmt}")
        per = []
        for gi, grp in enumerate(ex.layout.groups):
            k1, k2 = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, n_op), gi))
            n = grp.past + grp.new
            per.append((jax.random.normal(k1, (grp.count, n, a.kv_heads, a.head_dim), jnp.float32).astype(dt),
                        jax.random.normal(k2, (grp.count, n, a.kv_heads, a.vd), jnp.float32).astype(dt)))
        out[op.writes[0]] = tuple(per)
    return out


def init_ids(ex: Executable, seed: int = 2):
    import jax
    import jax.numpy as jnp

    if "ids" in FAMILY_INITS.get(_family(ex.compiled), {}):
        return FAMILY_INITS[_family(ex.compiled)]["ids"](ex, seed)
    cfg = ex.compiled.model.cfg
    vocab = getattr(cfg, "vocab", None) or cfg.vocab_size  # V4.1's config names it as HF does
    return jax.random.randint(jax.random.PRNGKey(seed), (ex.layout.rows,), 0, vocab, jnp.int32)


from . import kernels_mla  # noqa: E402,F401 - registers the DeepSeek-V3 family's kernels (MLA, DSA, V3 routing)
from . import kernels_v41  # noqa: E402,F401 - registers the DeepSeek-V4.1 kernels
from . import kernels_dspark  # noqa: E402,F401 - DSpark's kernels (they register into V4.1's)
from . import kernels_vision  # noqa: E402,F401 - V4.1's vision tower and aligner (they register into V4.1's)
