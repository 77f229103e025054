"""Execution plans: requests (possibly heterogeneous), the parallel mapping, and the policies in force."""
from __future__ import annotations

import functools
import re
from typing import Sequence

import attrs
import numpy as np

from .collectives import check_algorithms
from .errors import GraphsimError, one_of, require
from .ir import ATTENTION_PRECISIONS
from .limits import MAX_CONTEXT, MAX_LAYERS, MAX_MICRO_BATCHES, MAX_RANKS, MAX_REQUESTS, check_int, check_number
from .workload import TIERS, Workload

_REQ = re.compile(r"^(?P<kind>[a-z]+):(?P<len>[^x@+v]+)(?:x(?P<count>[^@+v]+))?(?:v(?P<verify>[^@+]+))?"
                  r"(?:@(?P<cached>[^+/]+)(?P<noswa>/noswa)?)?(?P<rest>(\+.*)?)$")


def _int_field(text: str, field: str, spec: str) -> int:
    digits = text.replace("_", "").replace(",", "")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        short = text if len(text) <= 24 else text[:21] + "..."
        if digits.isascii() and digits.isdigit():
            raise GraphsimError(field, f"{short!r} in request {spec[:60]!r} is too large (at most {MAX_CONTEXT:,})")
        raise GraphsimError(field, f"{short!r} in request {spec[:60]!r} is not a non-negative integer")
    return int(digits)


@attrs.frozen
class Request:
    """``count`` identical requests. Prefill: ``length`` prompt tokens of which ``cached`` are a prefix-cache
    hit (``swa_cached`` says whether that hit includes the SWA cache) read from ``tier``: ``hbm`` (already
    resident, nothing to copy), ``host`` (copied over C2C/PCIe; the default) or ``disk`` (read from local
    NVMe, then over the host link); ``image_tokens`` of the uncached
    positions are image tokens (Σ over the request's images, ``image_patches`` the ViT patches that make
    them). Decode: a step at context ``length`` emitting ``new`` positions (1, or 1 + verify length with
    speculative decoding); its images were encoded at prefill and are part of the context."""

    kind: str = attrs.field(validator=one_of("request", ("prefill", "decode")))
    length: int = attrs.field()
    count: int = 1
    cached: int = 0
    swa_cached: bool = True
    new: int = 1
    image_tokens: int = 0
    image_patches: int = 0
    tier: str = "host"
    #: the ``+img:WxH`` sizes a request string named when it was parsed without a model's processor (DeepSeek-V4.1's
    #: default): :func:`graphsim.driver.pipeline.compile_plan` recounts them with the model's own processor. Not part of
    #: the request's identity (equality, hash, str): the counts are.
    image_sizes: tuple = attrs.field(default=(), eq=False, repr=False)

    @length.validator
    def _len(self, _, v):
        check_int("request.length", v, 1, MAX_CONTEXT)

    def __attrs_post_init__(self):
        check_int("request.count", self.count, 1, MAX_REQUESTS)
        check_int("request.cached", self.cached, 0, MAX_CONTEXT)
        check_int("request.new", self.new, 1, 1024)  # 1 + the verified draft positions
        check_int("request.image_tokens", self.image_tokens, 0, MAX_CONTEXT)
        check_int("request.image_patches", self.image_patches, 0, MAX_CONTEXT)
        require(isinstance(self.swa_cached, bool), "request.swa_cached", f"must be true or false, got {self.swa_cached!r}")
        require(self.tier in TIERS, "request.tier", f"a prefix hit lives in one of {', '.join(TIERS)}, got {self.tier!r}")
        # patches make image tokens; image tokens without patches were encoded by an earlier chunk
        require(self.image_patches == 0 or self.image_tokens > 0, "request.image_patches",
                "ViT patches produce image tokens: give image_tokens > 0 with them")
        if self.kind == "prefill":
            require(self.cached < self.length, "request.cached",
                    f"cached prefix ({self.cached}) must be shorter than the prompt ({self.length})")
            require(self.image_tokens <= self.length - self.cached, "request.image_tokens",
                    "image tokens must fit in the uncached part of the prompt")
        else:
            require(self.cached == 0, "request.cached", "a decode request has no cached prefix (use the context length)")
            require(self.image_tokens == 0, "request.image",
                    "images are encoded at prefill; a decode step's context already holds their tokens")

    @property
    def new_tokens(self) -> int:
        """Positions this forward processes per request."""
        return self.length - self.cached if self.kind == "prefill" else self.new

    @property
    def past_tokens(self) -> int:
        """Positions already cached before this forward."""
        return self.cached if self.kind == "prefill" else self.length

    @staticmethod
    def parse(spec: str, processor=None) -> "Request":
        """``KIND:LEN[xCOUNT][vK][@CACHED[:TIER][/noswa]][+img:WxH...]``, e.g. ``decode:4096x64``,
        ``decode:4096x64v3`` (DSpark: verify 3 drafts), ``prefill:2048@1024`` (a 1,024-token hit in host
        memory), ``prefill:2048@1024:hbm`` (still in HBM: nothing to copy), ``prefill:2048@1024:disk``;
        ``/noswa``: the prefix hit has its global KV but not its SWA cache (a restore). LEN counts text
        tokens; each ``+img:WxH`` adds its image tokens on top (``prefill:2000+img:1024x768`` has
        2000 + 475 new positions), so ``length`` includes them. Image sizes go through ``processor`` (a model's
        :meth:`~graphsim.models.base.Model.image_processor`; default: DeepSeek-V4.1-Flash's)."""
        if not isinstance(spec, str):
            raise GraphsimError("request", f"must be a request string or Request, got {type(spec).__name__}")
        m = _REQ.match(spec.strip())
        if not m or m.group("kind") not in ("prefill", "decode"):
            short = spec if len(spec) <= 60 else spec[:57] + "..."
            raise GraphsimError("request", f"{short!r} is not KIND:LEN[xCOUNT][vK][@CACHED[:TIER][/noswa]][+img:WxH] "
                                "with KIND prefill or decode")
        n = _int_field(m.group("len"), "request.length", spec)
        c = _int_field(m.group("count"), "request.count", spec) if m.group("count") else 1
        extra = {}
        cached_text, _, tier = (m.group("cached") or "").partition(":")
        cached = _int_field(cached_text, "request.cached", spec) if cached_text else 0
        if tier:
            require(tier in TIERS, "request.tier", f"{tier!r} in request {spec!r}; allowed: {', '.join(TIERS)}")
            extra["tier"] = tier
        if m.group("verify"):  # decode:LENxCOUNTvK: a speculative step verifying K draft positions
            if m.group("kind") != "decode":
                raise GraphsimError("request.verify", f"only decode requests verify drafts ({spec!r})")
            extra["new"] = 1 + _int_field(m.group("verify"), "request.verify", spec)
        rest = m.group("rest")
        if rest:
            from .vision import parse_image_suffix  # vision rules live in their own module

            extra.update(parse_image_suffix(rest, spec, processor))
            n += extra["image_tokens"]  # LEN is text; image tokens come on top
            sizes = tuple((int(w), int(h)) for w, h in re.findall(r"\+img:(\d+)x(\d+)", rest))
            if processor is None and len(sizes) == rest.count("+img:"):
                extra["image_sizes"] = sizes
        if m.group("noswa"):
            extra["swa_cached"] = False
        return Request(m.group("kind"), n, c, cached, **extra)

    def for_processor(self, processor) -> "Request":
        """The request with its ``+img:WxH`` images counted by ``processor`` (a model's) instead of the default one
        it was parsed with; itself when it names no sizes or the counts do not come from them (a chunk)."""
        if processor is None or not self.image_sizes or self.kind != "prefill":
            return self
        from .vision import default_processor

        if (self.image_tokens, self.image_patches) != default_processor().total_tokens(self.image_sizes):
            return self
        tokens, patches = processor.total_tokens(self.image_sizes)
        return attrs.evolve(self, length=self.length - self.image_tokens + tokens, image_tokens=tokens,
                            image_patches=patches, image_sizes=())

    def __str__(self) -> str:
        s = f"{self.kind}:{self.length - self.image_tokens}"  # LEN is text tokens, as parse() reads it
        s += f"x{self.count}" if self.count != 1 else ""
        s += f"v{self.new - 1}" if self.kind == "decode" and self.new > 1 else ""
        s += (f"@{self.cached}" if self.cached else "") + (f":{self.tier}" if self.cached and self.tier != "host" else "")
        s += "/noswa" if self.cached and not self.swa_cached else ""
        return s + (f"+img:{self.image_tokens}tok/{self.image_patches}patches" if self.image_tokens else "")


def prefill_positions(prompt, cached, swa_cached, *, replay_window: int = 128, encoder_replay: bool = True):
    """(new, past, replay) positions of prefill requests, elementwise over arrays.

    A prefix hit whose SWA cache is missing replays its last min(cached, ``replay_window``) cached positions
    (encoder bounded replay); with ``encoder_replay`` off such a hit is recomputed from scratch.
    """
    prompt, cached = np.asarray(prompt, dtype=np.float64), np.asarray(cached, dtype=np.float64)
    lost = (cached > 0) & ~np.asarray(swa_cached, dtype=bool)  # a prefix hit without its SWA cache
    if encoder_replay:
        return prompt - cached, cached, np.where(lost, np.minimum(cached, float(replay_window)), 0.0)
    return np.where(lost, prompt, prompt - cached), np.where(lost, 0.0, cached), np.zeros_like(cached)


def workload_of(requests: Sequence[Request], *, replay_window: int = 128, encoder_replay: bool = True) -> Workload:
    """One workload point with one group per request spec (prefill positions per :func:`prefill_positions`)."""
    require(len(requests) > 0, "requests", "give at least one request")
    rows = []
    for r in requests:
        new, past, replay = r.new_tokens, r.past_tokens, 0
        if r.kind == "prefill":
            new, past, replay = (float(x) for x in prefill_positions(
                r.length, r.cached, r.swa_cached, replay_window=replay_window, encoder_replay=encoder_replay))
        rows.append((r.count, new, past, r.image_tokens, r.image_patches, replay, TIERS.index(r.tier)))
    cols = list(zip(*rows))
    return Workload(tuple(r.kind for r in requests), *([list(c)] for c in cols))


@attrs.frozen
class ParallelMapping:
    """How one model replica spreads over GPUs.

    ``tp`` splits attention heads / columns inside a DP group; ``dp`` is attention data parallelism
    (requests spread over ``dp`` groups); ``ep`` splits routed experts; the MoE side has ``tp·dp·cp`` ranks,
    so ``moe_tp = tp·dp·cp/ep``. ``pp`` pipeline stages multiply the GPU count. ``cp`` (context parallelism,
    long prefill only) splits each prompt's positions over ``cp`` ranks inside a DP group; rank order is
    tp innermost, then cp, then dp, then pp.
    """

    tp: int = 1
    dp: int = 1
    ep: int = 1
    pp: int = 1
    cp: int = 1

    def __attrs_post_init__(self):
        for f in ("tp", "dp", "ep", "pp", "cp"):
            check_int(f"mapping.{f}", getattr(self, f), 1, MAX_RANKS)
        require(self.gpus <= MAX_RANKS, "mapping", f"tp·dp·cp·pp = {self.gpus:,} GPUs; at most {MAX_RANKS:,}")
        require(self.world % self.ep == 0, "mapping.ep",
                f"ep={self.ep} must divide the tp·dp·cp={self.world} ranks of the MoE side")

    @property
    def world(self) -> int:
        """Ranks per pipeline stage."""
        return self.tp * self.dp * self.cp

    @property
    def gpus(self) -> int:
        return self.world * self.pp

    @property
    def moe_tp(self) -> int:
        return self.world // self.ep

    def size(self, group: str) -> int:
        return {"tp": self.tp, "dp": self.dp, "ep": self.ep, "world": self.world, "pp": self.pp,
                "cp": self.cp}[group]

    def __str__(self) -> str:
        return f"tp{self.tp}-dp{self.dp}-ep{self.ep}-pp{self.pp}" + (f"-cp{self.cp}" if self.cp > 1 else "")

    @staticmethod
    def parse(text: str, field: str = "mapping") -> "ParallelMapping":
        """``tp=4,dp=8,ep=32`` or ``tp4-dp8-ep32`` (what ``str`` writes) -> a mapping; a one-line error naming
        ``field`` otherwise."""
        import re

        require(isinstance(text, str), field, f"must be a mapping like tp4-dp1-ep4-pp1, got {text!r}")
        axes = {}
        for part in (x for x in re.split(r"[,\-\s]+", text.strip()) if x):
            m = re.fullmatch(r"(tp|dp|ep|pp|cp)=?(\d+)", part)
            require(m is not None, field, f"{part!r} in {text!r} is not AXIS=N with AXIS in tp, dp, ep, pp, cp")
            axes[m.group(1)] = int(m.group(2))
        return ParallelMapping(**axes)


def _int_in(lo: int, hi: int):
    def check(_inst, attr, v):
        check_int(f"policies.{attr.name}", v, lo, hi)
    return check


def _number_in(lo: float, hi: float):
    def check(_inst, attr, v):
        check_number(f"policies.{attr.name}", v, lo, hi)
    return check


def _as_float(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _floats(v):
    """A sequence of numbers -> a tuple of floats; anything else is left for the validator to name."""
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return tuple(float(x) for x in v)
    return v


def _algorithms(value) -> tuple:
    return check_algorithms(value)


#: Values of ``Policies.overlap`` (passes/overlap.py).
OVERLAPS = ("none", "serial", "two-batch")


@attrs.frozen
class Policies:
    """Runtime strategies a result is computed under (recorded in every report)."""

    decoder_replay: str = attrs.field(default="off", validator=one_of("policies", ("off", "sglang", "paper")))
    encoder_replay: str = attrs.field(default="on", validator=one_of("policies", ("on", "off")))
    fusion: str = attrs.field(default="unfused", validator=one_of("policies", ("unfused", "two-pass", "single-pass")))
    #: "none": one batch, its collectives overlapping the compute that does not depend on them (the model's
    #: dataflow; the SOL default); "serial": no overlap inside the batch (every collective exposed);
    #: "two-batch": two micro-batches (requests, or one prompt's tokens), each hiding the other's exchanges
    overlap: str = attrs.field(default="none", validator=one_of("policies", OVERLAPS))
    engram: str = attrs.field(default="hbm", validator=one_of("policies", ("hbm", "host")))
    #: Engram host residency: blocks ahead the row copy may start
    prefetch_distance: int = attrs.field(default=1, validator=_int_in(0, MAX_LAYERS))
    dspark: str = attrs.field(default="off", validator=one_of("policies", ("off", "on")))
    #: MTP drafting depth K (0 = off): the checkpoint's MTP module drafts K tokens per decode request and the
    #: verify forward checks 1 + K positions; ``acceptance`` a_1..a_K turns them into expected emitted tokens
    mtp: int = attrs.field(default=0, validator=_int_in(0, 16))
    #: W of both bounded replays (the SWA window of DeepSeek-V4.1)
    replay_window: int = attrs.field(default=128, validator=_int_in(1, MAX_CONTEXT))
    #: hottest EP rank's routed work / the mean (>= 1, at most ep); scales its expert work and its
    #: dispatch/combine bytes
    ep_imbalance: float = attrs.field(default=1.0, converter=_as_float, validator=_number_in(1.0, MAX_RANKS))
    #: pipeline micro-batches per forward (0 = as many as pipeline stages)
    pp_micro_batches: int = attrs.field(default=0, validator=_int_in(0, MAX_MICRO_BATCHES))
    #: collective -> algorithm overrides, e.g. {"all_reduce": "tree"} (see passes.sharding.ALGORITHMS)
    algorithms: tuple = attrs.field(default=(), converter=_algorithms)
    #: DSpark per-position conditional acceptance a_1..a_D: turns verified positions into E[emitted]
    acceptance: tuple = attrs.field(default=(), converter=_floats)
    #: the attention math's precision (QK^T, PV): "auto" = from the KV cache formats; an explicit narrower
    #: one also narrows a wider KV cache to what the kernel reads (FP8 attention keeps an FP8 cache)
    attention_precision: str = attrs.field(default="auto", validator=one_of("policies", ATTENTION_PRECISIONS))
    #: sequence parallelism: norm / mHC / elementwise runs after a TP all-reduce shard their tokens over TP
    #: (reduce-scatter in, all-gather out)
    sp: str = attrs.field(default="off", validator=one_of("policies", ("off", "on")))
    #: Engram table rows sharded over the TP group ("tp") or over every rank of the stage ("world", TP x EP:
    #: each rank holds 1/world of the rows; lookups become an all-to-all)
    engram_shard: str = attrs.field(default="tp", validator=one_of("policies", ("tp", "world")))
    #: the Engram projection 6144 -> 25600 replicated on every rank or column-split over TP (+ all-gather)
    engram_proj: str = attrs.field(default="replicated", validator=one_of("policies", ("replicated", "tp")))
    #: contexts beyond the model's max_position_embeddings: refused, or allowed as a what-if (up to
    #: graphsim.core.limits.MAX_CONTEXT; the choice is part of every result's identity)
    beyond_context: str = attrs.field(default="refuse", validator=one_of("policies", ("refuse", "allow")))

    @acceptance.validator
    def _acc(self, _, v):
        ok = isinstance(v, tuple) and len(v) <= 1024 and all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in v)
        require(ok, "policies.acceptance", f"must be numbers a_1..a_D in [0, 1], got {v!r}")

    def identity(self) -> dict:
        return attrs.asdict(self)


@functools.lru_cache(maxsize=4096)
def policy_text(p: Policies) -> str:
    """The policies that differ from the defaults, e.g. ``fusion=single-pass,overlap=two-batch`` (``default``: none;
    ``acceptance`` is left out: it is a probability vector, not a choice)."""
    base = Policies()
    out = []
    for f in attrs.fields(Policies):
        v = getattr(p, f.name)
        if v != getattr(base, f.name) and f.name != "acceptance":
            out.append(f"{f.name}={v}")
    return ",".join(out) or "default"


def parse_policy_text(text: str, field: str = "policies") -> Policies:
    """:func:`policy_text`'s inverse for scalar fields (``default`` -> the defaults); a one-line error naming
    ``field`` for an unknown field, a value of the wrong type, or a tuple field (give those as flags)."""
    if text in ("", "default", "nan"):
        return Policies()
    kw = {}
    fields = {f.name for f in attrs.fields(Policies)}
    for item in str(text).split(","):
        k, sep, v = item.partition("=")
        require(bool(sep) and k in fields, field, f"{item!r} in {text!r} is not FIELD=VALUE of Policies")
        default = getattr(Policies(), k)
        if isinstance(default, bool):
            kw[k] = v == "True"
        elif isinstance(default, (int, float)):
            try:
                kw[k] = type(default)(v)
            except ValueError:
                raise GraphsimError(field, f"{item!r}: {v!r} is not a "
                                    f"{'whole number' if isinstance(default, int) else 'number'}") from None
        elif isinstance(default, tuple):
            raise GraphsimError(field, f"{k} cannot be read from text; give it as a flag")
        else:
            kw[k] = v
    return Policies(**kw)


def _requests(rs) -> tuple:
    """Request strings or Requests (one alone, or a sequence of them) -> a tuple of Requests."""
    if isinstance(rs, (str, Request)):
        rs = (rs,)
    require(isinstance(rs, (list, tuple)), "requests", f"a list of requests, got {type(rs).__name__}")
    out = tuple(Request.parse(r) if isinstance(r, str) else r for r in rs)
    bad = [r for r in out if not isinstance(r, Request)]
    require(not bad, "requests", f"each request is a string like 'decode:4096x8' or a Request, got {bad[0]!r}"
            if bad else "")
    return out


@attrs.frozen
class Plan:
    """What runs: a batch of requests (one group per request spec), a mapping and policies."""

    requests: tuple = attrs.field(converter=_requests)
    mapping: ParallelMapping = ParallelMapping()
    policies: Policies = Policies()

    def __attrs_post_init__(self):
        require(len(self.requests) > 0, "requests", "give at least one request")

    @property
    def kinds(self) -> tuple:
        return tuple(r.kind for r in self.requests)

    def workload(self) -> Workload:
        p = self.policies
        return workload_of(self.requests, replay_window=p.replay_window, encoder_replay=p.encoder_replay == "on")
