"""DeepSeek-V4.1-Flash extras: the vision stage (before the trunk) and the DSpark stages (after it).

Vision (V41_FACTS §1, §12) — a ``vision`` stage when a prefill request carries image patches:
patch embed 588→1024, 32 bidirectional ViT blocks (16 heads, 2-D RoPE, SwiGLU 2816), final norm, then the
aligner (3×3 unfold of the padded patch grid → 9216→5120, GELU, 5120→5120) on the image tokens. Token sets
``vis_patches`` (prefill ``patches``) and ``vis_image`` (prefill ``image``) select nothing in decode, so the
tower runs once per request, never per decode step. The image tokens are part of the request's new
positions (``Request.length``), so they cross the trunk like text; the trunk's Engram sets take ``text``
only (image tokens bypass Engram). Conventions:

* attention pairs are ``full_pairs`` over a request's patches, n² per request: exact for one image; a request
  with several images is charged as one sequence of Σ patches, an upper bound on Σ n_i² (the workload
  carries the patch total per request, not per image);
* the tower is tensor-parallel like the trunk's dense parts (heads and MLP columns split, all-reduce after
  ``wo``, ``w2`` and the aligner's ``fc2``); its weights are read once per forward that has the stage.

DSpark (V41_FACTS §9, §12) — with ``policies.dspark == 'on'`` a decode group's ``new`` = 1 + k positions is
the target *verify* forward: the trunk stages (encoder, global_kv, decoder, head) ARE the verify; they are
not renamed. Two stages follow:

* ``commit`` (decode groups only, token set ``ds_verify`` = the 1 + k verified positions): rejection
  sampling over the verified logits; SWA write-back — the verify wrote its SWA entries to staging slots
  (the trunk's ``swa_write``) and the commit copies them into the ring (read + write per trunk layer; a
  fixed-shape masked copy of all 1 + k, so rejected positions cost as much as accepted ones); the m>1
  compressors' partial-group state is restored/advanced to the accepted prefix (read + write of one state
  row per pooled KV owner). Main KV and index K sit at their final positions in paged memory: rolling back
  is a length reset (no bytes).
* ``draft``: ``main_proj`` 3·5120→5120 over the pre-attention hidden states the trunk materialized for
  layers ``dspark_target_layer_ids`` (the pre-mix outputs, kept alive, no extra copy) at the context
  positions ``ds_ctx`` (decode: the 1 + k verified ones; prefill: the last W prompt tokens, all an SWA-only
  drafter sees); per block, the context features are projected to the block's latent KV and written to its
  SWA cache (DFlash-style context injection); the draft block ``ds_draft`` = the block_size positions after
  the new ones (rule ``ahead:D``: last token + noise tokens) runs the 3 SWA-only blocks with their own MoE
  (128 experts, top-3, + shared expert), then the shared LM head, the Markov head (vocab→256→vocab, added to
  the logits), sampling, and the fp32 confidence head (5120+256→1).

The drafter blocks are trunk-shaped: mHC, attention output and MoE come from the trunk's own emitters
(weight names mapped to ``dspark.blocks.{j}``, MoE sizes from the DSpark config), so a fusion pass treats
them like any trunk layer. Prefill groups draft too (the first drafter forward right after prefill, so the
first decode step has drafts to verify). DSpark weights are resident once (inventory group ``dspark``,
counted only when DSpark is on); repeated draft/verify steps add work, never weights.
"""
from __future__ import annotations

import copy

import attrs

from ..core.errors import require
from ..core.rules import GATED, embedding, gathered_logits, residual, vit_attention
from ..core.rules_v4 import dspark_commit_caches
from . import deepseek_v41 as sem
from .base import BF16, all_reduce_tp, attention_precision, rmsnorm

#: token sets (see the module docstring)
VIS_PATCHES, VIS_IMAGE = "vis_patches", "vis_image"
DS_CTX, DS_DRAFT, DS_VERIFY = "ds_ctx", "ds_draft", "ds_verify"


# --------------------------------------------------------------------------------------------------
# Vision
# --------------------------------------------------------------------------------------------------


def vision_stage(model, b, kinds, policies, requests) -> None:
    """Add the ``vision`` stage when a prefill request carries image patches (nothing otherwise)."""
    v = getattr(model.cfg, "vision", None)
    if v is None or not any(r.kind == "prefill" and r.image_patches for r in requests):
        return
    P = b.token_set(VIS_PATCHES, prefill="patches", decode="none")
    I = b.token_set(VIS_IMAGE, prefill="image", decode="none")
    h, f, d = v.hidden_size, v.intermediate_size, model.cfg.hidden_size
    tp = ("tp", "dp")
    with b.stage("vision"):
        b.gemm("vision.patch_embed", P, v.patch_dim, h, weight="vision.patch_embed.weight", split=("dp",), deps=())
        for i in range(v.num_hidden_layers):
            p = f"vision.blocks.{i}"
            with b.layer(None, prefix=f"{p}."):
                # 2-D RoPE on q and k by (row, column) of the patch; bidirectional attention within the image
                vit_attention(b, P, h, v.num_attention_heads, attention_precision(b), prefix=p, norm="norm1",
                              qkv="wqkv", out="wo", note="ViT wo", split=tp)
                rmsnorm(b, "norm2", P, h, reads=(f"{p}.norm2",))
                b.gemm("mlp.w1", P, h, f, weight=f"{p}.mlp.w1", split=tp)
                b.gemm("mlp.w3", P, h, f, weight=f"{p}.mlp.w3", split=tp)
                b.elementwise("mlp.swiglu", P, f, bytes_in=2 * BF16, bytes_out=BF16, flops_per_elem=4,
                              kind="activation", split=tp, exps=f, params={"role": GATED})
                b.gemm("mlp.w2", P, f, h, weight=f"{p}.mlp.w2", split=tp, comm=(all_reduce_tp(P, h, note="ViT w2"),))
                residual(b, "mlp.residual", P, h)
        rmsnorm(b, "vision.norm", P, h, reads=("vision.norm",))
        # r×r unfold of the grid padded to multiples of r: every image token gathers r² patch features
        # (padding included), so the traffic is per image token, exactly 9216 bf16 in and out.
        b.elementwise("vision.aligner.unfold", I, v.aligner_in, bytes_in=BF16, bytes_out=BF16, flops_per_elem=0,
                      kind="data_movement", split=("dp",))
        b.gemm("vision.aligner.fc1", I, v.aligner_in, d, weight="vision.aligner.fc1", split=tp)
        b.elementwise("vision.aligner.gelu", I, d, bytes_in=BF16, bytes_out=BF16, flops_per_elem=8,
                      kind="activation", split=tp, exps=d)  # one tanh (SFU) per element
        last = b.gemm("vision.aligner.fc2", I, d, d, weight="vision.aligner.fc2", split=tp,
                      comm=(all_reduce_tp(I, d, note="aligner fc2"),))
    # The trunk's embedding writes the image features into the image positions of the residual streams.
    b.depends(last, "embed")


# --------------------------------------------------------------------------------------------------
# DSpark
# --------------------------------------------------------------------------------------------------


def dspark_stages(model, b, kinds, policies, requests) -> None:
    """Add the ``commit`` (decode groups) and ``draft`` stages when ``policies.dspark == 'on'``."""
    c = model.cfg
    if getattr(policies, "dspark", "off") != "on":
        return
    require(c.n_dspark_blocks > 0, "policies.dspark", f"{model.name} has no DSpark blocks (num_nextn_predict_layers = 0)")
    W, D = c.sliding_window, c.dspark_block_size
    b.token_set(DS_CTX, prefill=f"tail:{W}", decode="all")
    b.token_set(DS_DRAFT, prefill=f"ahead:{D}", decode=f"ahead:{D}")
    if "decode" in kinds:
        b.token_set(DS_VERIFY, prefill="none", decode="all")
        with b.stage("commit"):
            _commit(model, b)
    with b.stage("draft"):
        _draft(model, b)


def _commit(model, b) -> None:
    c = model.cfg
    V = DS_VERIFY
    # Rejection sampling reads every verified position's fp32 logits (gathered over TP by the head).
    b.elementwise("commit.accept", V, c.vocab_size, bytes_in=4.0, bytes_out=0.0, flops_per_elem=4,
                  kind="sampling", split=("dp",), exps=c.vocab_size)  # softmax over the vocabulary
    pooled = sum(1 for li in model.layers if li.kv_source and c.pooled(li.ratio))
    dspark_commit_caches(b, V, layers=c.num_hidden_layers, swa_bytes=sem.swa_entry_bytes(c), owners=pooled,
                         state_bytes=sem.compressor_state_row_bytes(c))


def _draft(model, b) -> None:
    c = model.cfg
    d, n, R = c.hidden_size, c.hc_mult, c.dspark_markov_rank
    T, X = DS_DRAFT, DS_CTX
    targets = len(c.dspark_target_layer_ids)
    proj = b.gemm("dspark.main_proj", X, targets * d, d, weight="dspark.main_proj", act_in="bf16", split=("dp",))
    for L in c.dspark_target_layer_ids:  # the features come from the trunk's pre-attention pre-mix of L
        b.depends(f"layers.{L}.hc_attn.premix", proj)
    # Block input: the last token and D-1 noise tokens, embedded and spread over the residual streams.
    streams = n if c.dspark_has_mhc else 0
    embedding(b, "dspark.embed", T, d, "embed.weight", streams=streams, formula=f"gather {d} bf16 per draft position")
    drafter = _drafter_view(model)
    for j in range(c.n_dspark_blocks):
        _draft_block(model, drafter, b, j)
    with b.layer(None, prefix="dspark."):
        if c.dspark_has_mhc:
            b.elementwise("hc_final.premix", T, d, bytes_in=n * BF16, bytes_out=BF16, flops_per_elem=2 * n,
                          kind="mhc", split=("dp",), params={"mhc_elems": (n + 1) * d})
        rmsnorm(b, "norm", T, d, reads=("dspark.norm",))
        # The trunk's LM head, vocabulary-parallel; the Markov term is added per shard before the gather.
        b.gemm("head", T, d, c.vocab_size, weight="head.weight", act_out="fp32", split=("tp", "dp"))
        embedding(b, "markov.embed", T, R, "dspark.markov.embed", formula=f"gather {R} bf16 of the previous draft token")
        b.gemm("markov.proj", T, R, c.vocab_size, weight="dspark.markov.proj", act_out="fp32", split=("tp", "dp"),
               comm=(gathered_logits(T, c.vocab_size, "draft logits"),))
        b.elementwise("sample", T, c.vocab_size, bytes_in=4.0, bytes_out=0.0, flops_per_elem=2, kind="sampling",
                      split=("dp",), exps=c.vocab_size)  # softmax over the vocabulary
        # a_j = P(draft j accepted | earlier accepted), from the hidden state and the Markov feature (§9).
        b.gemm("confidence", T, d + R, 1, weight="dspark.confidence.proj", act_in="bf16", act_out="fp32",
               split=("dp",))


def _drafter_view(model):
    """The model with the drafter's MoE sizes, so the trunk's MoE emitter builds a DSpark block's MoE."""
    c = model.cfg
    view = copy.copy(model)
    view.cfg = attrs.evolve(c, n_routed_experts=c.dspark_n_routed_experts,
                            num_experts_per_tok=c.dspark_num_experts_per_tok, n_shared_experts=c.dspark_n_shared_experts)
    return view


def _draft_block(model, drafter, b, j: int) -> None:
    """One SWA-only drafter block over the draft positions, with context KV injected from ``main_proj``."""
    c = model.cfg
    T, X = DS_DRAFT, DS_CTX
    p = f"dspark.blocks.{j}"
    slot = c.num_hidden_layers + j  # its compress_ratios entry; used only to address the trunk emitters
    rb = _Renamed(b, f"layers.{slot}.", f"{p}.")
    a = f"{p}.attn"
    swa = b.tensor(f"{p}.swa", "swa_cache", c.swa_kv_format, elems_per_token=c.kv_dim, module=a)
    info = sem.LayerInfo(layer=slot, path="swa_only", stage="decoder", ratio=0, kv_owner=None, topk_producer=None,
                         engram=False, candidate_source=False, candidate_limited=False)
    with b.layer(None, prefix=f"{p}."):
        # Context injection: projected target features -> this block's latent KV -> its SWA cache.
        _latent_kv(b, c, a, X, "ctx_")
        b.cache_write("attn.ctx_swa_write", X, swa, sem.swa_entry_bytes(c), split=("dp",))
        _pre(model, rb, slot, "hc_attn", T, f"{p}.attn_norm")
        model._q_path(b, a, T)
        # The block's own keys (draft positions see each other); transient, never cached.
        _latent_kv(b, c, a, T, "", rope_heads=c.num_attention_heads)
        model._sparse_attention(rb, info, T)  # SWA-only: <= W cached context slots per draft position
        model._attention_out(rb, slot, T)
        _post(model, rb, slot, "hc_attn", T)
        _pre(model, rb, slot, "hc_ffn", T, f"{p}.ffn_norm")
        drafter._moe(rb, slot, T)
        _post(model, rb, slot, "hc_ffn", T)


def _latent_kv(b, c, a: str, ts: str, tag: str, *, rope_heads: int = 0) -> None:
    """The shared MQA latent (wkv + norm) and RoPE on its last dims (and on ``rope_heads`` query heads)."""
    b.gemm(f"attn.{tag}wkv", ts, c.hidden_size, c.kv_dim, weight=f"{a}.wkv", act_in="fp8", split=("dp",))
    b.elementwise(f"attn.{tag}kv_norm", ts, c.kv_dim, bytes_in=BF16, bytes_out=BF16, flops_per_elem=4, kind="norm",
                  split=("dp",), reads=(f"{a}.kv_norm",))
    b.elementwise(f"attn.{tag}rope", ts, c.qk_rope_head_dim * (rope_heads + 1), bytes_in=BF16, bytes_out=BF16,
                  flops_per_elem=4, split=("tp", "dp") if rope_heads else ("dp",))


def _pre(model, rb, slot: int, sub: str, ts: str, norm_weight: str) -> None:
    """Sub-block input: the trunk's mHC pre-mix + norm, or a plain RMSNorm without mHC."""
    if model.cfg.dspark_has_mhc:
        model._mhc_pre(rb, slot, sub, ts, norm_weight=norm_weight)
    else:
        rmsnorm(rb, f"{sub}.norm", ts, model.cfg.hidden_size, out_bytes=1.0, reads=(norm_weight,))


def _post(model, rb, slot: int, sub: str, ts: str) -> None:
    if model.cfg.dspark_has_mhc:
        model._mhc_post(rb, slot, sub, ts)
    else:
        residual(rb, f"{sub}.residual", ts, model.cfg.hidden_size)


class _Renamed:
    """A GraphBuilder view that maps names starting ``old`` to ``new`` in every argument (and in its tensor
    table), so the trunk's per-layer emitters, which address weights as ``layers.{i}.…``, emit a DSpark
    block reading ``dspark.blocks.{j}.…``. Op names are relative and never start with ``old``."""

    def __init__(self, b, old: str, new: str):
        self._b, self._old, self._new = b, old, new
        self._tensors = _RenamedTable(b._tensors, self._fix)

    def _fix(self, x):
        if isinstance(x, str) and x.startswith(self._old):
            return self._new + x[len(self._old):]
        if isinstance(x, tuple):
            return tuple(self._fix(v) for v in x)
        return x

    def __getattr__(self, name):
        attr = getattr(self._b, name)
        if not callable(attr):
            return attr

        def call(*args, **kw):
            return attr(*(self._fix(v) for v in args), **{k: self._fix(v) for k, v in kw.items()})

        return call


class _RenamedTable:
    def __init__(self, table: dict, fix):
        self._table, self._fix = table, fix

    def __getitem__(self, key: str):
        return self._table[self._fix(key)]

    def __contains__(self, key: str) -> bool:
        return self._fix(key) in self._table
