"""Cost rules: the op kinds a model is composed of, each one function that adds its ops to a
:class:`~graphsim.core.builder.GraphBuilder` with a closed-form cost, registered by name.

A family file (``graphsim/models/families.py``) turns a Hugging Face config into a stack of layers and the
generic decoder (``graphsim/models/decoder.py``) composes these rules for them; no family writes cost
terms. Every rule is unit-tested against its closed form (``tests/test_rules.py``); ``graphsim.core.rules.RULES``
lists them with their formulas.
"""
from __future__ import annotations

from typing import Callable

import attrs

from .builder import GraphBuilder
from .errors import GraphsimError
from .ir import CommSpec, Cost, Feature, fmt


@attrs.frozen
class Rule:
    name: str
    formula: str
    fn: Callable


RULES: dict[str, Rule] = {}


def rule(name: str, formula: str):
    """Register a cost rule under ``name`` with its closed form (for ``RULES`` and the docs)."""

    def deco(fn):
        if name in RULES:
            raise GraphsimError("rules", f"rule {name!r} registered twice")
        RULES[name] = Rule(name, formula, fn)
        return fn

    return deco


def tokens(ts: str) -> Feature:
    return Feature("tokens", ts)


#: The activation format a GEMM on weights of this format reads: FP8 weights take FP8 activations, NVFP4
#: FP4 ones (its scales per 16); MXFP4 (gpt-oss) runs W4A8 (MXFP4 x FP8, as TensorRT-LLM and SGLang run it
#: on Blackwell); weight-only int4/NVFP4 (W4A16) and BF16 weights take BF16.
ACT_FOR_WEIGHTS = {"fp8": "fp8", "fp8_b128x128": "fp8", "fp8_b32x32_ue8m0": "fp8", "fp8_e8m0_32": "fp8",
                   "nvfp4": "nvfp4", "mxfp4": "fp8", "fp4_ue8m0_32": "fp8", "int8": "int8", "w4a8_g128": "fp8"}


def act_for(weight_format: str) -> str:
    return ACT_FOR_WEIGHTS.get(fmt(weight_format).name, "bf16")


@rule("linear", "2·k·n·T FLOPs at the weights' GEMM rate; W read once per forward; activations in and out")
def linear(b: GraphBuilder, name: str, ts: str, k: int, n: int, weight: str, **kw) -> str:
    """A linear layer whose activation precision follows its weights' format (:data:`ACT_FOR_WEIGHTS`)."""
    kw.setdefault("act_in", act_for(b._tensors[weight].format.name))
    return b.gemm(name, ts, k, n, weight=weight, **kw)


@rule("rmsnorm", "4 FLOPs and 2+2 B per element per token")
def rmsnorm(b: GraphBuilder, name: str, ts: str, d: int, *, split=("dp",), out_bytes: float = 2.0, **kw) -> str:
    """RMSNorm: read bf16, write ``out_bytes`` (2 = bf16, 1 = fused FP8 quantization); ~4 flops/elem."""
    return b.elementwise(name, ts, d, bytes_in=2.0, bytes_out=out_bytes, flops_per_elem=4.0, kind="norm",
                         split=split, **kw)


def all_reduce_tp(ts: str, hidden: int, bytes_per: float = 2.0, note: str = "", merge: str = "") -> CommSpec:
    """TP all-reduce of a row-parallel output (batch-wide payload; the sharding pass takes the rank share)."""
    return CommSpec("all_reduce", "tp", Cost.of(tokens(ts), bytes_act=hidden * bytes_per), note=note, merge=merge)


#: Routed and shared expert outputs are summed before one all-reduce when their groups coincide.
MOE_OUT = "moe_out"

#: Activation functions: (matrices per gated/non-gated MLP, exponentials per intermediate element).
#: SiLU = x·sigmoid(x), GELU(tanh) = one tanh, ReLU² none.
ACTIVATIONS = {"silu": (3, 1.0), "gelu": (3, 1.0), "gelu_pytorch_tanh": (3, 1.0), "swigluoai": (3, 1.0),
               "relu2": (2, 0.0)}


#: the typed role of a gated MLP's activation, act(gate) * up (OpInfo.role): what measured views time as one
#: elementwise kernel
GATED = "gated"


def activation(act: str) -> tuple[int, float]:
    if act not in ACTIVATIONS:
        raise GraphsimError("config.hidden_act", f"unknown activation {act!r}; known: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[act]


@rule("mlp", "gated: 2·3·h·i·T FLOPs (gate/up column-parallel, down row-parallel + TP all-reduce), i exps "
      "per token; non-gated (ReLU²): 2·2·h·i·T")
def mlp(b: GraphBuilder, prefix: str, ts: str, hidden: int, inter: int, *, weights: tuple[str, str],
        act: str = "silu", merge: str = "", deps: tuple | None = None) -> str:
    """``deps``: the op whose output the MLP reads (default: the last compute op)."""
    up, down = weights
    mats, exps = activation(act)
    n_up = (mats - 1) * inter
    linear(b, f"{prefix}gate_up" if mats == 3 else f"{prefix}up", ts, hidden, n_up, up, split=("tp", "dp"),
           deps=deps)
    b.elementwise(f"{prefix}{'swiglu' if mats == 3 else act}", ts, inter, bytes_in=2.0 * (mats - 1), bytes_out=2.0,
                  flops_per_elem=4.0, kind="activation", split=("tp", "dp"), exps=exps * inter,
                  params={"role": GATED} if mats == 3 else {})
    return linear(b, f"{prefix}down", ts, inter, hidden, down, split=("tp", "dp"),
                  comm=(all_reduce_tp(ts, hidden, note="row-parallel down", merge=merge),))


@attrs.frozen
class AttentionShape:
    """One softmax-attention layer: heads and widths, and which positions a query sees."""

    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int = 0  #: 0 = head_dim
    window: int = 0  #: sliding window (0 = every earlier position)
    chunk: int = 0  #: chunked local attention: positions of the query's aligned chunk only (Llama 4)
    sinks: bool = False  #: a learned sink logit per head (gpt-oss): one more exponential per query and head
    qk_norm: bool = False  #: RMSNorm on each head of Q and K (Qwen3, Llama 4, Gemma 3)
    out_gate: bool = False  #: a sigmoid gate on the attention output (Qwen3.5/Qwen3-Next): Q projection doubled

    @property
    def vd(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def kv_elems(self) -> int:
        """Cache elements per token: K and V of every KV head."""
        return self.kv_heads * (self.head_dim + self.vd)

    def visible(self, ts: str) -> tuple[Feature, Feature]:
        """(pairs, cache entries read) for queries of ``ts``."""
        if self.window:
            return Feature("window_pairs", ts, (self.window,)), Feature("window_read", ts, (self.window,))
        if self.chunk:
            return Feature("chunk_pairs", ts, (self.chunk,)), Feature("chunk_read", ts, (self.chunk,))
        return Feature("causal_pairs", ts), Feature("kv_len", ts)


@rule("gqa_attention", "projections 2·h·(H·d·(1+gate) + 2·Hkv·d)·T + 2·H·d·h·T; core 2·H·(d+dv) FLOPs and H exps "
      "per visible (query, key) pair — causal, sliding window Σmin(i+1,W) or aligned chunk Σ(i mod C + 1) — "
      "+ H sink exps per query; cache read once per request per layer")
def gqa_attention(b: GraphBuilder, p: str, ts: str, hidden: int, a: AttentionShape, *, weights: tuple[str, str],
                  cache: str, kv_format: str, precision: str, act_bytes: float, restore: str | None = None) -> str:
    """Q/K/V projection (+ per-head QK norm), cache write, the attention core and the output projection
    (row-parallel + TP all-reduce). ``restore``: the layer's prefix-restore copy the core waits for."""
    wqkv, wo = weights
    q = a.heads * a.head_dim
    kvb = a.kv_elems * fmt(kv_format).bytes_per_elem
    linear(b, "wqkv", ts, hidden, q * (2 if a.out_gate else 1) + a.kv_heads * (a.head_dim + a.vd), wqkv,
           split=("tp", "dp"))
    if a.qk_norm:
        rmsnorm(b, "qk_norm", ts, (a.heads + a.kv_heads) * a.head_dim, split=("tp", "dp"))
    b.cache_write("kv_write", ts, cache, kvb, split=("tp", "dp"))
    pairs, read = a.visible(ts)
    core = b.attention("attn", ts, pairs=pairs, flops_per_pair=2.0 * a.heads * (a.head_dim + a.vd), heads=a.heads,
                       kv_read=read, kv_bytes_per_entry=kvb, q_bytes_per_token=act_bytes * a.heads * (a.head_dim + a.vd),
                       precision=precision, sinks=a.sinks, split=("tp", "dp"), reads=(cache,),
                       params={"kv_heads": a.kv_heads, "attn": "gqa", "head_dim": a.head_dim,
                               "window": a.window or a.chunk})
    if restore:
        b.depends(restore, core, "cache_read")
    if a.out_gate:  # sigmoid(gate) * attention output: one exp per element
        b.elementwise("out_gate", ts, q, bytes_in=4.0, bytes_out=2.0, flops_per_elem=3.0, kind="activation",
                      split=("tp", "dp"), exps=q)
    return linear(b, "wo", ts, a.heads * a.vd, hidden, wo, split=("tp", "dp"),
                  comm=(all_reduce_tp(ts, hidden, note="row-parallel wo"),))


@attrs.frozen
class RecurrentShape:
    """A recurrent token mixer with a fixed-size state per request: Gated DeltaNet (Qwen3.5 / Qwen3-Next
    linear attention) or Mamba-2 (Nemotron-H)."""

    kind: str  #: "gated_delta_net" | "mamba2"
    heads: int  #: value heads (GDN) / SSM heads (Mamba-2)
    k_heads: int  #: key heads (GDN) / B,C groups (Mamba-2)
    k_dim: int  #: key head dim (GDN) / SSM state size (Mamba-2)
    v_dim: int  #: value head dim (GDN) / SSM head dim (Mamba-2)
    conv: int  #: causal conv1d kernel
    state_bytes_per_elem: float = 4.0  #: the recurrent state's dtype (FP32 in both checkpoints' runtimes)

    @property
    def conv_dim(self) -> int:
        if self.kind == "gated_delta_net":
            return 2 * self.k_heads * self.k_dim + self.heads * self.v_dim
        return self.heads * self.v_dim + 2 * self.k_heads * self.k_dim

    @property
    def in_proj(self) -> int:
        """Input projection width: GDN q,k,v + z (output gate) + a,b (decay, beta); Mamba-2 x,z,B,C,dt."""
        if self.kind == "gated_delta_net":
            return self.conv_dim + self.heads * self.v_dim + 2 * self.heads
        return 2 * self.heads * self.v_dim + 2 * self.k_heads * self.k_dim + self.heads

    @property
    def inner(self) -> int:
        return self.heads * self.v_dim

    def state_bytes(self) -> float:
        """One request's recurrent state: heads x k_dim x v_dim at the state dtype, + the conv window (BF16)."""
        return self.heads * self.k_dim * self.v_dim * self.state_bytes_per_elem + (self.conv - 1) * self.conv_dim * 2.0

    @property
    def flops_per_token(self) -> float:
        """The recurrence per token and head over its k_dim x v_dim state: GDN decay (1) + S·k (2) + the
        rank-1 delta update (2) + S·q (2) = 7; Mamba-2 decay (1) + B x outer product (2) + C contraction (2)
        = 5 — the recurrent form, the fewest FLOPs any kernel (chunked or not) needs."""
        return (7.0 if self.kind == "gated_delta_net" else 5.0) * self.heads * self.k_dim * self.v_dim


@rule("recurrent_mixer", "in/out projections 2·h·(in + inner)·T; conv 2·K·conv_dim·T; recurrence 7 (GDN) or 5 "
      "(Mamba-2) FLOPs per state element per token; state read + written once per request per forward")
def recurrent_mixer(b: GraphBuilder, p: str, ts: str, hidden: int, r: RecurrentShape, *,
                    weights: tuple[str, str], state: str) -> str:
    w_in, w_out = weights
    linear(b, "in_proj", ts, hidden, r.in_proj, w_in, split=("tp", "dp"))
    # causal conv1d over the last K inputs + SiLU (one exp per channel)
    b.elementwise("conv1d", ts, r.conv_dim, bytes_in=2.0, bytes_out=2.0, flops_per_elem=2.0 * r.conv + 4.0,
                  kind="activation", split=("tp", "dp"), exps=r.conv_dim)
    sb = r.state_bytes()
    # the recurrence's FLOPs at the BF16 tensor rate: the chunked kernels that run prefill (FLA's chunked
    # delta rule, Mamba-2's SSD) do them as tensor-core matmuls, so no real run is faster than this bound
    cost = (Cost.of(tokens(ts), flops_bf16=r.flops_per_token, exps=float(r.heads),
                    bytes_act=2.0 * (r.conv_dim + 2 * r.inner))
            + Cost.of(Feature("requests", ts), bytes_kv=2.0 * sb))
    b.op("recurrence", "recurrent", cost, token_set=ts, precision="bf16", split=("tp", "dp"), reads=(state,),
         writes=(state,), params={"heads": r.heads, "kv_heads": r.heads},
         formula=f"{r.flops_per_token:g} FLOPs per token over a {r.heads}x{r.k_dim}x{r.v_dim} state; "
                 f"{sb:g} B state read + written per request")
    rmsnorm(b, "gate_norm", ts, r.inner, split=("tp", "dp"))
    return linear(b, "out_proj", ts, r.inner, hidden, w_out, split=("tp", "dp"),
                  comm=(all_reduce_tp(ts, hidden, note="row-parallel out_proj"),))


@attrs.frozen
class MoEShape:
    experts: int
    top_k: int
    inter: int  #: each routed expert's intermediate size
    shared_inter: int = 0  #: the shared expert(s)' total intermediate size (0 = none)
    act: str = "silu"
    redundant: int = 0  #: extra expert copies for EP load balancing (memory only; routing unchanged)
    scoring: str = "softmax"  #: router: softmax or sigmoid, one exponential per expert either way
    latent: int = 0  #: latent MoE (Nemotron 3): tokens projected hidden -> latent, experts work in the latent

    @property
    def slots(self) -> int:
        return self.experts + self.redundant

    def expert_width(self, hidden: int) -> int:
        """The width routed experts read and write: the latent, or the hidden size."""
        return self.latent or hidden


@rule("moe", "router 2·h·E·T + E exps per token; experts 2·m·w·i·k·T FLOPs (m = 3 gated, 2 ReLU²; w = hidden or "
      "the latent), weights of E(1-(1-k/E)^T) distinct experts; EP dispatch k·w and combine k·w·2 B per token; "
      "latent MoE: 2·h·w·T down and up projections; shared expert as mlp")
def moe(b: GraphBuilder, p: str, ts: str, hidden: int, s: MoEShape, *, experts: str, router: str,
        shared: tuple[str, str] | None = None, latent: tuple[str, str] | None = None) -> None:
    x = b.last  # the block's input: the router and the shared expert both read it
    b.gemm("router", ts, hidden, s.experts, weight=router, act_out="fp32", split=("dp",))
    b.elementwise("topk", ts, s.experts, bytes_in=4.0, bytes_out=0.0, flops_per_elem=2.0, kind="router",
                  split=("dp",), exps=s.experts)
    act = act_for(b._tensors[experts].format.name)
    w = s.expert_width(hidden)
    if s.latent:
        linear(b, "moe.latent_down", ts, hidden, w, latent[0], split=("dp",))
    t = tokens(ts)
    dispatch = CommSpec("all_to_all", "ep", Cost.of(t, bytes_act=s.top_k * fmt(act).nbytes(w)), "before",
                        note=f"dispatch ({act})", phase="dispatch", payload_format=act)
    combine = CommSpec("all_to_all", "ep", Cost.of(t, bytes_act=s.top_k * w * 2.0), "after", note="combine (BF16)",
                       phase="combine", payload_format="bf16")
    reduce = CommSpec("all_reduce", "moe_tp", Cost.of(t, bytes_act=w * 2.0), "after", note="expert TP",
                      merge="" if s.latent else MOE_OUT)
    mats, exps = activation(s.act)
    b.moe_experts("moe.experts", ts, experts=s.experts, top_k=s.top_k, hidden=w, inter=s.inter,
                  weight=experts, act_in=act, split=("ep",), comm=(dispatch, combine, reduce), matrices=mats,
                  exps_per_elem=exps, slots=s.slots)
    if s.latent:
        linear(b, "moe.latent_up", ts, w, hidden, latent[1], split=("dp",))
    if shared:  # beside the routed path (dataflow: it needs none of the exchange), summed with its output
        routed = b.last
        mlp(b, "moe.shared.", ts, hidden, s.shared_inter, weights=shared, act=s.act, merge=MOE_OUT,
            deps=(x,) if x else None)
        b.join(routed)


@rule("dsa_indexer", "index Q 2·q_lora·H·D + weights 2·h·H per token; 2·H·D + 3·H FLOPs per scored (query, key) "
      "pair at the index-key format's rate (ReLU scores: no exps); index keys read once per request; top-K "
      "over the scored keys")
def dsa_indexer(b: GraphBuilder, p: str, ts: str, *, hidden: int, q_in: int, heads: int, dim: int, topk: int,
                wq: str, wk: str, wproj: str, key_format: str, key_cache: str, ratio: int = 1) -> str:
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): scores every visible (or, with
    ``ratio`` m > 1, every compressed) key with ReLU-gated multi-head dot products and selects the top
    ``topk`` per query; the index keys are written once per token. Replicated across TP."""
    linear(b, "indexer.wq_b", ts, q_in, heads * dim, wq, split=("dp",), kind="indexer")
    b.gemm("indexer.weights_proj", ts, hidden, heads, weight=wproj, act_out="fp32", split=("dp",), kind="indexer")
    kb = fmt(key_format)
    entry = kb.nbytes(dim)
    wkt = b._tensors[wk]
    b.op("indexer.k_write", "indexer", Cost.of(Feature("active", ts), bytes_weight=wkt.nbytes)
         + Cost.of(Feature("new_groups", ts, (ratio,)) if ratio > 1 else tokens(ts),
                   flops_bf16=2.0 * hidden * dim, bytes_act=2.0 * hidden, bytes_kv=entry),
         token_set=ts, split=("dp",), reads=(wk,), writes=(key_cache,), params={"k": hidden, "n": dim},
         formula=f"wk {hidden}->{dim} + norm per new key, {entry:g} B per key")
    if ratio > 1:
        pairs, reads = Feature("compressed_pairs", ts, (ratio,)), Feature("compressed", ts, (ratio,))
    else:
        pairs, reads = Feature("causal_pairs", ts), Feature("kv_len", ts)
    per_pair = 2.0 * heads * dim + 3.0 * heads
    prec = kb.compute
    b.op("indexer.score", "indexer", Cost.of(pairs, **{f"flops_{prec}": per_pair})
         + Cost.of(reads, bytes_kv=entry) + Cost.of(tokens(ts), bytes_act=kb.nbytes(heads * dim) + heads * 4.0),
         token_set=ts, precision=prec, split=("dp",), reads=(key_cache,),
         formula=f"{per_pair:g} {prec} flops per scored key; ReLU scores, no exps")
    sel = b.tensor(f"{p}topk", "workspace", "int8", elems_per_token=4 * topk, module=p.rstrip("."))
    return b.op("indexer.topk", "topk", Cost.of(Feature("topk_pairs", ts, (ratio, topk)), bytes_act=4.0)
                + Cost.of(pairs, flops_fp32=2.0), token_set=ts, split=("dp",), writes=(sel,),
                formula=f"Top-{topk} of the scored keys; indices written")


@rule("embedding", "a row gather per token: read + write 2·d B (BF16), + 2·d B per residual stream written (mHC)")
def embedding(b: GraphBuilder, name: str, ts: str, d: int, weight: str, *, streams: int = 0, formula: str = "",
              **kw) -> str:
    """Embedding gather: reads one row per token (never the whole table); ``streams`` residual copies."""
    cost = Cost.of(tokens(ts), bytes_act=d * 2.0 * 2 + streams * d * 2.0)
    kw.setdefault("split", ("dp",))
    return b.op(name, "embedding", cost, token_set=ts, reads=(weight,),
                formula=formula or f"gather {d} bf16 per token" + (f", write {streams} residual streams" if streams else ""),
                **kw)


def gathered_logits(ts: str, vocab: int, note: str = "logits") -> CommSpec:
    """The vocabulary-parallel head's fp32 logits all-gathered over TP."""
    return CommSpec("all_gather", "tp", Cost.of(tokens(ts), bytes_act=vocab * 4.0), note=note)


@rule("lm_head", "final RMSNorm + 2·h·V·T FLOPs vocabulary-parallel, fp32 logits all-gathered (4·V B per token)")
def lm_head(b: GraphBuilder, ts: str, hidden: int, vocab: int, weight: str) -> str:
    """Final norm + vocabulary projection on the positions that need logits."""
    rmsnorm(b, "final_norm", ts, hidden)
    return b.gemm("head", ts, hidden, vocab, weight=weight, split=("tp", "dp"), act_out="fp32",
                  comm=(gathered_logits(ts, vocab),))


@rule("residual", "x + f(x): 1 FLOP, two BF16 vectors read and one written per element")
def residual(b: GraphBuilder, name: str, ts: str, h: int) -> str:
    return b.elementwise(name, ts, h, bytes_in=4.0, bytes_out=2.0, flops_per_elem=1, split=("dp",))


@rule("vit_attention", "a ViT block's attention half over an image's patches: RMSNorm, fused QKV GEMM, 2-D RoPE on "
      "q and k (4 FLOPs per element), bidirectional attention (4h FLOPs per (query, key) pair of one image, or of one "
      "B-patch tile), the output GEMM with its TP all-reduce, the residual; optionally per-head q/k/v RMSNorms and a "
      "norm on the output before the residual (Gemma 4), no RoPE (SigLIP)")
def vit_attention(b: GraphBuilder, ts: str, h: int, heads: int, precision: str, *, prefix: str, norm: str, qkv: str,
                  out: str, note: str, split=("tp", "dp"), block: int = 0, rope: bool = True, qkv_norm: str = "",
                  post_norm: str = "") -> str:
    """``block`` > 0: the tower runs on fixed blocks of ``block`` positions (Llama 4's 577-position tiles, Gemma 3's
    4096-patch images), attention within each (``block_pairs``); 0: within the request's patches (``full_pairs``).
    ``qkv_norm`` / ``post_norm``: the weights of per-head q/k/v RMSNorms and of a norm on the attention output
    before the residual (read from ``prefix``.name); ``rope`` False: absolute position embeddings only."""
    rmsnorm(b, "norm1", ts, h, reads=(f"{prefix}.{norm}",))
    b.gemm(f"attn.{qkv}", ts, h, 3 * h, weight=f"{prefix}.attn.{qkv}", split=split)
    if qkv_norm:
        rmsnorm(b, "attn.qkv_norm", ts, 3 * h, split=split, reads=(f"{prefix}.{qkv_norm}",))
    if rope:
        b.elementwise("attn.rope2d", ts, 2 * h, bytes_in=2.0, bytes_out=2.0, flops_per_elem=4, split=split)
    pairs = Feature("block_pairs", ts, (block,)) if block else Feature("full_pairs", ts)
    b.attention("attn.core", ts, pairs=pairs, flops_per_pair=4.0 * h, heads=heads,
                precision=precision, q_bytes_per_token=(3 * h + h) * 2.0, split=split,
                params={"attn": "encoder", "head_dim": h // heads})
    b.gemm(f"attn.{out}", ts, h, h, weight=f"{prefix}.attn.{out}", split=split, comm=(all_reduce_tp(ts, h, note=note),))
    if post_norm:
        rmsnorm(b, "attn.post_norm", ts, h, reads=(f"{prefix}.{post_norm}",))
    return residual(b, "attn.residual", ts, h)


#: Where a prefix-cache hit is copied from, and the links its bytes cross: host memory over C2C/PCIe; local
#: NVMe, then the same host link (a GPUDirect read crosses the same PCIe/C2C port). HBM hits copy nothing.
RESTORE_LINKS = {"host": ("bytes_c2c",), "disk": ("bytes_disk", "bytes_c2c")}


@rule("prefix_restore", "per tier, Σ bytes over the cached positions of that tier, on every link it crosses "
      "(host: C2C/PCIe; disk: NVMe then C2C/PCIe)")
def restore_copy(b: GraphBuilder, bytes_of, *, split=("dp",), params: dict | None = None) -> str:
    """One layer's prefix restore on the host-copy stream: ``bytes_of(tier)`` -> [(feature, bytes)] for the
    ``cached_<tier>`` sets of :func:`graphsim.models.base.restore_sets`. Models issue every layer's copy up
    front, in layer order, with no data dependency (the hits are known before the forward), so later layers'
    copies overlap earlier layers' compute; the caller makes the layer's first reader of the cache wait for it."""
    terms = [(link, f, v) for tier, links in RESTORE_LINKS.items() for f, v in bytes_of(tier) for link in links]
    with b.stage("restore"):
        return b.op("restore", "host_copy", Cost(tuple(terms)), stream="host_copy", token_set="cached_host",
                    split=split, deps=(), params=params,
                    formula="cached KV of this layer: host hits over C2C/PCIe, disk hits from NVMe then C2C/PCIe")


@rule("mla_kv_up", "MLA prefill: 2·r·H(dn+dv) FLOPs per visible position (latent -> per-head K_nope, V), the "
      "latent read and K/V written once per request; W read once")
def mla_kv_up(b: GraphBuilder, name: str, ts: str, *, rank: int, up: int, weight: str, cache: str,
              latent_bytes: float, out_bytes: float) -> str:
    from .ir import wider

    w = b._tensors[weight]
    prec = wider(fmt(act_for(w.format.name)).compute, w.format.compute)
    kv_len = Feature("kv_len", ts)
    cost = (Cost.of(Feature("active", ts), bytes_weight=w.nbytes)
            + Cost.of(kv_len, **{f"flops_{prec}": 2.0 * rank * up, "bytes_kv": latent_bytes, "bytes_act": out_bytes * up}))
    return b.op(name, "gemm", cost, token_set=ts, precision=prec, split=("tp", "dp"), reads=(weight, cache),
                formula=f"2·{rank}·{up} flops per visible position",
                params={"k": rank, "n": up, "copies": 1, "weight_format": w.format.name,
                        "kv_heads": 1})  # every TP rank reads the whole latent


__all__ = ["RULES", "Rule", "rule", "linear", "rmsnorm", "mlp", "gqa_attention", "recurrent_mixer", "moe",
           "dsa_indexer", "embedding", "gathered_logits", "lm_head", "restore_copy", "mla_kv_up", "RESTORE_LINKS",
           "residual", "vit_attention",
           "AttentionShape", "RecurrentShape", "MoEShape", "all_reduce_tp", "MOE_OUT", "GATED", "act_for", "tokens",
           "activation"]
