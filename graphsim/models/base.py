"""What every model offers: resident weights, a graph builder for a request structure, mapping checks."""
from __future__ import annotations

from typing import Sequence

from ..core.builder import GraphBuilder
from ..core.errors import GraphsimError, require
from ..core.ir import ONE, Graph, Tensor, fmt, wider
from ..core.plan import ParallelMapping
from ..core.rules import (  # noqa: F401  (re-exported: the model files' vocabulary)
    MOE_OUT,
    RESTORE_LINKS,
    all_reduce_tp,
    embedding as _embedding,
    lm_head,
    restore_copy,
    rmsnorm,
    tokens,
)
#: The cache an attention kernel at this precision reads (FP8 attention reads FP8 Q/K/V and an FP8 cache;
#: FP4 attention an E2M1 cache with E4M3 scales per 16), where the checkpoint's cache is wider.
KV_FORMAT_AT = {"fp8": "fp8", "fp4": "fp4_e2m1_e4m3_16"}



class _PolicyReads:
    """A read-only stand-in for a :class:`~graphsim.driver.pipeline.Policies` value that records each field a build
    reads (name -> value): the build cache's key for the policies."""

    __slots__ = ("_policies", "read")

    def __init__(self, policies) -> None:
        object.__setattr__(self, "_policies", policies)
        object.__setattr__(self, "read", {})

    def __getattr__(self, name: str):
        value = getattr(self._policies, name)
        if not name.startswith("_") and not callable(value):
            self.read[name] = value
        return value

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"policies are read-only during a build ({name})")

class Model:
    """The model protocol. Subclasses set ``name``/``family``/``cfg`` and implement ``weights``, ``_build`` and
    ``kv_bytes``; every optional capability has a declared default here (no caller probes for attributes):
    layers, KV layout per layer and per device, resident groups, the reference graph, policy passes and
    support, speculative drafting (MTP, DSpark) and parameter counts."""

    name = "model"
    family = "model"
    #: the Hugging Face id the model was named by, or the public repository of a shipped config (None: a file or a
    #: dict); launch commands carry it
    hf_id = None
    #: policy field -> values this model honours (graphsim.driver.pipeline.BASE_SUPPORT for the rest)
    POLICY_SUPPORT: dict = {}
    #: the checkpoint's weight quantization (graphsim.core.quant.Quantization) where the family reads it; None when
    #: the model's own semantics fix its formats (DeepSeek-V4/V4.1)
    quant = None
    #: the constructor takes ``weights`` / ``redundant_experts`` / ``sibling`` (an hf_quant_config.json) from
    #: load_model (class-based families; the generic decoder always does)
    QUANT_AWARE = False
    #: the constructor takes ``vision`` = (vision tower, image processor) from load_model when the config has a tower
    #: graphsim models (graphsim.models.vision_tower)
    VISION_AWARE = False

    # ---- structure ------------------------------------------------------------------------------------
    def num_layers(self) -> int:
        """Trunk decoder layers (pipeline stages split them; per-layer KV is keyed by them)."""
        cfg = getattr(self, "cfg", None)
        for name in ("num_hidden_layers", "layers"):
            v = getattr(cfg, name, None)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        raise GraphsimError("model", f"{self.name}: cannot tell how many trunk layers it has")

    def layer_table(self):
        """Per-layer roles (``graphsim layers``); None when the model has no such table."""
        return None

    def passes(self, policies) -> list:
        """The model's policy passes (replay, fusion…) as (name, pass) pairs, in order."""
        return []

    def validate_plan(self, plan) -> None:
        """Raise GraphsimError for plans this model cannot run (beyond the policy support table)."""

    def reference_graph(self, policies=None):
        """Every stage the model can run, for how each resident tensor is sharded."""
        return self.build(("prefill", "decode"), policies=policies)

    def resident_groups(self, policies=None) -> tuple:
        """Inventory groups this deployment loads under ``policies`` (default: all of them)."""
        return tuple(sorted({t.group for t in self.weights()}))

    def vision(self) -> str:
        """Why image inputs cannot run ("" when the model has a vision path that prices them)."""
        return f"{self.name} has no vision tower"

    def image_processor(self):
        """The processor that turns ``+img:WxH`` into patches and image tokens for this model (an object with
        ``image_tokens(w, h)``); None: graphsim.core.vision's default (DeepSeek-V4.1-Flash's)."""
        return None

    # ---- speculative decoding -----------------------------------------------------------------------------
    def max_mtp(self) -> int:
        """Draft depth the checkpoint's MTP module may run at (0: it ships none)."""
        return 0

    def draft_ahead(self, policies) -> int:
        """Positions a drafter holds beyond the context under ``policies`` (DSpark's draft block)."""
        return 0

    # ---- KV layout ---------------------------------------------------------------------------------------
    def kv_request_bytes(self, context: int, policies=None) -> float:
        """KV bytes one request holds at ``context`` under ``policies`` (drafters' caches included)."""
        return self.kv_bytes(context, policies)

    def kv_bytes_by_layer(self, context: int, policies=None) -> dict:
        """One request's KV bytes per layer (extra keys sort after the trunk); uniform by default."""
        n = self.num_layers()
        per = self.kv_request_bytes(context, policies) / n
        return {i: per for i in range(n)}

    def kv_owners(self) -> dict:
        """layer -> the layer whose KV it reads (shared KV); empty when every layer reads its own."""
        return {}

    def owner_kv_bytes(self, context: int, layer: int) -> float:
        """The KV an owner layer holds for the layers that share it (0 without sharing)."""
        return 0.0

    def kv_split(self, m: ParallelMapping) -> int:
        """How many devices one request's KV is spread over (attention data parallelism by default)."""
        return m.dp

    def kv_breakdown(self, context: int) -> dict | None:
        """A model-specific breakdown of one request's KV at ``context`` (``graphsim memory``), if any."""
        return None

    def weights(self) -> tuple[Tensor, ...]:
        """Resident inventory by physical module (never depends on the workload)."""
        raise NotImplementedError

    def kv_bytes(self, context: int, policies=None) -> float:
        """KV-cache bytes one request holds at ``context`` tokens (all layers, whole model) under ``policies``
        (an FP8 attention reads, so stores, an FP8 cache)."""
        raise NotImplementedError

    #: the checkpoint's KV-cache storage format(s) the attention reads (models set it from the config)
    kv_format = "bf16"

    def kv_formats(self) -> tuple[str, ...]:
        return (self.kv_format,)

    def attention_precision(self, policies=None) -> str:
        """The precision the attention math runs at: the plan's ``attention_precision``, or ("auto") the
        widest compute precision of the caches it reads (a BF16 cache -> BF16, an FP8 cache -> FP8; a
        storage-only FP4 cache such as V4.1's main KV is dequantized first -> BF16)."""
        p = getattr(policies, "attention_precision", "auto") if policies is not None else "auto"
        if p != "auto":
            return p
        out = "fp4"
        for f in self.kv_formats():
            out = wider(out, fmt(f).compute)
        return out

    def max_context(self) -> int:
        """Longest context the model was built for (``max_position_embeddings``; the graphsim bound when the
        config has none): requests beyond it are refused unless the plan allows beyond-context what-ifs."""
        from ..core.limits import MAX_CONTEXT

        cfg = getattr(self, "cfg", None)
        return int(getattr(cfg, "max_position", None) or getattr(cfg, "max_position_embeddings", None) or MAX_CONTEXT)

    def hidden_size(self) -> int:
        cfg = getattr(self, "cfg", None)
        hidden = getattr(cfg, "hidden", None) or getattr(cfg, "hidden_size", None)
        require(isinstance(hidden, int), "model", f"{self.name}: no hidden size in its config")
        return hidden

    def residual_bytes_per_token(self) -> float:
        """The residual state one token carries from layer to layer, in BF16 (mHC keeps ``hc_mult`` streams):
        what a pipeline stage sends on and what a scattered layer gathers back."""
        return 2.0 * self.hidden_size() * getattr(self.cfg, "hc_mult", 1)

    def kv_cache_format(self, policies=None) -> str:
        """The KV cache as stored under ``policies``: the checkpoint's, narrowed to what an explicitly lower
        attention precision reads (FP8 attention keeps an FP8 cache)."""
        p = self.attention_precision(policies)
        if p in KV_FORMAT_AT and fmt(KV_FORMAT_AT[p]).bytes_per_elem < fmt(self.kv_format).bytes_per_elem:
            return KV_FORMAT_AT[p]
        return self.kv_format

    def validate_mapping(self, mapping: ParallelMapping) -> None:
        """Raise GraphsimError for mappings that cannot exist for this model."""

    def param_counts(self) -> dict:
        """Parameter counts: ``total_params`` (every weight the model loads by default, Engram tables
        included; optional modules such as a shipped MTP/draft module apart: ``shipped_params`` has them too),
        ``active_params_per_token`` (what one token's forward reads: all weights but the routed experts it is
        not sent to — top_k of each MoE layer's expert slots —, the token embedding and Engram tables, of which
        it reads one row each (a tied embedding counts: the head reads it whole)) and
        ``active_params_with_embeddings`` (the same with the token embedding, the convention of some model
        cards; Engram tables still apart) and ``vision_params`` (the vision tower's inventory group, inside
        ``total_params``; a text token runs none of it). Read off the model's reference graph, so every family
        gets them."""
        graph = self.reference_graph()
        weights = {t.name: t for t in self.weights()}
        shipped = sum(t.elems for t in weights.values())
        groups = self.resident_groups(None)
        loaded = {name: t for name, t in weights.items() if t.group in groups}
        idle = 0.0
        for op in graph.ops:
            if op.kind == "moe_experts" and op.info.slots:
                for name in op.reads:
                    if name in loaded:
                        idle += loaded[name].elems * (1.0 - op.info.top_k / op.info.slots)
        head_reads = {r for op in graph.ops if op.stage == "head" for r in op.reads}
        # lookup tables: the token embedding (unless tied to the head, which reads it whole) and Engram tables
        embed = {r for op in graph.ops if op.kind == "embedding" for r in op.reads} - head_reads
        emb = sum(loaded[r].elems for r in embed if r in loaded)
        tables = sum(t.elems for t in loaded.values() if t.role == "table")
        # a text token does not run the vision tower
        other = {r for op in graph.ops if op.stage != "vision" for r in op.reads}
        vision_only = {r for op in graph.ops if op.stage == "vision" for r in op.reads} - other
        vision = sum(loaded[r].elems for r in vision_only if r in loaded)
        total = sum(t.elems for t in loaded.values())
        active = int(round(total - idle - vision))
        return {"total_params": total, "active_params_per_token": active - emb - tables,
                "active_params_with_embeddings": active - tables, "shipped_params": shipped,
                "vision_params": sum(t.elems for t in loaded.values() if t.group == "vision")}

    def active_params_per_token(self) -> int:
        return self.param_counts()["active_params_per_token"]

    #: distinct builds a model keeps (graphs are frozen values, so a sweep over mappings and policies
    #: shares one build per (kinds, policies, requests) instead of rebuilding it per point)
    BUILD_CACHE_SIZE = 16

    def __getstate__(self) -> dict:
        """Pickles and copies leave the per-object caches behind (a sweep's workers get the model, not its
        graphs; a copy.copy variant builds its own)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_build_cache", "_inventory_cache")}

    def build(self, kinds: Sequence[str], **options) -> Graph:
        """The logical (unsharded) graph for a batch whose request groups have ``kinds``. Builds are
        memoized per (kinds, options) on the model (a small LRU; the graph is a frozen value). The policies
        enter the key by the fields the build *read* (recorded while it ran): a build is a function of what it
        reads, so a search over overlap, replay windows or collective algorithms reuses one build per
        (kinds, requests, the policy values the model looks at)."""
        kinds = tuple(kinds)
        if not kinds:
            raise GraphsimError("requests", "give at least one request")
        policies = options.get("policies")
        rest = {k: v for k, v in options.items() if k != "policies"}
        try:
            key = (kinds, policies is None, tuple(sorted(rest.items())))
            hash(key)
        except TypeError:  # unhashable options: build without the cache
            return self._build_graph(kinds, options)
        owner, cache = self.__dict__.get("_build_cache", (None, None))
        if owner is not self:  # none yet, or a copy.copy of another model (a variant with its own config)
            cache = {}
            self.__dict__["_build_cache"] = (self, cache)
        for k, (key_, reads, graph) in cache.items():
            if key_ == key and all(getattr(policies, f) == v for f, v in reads):
                cache[k] = cache.pop(k)  # most recently used last
                return graph
        if policies is None:
            graph, reads = self._build_graph(kinds, options), ()
        else:
            seen = _PolicyReads(policies)
            graph = self._build_graph(kinds, {**options, "policies": seen})
            reads = tuple(sorted(seen.read.items()))
        while len(cache) >= self.BUILD_CACHE_SIZE:
            cache.pop(next(iter(cache)))  # least recently used first
        cache[object()] = (key, reads, graph)
        return graph

    def _build_graph(self, kinds: tuple, options: dict) -> Graph:
        b = GraphBuilder(self.name, meta={"model": self.name, "kinds": kinds,
                                          "attention_precision": self.attention_precision(options.get("policies")),
                                          "residual_bytes": self.residual_bytes_per_token()})
        for t in self._inventory():
            b.declare(t)
        self._build(b, kinds, **options)
        return b.build()

    def _inventory(self) -> tuple[Tensor, ...]:
        """The resident inventory as every build declares it (each weight as ``GraphBuilder.tensor`` makes it:
        its module defaulting to its name, no per-token part), computed once per model object."""
        owner, inv = self.__dict__.get("_inventory_cache", (None, None))
        if owner is not self:
            inv = tuple(t if (t.module and t.elems_per_token == 0 and type(t.elems) is int) else
                        Tensor(t.name, t.role, t.format, int(t.elems), 0, t.module or t.name, t.group)
                        for t in self.weights())
            self.__dict__["_inventory_cache"] = (self, inv)
        return inv

    def _build(self, b: GraphBuilder, kinds: tuple, **options) -> None:
        raise NotImplementedError


def divides(field: str, parts: int, total: int, what: str) -> None:
    if total % parts:
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        raise GraphsimError(field, f"{parts} does not divide {what} ({total}); allowed: {divisors}")


def embedding(b: GraphBuilder, ts: str, hidden: int, weight: str) -> str:
    """The token embedding (the ``embedding`` rule), first op of a graph."""
    return _embedding(b, "embed", ts, hidden, weight, deps=())


def restore_sets(b: GraphBuilder, swa_window: int = 0) -> None:
    """Token sets of a prefix restore, per tier: the cached positions (``cached_<tier>``) and, for a model
    with an SWA cache, the kept window (``cached_swa_<tier>``; none when the window is replayed). Declares the
    ``restore`` stage first, so reports list it before the trunk."""
    b.declare_stage("restore")
    for tier in RESTORE_LINKS:
        b.token_set(f"cached_{tier}", prefill=f"cached@{tier}", decode="none")
        if swa_window:
            b.token_set(f"cached_swa_{tier}", prefill=f"cached_swa:{swa_window}@{tier}", decode="none")


def attention_act_bytes(precision: str) -> float:
    """Bytes per element of the Q/K/V an attention kernel at ``precision`` reads and writes (FP8 attention
    runs on FP8 operands; BF16 on BF16)."""
    return fmt(KV_FORMAT_AT.get(precision, precision)).bytes_per_elem


__all__ = ["Model", "BF16", "attention_precision", "divides", "attention_act_bytes", "restore_sets", "restore_copy", "tokens", "rmsnorm",
           "all_reduce_tp", "embedding", "lm_head", "ONE", "MOE_OUT"]


#: bytes per BF16 element (activations and unquantized weights of the DeepSeek-V4 family's graphs)
BF16 = 2.0


def attention_precision(b) -> str:
    """The precision the attention math of the graph being built runs at (set by ``Model.build``)."""
    return b.meta.get("attention_precision", "bf16")
