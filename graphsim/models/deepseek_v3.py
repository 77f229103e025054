"""DeepSeek-V3/R1 and the models with its shapes (Kimi K2/K2.5): MLA attention (prefill path with up-projected
K/V, absorbed decode path over the latent cache), dense first layers, MoE with a sigmoid router, routed top-k +
shared experts, weights in the checkpoint's quantization (FP8 128x128 blocks for DeepSeek's own release).
DeepSeek-V3.2 and GLM-5 add DeepSeek Sparse Attention: a lightning indexer (:func:`graphsim.core.rules.dsa_indexer`)
selects ``index_topk`` positions per query and MLA attends over those only.
The shipped MTP module drafts with ``policies.mtp`` (it is not part of the trunk otherwise)."""
from __future__ import annotations

import attrs

from ..core.builder import GraphBuilder
from ..core.config import field, kv_cache_format, structure, text_config
from ..core.errors import require
from ..core.limits import MAX_CONTEXT
from ..core.ir import Feature, Tensor, fmt
from ..core.plan import ParallelMapping
from ..core.rules import MoEShape, act_for, all_reduce_tp, dsa_indexer, linear, mla_kv_up, mlp, moe, rmsnorm, tokens
from .base import Model, attention_act_bytes, divides, embedding, lm_head, restore_copy, restore_sets


@attrs.frozen
class V3Config:
    """DeepSeek-V3-shaped configs, read through the one converter (graphsim.core.config.structure)."""

    hidden: int = field("int", hf="hidden_size")
    layers: int = field("int", hf="num_hidden_layers")
    dense_layers: int = field("int", hf="first_k_dense_replace", lo=0)
    heads: int = field("int", hf="num_attention_heads")
    q_lora: int = field("int", hf="q_lora_rank")
    kv_lora: int = field("int", hf="kv_lora_rank")
    nope: int = field("int", hf="qk_nope_head_dim")
    rope: int = field("int", hf="qk_rope_head_dim")
    v_dim: int = field("int", hf="v_head_dim")
    inter: int = field("int", hf="intermediate_size")
    moe_inter: int = field("int", hf="moe_intermediate_size")
    experts: int = field("int", hf="n_routed_experts")
    shared: int = field("int", hf="n_shared_experts", lo=0)
    top_k: int = field("int", hf="num_experts_per_tok")
    vocab: int = field("int", hf="vocab_size")
    max_position: int = field("int", MAX_CONTEXT, hf="max_position_embeddings")
    #: DSA lightning indexer (DeepSeek-V3.2, GLM-5); 0 = dense MLA
    index_heads: int = field("int", 0, hf="index_n_heads")
    index_dim: int = field("int", 0, hf="index_head_dim")
    index_topk: int = field("int", 0, hf="index_topk")
    mtp_layers: int = field("int", 0, hf="num_nextn_predict_layers", lo=0)  #: shipped MTP modules
    #: the routing and RoPE facts the executor (graphsim.views.collect.kernels_mla) needs; the cost model does not
    n_group: int = field("int", 1, hf="n_group")  #: expert groups (top ``topk_group`` groups kept per token)
    topk_group: int = field("int", 1, hf="topk_group")
    routed_scale: float = field("float", 1.0, hf="routed_scaling_factor")
    norm_topk: bool = field("bool", True, hf="norm_topk_prob")
    rope_theta: float = field("float", 10000.0, hf="rope_theta")

    def __attrs_post_init__(self):
        require(self.dense_layers <= self.layers, "config.first_k_dense_replace",
                f"must be <= num_hidden_layers ({self.layers}), got {self.dense_layers}")
        require(self.top_k <= self.experts, "config.num_experts_per_tok",
                f"must be <= n_routed_experts ({self.experts}), got {self.top_k}")
        require(not self.index_topk or (self.index_heads and self.index_dim), "config.index_topk",
                "a DSA indexer needs index_n_heads and index_head_dim too")

    @staticmethod
    def from_dict(cfg: dict) -> "V3Config":
        return V3Config(**structure(V3Config, text_config(cfg)))

    @property
    def sparse(self) -> bool:
        return self.index_topk > 0

    @property
    def qk_dim(self) -> int:
        return self.nope + self.rope

    @property
    def latent(self) -> int:
        """MLA cache elements per token per layer: compressed KV + the shared RoPE key (512 + 64 = 576)."""
        return self.kv_lora + self.rope


#: Hugging Face module names of a layer's weights (what quantization configs name).
HF = {"wq_a": "self_attn.q_a_proj", "wq_b": "self_attn.q_b_proj", "wkv_a": "self_attn.kv_a_proj_with_mqa",
      "wkv_b": "self_attn.kv_b_proj", "wo": "self_attn.o_proj", "mlp.gate_up": "mlp.gate_proj",
      "mlp.down": "mlp.down_proj", "moe.experts": "mlp.experts", "moe.shared.gate_up": "mlp.shared_experts.gate_proj",
      "moe.shared.down": "mlp.shared_experts.down_proj", "indexer.wq_b": "self_attn.indexer.wq_b",
      "indexer.wk": "self_attn.indexer.wk"}


class DeepSeekV3(Model):
    family = "deepseek_v3"
    #: takes ``weights`` / ``redundant_experts`` / ``sibling`` (hf_quant_config.json) from load_model
    QUANT_AWARE = True
    #: Kimi K2.5's MoonViT-3D tower (graphsim.models.vision_tower) when load_model finds one in the config
    VISION_AWARE = True

    def __init__(self, cfg: dict, name: str = "deepseek-v3", kv_format: str | None = None, *,
                 weights: str | None = None, redundant_experts: int = 0, sibling: dict | None = None,
                 vision: tuple | None = None):
        from ..core.quant import from_config

        self.name = name
        self.cfg = V3Config.from_dict(cfg)
        self.family = str(text_config(cfg).get("model_type", "deepseek_v3"))
        # the checkpoint's KV cache (quantization_config / kv_cache_dtype / hf_quant_config), BF16 by default
        kv_src = {**cfg, "quantization_config": sibling.get("quantization", sibling)} if sibling else cfg
        self.kv_format = kv_format or kv_cache_format(kv_src)
        # weights as the checkpoint stores them (DeepSeek's release: FP8 e4m3 with one fp32 scale per 128x128
        # block, V41_FACTS §13), or as ``weights`` overrides
        self.quant = from_config(cfg, sibling)
        if weights is not None:
            self.quant = self.quant.override(weights)
        self.redundant = redundant_experts
        #: (vision tower, image processor), or Nones: a text model
        self.tower, self.processor = vision or (None, None)
        require(not redundant_experts or self.cfg.layers > self.cfg.dense_layers, "redundant_experts",
                f"{name} has no MoE layers")

    def _fmt(self, i: int, key: str) -> str:
        return self.quant.format_of(f"layers.{i}.{HF[key]}")

    # ---- resident inventory -------------------------------------------------------------------------
    def weights(self) -> tuple[Tensor, ...]:
        c = self.cfg
        out = [Tensor("embed", "weight", "bf16", c.vocab * c.hidden, module="embed", group="embed")]
        for i in range(c.layers):
            out += self._layer_weights(f"layers.{i}.", i, dense=i < c.dense_layers)
        out += [Tensor("final_norm", "weight", "bf16", c.hidden, module="final_norm", group="embed"),
                Tensor("head", "weight", self.quant.format_of("lm_head"), c.hidden * c.vocab, module="head",
                       group="embed")]
        if c.mtp_layers:  # the MTP module (HF: layers.<num_hidden_layers>): eh_proj, its norms, one MoE layer
            i = c.layers
            out += [Tensor("mtp.eh_proj", "weight", self.quant.format_of(f"layers.{i}.eh_proj"), 2 * c.hidden * c.hidden,
                           module="mtp", group="mtp"),
                    Tensor("mtp.proj_norms", "weight", "bf16", 3 * c.hidden, module="mtp", group="mtp")]
            out += self._layer_weights("mtp.", i, dense=False, group="mtp")
        if self.tower is not None:
            out += self.tower.weights()
        return tuple(out)

    def _layer_weights(self, p: str, i: int, *, dense: bool, group: str = "trunk") -> list:
        c = self.cfg

        def w(key, elems, module):  # format from the HF module the tensor is (the HF table)
            return Tensor(p + key, "weight", self._fmt(i, key.removeprefix("attn.")), elems, module=p + module,
                          group=group)

        def bf16(key, elems, module, f="bf16"):
            return Tensor(p + key, "weight", f, elems, module=p + module, group=group)

        out = [
            w("attn.wq_a", c.hidden * c.q_lora, "attn"),
            w("attn.wq_b", c.q_lora * c.heads * c.qk_dim, "attn"),
            w("attn.wkv_a", c.hidden * c.latent, "attn"),
            w("attn.wkv_b", c.kv_lora * c.heads * (c.nope + c.v_dim), "attn"),
            w("attn.wo", c.heads * c.v_dim * c.hidden, "attn"),
            bf16("norms", 2 * c.hidden + c.q_lora + c.kv_lora, "norms"),
        ]
        if c.sparse:  # lightning indexer: index queries, index keys (+ LayerNorm), per-head weights
            out += [w("attn.indexer.wq_b", c.q_lora * c.index_heads * c.index_dim, "attn"),
                    w("attn.indexer.wk", c.hidden * c.index_dim, "attn"),
                    bf16("attn.indexer.weights_proj", c.hidden * c.index_heads, "attn"),
                    bf16("attn.indexer.k_norms", 2 * c.index_dim, "norms")]
        if dense:
            return out + [w("mlp.gate_up", 2 * c.hidden * c.inter, "mlp"), w("mlp.down", c.inter * c.hidden, "mlp")]
        return out + [
            bf16("moe.router", c.hidden * c.experts, "moe"),
            # the router's per-expert score-correction bias (e_score_correction_bias)
            bf16("moe.router_bias", c.experts, "moe", "fp32"),
            w("moe.experts", (c.experts + self.redundant) * 3 * c.hidden * c.moe_inter, "moe"),
            w("moe.shared.gate_up", c.shared * 2 * c.hidden * c.moe_inter, "moe"),
            w("moe.shared.down", c.shared * c.moe_inter * c.hidden, "moe"),
        ]

    def index_key_bytes(self) -> float:
        """One position's index key: FP8 + an fp32 scale per 128 (DeepSeek-V3.2's indexer cache)."""
        return fmt("fp8_s128").nbytes(self.cfg.index_dim) if self.cfg.sparse else 0.0

    def kv_bytes(self, context: int, policies=None) -> float:
        """Latent (+ index key) per position per layer; drafting with MTP adds its layer's cache."""
        per = self.cfg.latent * fmt(self.kv_cache_format(policies)).bytes_per_elem + self.index_key_bytes()
        mtp = 1 if getattr(policies, "mtp", 0) else 0
        return context * (self.cfg.layers + mtp) * per

    def validate_mapping(self, m: ParallelMapping) -> None:
        divides("mapping.tp", m.tp, self.cfg.heads, "attention heads")
        what = f"routed experts + {self.redundant} redundant" if self.redundant else "routed experts"
        divides("mapping.ep", m.ep, self.cfg.experts + self.redundant, what)

    # ---- graph ------------------------------------------------------------------------------------
    def vision(self) -> str:
        return "" if self.tower is not None else super().vision()

    def image_processor(self):
        return self.processor

    def reference_graph(self, policies=None):
        """Every stage the model can run: with a vision tower, a prefill with an image too."""
        if self.tower is None:
            return super().reference_graph(policies)
        from ..core.plan import Request

        reqs = (Request("prefill", 64 + 4, image_tokens=4, image_patches=4 * self.tower.merge ** 2),
                Request("decode", 64))
        return self.build(("prefill", "decode"), policies=policies, requests=reqs)

    def _build(self, b: GraphBuilder, kinds: tuple, policies=None, requests=(), **_) -> None:
        c = self.cfg
        if self.tower is not None and any(r.kind == "prefill" and r.image_patches for r in requests or ()):
            self.tower.build(b)  # the vision stage first: the embedding writes its image features
        kv_fmt = self.kv_cache_format(policies)
        prec = self.attention_precision(policies)
        kvb = c.latent * fmt(kv_fmt).bytes_per_elem
        b.token_set("all")
        b.token_set("pf", prefill="all", decode="none")  # MLA prefill path (K/V up-projected)
        b.token_set("dec", prefill="none", decode="all")  # MLA absorbed path over the latent cache
        b.token_set("last", prefill="one", decode="all")
        tp_dp = ("tp", "dp")
        copies = {}
        if "prefill" in kinds:  # prefix hits copy each layer's latent cache in (whole on every TP rank)
            restore_sets(b)
            for i in range(c.layers):
                with b.layer(i):
                    copies[i] = restore_copy(b, lambda tier: [(tokens(f"cached_{tier}"), kvb)], split=tp_dp,
                                             params={"kv_heads": 1})
        with b.stage("embed"):
            embedding(b, "all", c.hidden, "embed")
        with b.stage("trunk"):
            for i in range(c.layers):
                with b.layer(i):
                    self._layer(b, f"layers.{i}.", kinds, kvb, prec, kv_fmt, dense=i < c.dense_layers,
                                copy=copies.get(i))
        with b.stage("head"):
            lm_head(b, "last", c.hidden, c.vocab, "head")
        k = getattr(policies, "mtp", 0) if policies is not None else 0
        if k and "decode" in kinds:
            self._mtp(b, k, kvb, prec, kv_fmt)

    def _layer(self, b: GraphBuilder, p: str, kinds: tuple, kvb: float, prec: str, kv_fmt: str, *, dense: bool,
               copy: str | None = None, ts: tuple = ("all", "pf", "dec"), cache: str = "", state: str = "") -> None:
        """One decoder layer (MLA + dense MLP or MoE) over token sets ``ts`` = (all, prefill path, decode
        path), weights under the prefix ``p``, its latent cache ``cache`` (default ``p + "kv"``) and its
        other per-pass tensors (index keys, Top-K selection) under ``state`` (default ``p``): a module run
        several times in one forward (MTP depths) owns one of each per run."""
        c, tp_dp = self.cfg, ("tp", "dp")
        t_all, state = ts[0], state or p
        kv = b.tensor(cache or p + "kv", "kv_cache", kv_fmt, elems_per_token=c.latent, module=p + "attn")
        rmsnorm(b, "attn_norm", t_all, c.hidden)
        linear(b, "wq_a", t_all, c.hidden, c.q_lora, p + "attn.wq_a", split=("dp",))
        rmsnorm(b, "q_norm", t_all, c.q_lora, out_bytes=fmt(act_for(b._tensors[p + "attn.wq_b"].format.name)).bytes_per_elem)
        linear(b, "wq_b", t_all, c.q_lora, c.heads * c.qk_dim, p + "attn.wq_b", split=tp_dp)
        linear(b, "wkv_a", t_all, c.hidden, c.latent, p + "attn.wkv_a", split=("dp",))
        rmsnorm(b, "kv_norm", t_all, c.kv_lora)
        b.cache_write("kv_write", t_all, kv, kvb, split=("dp",))
        readers, topk = [], None
        if c.sparse:
            keys = b.tensor(state + "index_k", "index_cache", "fp8_s128", elems_per_token=c.index_dim,
                            module=p + "attn")
            topk = dsa_indexer(b, state + "attn.", t_all, hidden=c.hidden, q_in=c.q_lora, heads=c.index_heads,
                               dim=c.index_dim, topk=c.index_topk, wq=p + "attn.indexer.wq_b",
                               wk=p + "attn.indexer.wk", wproj=p + "attn.indexer.weights_proj",
                               key_format="fp8_s128", key_cache=keys)
            readers.append(topk)
        if "prefill" in kinds:
            readers.append(self._mla_prefill(b, p, kvb, prec, topk, ts[1], kv))
        if "decode" in kinds:
            readers.append(self._mla_decode(b, p, kvb, prec, topk, ts[2], kv))
        if copy:
            for r in readers:  # the layer's cache readers wait for its restored prefix
                b.depends(copy, r, "cache_read")
        linear(b, "wo", t_all, c.heads * c.v_dim, c.hidden, p + "attn.wo", split=tp_dp,
               comm=(all_reduce_tp(t_all, c.hidden, note="row-parallel wo"),))
        rmsnorm(b, "mlp_norm", t_all, c.hidden)
        if dense:
            mlp(b, "mlp.", t_all, c.hidden, c.inter, weights=(p + "mlp.gate_up", p + "mlp.down"))
        else:
            self._moe(b, p, t_all)

    def _mtp(self, b: GraphBuilder, k: int, kvb: float, prec: str, kv_fmt: str) -> None:
        """MTP drafting (DeepSeek-V3 §2.2): ``k`` sequential passes of the shipped MTP module — embed the
        last token, concatenate with the previous hidden state (eh_proj 2h -> h), one MoE decoder layer over
        its own latent cache, the shared LM head and sampling — one draft position per decode request each;
        the verify forward is the trunk over 1 + k positions (graphsim's speculative-decoding accounting)."""
        c = self.cfg
        b.token_set("mtp", prefill="none", decode="one")
        with b.stage("draft"):
            for j in range(k):
                with b.layer(None, prefix=f"mtp.{j}."):
                    embedding(b, "mtp", c.hidden, "embed")
                    rmsnorm(b, "enorm", "mtp", c.hidden)
                    rmsnorm(b, "hnorm", "mtp", c.hidden)
                    linear(b, "eh_proj", "mtp", 2 * c.hidden, c.hidden, "mtp.eh_proj", split=("dp",))
                    # draft depth j writes (and reads up to) its own positions' entries of the MTP layer's
                    # caches (latent, DSA index keys) and selects its own Top-K: one tensor of each per depth
                    self._layer(b, "mtp.", ("decode",), kvb, prec, kv_fmt, dense=False, ts=("mtp", "mtp", "mtp"),
                                cache=f"mtp.kv.{j}", state=f"mtp.{j}.")
                    lm_head(b, "mtp", c.hidden, c.vocab, "head")
                    b.elementwise("sample", "mtp", c.vocab, bytes_in=4.0, bytes_out=0.0, flops_per_elem=2.0,
                                  kind="sampling", split=("dp",), exps=c.vocab)

    def max_mtp(self) -> int:
        """Draft depth MTP may run at: the shipped module reused up to 8 times (TensorRT-LLM and SGLang run
        DeepSeek-V3/R1's single MTP layer recursively, e.g. MTP-3); 0 when the checkpoint ships none."""
        return 8 if self.cfg.mtp_layers else 0

    def resident_groups(self, policies=None) -> tuple:
        """The MTP module is loaded only when drafting with it."""
        groups = ("embed", "trunk", "vision") if self.tower is not None else ("embed", "trunk")
        return groups + ("mtp",) if getattr(policies, "mtp", 0) else groups

    def _mla_prefill(self, b: GraphBuilder, p: str, kvb: float, prec: str, topk: str | None = None,
                     ts: str = "pf", kv: str = "") -> str:
        """Prefill: up-project every visible latent to per-head K_nope and V (written at the attention's
        operand precision), then causal attention at ``prec`` — with DSA, over each query's top-K selection
        only (sparse attention in MHA form: the fewest FLOPs of the kernels that run it)."""
        c = self.cfg
        kv_len = Feature("kv_len", ts)
        up = c.heads * (c.nope + c.v_dim)
        ab = attention_act_bytes(prec)
        reader = mla_kv_up(b, "wkv_b", ts, rank=c.kv_lora, up=up, weight=p + "attn.wkv_b", cache=kv or p + "kv",
                           latent_bytes=kvb, out_bytes=ab)
        pairs = Feature("topk_pairs", ts, (1, c.index_topk)) if topk else Feature("causal_pairs", ts)
        read = Feature("sparse_read", ts, (1, c.index_topk)) if topk else kv_len
        b.attention("attn_prefill", ts, pairs=pairs,
                    flops_per_pair=2.0 * (c.qk_dim + c.v_dim) * c.heads, heads=c.heads, precision=prec,
                    kv_read=read, kv_bytes_per_entry=ab * (c.heads * (c.nope + c.v_dim) + c.rope),
                    q_bytes_per_token=ab * c.heads * (c.qk_dim + c.v_dim), split=("tp", "dp"),
                    params={"attn": "mla_mha", "head_dim": c.qk_dim})
        return reader

    def _mla_decode(self, b: GraphBuilder, p: str, kvb: float, prec: str, topk: str | None = None,
                    ts: str = "dec", kv: str = "") -> str:
        """Decode: absorb W_UK into the query and W_UV into the output; attend over the 576-wide latent
        (with DSA, over each query's top-K selected positions)."""
        c = self.cfg
        b.gemm("q_absorb", ts, c.nope, c.kv_lora, weight=p + "attn.wkv_b", copies=c.heads, precision="bf16",
               split=("tp", "dp"))
        K = c.index_topk
        pairs = Feature("topk_pairs", ts, (1, K)) if topk else Feature("causal_pairs", ts)
        read = Feature("sparse_read", ts, (1, K)) if topk else Feature("kv_len", ts)
        reader = b.attention("attn_decode", ts, pairs=pairs,
                             flops_per_pair=2.0 * (c.latent + c.kv_lora) * c.heads, heads=c.heads, precision=prec,
                             kv_read=read, kv_bytes_per_entry=kvb,
                             q_bytes_per_token=attention_act_bytes(prec) * c.heads * (c.latent + c.kv_lora),
                             split=("tp", "dp"), reads=(kv or p + "kv",),
                             params={"kv_heads": 1, "attn": "mla", "head_dim": c.latent})  # one latent, replicated across TP
        b.gemm("o_absorb", ts, c.kv_lora, c.v_dim, weight=p + "attn.wkv_b", copies=c.heads, precision="bf16",
               split=("tp", "dp"))
        return reader

    def _moe(self, b: GraphBuilder, p: str, ts: str = "all") -> None:
        """Sigmoid-routed top-k experts (+ redundant copies) and the shared expert(s): the ``moe`` rule."""
        c = self.cfg
        shape = MoEShape(c.experts, c.top_k, c.moe_inter, c.shared * c.moe_inter, "silu", self.redundant, "sigmoid")
        moe(b, p, ts, c.hidden, shape, experts=p + "moe.experts", router=p + "moe.router",
            shared=(p + "moe.shared.gate_up", p + "moe.shared.down"))

