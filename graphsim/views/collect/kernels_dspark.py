"""DSpark (V41_FACTS §9, §12) executed: greedy verification and commit, the drafter's context (the target
layers' attention inputs, projected), its SWA-only blocks over the context and the draft positions, the trunk's
head plus the Markov head, the confidence head. Registered into :data:`graphsim.views.collect.kernels_v41.V41`; the
blocks' other ops (mHC, q/kv paths, MoE) are the trunk's kernels.

Verification (a decode group's 1 + k new positions: the last accepted token, then k drafts) keeps, per request,
the longest prefix of drafts equal to the target's greedy tokens (a ∈ [0, k]); the committed context ends at
position past + a. The commit rolls the m > 1 compressors' pending group back to that prefix; the SWA entries,
main-KV / index-K entries and token ids the rejected positions wrote lie beyond it, where nothing reads them
before the next forward rewrites them (the executor's caches are linear, not rings: the priced staging copy
moves nothing here). The draft block then starts after the accepted prefix: its input token is the target's
greedy token at past + a, its positions follow (traced: ``positions``), and its context is the drafter cache up
to the accepted prefix.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import Act, Unsupported
from .formats_v41 import act_in
from .kernels_v41 import (
    HOOKS,
    _final_premix,
    _operand,
    _prefix,
    _swa_write,
    _v,
    find,
    groups_of,
    positions,
    read_tensor,
    rms,
    rope,
    sel,
    v41,
)


@v41("sampling", "commit.accept")
def _accept(op, ctx, inputs, state, params):
    """Greedy verification: the target's token at every verified position; per request the accepted drafts
    a = the longest run of drafts equal to the target's token one position before (``dspark.accepted``, per
    group), and the shift of its draft block's positions, 1 + a − new (``dspark.shift``, per layout row)."""
    import jax.numpy as jnp

    (a,) = inputs
    greedy = jnp.argmax(sel(ctx, a, op.token_set), axis=-1).astype(jnp.int32)
    v = _v(ctx)
    rows = ctx.rows[op.token_set]
    accepted, shift = {}, jnp.zeros(len(v.pos), jnp.int32)
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        g = ctx.layout.groups[gi]
        if len(pos) != g.count * g.new:
            raise Unsupported(op, "a verification over part of a group's new positions")
        toks = jnp.take(state["ids"], jnp.asarray(rows[s]), axis=0).reshape(g.count, g.new)
        match = (toks[:, 1:] == greedy[s].reshape(g.count, g.new)[:, :-1]).astype(jnp.int32)
        acc = jnp.sum(jnp.cumprod(match, axis=1), axis=1)
        accepted[gi] = acc
        draft = np.nonzero((v.grp == gi) & (v.pos >= g.past + g.new))[0]  # this group's draft-block rows
        shift = shift.at[jnp.asarray(draft)].set((1 + acc - g.new)[jnp.asarray(v.req[draft])])
    state.setdefault("v41", {}).update({"dspark.accepted": accepted, "dspark.shift": shift})
    return Act(greedy, op.token_set)


@v41("cache_write", "commit.swa")
def _commit_swa(op, ctx, inputs, state, params):
    """The verify wrote its SWA entries in place (a linear cache, no staging ring): the rejected positions'
    entries lie beyond the accepted prefix, never read before the next forward writes them again."""
    (a,) = inputs
    return Act(a.x, a.ts)


@v41("cache_write", "commit.compressor_state")
def _commit_state(op, ctx, inputs, state, params):
    """Each m > 1 compressor's pending group rolled back to the accepted prefix: the (past + 1 + a) mod m
    rows before it, taken from the rows its pool saw this forward (pending + new)."""
    import jax.numpy as jnp

    (a,) = inputs
    acc = state.get("v41", {}).get("dspark.accepted")
    if acc is None:
        raise Unsupported(op, "a commit without a verification")
    for li in _v(ctx).layers.values():
        if not (li.kv_source and li.ratio > 1):
            continue
        name = f"layers.{li.layer}.compressor.state"
        seen = _pool_rows(ctx, op, li.layer)
        st = list(state["caches"][name])
        m = li.ratio
        for gi, n_acc in acc.items():
            g = ctx.layout.groups[gi]
            start, kv, gt = seen[gi]
            end = g.past + 1 + n_acc  # [count]: the committed context's length
            r = end % m
            idx = (end - r - start)[:, None] + jnp.arange(m)[None, :]
            keep = (jnp.arange(m)[None, :] < r[:, None])[..., None]
            st[gi] = tuple(jnp.where(keep, jnp.take_along_axis(x, jnp.clip(idx, 0, x.shape[1] - 1)[..., None], 1), 0.0)
                           for x in (kv, gt))
        state["caches"][name] = st
    return Act(a.x, a.ts)


def _pool_rows(ctx, op, layer: int):
    """The rows a layer's pool saw this forward, only if the pool is an ancestor of ``op``."""
    from .kernels_v41 import _reaches

    pool = f"layers.{layer}.compressor.pool"
    if not _reaches(ctx, op, pool):
        raise Unsupported(op, f"rolls back {pool}'s pending rows but it is not an ancestor (a missing dependency edge)")
    return ctx._state["v41"][f"layers.{layer}.compressor.state.rows"]


@v41("gemm", "dspark.main_proj")
def _main_proj(op, ctx, inputs, state, params):
    """The drafter's context: the target layers' attention inputs (their pre-mix), concatenated, projected."""
    import jax.numpy as jnp

    outs = ctx._state["out"]
    xs = []
    for L in ctx.cfg.dspark_target_layer_ids:
        name = f"layers.{L}.hc_attn.premix"
        alts = [n for n in (name, f"layers.{L}.hc_attn.fused", f"layers.{L}.hc_attn.pre") if n in ctx.preds[op.name]]
        if not alts:
            raise Unsupported(op, f"no data edge from {name} (a missing dependency edge)")
        x = sel(ctx, outs[alts[0]], op.token_set)
        xs.append(x["h"] if isinstance(x, dict) else x)
    return Act(act_in(jnp.concatenate(xs, axis=-1), op.precision) @ params[op.reads[0]], op.token_set)


def _next_tokens(ctx, op, head_name: str):
    """Per request (group-major), the target's greedy token at its last new position — after a verification,
    at its last accepted position past + a."""
    import jax.numpy as jnp

    a = find(ctx, op, head_name)
    logits = a.x
    rows = ctx.rows[a.ts]
    v = _v(ctx)
    acc = ctx._state.get("v41", {}).get("dspark.accepted", {})
    out = []
    for gi, g in enumerate(ctx.layout.groups):
        for r in range(g.count):
            hit = np.nonzero((v.grp[rows] == gi) & (v.req[rows] == r) & (v.pos[rows] == g.past + g.new - 1))[0]
            if not len(hit):
                raise Unsupported(op, "the target's logits do not cover every request's last position")
            if gi in acc:  # the verified rows of a request are consecutive positions: past .. past + new - 1
                out.append(jnp.argmax(jnp.take(logits, int(hit[0]) - (g.new - 1) + acc[gi][r], axis=0)))
            else:
                out.append(jnp.argmax(logits[int(hit[0])]))
    return jnp.stack(out).astype(jnp.int32)


@v41("embedding", "dspark.embed")
def _draft_embed(op, ctx, inputs, state, params):
    """The draft block's input: the target's next token, then noise tokens (V41_FACTS §12)."""
    import jax.numpy as jnp

    raw = ctx.c.model.raw.get("text_config", ctx.c.model.raw)
    noise = int(raw.get("dspark_noise_token_id", 0))
    first = _next_tokens(ctx, op, "head")
    A = _v(ctx).ahead
    ids = jnp.concatenate([first[:, None], jnp.full((first.shape[0], A - 1), noise, jnp.int32)], axis=1).reshape(-1)
    rows = ctx.rows[op.token_set]
    if len(rows) != ids.shape[0]:
        raise Unsupported(op, "a draft block over part of the requests")
    e = jnp.take(params[op.reads[0]], ids, axis=0).astype(jnp.float32)
    state.setdefault("v41", {})["dspark.ids"] = ids
    return Act(jnp.repeat(e[:, None, :], ctx.cfg.hc_mult, axis=1), op.token_set)


@v41("elementwise", "attn.ctx_rope")
def _ctx_rope(op, ctx, inputs, state, params):
    (a,) = inputs
    pos = _v(ctx).pos[ctx.rows[op.token_set]]
    return Act({"kv": rope(sel(ctx, a, op.token_set), pos, ctx.cfg.qk_rope_head_dim, _v(ctx).theta)}, op.token_set)


@v41("cache_write", "attn.ctx_swa_write")
def _ctx_swa_write(op, ctx, inputs, state, params):
    return _swa_write(op, ctx, inputs, state, params)


def draft_attention(op, ctx, inputs, state, params):
    """A drafter block (SWA-only): each draft position reads the block's SWA cache (the context written
    this forward or before) inside the window, and the draft positions up to itself; a sink per head."""
    import jax.numpy as jnp

    c = ctx.cfg
    W, H, D = c.sliding_window, c.num_attention_heads, c.head_dim
    r = _operand(ctx, op, "attn.rope")
    q, kvd = r["q"], r["kv"]
    swa = read_tensor(ctx, op, op.reads[0])
    sink = params[f"{_prefix(op)}attn.sink"]
    outs = []
    acc = ctx._state.get("v41", {}).get("dspark.accepted", {})
    dyn = positions(ctx, op.token_set)
    for gi, s, b, pos in groups_of(ctx, op.token_set):
        g = ctx.layout.groups[gi]
        bj = jnp.asarray(b)
        # cache positions < end: the new ones, or after a verification the accepted prefix (per row)
        end = (g.past + 1 + acc[gi][bj]) if gi in acc else g.past + g.new
        kp = (dyn[s] if gi in acc else pos)[:, None] - np.arange(W)[None, ::-1]
        ok_c = (kp >= 0) & (kp < (end[:, None] if gi in acc else end))
        kc = swa[gi][bj[:, None], jnp.clip(jnp.asarray(kp), 0, (end[:, None] if gi in acc else end) - 1)]
        # the draft positions of the same request, causal
        same = (b[:, None] == b[None, :]) & (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - W)
        kd = jnp.broadcast_to(kvd[s][None], (len(pos),) + kvd[s].shape)
        k = jnp.concatenate([kc, kd], axis=1)
        ok = jnp.concatenate([jnp.asarray(ok_c), jnp.asarray(same)], axis=1)
        lg = jnp.where(ok[:, None, :], jnp.einsum("thd,tsd->ths", q[s], k) / math.sqrt(D), -jnp.inf)
        mx = jnp.maximum(jnp.max(lg, axis=-1), sink[None, :])
        p = jnp.exp(lg - mx[..., None])
        den = jnp.sum(p, axis=-1) + jnp.exp(sink[None, :] - mx)
        outs.append((jnp.einsum("ths,tsd->thd", p, k) / den[..., None]).reshape(len(pos), H * D))
    return Act(jnp.concatenate(outs, axis=0) if len(outs) > 1 else outs[0], op.token_set)


@v41("mhc", "dspark.hc_final.premix")
def _draft_premix(op, ctx, inputs, state, params):
    return _final_premix(op, ctx, inputs, state, params)


@v41("norm", "dspark.norm")
def _draft_norm(op, ctx, inputs, state, params):
    (a,) = inputs
    return Act(rms(sel(ctx, a, op.token_set), params[op.reads[0]], _v(ctx).eps), op.token_set)


def _draft_prev_tokens(ctx, op):
    """Per draft position, the token before it: the block input at the first, the drafter's greedy token
    at the one before otherwise (what the Markov head conditions on)."""
    import jax.numpy as jnp

    ids = ctx._state["v41"]["dspark.ids"]
    logits = find(ctx, op, "dspark.head").x
    A = _v(ctx).ahead
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32).reshape(-1, A)
    prev = jnp.concatenate([ids.reshape(-1, A)[:, :1], greedy[:, :-1]], axis=1)
    return prev.reshape(-1)


@v41("embedding", "dspark.markov.embed")
def _markov_embed(op, ctx, inputs, state, params):
    import jax.numpy as jnp

    return Act(jnp.take(params[op.reads[0]], _draft_prev_tokens(ctx, op), axis=0), op.token_set)


@v41("sampling", "dspark.sample")
def _draft_sample(op, ctx, inputs, state, params):
    """Draft tokens: greedy over the drafter's logits plus the Markov head's."""
    import jax.numpy as jnp

    (a,) = inputs
    logits = find(ctx, op, "dspark.head").x + sel(ctx, a, op.token_set)
    return Act(jnp.argmax(logits, axis=-1).astype(jnp.int32), op.token_set)


@v41("gemm", "dspark.confidence")
def _confidence(op, ctx, inputs, state, params):
    """a_j = sigmoid([hidden, Markov embedding] · w): each draft position's acceptance probability (fp32)."""
    import jax
    import jax.numpy as jnp

    h = sel(ctx, find(ctx, op, "dspark.norm"), op.token_set)
    m = sel(ctx, find(ctx, op, "dspark.markov.embed"), op.token_set)
    return Act(jax.nn.sigmoid(jnp.concatenate([h, m], axis=-1) @ params[op.reads[0]]), op.token_set)


HOOKS["draft_attention"] = draft_attention
