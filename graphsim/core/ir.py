"""The intermediate representation: storage formats, tensors, features, costs, ops, token sets, graphs.

Everything here is a frozen value object. An op's cost is *linear in features*: a feature is a named,
possibly nonlinear function of the workload (Σ tokens of a token set, Σ attention pairs, expected distinct
experts, …) and the op multiplies it by a coefficient per cost component. That is what lets one built graph
be evaluated at millions of workload points in one vectorized call (see ``graphsim.lowering``).
"""
from __future__ import annotations

import functools
import math
from typing import Iterable, Mapping

import attrs

from .features import FEATURE_KINDS, FEATURES
from .errors import GraphsimError, one_of, require

# --------------------------------------------------------------------------------------------------
# Precisions and storage formats
# --------------------------------------------------------------------------------------------------

PRECISIONS = ("fp4", "fp8", "bf16", "tf32", "fp32", "int8")
#: Precisions the attention math (QK^T, PV) may run at; "auto" derives it from the KV cache formats.
ATTENTION_PRECISIONS = ("auto", "bf16", "fp8", "fp4")
#: Tensor-core width order: a GEMM runs at the rate of its wider operand (FP8 activations x FP4 weights run
#: at the FP8 rate on Blackwell; only FP4 x FP4 reaches the FP4 peak).
_WIDTH = {"fp4": 0, "int8": 1, "fp8": 1, "bf16": 2, "tf32": 3, "fp32": 4}


def wider(a: str, b: str) -> str:
    """The precision a GEMM of operands ``a`` and ``b`` runs at."""
    return a if _WIDTH[a] >= _WIDTH[b] else b

#: Cost components, in the order of the lowered coefficient tensor's last axis.
#: ``flops_*`` are divided by the peak of that precision, ``exps`` (softmax exponentials and other
#: special-function ops) by the SFU rate, ``bytes_*`` by a bandwidth, ``hops_*`` are multiplied by a
#: per-hop latency.  HBM traffic is kept in three parts (weights, KV/index/SWA caches,
#: activations and workspace) so reports can show them apart; all three share the HBM bandwidth.
COMPONENTS = (
    *(f"flops_{p}" for p in PRECISIONS),
    "exps",
    "bytes_weight",
    "bytes_kv",
    "bytes_act",
    "bytes_nvlink",
    "bytes_scaleout",
    "bytes_c2c",
    "bytes_disk",
    "hops_nvlink",
    "hops_scaleout",
    "hops_nvlink_ll",
    "hops_nvlink_simple",
)
COMPONENT_INDEX = {c: i for i, c in enumerate(COMPONENTS)}
HBM_COMPONENTS = ("bytes_weight", "bytes_kv", "bytes_act")


@attrs.frozen
class StorageFormat:
    """How a tensor is stored: data bits per element plus one ``scale_bits`` scale per ``block`` elements."""

    name: str
    bits: float
    scale_bits: int = 0
    block: int = 1
    compute: str = "bf16"  #: precision a GEMM reading this format runs at (FP4 KV is dequantized first)

    @property
    def bytes_per_elem(self) -> float:
        scale = (self.scale_bits / 8) / self.block if self.scale_bits else 0.0
        return self.bits / 8 + scale

    def nbytes(self, elems: float) -> float:
        return elems * self.bytes_per_elem


FORMATS: dict[str, StorageFormat] = {
    f.name: f
    for f in (
        StorageFormat("fp32", 32, compute="fp32"),
        StorageFormat("bf16", 16, compute="bf16"),
        StorageFormat("fp16", 16, compute="bf16"),
        StorageFormat("fp8", 8, compute="fp8"),
        StorageFormat("int8", 8, compute="int8"),
        # DeepSeek-V3: FP8 e4m3 weights, one fp32 scale per 128x128 block (V41_FACTS §13).
        StorageFormat("fp8_b128x128", 8, 32, 128 * 128, compute="fp8"),
        # DeepSeek-V4.1 dense linears: FP8, 32x32 weight blocks, ue8m0 scale (V41_FACTS §8).
        StorageFormat("fp8_b32x32_ue8m0", 8, 8, 32 * 32, compute="fp8"),
        # V4.1 MoE experts: FP4 with a ue8m0 scale per 32 (V41_FACTS §12).
        StorageFormat("fp4_ue8m0_32", 4, 8, 32, compute="fp4"),
        # V4.1 main KV: E2M1 + one E4M3 scale per 16 channels -> 288 B per 512-entry (V41_FACTS §8).
        # Stored format only: it is dequantized before attention, so compute is bf16.
        StorageFormat("fp4_e2m1_e4m3_16", 4, 8, 16, compute="bf16"),
        # V4.1 index K: MXFP4, groups of 32 -> 68 B per 128-entry (V41_FACTS §8).
        StorageFormat("mxfp4", 4, 8, 32, compute="fp4"),
        # V4.1 Engram tables/projections: FP8 with one e8m0 scale per 32 elements (V41_FACTS §6).
        StorageFormat("fp8_e8m0_32", 8, 8, 32, compute="fp8"),
        # Checkpoint weight schemes (graphsim.core.quant): NVFP4 = E2M1 + one E4M3 scale per 16 (ModelOpt), on the
        # FP4 tensor rate with FP4 activations; its W4A16 variant dequantizes to BF16; int4 weight-only
        # (AWQ/GPTQ/compressed-tensors) with one BF16 scale per group of 32/64/128, BF16 activations.
        # DeepSeek-V3.2 / GLM-5 indexer keys: FP8 + one fp32 scale per 128 -> 132 B per 128-entry key.
        StorageFormat("fp8_s128", 8, 32, 128, compute="fp8"),
        StorageFormat("nvfp4", 4, 8, 16, compute="fp4"),
        StorageFormat("nvfp4_w4a16", 4, 8, 16, compute="bf16"),
        StorageFormat("w4a16_g32", 4, 16, 32, compute="bf16"),
        StorageFormat("w4a16_g64", 4, 16, 64, compute="bf16"),
        StorageFormat("w4a16_g128", 4, 16, 128, compute="bf16"),
        # int4 weights with FP8 activations (ModelOpt W4A8_AWQ): the FP8 tensor rate
        StorageFormat("w4a8_g128", 4, 16, 128, compute="fp8"),
    )
}


def fmt(name: str | StorageFormat) -> StorageFormat:
    """Look a storage format up by name."""
    if isinstance(name, StorageFormat):
        return name
    try:
        return FORMATS[name]
    except KeyError:
        raise GraphsimError("format", f"unknown storage format {name!r}; known: {sorted(FORMATS)}") from None


# --------------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------------

def _count(field: str, v) -> None:
    if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 53):
        raise GraphsimError(field, f"must be a whole number in [0, 2^53), got {v!r}")


def _nonneg_count(_inst, attr, v) -> None:
    if not (type(v) is int and 0 <= v < 1 << 53):  # (the field's name is spelled only for an error)
        _count(f"tensor.{attr.name}", v)


ROLES = ("weight", "activation", "kv_cache", "index_cache", "swa_cache", "table", "workspace", "state")
RESIDENT_ROLES = ("weight", "table")


@attrs.frozen
class Tensor:
    """A named tensor. Resident tensors (weights, tables) have fixed ``elems``; the rest scale with tokens.

    ``module`` is the physical module it belongs to (e.g. ``layers.3.attn.wq_a``) and ``group`` the
    inventory group (``trunk``, ``engram``, ``dspark``, ``vision``, ``embed``…) used by memory reports.
    """

    name: str
    role: str = attrs.field(validator=one_of("tensor", ROLES))
    format: StorageFormat = attrs.field(converter=fmt)
    elems: int = attrs.field(default=0, validator=_nonneg_count)
    elems_per_token: int = attrs.field(default=0, validator=_nonneg_count)
    module: str = ""
    group: str = "trunk"

    @property
    def nbytes(self) -> float:
        """Bytes of the fixed part (the whole tensor for weights and tables)."""
        return self.format.nbytes(self.elems)

    @property
    def resident(self) -> bool:
        return self.role in RESIDENT_ROLES


# --------------------------------------------------------------------------------------------------
# Token sets
# --------------------------------------------------------------------------------------------------

#: Interval rules a token set applies per request kind. Positions are 0-based; a request's forward covers
#: ``new`` positions after ``past`` cached ones. ``tail:W`` = last min(new, W) new positions; ``dtail:W``
#: the same positions whose SWA history starts at the tail (decoder bounded replay truncates it there);
#: ``replay`` = the ``replay`` cached positions recomputed by a prefix restore (workload field);
#: ``text``/``image`` split the new positions by modality (count-only); ``patches`` = vision patches;
#: ``one`` = the last new position; ``cached`` = every cached position; ``cached_swa:W`` = the last W cached
#: positions of a request whose SWA cache is restored (none when they are replayed); ``ahead:N`` = the N
#: positions right after the new ones (a speculative draft block). A ``replay+`` prefix applies the rule to
#: the replayed positions and the new ones together (a restore recomputes the last cached tokens with the suffix).
#: An ``@TIER`` suffix (``cached@host``) keeps the positions only of requests whose cached prefix lives in
#: that tier (workload field ``tier``): what a restore copies from host memory or disk.
RULE_KINDS = ("all", "none", "tail", "dtail", "replay", "text", "image", "patches", "one", "cached", "cached_swa", "ahead")
REQUEST_KINDS = ("prefill", "decode")


#: Where a cached prefix lives: already in HBM, in host memory, on local disk.
CACHE_TIERS = ("hbm", "host", "disk")


def _check_rule(rule: str) -> str:
    base = rule[len("replay+"):] if rule.startswith("replay+") else rule
    base, at, tier = base.partition("@")
    require(not at or tier in CACHE_TIERS, "token_set.rule", f"{rule!r}: tier after @ must be one of {CACHE_TIERS}")
    head, _, arg = base.partition(":")
    require(head in RULE_KINDS, "token_set.rule", f"unknown rule {rule!r}; allowed: {RULE_KINDS} (optionally 'replay+' before)")
    if head in ("tail", "dtail", "cached_swa", "ahead"):
        require(arg.isdigit() and int(arg) > 0, "token_set.rule", f"{rule!r} needs a positive window, e.g. tail:128")
    return rule


@attrs.frozen
class TokenSet:
    """Which positions of each request an op processes, per request kind (prefill / decode)."""

    name: str
    prefill: str = attrs.field(default="all", converter=_check_rule)
    decode: str = attrs.field(default="all", converter=_check_rule)

    def rule(self, kind: str) -> str:
        return getattr(self, kind)


# --------------------------------------------------------------------------------------------------
# Features and costs
# --------------------------------------------------------------------------------------------------

#: Every feature kind (FEATURE_KINDS), with its closed form, parameters and CP/window flags (FEATURES): the
#: registry in graphsim.core.features.


@attrs.frozen(cache_hash=True)
class Feature:
    """A workload feature: ``kind`` over ``token_set`` with ``params``; ``frac`` scales request counts
    (micro-batch splitting by requests) before any nonlinearity; ``chunk`` = (j, m) evaluates it on causal
    chunk j of m of every prefill request's new positions (micro-batch splitting of long prompts: chunk j
    covers new positions [⌊j·n/m⌋, ⌊(j+1)·n/m⌋) with everything before it cached in HBM)."""

    kind: str = attrs.field(validator=one_of("feature", FEATURE_KINDS))
    token_set: str = ""
    params: tuple = ()
    frac: float = 1.0
    chunk: tuple = ()

    def __attrs_post_init__(self):
        want = FEATURES[self.kind].params
        if len(self.params) != len(want):
            raise GraphsimError(f"feature[{self.kind}].params", f"takes ({', '.join(want)}), got {self.params!r}")

    def __str__(self) -> str:
        p = ",".join(str(x) for x in self.params)
        s = f"{self.kind}({self.token_set}{';' if p and self.token_set else ''}{p})"
        s = s if self.frac == 1.0 else f"{s}*{self.frac:g}"
        return s if not self.chunk else f"{s}[chunk {self.chunk[0]}/{self.chunk[1]}]"


ONE = Feature("one")


#: Feature -> its repr: terms sort by it. Only features whose numbers have one type each (float frac,
#: int params, no chunk) are kept, so equal features here always print alike (1 == 1.0, not in repr).
_FEATURE_KEYS: dict = {}


def feature_key(f: Feature) -> str:
    """The canonical order of features inside a cost: ``repr(f)``, cached (sorting terms is hot)."""
    if _canonical_feature(f):
        k = _FEATURE_KEYS.get(f)
        if k is None:
            if len(_FEATURE_KEYS) > 1 << 16:  # bounded: a long-lived process sweeping many fractions
                _FEATURE_KEYS.clear()
            k = _FEATURE_KEYS[f] = repr(f)
        return k
    return repr(f)


def _canonical_feature(f: Feature) -> bool:
    fr = f.frac
    return (type(fr) is float and fr > 0.0 and not f.chunk
            and (not f.params or all(type(x) is int for x in f.params)))


def intern_cost(cost: "Cost", table: dict) -> "Cost":
    """``cost``, or the equal Cost already in ``table`` (hash-consing: repeated layers then share one
    object, so every later lookup by cost is an identity hit). Only costs whose features print alike
    whenever they are equal (float frac, int params, no chunk; coefficients are floats) are shared."""
    if type(cost) is not Cost:
        return cost
    hit = table.get(cost)
    if hit is not None and hit is not cost:
        if all(_canonical_feature(f) for _, f, _ in cost.terms):
            return hit
        return cost
    if hit is None and all(_canonical_feature(f) for _, f, _ in cost.terms):
        table[cost] = cost
    return cost


def _term_key(t: tuple) -> tuple:
    return t[0], feature_key(t[1])


def _component(t: tuple) -> str:
    return t[0]


def _bad_term(term) -> None:
    """Raise the error naming what is wrong with ``term`` (the checks of :func:`_norm_terms`, spelled out)."""
    require(isinstance(term, tuple) and len(term) == 3, "cost.terms", f"each term is (component, Feature, "
            f"coefficient), got {term!r}")
    comp, feat, coef = term
    if comp not in COMPONENT_INDEX:
        raise GraphsimError("cost.component", f"unknown component {comp!r}; allowed: {COMPONENTS}")
    require(isinstance(feat, Feature), "cost.feature", f"must be a Feature, got {feat!r}")
    ok = isinstance(coef, (int, float)) and not isinstance(coef, bool) and math.isfinite(coef)
    require(ok, "cost.coefficient", f"must be a finite number, got {coef!r}")


def _norm_terms(terms: Iterable[tuple[str, Feature, float]]) -> tuple:
    acc: dict[tuple[str, Feature], float] = {}
    index, isfinite = COMPONENT_INDEX, math.isfinite
    for term in terms:
        if type(term) is not tuple or len(term) != 3:
            _bad_term(term)
        comp, feat, coef = term
        tc = type(coef)
        if (comp not in index or not isinstance(feat, Feature)
                or not ((tc is float or tc is int or (isinstance(coef, (int, float)) and tc is not bool))
                        and isfinite(coef))):
            _bad_term(term)
        if coef:
            key = (comp, feat)
            acc[key] = acc.get(key, 0.0) + float(coef)
    out = [(c, f, v) for (c, f), v in acc.items() if v]
    if len(out) > 1:
        f0 = out[0][1]
        if all(t[1] is f0 or t[1] == f0 for t in out):  # one feature: its components are distinct, order by them
            out.sort(key=_component)
        else:
            out.sort(key=_term_key)
    return tuple(out)


@attrs.frozen(cache_hash=True)
class Cost:
    """Σ coef · feature per cost component; the linear form that lowering turns into matrices."""

    terms: tuple = attrs.field(default=(), converter=_norm_terms)

    @classmethod
    def _normalized(cls, terms: tuple) -> "Cost":
        """A Cost from terms already in normal form (merged, nonzero, finite, sorted): no re-checking. Only
        for terms taken from existing Costs with their (component, feature) pairs and order unchanged."""
        c = object.__new__(cls)
        object.__setattr__(c, "terms", terms)
        object.__setattr__(c, "_attrs_cached_hash", None)  # attrs' hash cache (cache_hash=True), unset
        return c

    @staticmethod
    def of(feature: Feature, **components: float) -> "Cost":
        """``Cost.of(tokens, flops_fp8=2*k*n, bytes_act=...)``: several components over one feature."""
        if isinstance(feature, Feature) and all(c in COMPONENT_INDEX and (type(v) is float or type(v) is int)
                                                and math.isfinite(v) for c, v in components.items()):
            # already checked, one feature, distinct components: the normal form is the nonzero terms by
            # component (what _norm_terms would make of them)
            return Cost._normalized(tuple(sorted(((c, feature, float(v)) for c, v in components.items() if v),
                                                 key=_component)))
        return Cost(tuple((c, feature, v) for c, v in components.items()))

    def __add__(self, other: "Cost") -> "Cost":
        a, b = self.terms, other.terms
        if type(self) is Cost and type(other) is Cost:  # both in normal form already
            if not (a and b):
                return other if not a else self
            if len(b) == 1 or len(a) == 1:
                seen = {(c, f) for c, f, _ in (a if len(b) == 1 else b)}
                t = b[0] if len(b) == 1 else a[0]
                disjoint = (t[0], t[1]) not in seen
            else:
                seen = {(c, f) for c, f, _ in a}
                disjoint = not any((c, f) in seen for c, f, _ in b)
            if disjoint:  # nothing to merge: the normal form is the terms in canonical order
                return Cost._normalized(tuple(sorted(a + b, key=_term_key)))
        return Cost(a + b)

    def __mul__(self, k: float) -> "Cost":
        return Cost(tuple((c, f, v * k) for c, f, v in self.terms))

    __rmul__ = __mul__

    def scaled(self, factor_of) -> "Cost":
        """Scale each term by ``factor_of(component)``."""
        return Cost(tuple((c, f, v * factor_of(c)) for c, f, v in self.terms))

    def map_features(self, fn) -> "Cost":
        return Cost(tuple((c, fn(f), v) for c, f, v in self.terms))

    def features(self) -> tuple[Feature, ...]:
        return tuple(dict.fromkeys(f for _, f, _ in self.terms))

    def component(self, name: str) -> tuple[tuple[Feature, float], ...]:
        return tuple((f, v) for c, f, v in self.terms if c == name)

    def evaluate(self, values: Mapping[Feature, float]) -> dict[str, float]:
        """Component totals for one workload point given its feature values."""
        out = dict.fromkeys(COMPONENTS, 0.0)
        for c, f, v in self.terms:
            out[c] += v * values[f]
        return out


# --------------------------------------------------------------------------------------------------
# Ops, edges, graphs
# --------------------------------------------------------------------------------------------------

STREAMS = ("compute", "comm", "host_copy")
#: data = activations; cache_read = a KV owner's cache read by another op; topk_reuse = another layer's Top-K
#: selection; candidates = the hierarchical indexer's shared candidate pool; order = ordering without data
EDGE_KINDS = ("data", "cache_read", "topk_reuse", "candidates", "order")
#: tp: heads/columns (work and weights); dp: requests (work); ep: routed experts over every rank of the stage
#: (work and weights, the hottest rank carrying any EP imbalance); world: any other table or work spread
#: evenly over every rank of the stage (work and weights, e.g. Engram rows sharded TP x EP)
SPLIT_AXES = ("tp", "dp", "ep", "world")
_SPLIT_AXES = frozenset(SPLIT_AXES)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


@attrs.frozen
class CommSpec:
    """A collective an op needs when its ``group`` axis has more than one rank.

    ``bytes`` is the payload per rank before the collective (a Cost over ``bytes_act``); the sharding pass
    turns it into a comm op on the comm stream with algorithm-specific link bytes and hops.
    """

    collective: str = attrs.field(validator=one_of("comm", COLLECTIVES))
    group: str = attrs.field(validator=one_of("comm", ("tp", "ep", "dp", "world", "moe_tp", "pp")))
    payload: Cost = Cost()
    where: str = attrs.field(default="after", validator=one_of("comm", ("before", "after")))
    algorithm: str = attrs.field(default="auto", validator=one_of("comm", ("auto", "ring", "tree", "direct")))
    note: str = ""
    #: collectives of one layer with the same ``merge`` key that land on the same ranks are one collective
    #: (e.g. routed and shared expert outputs summed before a single all-reduce): the later one carries it
    merge: str = ""
    #: an MoE token exchange: which half (dispatch / combine) and the storage format of the rows it moves
    phase: str = attrs.field(default="", validator=one_of("comm", ("", "dispatch", "combine")))
    payload_format: str = ""


def _frozen_params(p) -> tuple:
    if type(p) is tuple:  # (the common case, without the ABC check below)
        return p
    if isinstance(p, Mapping):
        return tuple(p.items())
    return tuple(p)


def _nonneg_int(field: str):
    def check(_inst, attr, v):
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):  # (message only when needed)
            raise GraphsimError(f"{field}.{attr.name}", f"must be a whole number >= 0, got {v!r}")
    return check


def _nonneg_num(field: str):
    def check(_inst, attr, v):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        if not ok:
            raise GraphsimError(f"{field}.{attr.name}", f"must be a finite number >= 0, got {v!r}")
    return check


def _info_int():
    return attrs.field(default=0, validator=_nonneg_int("op.info"))


#: Attention forms: GQA/MQA/MHA over a per-head KV cache ("gqa"); MLA's absorbed decode over the shared
#: latent ("mla"); MLA prefill in MHA form ("mla_mha"); sparse attention over selected positions ("sparse");
#: bidirectional attention of an encoder ("encoder")
ATTENTION_FORMS = ("gqa", "mla", "mla_mha", "sparse", "encoder")


@attrs.frozen
class OpInfo:
    """The typed facts about an op that passes and reports read (0 / "" = not applicable). Free-form notes
    for people live in ``Op.params``; nothing reads those to decide anything."""

    #: GEMM shape: ``copies`` independent k x n products per token (block-diagonal / per-head when > 1)
    k: int = _info_int()
    n: int = _info_int()
    copies: int = _info_int()
    weight_format: str = ""
    #: routed experts: how many, how many per token, their hidden and intermediate widths
    experts: int = _info_int()
    top_k: int = _info_int()
    hidden: int = _info_int()
    inter: int = _info_int()
    #: routed-expert weight slots held (experts + redundant copies for EP load balancing)
    slots: int = _info_int()
    #: elementwise ops: elements per token and bytes read / written per element
    elems: int = _info_int()
    bytes_in: float = attrs.field(default=0.0, validator=_nonneg_num("op.info"))
    bytes_out: float = attrs.field(default=0.0, validator=_nonneg_num("op.info"))
    #: attention: query heads, and the KV heads of the cache it reads (fewer than TP ranks: read whole)
    heads: int = _info_int()
    kv_heads: int = _info_int()
    #: a role inside a fusable unit (mHC: coeff, sinkhorn, premix, prenorm, residual) and its element traffic
    role: str = ""
    mhc_elems: int = _info_int()
    #: attention: its form (ATTENTION_FORMS), the QK head width the kernel sees, its sliding window (0: none)
    attn: str = attrs.field(default="", validator=one_of("op.info", ("",) + ATTENTION_FORMS))
    head_dim: int = _info_int()
    window: int = _info_int()
    #: collective ops: which collective, over how many ranks, and the link bytes per payload byte of its
    #: busiest link (the payload is the whole buffer, nccl-tests' convention)
    collective: str = ""
    ranks: int = _info_int()
    link_factor: float = attrs.field(default=0.0, validator=_nonneg_num("op.info"))
    #: an MoE token exchange's rows (``role`` dispatch / combine; ``hidden``, ``top_k``, ``experts`` of its
    #: MoE): their storage format
    payload_format: str = ""

    def items(self) -> dict:
        """The fields that apply (non-default), for display."""
        default = OpInfo()
        return {a.name: getattr(self, a.name) for a in attrs.fields(OpInfo)
                if getattr(self, a.name) != getattr(default, a.name)}


INFO_FIELDS = frozenset(a.name for a in attrs.fields(OpInfo))


def split_params(params) -> tuple[OpInfo, tuple]:
    """(typed OpInfo, remaining display notes) from a params mapping or pairs."""
    d = dict(params or {})
    facts = {k: d.pop(k) for k in list(d) if k in INFO_FIELDS}
    try:  # builders repeat the same facts layer after layer: one OpInfo per distinct set (types included)
        key = tuple((k, type(v), repr(v) if type(v) is float else v) for k, v in facts.items())
        info = _INFOS.get(key)
    except TypeError:  # an unhashable value: let OpInfo name it
        key = info = None
    if info is None:
        info = OpInfo(**facts)
        if key is not None:
            if len(_INFOS) > 1 << 14:
                _INFOS.clear()
            _INFOS[key] = info
    return info, tuple(d.items())


_INFOS: dict = {}


@attrs.frozen
class Op:
    """One operation: what it computes (``kind``, typed ``info``, ``formula``), on which tokens, where
    (``stage``, ``layer``, ``stream``), its linear ``cost`` and how it splits across parallel ranks.
    ``params`` are free-form notes for reports (the collective and group of a comm op, a micro-batch index)."""

    name: str
    kind: str
    stage: str
    cost: Cost = Cost()
    layer: int | None = None
    stream: str = attrs.field(default="compute", validator=one_of("op", STREAMS))
    token_set: str = ""
    precision: str = ""
    split: frozenset = attrs.field(default=frozenset(), converter=frozenset)
    reads: tuple = attrs.field(default=(), converter=tuple)
    writes: tuple = attrs.field(default=(), converter=tuple)
    comm: tuple = attrs.field(default=(), converter=tuple)
    params: tuple = attrs.field(default=(), converter=_frozen_params)
    formula: str = ""
    #: which device of the representative timeline runs it (pipeline stages are different GPUs): ops of
    #: one stream issue in program order per device
    device: int = 0
    #: the logical op this one is a copy of (a two-batch half, a pipeline micro-batch), "" for an original:
    #: copies share the original's tensor writes, each for its own tokens
    origin: str = ""
    info: OpInfo = OpInfo()
    #: alternative costs of one op, ``(label, Cost)`` pairs (a collective's algorithm x protocol): the op takes
    #: the fastest at each evaluated point. Empty, or the first is ``cost`` (what memory, measured tables and
    #: component totals read); passes that change ``cost`` change every alternative alike (:func:`map_cost`).
    alts: tuple = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self):
        require(isinstance(self.name, str) and bool(self.name), "op.name", "must be a non-empty string")
        if self.split:  # (messages are spelled only for a failing op: every op of every graph runs this)
            bad = set(self.split) - _SPLIT_AXES
            if bad:
                raise GraphsimError(f"op[{self.name}].split", f"unknown axes {sorted(bad)}; allowed {SPLIT_AXES}")
        if self.params:
            clash = INFO_FIELDS & {k for k, _ in self.params}
            if clash:
                raise GraphsimError(f"op[{self.name}].params", f"{sorted(clash)} are typed facts: give them in info")

    @property
    def param_dict(self) -> dict:
        """Typed facts and display notes together (for reports and exports)."""
        return {**self.info.items(), **dict(self.params)}


_OP_FIELDS = tuple(a.name for a in attrs.fields(Op))
#: Fields :func:`replace_op` sets without attrs' converters, checked here as ``Op`` checks them.
_OP_FAST = {"name", "kind", "stage", "cost", "layer", "token_set", "precision", "reads", "writes", "comm", "params",
            "formula", "device", "origin", "info", "alts"}


def replace_op(op: Op, **changes) -> Op:
    """``attrs.evolve(op, **changes)`` for the passes' hot loops: the same result and the same checks on
    the changed fields, without re-running the unchanged fields' converters and validators. Changes to
    ``stream`` or ``split`` (validated) go through ``attrs.evolve``."""
    if not changes.keys() <= _OP_FAST:
        return attrs.evolve(op, **changes)
    if "name" in changes:
        name = changes["name"]
        require(isinstance(name, str) and bool(name), "op.name", "must be a non-empty string")
    if "params" in changes:
        params = changes["params"]
        if type(params) is not tuple:
            changes["params"] = params = _frozen_params(params)
        old = op.params
        if old and params[:len(old)] == old:  # the op's own (checked) notes and more: check the more
            clash = INFO_FIELDS.intersection([k for k, _ in params[len(old):]])
        else:
            clash = INFO_FIELDS.intersection([k for k, _ in params])
        require(not clash, f"op[{changes.get('name', op.name)}].params",
                f"{sorted(clash)} are typed facts: give them in info")
    for f in ("reads", "writes", "comm", "alts"):
        if f in changes and type(changes[f]) is not tuple:
            changes[f] = tuple(changes[f])
    return _copy_op(op, changes)


def _op_copier():
    """``copy(op, changes)``: a new Op with ``changes`` over ``op``'s fields, unrolled (as attrs writes
    its own __init__) — the loop over fields is what a pass rewriting thousands of ops pays for."""
    lines = ["def copy(op, c):", "    new = _new(Op)"]
    lines += [f"    _set_{f}(new, c[{f!r}] if {f!r} in c else op.{f})" for f in _OP_FIELDS]
    lines.append("    return new")
    scope = {"_new": object.__new__, "Op": Op}
    scope.update({f"_set_{f}": Op.__dict__[f].__set__ for f in _OP_FIELDS})  # the slots' own setters
    exec("\n".join(lines), scope)
    return scope["copy"]


_copy_op = _op_copier()


def map_cost(op: Op, fn, **changes) -> Op:
    """``op`` with ``fn`` applied to its cost and to each alternative's (``changes`` besides): how a pass that
    rescales costs (a half batch, a micro-batch) keeps an op's alternatives its own."""
    if op.alts:
        changes["alts"] = tuple((label, fn(c)) for label, c in op.alts)
        changes["cost"] = changes["alts"][0][1]
    else:
        changes["cost"] = fn(op.cost)
    return replace_op(op, **changes)


@attrs.frozen
class Edge:
    src: str
    dst: str
    kind: str = attrs.field(default="data", validator=one_of("edge", EDGE_KINDS))


def _str_tuple(v) -> tuple:
    if isinstance(v, str):
        return tuple(x for x in v.split(",") if x)
    return tuple(v)


@attrs.frozen
class GraphMeta:
    """What a graph records about how it was made — typed, read by passes and reports (no side channel)."""

    model: str = ""
    #: request kind of each group of the batch the graph was built for
    kinds: tuple = attrs.field(default=(), converter=_str_tuple)
    #: the precision the attention math runs at (resolved from the policies and the checkpoint)
    attention_precision: str = "bf16"
    #: bytes of the residual state one token carries between layers (BF16; mHC keeps several streams)
    residual_bytes: float = 0.0
    #: the verified passes that made this graph, in order
    passes: tuple = attrs.field(default=(), converter=_str_tuple)
    #: token-set rewrites of the replay passes ("decoder_replay=sglang:W=128", ...)
    token_set_rewrites: tuple = attrs.field(default=(), converter=_str_tuple)
    mapping: str = ""
    hw: str = ""
    policies: str = ""
    #: token layouts the sharding pass picked for MoE blocks ("scatter", "replicated")
    moe_layout: tuple = attrs.field(default=(), converter=_str_tuple)
    #: pipeline parallelism: layers per stage, micro-batches, how the batch was split, the bottleneck stage
    pp_stages: tuple = ()
    pp_micro_batches: int = 0
    pp_split: str = ""
    pp_bottleneck_stage: int | None = None
    #: Engram host prefetch distance (blocks ahead), when the tables live on the host
    prefetch_distance: int | None = None


def _meta(v) -> GraphMeta:
    if isinstance(v, GraphMeta):
        return v
    d = dict(v)
    known = {a.name for a in attrs.fields(GraphMeta)}
    bad = set(d) - known
    require(not bad, "graph.meta", f"unknown fields {sorted(bad)}; known: {', '.join(sorted(known))}")
    return GraphMeta(**d)


#: Cached lookups of a Graph (and its passed structural check) -> the fields they are derived from.
_DERIVED = {"op_index": ("ops",), "tensor_map": ("tensors",), "token_set_map": ("token_sets",),
            "_valid": ("ops", "edges", "tensors", "token_sets", "stages")}


@attrs.frozen(slots=False, eq=False)
class Graph:
    """An immutable stage-and-dependency DAG. Op order is program order (ops on one stream issue in it).

    Passes never mutate a graph: they return ``graph.evolve(...)``.
    """

    name: str
    ops: tuple = attrs.field(converter=tuple)
    edges: tuple = attrs.field(converter=tuple)
    tensors: tuple = attrs.field(default=(), converter=tuple)
    token_sets: tuple = attrs.field(default=(), converter=tuple)
    stages: tuple = attrs.field(default=(), converter=tuple)
    meta: GraphMeta = attrs.field(default=GraphMeta(), converter=_meta)

    def __repr__(self) -> str:  # a summary: the fields hold thousands of ops (str(graph.ops) shows them)
        return (f"Graph({self.name!r}: {len(self.ops)} ops, {len(self.edges)} edges, {len(self.tensors)} tensors, "
                f"stages {', '.join(self.stages) or '-'})")

    # Notebook display: the picture comes from the renderer the exporters register (graphsim.core.display).
    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """Jupyter: the SVG picture (big graphs: one node per layer) where Graphviz's ``dot`` is installed, else
        an HTML summary (op, edge and layer counts, ops per stage and kind) — never a traceback."""
        from .display import graph_html, renderer

        svg_of = renderer("graph_svg")
        svg = svg_of(self) if svg_of is not None else None
        return {"image/svg+xml": svg} if svg is not None else {"text/html": graph_html(self)}

    def _repr_svg_(self) -> str | None:
        """The SVG alone (None without ``dot``): for front ends that ask for it by name."""
        from .display import renderer

        svg_of = renderer("graph_svg")
        return svg_of(self) if svg_of is not None else None

    def evolve(self, **changes) -> "Graph":
        new = attrs.evolve(self, **changes)
        # lookups and the structural check depend only on some fields: keep them where those are unchanged
        for key, deps in _DERIVED.items():
            if key in self.__dict__ and all(getattr(new, d) is getattr(self, d) for d in deps):
                new.__dict__[key] = self.__dict__[key]
        return new

    # ---- lookups ---------------------------------------------------------------------------------
    @functools.cached_property
    def op_index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    def op(self, name: str) -> Op:
        try:
            return self.ops[self.op_index[name]]
        except KeyError:
            raise GraphsimError("op", f"no op named {name!r} in graph {self.name!r}") from None

    @functools.cached_property
    def tensor_map(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    @functools.cached_property
    def token_set_map(self) -> dict[str, TokenSet]:
        return {t.name: t for t in self.token_sets}

    @property
    def meta_dict(self) -> dict:
        return attrs.asdict(self.meta)

    def weights(self) -> tuple[Tensor, ...]:
        """The resident inventory: weights and tables, each counted once."""
        return tuple(t for t in self.tensors if t.resident)

    def weight_bytes(self, group: str | None = None) -> float:
        return sum(t.nbytes for t in self.weights() if group is None or t.group == group)

    def weight_params(self, group: str | None = None) -> int:
        return sum(t.elems for t in self.weights() if group is None or t.group == group)

    def to_networkx(self):
        """The graph as a ``networkx.DiGraph`` for your own analyses: nodes are op names (attributes ``op``, ``kind``,
        ``stage``, ``stream``), edges the dependency edges (attribute ``kind``: the first, most specific one when
        two ops share several). networkx is imported here, on first use."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for op in self.ops:
            g.add_node(op.name, op=op, kind=op.kind, stage=op.stage, stream=op.stream)
        for e in self.edges:
            if not g.has_edge(e.src, e.dst):
                g.add_edge(e.src, e.dst, kind=e.kind)
        return g

    def schedule_edges(self) -> list[tuple[int, int]]:
        """Dependency edges plus stream-order edges (consecutive ops of one stream of one device), as op
        indices."""
        idx = self.op_index
        out = {(idx[e.src], idx[e.dst]) for e in self.edges}
        last: dict[tuple, int] = {}
        for i, op in enumerate(self.ops):
            key = (op.device, op.stream)
            if key in last:
                out.add((last[key], i))
            last[key] = i
        return sorted(out)

    # ---- validation --------------------------------------------------------------------------------
    def validate(self) -> "Graph":
        """Check structure; raise GraphsimError naming the offending op/edge/tensor. The checks run in bulk
        (sets of what is used against what is declared); only a graph that fails them is walked op by op
        to name the first offender. A graph passes once (the result is kept with it and its evolutions
        that keep ops, edges, tensors, token sets and stages)."""
        if self.__dict__.get("_valid"):
            return self
        try:
            ok = self._valid_in_bulk()
        except Exception:  # malformed parts: let the walk below name them
            ok = False
        if not ok:
            self._validate_each()
        self.__dict__["_valid"] = True
        return self

    def _valid_in_bulk(self) -> bool:
        ops, names = self.ops, self.op_index
        if len(names) != len(ops):
            return False
        ts, tensors = self.token_set_map, self.tensor_map
        if not {op.stage for op in ops} <= set(self.stages):
            return False
        used_ts = {op.token_set for op in ops}
        costs = {id(c): c for c in [op.cost for op in ops] + [c for op in ops for _, c in op.alts]}  # shared: once
        used_ts.update(f.token_set for c in costs.values() for _, f, _ in c.terms)
        used_ts.discard("")
        if not used_ts <= ts.keys():
            return False
        if not set().union(*[op.reads for op in ops], *[op.writes for op in ops]) <= tensors.keys():
            return False
        if any(op.alts and op.alts[0][1] != op.cost for op in ops):
            return False
        get = names.get
        for e in self.edges:
            a, b = get(e.src), get(e.dst)
            if a is None or b is None or a >= b:
                return False
        return True

    def _validate_each(self) -> None:
        names = self.op_index
        require(len(names) == len(self.ops), "graph.ops", "op names must be unique")
        ts = self.token_set_map
        tensors = self.tensor_map
        stages = set(self.stages)
        for op in self.ops:
            require(op.stage in stages, f"op[{op.name}].stage", f"unknown stage {op.stage!r}; stages: {self.stages}")
            if op.token_set:
                require(op.token_set in ts, f"op[{op.name}].token_set", f"unknown token set {op.token_set!r}")
            for f in (*op.cost.features(), *(f for _, c in op.alts for f in c.features())):
                if f.token_set:
                    require(f.token_set in ts, f"op[{op.name}].cost", f"feature {f} uses unknown token set")
            for t in (*op.reads, *op.writes):
                require(t in tensors, f"op[{op.name}]", f"tensor {t!r} is not declared")
            if op.alts:
                require(all(isinstance(l, str) and isinstance(c, Cost) for l, c in op.alts), f"op[{op.name}].alts",
                        "must be (label, Cost) pairs")
                require(op.alts[0][1] == op.cost, f"op[{op.name}].alts",
                        "the first alternative must be the op's cost (a pass changed one and not the other: "
                        "use ir.map_cost)")
        for e in self.edges:
            require(e.src in names, "edge.src", f"unknown op {e.src!r}")
            require(e.dst in names, "edge.dst", f"unknown op {e.dst!r}")
            require(names[e.src] < names[e.dst], "edge", f"{e.src} -> {e.dst} goes against program order")
