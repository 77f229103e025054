"""Image processor rules: image size -> resized size, ViT patch grid and language-side image tokens.

Seed 000 (§08 多模态): "实际输入缩放、网格补齐及输出 token 数应由 image processor 决定，不能无条件用原始宽高
相除" — token counts come from the processor's resize/snap/pad rules, never from raw width/height divided by
the patch size. Every constant is read from ``vision_config`` (V41_FACTS §1, §12): ``patch_size`` p = 14,
``downsample_ratio`` r = 3 (3x3 pixel-unshuffle in the aligner, which pads the patch grid to a multiple
of 3), ``max_image_tokens`` = 1024, ``min_pixels`` = 295,936 (= 544^2), ``max_wh_ratio`` (null = no limit).

The rules, in order (the seed fixes none of the rounding details; the choices are marked *choice*):

1. Keep the aspect ratio. With A = w*h, scale by sqrt(min_pixels / A) if A < min_pixels (upscale to the
   floor), by sqrt(max_pixels / A) if A > max_pixels (downscale to the budget), else 1. The budget
   ``max_pixels = max_image_tokens * (p*r)^2`` (1,806,336 = 1344^2) is the area at which a 1024-token grid
   needs no padding.
2. *choice*: snap each side UP to a multiple of p (``ceil``). Rounding up never drops image content (the
   last partial patch is kept), keeps ``area >= min_pixels`` after snapping, and is monotone, so a larger
   image at the same aspect ratio never gets fewer tokens. (Round-to-nearest + re-check, as in some
   processors, can lose the floor and is not monotone at the budget boundary.)
3. Patch grid (h_p, w_p) = resized size / p; the aligner pads each side up to a multiple of r and
   unshuffles: tokens = (h_p'/r) * (w_p'/r) = ceil(h_p/r) * ceil(w_p/r).
4. Hard cap: steps 2 and 3 round up, so a budget-sized image can land above max_image_tokens (1920x1080:
   1032). Then shrink the scale to the largest one whose padded grid fits, keeping the aspect ratio; the
   grid then need not fill the cap exactly (1920x1080 gets 1008 tokens; some aspects get fewer). The
   cap wins over the min_pixels floor (only very elongated images hit both).

*choice*: ``n_patches = h_p * w_p`` — the ViT sequence length counts real patches only; the pad to a multiple
of r is applied by the aligner to ViT outputs (V41_FACTS §12 "aligner 3x3 unfold (pad to multiple of 3)").
``padded_patches`` is what the aligner's unfold sees.

*choice*: with ``max_wh_ratio`` set, an image whose long/short side ratio exceeds it is rejected.

All arithmetic is exact (integers and fractions), so equal aspect ratios give bit-identical results.
"""
from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from numbers import Integral, Real
from typing import Iterable, Mapping

import attrs

from .errors import GraphsimError, require

__all__ = ["ImageRule", "ImageTokens", "VisionProcessor", "QwenVLProcessor", "KimiProcessor", "Llama4Processor",
           "Gemma3Processor", "Gemma4Processor", "default_processor", "parse_image_suffix"]


def _pos_int(value, field: str) -> int:
    require(isinstance(value, Integral) and not isinstance(value, bool) and value > 0, field,
            f"must be a positive integer, got {value!r}")
    return int(value)


def _ceil_sqrt_ratio(num: int, den: int, step: int) -> int:
    """Smallest n >= 1 with (step * n)^2 >= num / den, i.e. ceil(sqrt(num/den) / step), exactly."""
    n = max(1, math.isqrt(num // (den * step * step)))
    while (step * n) ** 2 * den < num:
        n += 1
    while n > 1 and (step * (n - 1)) ** 2 * den >= num:
        n -= 1
    return n


@functools.lru_cache(maxsize=4096)
def _height_cap(w0: int, h0: int, u: int, cap: int) -> Fraction:
    """Step 4's bound (depends on the aspect ratio only): the largest target height h' whose padded grid fits.

    ceil(ceil(x / p) / r) == ceil(x / u), so a th x tw token grid fits iff h' <= u*th and
    w' = h'*w0/h0 <= u*tw; maximize over th with tw = cap // th.
    """
    return max(min(Fraction(u * th), Fraction(u * (cap // th) * h0, w0)) for th in range(1, cap + 1))


@attrs.frozen
class ImageRule:
    """The processor constants, validated (all from ``vision_config``)."""

    patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.patch_size"))
    downsample_ratio: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.downsample_ratio"))
    max_image_tokens: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.max_image_tokens"))
    min_pixels: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.min_pixels"))
    max_wh_ratio: float | None = attrs.field(default=None)

    def __attrs_post_init__(self):
        m = self.max_wh_ratio
        require(m is None or (isinstance(m, Real) and not isinstance(m, bool) and math.isfinite(m) and m >= 1),
                "vision_config.max_wh_ratio", f"must be null or a finite number >= 1, got {m!r}")
        require(self.min_pixels <= self.max_pixels, "vision_config.min_pixels",
                f"{self.min_pixels} exceeds the pixel budget of max_image_tokens, {self.max_pixels}")

    @classmethod
    def from_config(cls, vision_config: Mapping) -> "ImageRule":
        """Read the rule from ``vision_config`` (the full model config is accepted too)."""
        vc = vision_config.get("vision_config", vision_config)
        for key in ("patch_size", "downsample_ratio", "max_image_tokens", "min_pixels"):
            require(key in vc, f"vision_config.{key}", "missing from the config")
        return cls(vc["patch_size"], vc["downsample_ratio"], vc["max_image_tokens"], vc["min_pixels"],
                   vc.get("max_wh_ratio"))

    @property
    def token_side(self) -> int:
        """Pixels per image-token side: patch_size * downsample_ratio (42)."""
        return self.patch_size * self.downsample_ratio

    @property
    def max_pixels(self) -> int:
        """Area budget: max_image_tokens padding-free tokens of token_side^2 pixels (1,806,336 = 1344^2)."""
        return self.max_image_tokens * self.token_side ** 2


@attrs.frozen
class ImageTokens:
    """One image through the processor."""

    width: int  #: input width (pixels)
    height: int  #: input height (pixels)
    resized_width: int  #: after scale + snap: patch_size * grid_w
    resized_height: int  #: after scale + snap: patch_size * grid_h
    grid_h: int  #: ViT patch rows
    grid_w: int  #: ViT patch columns
    padded_h: int  #: patch rows after the aligner pads to a multiple of downsample_ratio
    padded_w: int  #: patch columns after padding
    n_patches: int  #: ViT sequence length = grid_h * grid_w (padding excluded; the ViT runs on real patches)
    n_tokens: int  #: image tokens entering the language model = (padded_h / r) * (padded_w / r)

    @property
    def padded_patches(self) -> int:
        """Patch features the aligner's r x r unfold consumes (real + zero padding)."""
        return self.padded_h * self.padded_w


@attrs.frozen
class VisionProcessor:
    """Applies an :class:`ImageRule` to image sizes."""

    rule: ImageRule

    @classmethod
    def from_config(cls, vision_config: Mapping) -> "VisionProcessor":
        return cls(ImageRule.from_config(vision_config))

    def image_tokens(self, width: int, height: int) -> ImageTokens:
        """Resize, snap, pad and cap one ``width`` x ``height`` image (see module doc for the rules)."""
        w0, h0 = _pos_int(width, "width"), _pos_int(height, "height")
        rule = self.rule
        if rule.max_wh_ratio is not None:
            require(max(w0, h0) <= rule.max_wh_ratio * min(w0, h0), "width",
                    f"aspect ratio {max(w0, h0) / min(w0, h0):.4g} of {w0}x{h0} exceeds max_wh_ratio {rule.max_wh_ratio}")
        p, u, cap = rule.patch_size, rule.token_side, rule.max_image_tokens
        area = w0 * h0

        # Target height h' as an exact square Q = h'^2 (w' = h' * w0 / h0): step 1.
        if area < rule.min_pixels:
            q = Fraction(rule.min_pixels * h0, w0)
        elif area > rule.max_pixels:
            q = Fraction(rule.max_pixels * h0, w0)
        else:
            q = Fraction(h0 * h0)

        g = math.gcd(w0, h0)
        h_cap = _height_cap(w0 // g, h0 // g, u, cap)

        if h_cap * h_cap < q:  # the cap binds: h' = h_cap, rational
            grid_h = max(1, math.ceil(h_cap / p))
            grid_w = max(1, math.ceil(h_cap * w0 / (h0 * p)))
        else:  # h' = sqrt(q): step 2's ceil snap, exact
            grid_h = _ceil_sqrt_ratio(q.numerator, q.denominator, p)
            # w' = sqrt(q) * w0 / h0  ->  w'^2 = q * w0^2 / h0^2
            qw = q * w0 * w0 / (h0 * h0)
            grid_w = _ceil_sqrt_ratio(qw.numerator, qw.denominator, p)

        r = rule.downsample_ratio
        padded_h, padded_w = -(-grid_h // r) * r, -(-grid_w // r) * r
        n_tokens = (padded_h // r) * (padded_w // r)
        if n_tokens > cap:  # unreachable by construction; the cap is a hard invariant, so say so loudly
            raise GraphsimError("max_image_tokens", f"internal: {w0}x{h0} produced {n_tokens} > {cap} tokens")
        return ImageTokens(w0, h0, p * grid_w, p * grid_h, grid_h, grid_w, padded_h, padded_w,
                           grid_h * grid_w, n_tokens)

    def total_tokens(self, sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
        """(sum of n_tokens, sum of n_patches) over ``(width, height)`` pairs, e.g. one request's images."""
        out = [self.image_tokens(w, h) for w, h in sizes]
        return sum(t.n_tokens for t in out), sum(t.n_patches for t in out)


# --------------------------------------------------------------------------------------------------
# Qwen-VL processors (Qwen2-VL's ``smart_resize``, used by Qwen2.5-VL, Qwen3-VL and Qwen3.5)
# --------------------------------------------------------------------------------------------------

#: Qwen3-VL / Qwen3.5 ``preprocessor_config.json`` as the checkpoints ship it (Qwen2VLImageProcessorFast):
#: ``size = {shortest_edge: 65536, longest_edge: 16777216}`` (256² to 4096² pixels), ``patch_size`` 16,
#: ``temporal_patch_size`` 2, ``merge_size`` 2. The family's defaults when no preprocessor_config.json is beside
#: the config (the bundled snapshot has none).
QWEN3_VL_PREPROCESSOR = {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16,
                         "temporal_patch_size": 2, "merge_size": 2}


@attrs.frozen
class QwenVLProcessor:
    """Qwen2-VL's image processor (``image_processing_qwen2_vl.smart_resize``), as Qwen3-VL and Qwen3.5 run it:

    1. factor = patch_size * merge_size (32); reject aspect ratios above 200;
    2. round each side to the nearest multiple of the factor (Python's ``round``: halves to even);
    3. if the area exceeds ``max_pixels``: beta = sqrt(h*w / max_pixels), each side ``floor(side / beta /
       factor) * factor`` (at least one factor); if it is below ``min_pixels``: beta = sqrt(min_pixels / (h*w)),
       each side ``ceil(side * beta / factor) * factor``;
    4. patches = (h'/p) * (w'/p) (one temporal patch: an image is repeated ``temporal_patch_size`` times),
       image tokens = patches / merge_size² (the merger concatenates merge x merge neighbours).

    ``min_pixels`` / ``max_pixels`` come from ``size.shortest_edge`` / ``size.longest_edge`` (areas, despite the
    names) or the older top-level ``min_pixels`` / ``max_pixels``."""

    patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.patch_size"))
    merge_size: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.merge_size"))
    temporal_patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.temporal_patch_size"))
    min_pixels: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.size.shortest_edge"))
    max_pixels: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.size.longest_edge"))
    source: str = "family defaults"  #: where the constants came from (a preprocessor_config.json, or the defaults)

    def __attrs_post_init__(self):
        require(self.min_pixels <= self.max_pixels, "preprocessor_config.size",
                f"shortest_edge (min pixels {self.min_pixels}) exceeds longest_edge (max pixels {self.max_pixels})")

    @classmethod
    def from_preprocessor(cls, pp: Mapping | None, source: str = "family defaults") -> "QwenVLProcessor":
        """Read ``preprocessor_config.json`` (a mapping); missing keys take :data:`QWEN3_VL_PREPROCESSOR`'s."""
        d = QWEN3_VL_PREPROCESSOR
        pp = pp or {}
        size = pp.get("size") if isinstance(pp.get("size"), Mapping) else {}
        lo = size.get("shortest_edge", pp.get("min_pixels", d["size"]["shortest_edge"]))
        hi = size.get("longest_edge", pp.get("max_pixels", d["size"]["longest_edge"]))
        return cls(pp.get("patch_size", d["patch_size"]), pp.get("merge_size", d["merge_size"]),
                   pp.get("temporal_patch_size", d["temporal_patch_size"]), lo, hi, source)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """(resized width, resized height): ``smart_resize`` exactly (integers and fractions, no float error)."""
        w0, h0 = _pos_int(width, "width"), _pos_int(height, "height")
        require(max(w0, h0) <= 200 * min(w0, h0), "width",
                f"aspect ratio of {w0}x{h0} exceeds 200 (the Qwen-VL processor rejects it)")
        f = self.factor
        h, w = round(Fraction(h0, f)) * f, round(Fraction(w0, f)) * f
        area = w0 * h0
        if h * w > self.max_pixels:  # side / beta / f with beta = sqrt(area / max): floor(sqrt(side² max / area) / f)
            h = max(f, _floor_sqrt_ratio(h0 * h0 * self.max_pixels, area, f) * f)
            w = max(f, _floor_sqrt_ratio(w0 * w0 * self.max_pixels, area, f) * f)
        elif h * w < self.min_pixels:
            h = _ceil_sqrt_ratio(h0 * h0 * self.min_pixels, area, f) * f
            w = _ceil_sqrt_ratio(w0 * w0 * self.min_pixels, area, f) * f
        return w, h

    def image_tokens(self, width: int, height: int) -> ImageTokens:
        w, h = self.resize(width, height)
        gh, gw, m = h // self.patch_size, w // self.patch_size, self.merge_size
        return ImageTokens(int(width), int(height), w, h, gh, gw, gh, gw, gh * gw, (gh // m) * (gw // m))

    def total_tokens(self, sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
        out = [self.image_tokens(w, h) for w, h in sizes]
        return sum(t.n_tokens for t in out), sum(t.n_patches for t in out)


#: Kimi K2.5's ``preprocessor_config.json`` ``media_proc_cfg`` for images, as the checkpoint ships it (and as vLLM,
#: SGLang and RTP-LLM default it): 14-pixel patches, 2x2 merge, at most 16,384 patches and 512 patches a side.
KIMI_K25_MEDIA_PROC = {"patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 16384, "patch_limit_on_one_side": 512}


@attrs.frozen
class KimiProcessor:
    """Kimi K2.5's image processor (``media_utils.navit_resize_image``):

    1. scale = min(1, sqrt(in_patch_limit / (max(1, w // p) * max(1, h // p))), side_limit * p / w,
       side_limit * p / h); new side = min(max(1, int(side * scale)), side_limit * p) (truncation);
    2. pad each side (bottom/right, zeros) up to a multiple of merge * p;
    3. patches = padded grid (the ViT runs on the padding too), image tokens = patches / merge².

    The scale is computed in floats, as the processor does."""

    patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "media_proc_cfg.patch_size"))
    merge_size: int = attrs.field(converter=lambda v: _pos_int(v, "media_proc_cfg.merge_kernel_size"))
    in_patch_limit: int = attrs.field(converter=lambda v: _pos_int(v, "media_proc_cfg.in_patch_limit"))
    side_limit: int = attrs.field(converter=lambda v: _pos_int(v, "media_proc_cfg.patch_limit_on_one_side"))
    source: str = "family defaults"

    @classmethod
    def from_preprocessor(cls, pp: Mapping | None, source: str = "family defaults") -> "KimiProcessor":
        """Read ``media_proc_cfg`` from ``preprocessor_config.json``; missing keys take Kimi K2.5's defaults."""
        d = {**KIMI_K25_MEDIA_PROC, **((pp or {}).get("media_proc_cfg") or {})}
        mk = d["merge_kernel_size"]
        mk = mk[0] if isinstance(mk, (list, tuple)) and mk else mk
        return cls(d["patch_size"], mk, d["in_patch_limit"], d["patch_limit_on_one_side"], source)

    def image_tokens(self, width: int, height: int) -> ImageTokens:
        w0, h0 = _pos_int(width, "width"), _pos_int(height, "height")
        p, lim = self.patch_size, self.side_limit
        s1 = math.sqrt(self.in_patch_limit / (max(1.0, w0 // p) * max(1.0, h0 // p)))
        scale = min(1.0, s1, lim * p / w0, lim * p / h0)
        w, h = min(max(1, int(w0 * scale)), lim * p), min(max(1, int(h0 * scale)), lim * p)
        f = self.merge_size * p
        gh, gw = -(-h // f) * f // p, -(-w // f) * f // p
        m = self.merge_size
        return ImageTokens(w0, h0, p * gw, p * gh, gh, gw, gh, gw, gh * gw, (gh // m) * (gw // m))

    def total_tokens(self, sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
        out = [self.image_tokens(w, h) for w, h in sizes]
        return sum(t.n_tokens for t in out), sum(t.n_patches for t in out)


@attrs.frozen
class Llama4Processor:
    """Llama 4's image processor (``image_processing_llama4_fast.py``, ``processing_llama4.py``):

    1. canvases: every (a x b) grid of ``tile`` x ``tile`` tiles with a·b <= ``max_patches`` (16);
    2. ``get_best_fit``: per canvas the scale min(H / h, W / w); the smallest scale >= 1 if any (the largest one with
       ``resize_to_max_canvas``), else the largest below 1; among the canvases with that scale the smallest area;
    3. the image is resized into the canvas without distortion, padded, and split into its a·b tiles; a canvas of
       more than one tile adds a global tile (the whole image at ``tile`` x ``tile``);
    4. the ViT runs on each tile: (tile / patch)² patches + a class token (577 positions); the pixel shuffle
       (``pixel_shuffle_ratio`` 0.5) leaves (tile / patch)² / 4 = 144 ``<|patch|>`` tokens per tile.

    ``n_patches`` counts the ViT's positions (class tokens included), ``n_tokens`` the ``<|patch|>`` positions the
    image features fill. The processor's markers (``<|image_start|>``, ``<|image|>``, ``<|image_end|>`` and, for a
    tiled image, one separator per tile) are text positions, like Qwen's ``<|vision_start|>``. Scales are compared as
    exact fractions (HF compares float32 quotients; the tile count is the same for all but ties closer than 1e-7)."""

    patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.patch_size"))
    merge_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.pixel_shuffle_ratio"))
    tile: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.size.height"))
    max_patches: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.max_patches"))
    resize_to_max_canvas: bool = False
    source: str = "family defaults"

    def __attrs_post_init__(self):
        require(self.tile % (self.patch_size * self.merge_size) == 0, "preprocessor_config.size",
                f"tile {self.tile} must be a multiple of patch_size x 1/pixel_shuffle_ratio "
                f"({self.patch_size * self.merge_size})")

    @classmethod
    def from_preprocessor(cls, pp: Mapping | None, source: str = "family defaults") -> "Llama4Processor":
        """Read ``preprocessor_config.json`` (``size``, ``max_patches``, ``resize_to_max_canvas``, and the tower's
        ``patch_size`` / ``merge_size``, which :func:`graphsim.models._vision_of` fills from ``vision_config``)."""
        pp = dict(pp or {})
        size = pp.get("size") if isinstance(pp.get("size"), Mapping) else {"height": 336, "width": 336}
        require(size.get("height") == size.get("width"), "preprocessor_config.size", f"must be square, got {size}")
        return cls(pp.get("patch_size", 14), pp.get("merge_size", 2), size.get("height"), pp.get("max_patches", 16),
                   bool(pp.get("resize_to_max_canvas", False)), source)

    @property
    def tile_positions(self) -> int:
        """ViT positions a tile: its patches and the class token."""
        return (self.tile // self.patch_size) ** 2 + 1

    @property
    def tile_tokens(self) -> int:
        """``<|patch|>`` tokens a tile: its patches after the pixel shuffle."""
        return (self.tile // self.patch_size // self.merge_size) ** 2

    def canvas(self, width: int, height: int) -> tuple[int, int]:
        """(tile rows, tile columns) of ``get_best_fit``'s canvas."""
        w0, h0 = _pos_int(width, "width"), _pos_int(height, "height")
        grids = [(a, n // a) for n in range(1, self.max_patches + 1) for a in range(1, n + 1) if n % a == 0]
        scale = {g: min(Fraction(g[0] * self.tile, h0), Fraction(g[1] * self.tile, w0)) for g in grids}
        up = [s for s in scale.values() if s >= 1]
        pick = (max(up) if self.resize_to_max_canvas else min(up)) if up else max(scale.values())
        return min((g for g in grids if scale[g] == pick), key=lambda g: g[0] * g[1])

    def image_tokens(self, width: int, height: int) -> ImageTokens:
        rows, cols = self.canvas(width, height)
        tiles = rows * cols + (1 if rows * cols > 1 else 0)  # the global tile
        g = self.tile // self.patch_size
        return ImageTokens(int(width), int(height), cols * self.tile, rows * self.tile, rows * g, cols * g, rows * g,
                           cols * g, tiles * self.tile_positions, tiles * self.tile_tokens)

    def total_tokens(self, sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
        out = [self.image_tokens(w, h) for w, h in sizes]
        return sum(t.n_tokens for t in out), sum(t.n_patches for t in out)


@attrs.frozen
class Gemma3Processor:
    """Gemma 3's image processor (``image_processing_gemma3.py``) at its defaults: every image resized to
    ``image_size`` x ``image_size`` (896², no aspect ratio kept), (896 / 14)² = 4096 SigLIP patches, average-pooled
    ``merge_size`` x ``merge_size`` (4 x 4) to ``mm_tokens_per_image`` (256) soft tokens. Pan & Scan (extra crops,
    ``do_pan_and_scan``, off by default) is not modelled."""

    patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.patch_size"))
    merge_size: int = attrs.field(converter=lambda v: _pos_int(v, "mm_tokens_per_image"))
    image_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.image_size"))
    source: str = "family defaults"

    def __attrs_post_init__(self):
        require(self.image_size % (self.patch_size * self.merge_size) == 0, "vision_config.image_size",
                f"{self.image_size} must be a multiple of patch_size x pooling kernel ({self.patch_size * self.merge_size})")

    @classmethod
    def from_preprocessor(cls, pp: Mapping | None, source: str = "family defaults") -> "Gemma3Processor":
        pp = dict(pp or {})
        require(not pp.get("do_pan_and_scan"), "preprocessor_config.do_pan_and_scan",
                f"{source}: Pan & Scan crops are not modelled (graphsim prices one 896x896 view per image)")
        size = pp.get("size") if isinstance(pp.get("size"), Mapping) else {}
        side = size.get("height", pp.get("image_size", 896))
        require(size.get("width", side) == side, "preprocessor_config.size", f"must be square, got {size}")
        return cls(pp.get("patch_size", 14), pp.get("merge_size", 4), side, source)

    def image_tokens(self, width: int, height: int) -> ImageTokens:
        w0, h0 = _pos_int(width, "width"), _pos_int(height, "height")
        g = self.image_size // self.patch_size
        return ImageTokens(w0, h0, self.image_size, self.image_size, g, g, g, g, g * g, (g // self.merge_size) ** 2)

    def total_tokens(self, sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
        out = [self.image_tokens(w, h) for w, h in sizes]
        return sum(t.n_tokens for t in out), sum(t.n_patches for t in out)


#: Gemma 4's image processor's soft-token budgets (``max_soft_tokens``)
GEMMA4_SOFT_TOKENS = (70, 140, 280, 560, 1120)


@attrs.frozen
class Gemma4Processor:
    """Gemma 4's image processor (``image_processing_gemma4.get_aspect_ratio_preserving_size``), in floats as HF runs it:

    1. max_patches = ``max_soft_tokens`` (280, from the config's ``vision_soft_tokens_per_image``) x k² (k =
       ``pooling_kernel_size``, 3); factor = sqrt(max_patches · p² / (h · w));
    2. each side floor(side · factor / (k·p)) · k·p (a side rounding to 0 becomes k·p, the other
       min(floor(long / short) · k·p, max_patches / k² · k·p));
    3. patches = (h' / p) · (w' / p); soft tokens = patches / k² (the pooler averages k x k patches).

    ``n_patches`` counts real patches: HF pads every image to max_patches and masks the padding in attention (an
    implementation that runs the padding does up to max_patches positions per image)."""

    patch_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.patch_size"))
    merge_size: int = attrs.field(converter=lambda v: _pos_int(v, "vision_config.pooling_kernel_size"))
    max_soft_tokens: int = attrs.field(converter=lambda v: _pos_int(v, "preprocessor_config.max_soft_tokens"))
    source: str = "family defaults"

    def __attrs_post_init__(self):
        require(self.max_soft_tokens in GEMMA4_SOFT_TOKENS, "preprocessor_config.max_soft_tokens",
                f"must be one of {GEMMA4_SOFT_TOKENS}, got {self.max_soft_tokens}")

    @classmethod
    def from_preprocessor(cls, pp: Mapping | None, source: str = "family defaults") -> "Gemma4Processor":
        pp = dict(pp or {})
        return cls(pp.get("patch_size", 16), pp.get("pooling_kernel_size", pp.get("merge_size", 3)),
                   pp.get("max_soft_tokens", 280), source)

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.merge_size ** 2

    def resize(self, width: int, height: int) -> tuple[int, int]:
        """(resized width, resized height), as ``get_aspect_ratio_preserving_size``."""
        w0, h0 = _pos_int(width, "width"), _pos_int(height, "height")
        p, k = self.patch_size, self.merge_size
        factor = math.sqrt(self.max_patches * p * p / (h0 * w0))
        side = k * p
        th, tw = int(math.floor(factor * h0 / side)) * side, int(math.floor(factor * w0 / side)) * side
        require(th or tw, "width", f"{w0}x{h0} resizes to 0x0 (the Gemma 4 processor rejects it)")
        longest = (self.max_patches // k ** 2) * side
        if th == 0:
            th, tw = side, min(int(math.floor(w0 / h0)) * side, longest)
        elif tw == 0:
            tw, th = side, min(int(math.floor(h0 / w0)) * side, longest)
        return tw, th

    def image_tokens(self, width: int, height: int) -> ImageTokens:
        w, h = self.resize(width, height)
        gh, gw, k = h // self.patch_size, w // self.patch_size, self.merge_size
        return ImageTokens(int(width), int(height), w, h, gh, gw, gh, gw, gh * gw, gh * gw // k ** 2)

    def total_tokens(self, sizes: Iterable[tuple[int, int]]) -> tuple[int, int]:
        out = [self.image_tokens(w, h) for w, h in sizes]
        return sum(t.n_tokens for t in out), sum(t.n_patches for t in out)


#: vision tower family -> its image processor class (each reads ``preprocessor_config.json`` or its defaults)
PROCESSORS = {"qwen3_vl": QwenVLProcessor, "kimi_k25": KimiProcessor, "llama4": Llama4Processor,
              "gemma3": Gemma3Processor, "gemma4": Gemma4Processor}


def processor_for(family: str, pp: Mapping | None, source: str = "family defaults"):
    """The image processor of a vision tower's family (:data:`PROCESSORS`), from ``preprocessor_config.json``
    (``pp``) or the family's defaults."""
    return PROCESSORS.get(family, QwenVLProcessor).from_preprocessor(pp, source)


def _floor_sqrt_ratio(num: int, den: int, step: int) -> int:
    """Largest n >= 0 with (step * n)^2 <= num / den, i.e. floor(sqrt(num/den) / step), exactly."""
    n = math.isqrt(num // (den * step * step))
    while (step * (n + 1)) ** 2 * den <= num:
        n += 1
    while n > 0 and (step * n) ** 2 * den > num:
        n -= 1
    return n


# --------------------------------------------------------------------------------------------------
# Request strings: ``prefill:2000+img:1024x768+img:640x480``
# --------------------------------------------------------------------------------------------------

#: Processor of request-string images: request strings name no model, and DeepSeek-V4.1-Flash is the one
#: shipped vision model. Another processor: give ``Request(image_tokens=..., image_patches=...)`` or the
#: explicit ``+img:Ttok/Ppatches`` form.
DEFAULT_VISION_MODEL = "deepseek-v4.1-flash"

_IMAGE = re.compile(r"^img:(?:(?P<w>\d+)x(?P<h>\d+)|(?P<tokens>\d+)tok/(?P<patches>\d+)patches)$")


@functools.lru_cache(maxsize=1)
def default_processor() -> VisionProcessor:
    """The image processor of :data:`DEFAULT_VISION_MODEL` (its ``vision_config``)."""
    from .config import load_config

    return VisionProcessor.from_config(load_config(DEFAULT_VISION_MODEL))


def parse_image_suffix(rest: str, spec: str, processor=None) -> dict:
    """``+img:WxH`` per image (repeatable), or ``+img:Ttok/Ppatches`` -> ``{image_tokens, image_patches}``
    summed over the request's images (what :class:`graphsim.core.plan.Request` takes).

    Sizes go through ``processor`` (the model's: :meth:`graphsim.models.base.Model.image_processor`), else
    :func:`default_processor` (resize, snap, pad, cap; never raw w·h / 14²). Several
    images of one request are summed: the ViT sequence of the request is then Σ patches (see
    ``deepseek_v41_extras.vision_stage`` for what that means for attention pairs).
    """
    parts = rest.split("+")
    require(parts[0] == "" and len(parts) > 1, "request.image", f"{rest!r} in request {spec!r} must start with '+'")
    tokens = patches = 0
    for part in parts[1:]:
        m = _IMAGE.match(part)
        if m is None:
            raise GraphsimError("request.image", f"'+{part}' in request {spec!r} is not img:WxH (e.g. +img:1024x768) "
                                                 "or img:Ttok/Ppatches")
        if m["w"] is not None:
            try:
                t = (processor or default_processor()).image_tokens(int(m["w"]), int(m["h"]))
            except GraphsimError as e:
                raise GraphsimError("request.image", f"'+{part}' in request {spec!r}: {e}") from None
            tokens, patches = tokens + t.n_tokens, patches + t.n_patches
        else:
            t, p = int(m["tokens"]), int(m["patches"])
            require(t > 0 and p > 0, "request.image", f"'+{part}' in request {spec!r} needs positive tokens and patches")
            tokens, patches = tokens + t, patches + p
    return {"image_tokens": tokens, "image_patches": patches}
