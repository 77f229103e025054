"""Image processor rules (graphsim.core.vision): image size -> patch grid -> image tokens."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphsim.core.errors import GraphsimError
from graphsim.core.vision import ImageRule, ImageTokens, VisionProcessor

CONFIG = json.loads((Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "deepseek-v4.1-flash.json").read_text())
VP = VisionProcessor.from_config(CONFIG["vision_config"])
RULE = VP.rule


def test_constants_come_from_config():
    assert (RULE.patch_size, RULE.downsample_ratio, RULE.max_image_tokens, RULE.min_pixels) == (14, 3, 1024, 295_936)
    assert RULE.max_wh_ratio is None
    assert RULE.min_pixels == 544**2
    assert RULE.token_side == 42
    assert RULE.max_pixels == 1024 * 42**2 == 1344**2 == 1_806_336
    # The full model config is accepted too.
    assert VisionProcessor.from_config(CONFIG).rule == RULE == ImageRule.from_config(CONFIG)


def check_invariants(t: ImageTokens):
    p, r = RULE.patch_size, RULE.downsample_ratio
    assert t.resized_width == p * t.grid_w and t.resized_height == p * t.grid_h
    assert t.padded_h % r == 0 and t.padded_w % r == 0
    assert t.grid_h <= t.padded_h < t.grid_h + r and t.grid_w <= t.padded_w < t.grid_w + r
    assert t.n_patches == t.grid_h * t.grid_w
    assert t.n_tokens == (t.padded_h // r) * (t.padded_w // r) == t.padded_patches // r**2
    assert 1 <= t.n_tokens <= RULE.max_image_tokens


def test_224_is_upscaled_to_the_floor():
    t = VP.image_tokens(224, 224)
    check_invariants(t)
    # scale sqrt(295936 / 224^2) = 544/224 -> 544 x 544 -> ceil(544 / 14) = 39 patches -> 546 px
    assert (t.resized_width, t.resized_height) == (546, 546)
    assert (t.grid_h, t.grid_w) == (39, 39) and (t.padded_h, t.padded_w) == (39, 39)  # 39 = 13 * 3, no pad
    assert t.n_patches == 1521 and t.n_tokens == 169
    assert t.resized_width * t.resized_height >= RULE.min_pixels


def test_544_is_exactly_the_floor_and_snaps_up():
    t = VP.image_tokens(544, 544)
    check_invariants(t)
    # 544 / 14 = 38.857...: snapping rounds UP to 39 patches (546 px); round-down would be 532 px and drop
    # below min_pixels (532^2 = 283,024 < 295,936).
    assert 544 % 14 != 0
    assert (t.grid_h, t.grid_w) == (39, 39) and t.resized_width == 546
    assert t.n_tokens == 169
    assert 532**2 < RULE.min_pixels <= 546**2
    assert t == ImageTokens(544, 544, 546, 546, 39, 39, 39, 39, 1521, 169)


def test_1024x768_in_budget():
    t = VP.image_tokens(1024, 768)
    check_invariants(t)
    # area 786,432 lies in [min_pixels, max_pixels]: no scaling; snap up: 1024/14 = 73.1 -> 74, 768/14 = 54.9 -> 55
    assert (t.grid_w, t.grid_h) == (74, 55) and (t.resized_width, t.resized_height) == (1036, 770)
    # pad to multiples of 3: 74 -> 75, 55 -> 57; tokens = 25 * 19
    assert (t.padded_w, t.padded_h) == (75, 57)
    assert t.n_patches == 4070 and t.n_tokens == 475


def test_4096_hits_the_cap():
    t = VP.image_tokens(4096, 4096)
    check_invariants(t)
    # scaled to the 1344^2 budget: 96 x 96 patches, already a multiple of 3 -> 32 x 32 = 1024 tokens
    assert (t.resized_width, t.resized_height) == (1344, 1344)
    assert (t.grid_h, t.grid_w) == (96, 96) and t.n_patches == 9216
    assert t.n_tokens == 1024 == RULE.max_image_tokens
    assert VP.image_tokens(1344, 1344) == ImageTokens(1344, 1344, 1344, 1344, 96, 96, 96, 96, 9216, 1024)


def test_budget_rescale_plus_snap_up_would_exceed_cap_so_it_shrinks():
    # 1920x1080 is scaled to the area budget exactly: 1792 x 1008 (1792 * 1008 = 1344^2) = 128 x 72 patches;
    # padding 128 -> 129 would give 43 x 24 = 1032 tokens > 1024, so the cap shrinks the scale until the
    # padded grid fits: 126 x 71 patches -> 126 x 72 padded -> 42 x 24 = 1008 tokens.
    assert 1792 * 1008 == RULE.max_pixels and math.ceil(128 / 3) * math.ceil(72 / 3) == 1032
    t = VP.image_tokens(1920, 1080)
    check_invariants(t)
    assert (t.grid_w, t.grid_h) == (126, 71) and (t.padded_w, t.padded_h) == (126, 72)
    assert t.n_tokens == 1008


def test_very_wide_images():
    t = VP.image_tokens(8000, 100)  # in the area budget, cap not hit
    check_invariants(t)
    assert (t.grid_h, t.grid_w) == (8, 572) and (t.padded_h, t.padded_w) == (9, 573) and t.n_tokens == 573
    t = VP.image_tokens(20000, 100)  # budget rescale leaves 3 x 453 = 1359 tokens: the cap shrinks it
    check_invariants(t)
    assert (t.grid_h, t.grid_w) == (6, 1200) and t.n_tokens == 800
    t = VP.image_tokens(100_000, 1)  # one patch row, padded to 3; the cap binds on the width
    check_invariants(t)
    assert (t.grid_h, t.grid_w) == (1, 3072) and t.padded_h == 3 and t.n_tokens == 1024
    # Very tall is the transpose.
    u = VP.image_tokens(1, 100_000)
    assert (u.grid_w, u.grid_h, u.n_tokens) == (1, 3072, 1024)


def test_padding_to_multiples_of_3():
    for w, h in [(1024, 768), (600, 700), (700, 560), (1000, 333)]:
        t = VP.image_tokens(w, h)
        check_invariants(t)
        assert t.n_tokens == math.ceil(t.grid_h / 3) * math.ceil(t.grid_w / 3)
    t = VP.image_tokens(700, 560)  # 50 x 40 patches -> padded 51 x 42
    assert (t.grid_w, t.grid_h, t.padded_w, t.padded_h, t.n_tokens) == (50, 40, 51, 42, 17 * 14)
    # The ViT runs on real patches; the pad lives in the aligner's unfold.
    assert t.n_patches == 2000 < t.padded_patches == 2142


def test_same_aspect_ratio_small_images_are_identical():
    # Every image below the floor at one aspect ratio lands on the same size (exact arithmetic).
    a = VP.image_tokens(100, 50)
    for k in (1, 2, 3, 7):
        b = VP.image_tokens(100 * k, 50 * k)
        assert (b.grid_h, b.grid_w, b.n_tokens) == (a.grid_h, a.grid_w, a.n_tokens)


@pytest.mark.parametrize(
    "w, h, field",
    [(0, 10, "width"), (10, 0, "height"), (-5, 10, "width"), (10, -1, "height"), (10.5, 10, "width"),
     (True, 10, "width"), ("10", 10, "width")],
)
def test_rejects_bad_sizes(w, h, field):
    with pytest.raises(GraphsimError) as e:
        VP.image_tokens(w, h)
    assert e.value.field == field


def test_config_validation_and_max_wh_ratio():
    vc = dict(CONFIG["vision_config"])
    del vc["min_pixels"]
    with pytest.raises(GraphsimError) as e:
        VisionProcessor.from_config(vc)
    assert e.value.field == "vision_config.min_pixels"
    with pytest.raises(GraphsimError) as e:
        VisionProcessor.from_config({**CONFIG["vision_config"], "patch_size": 0})
    assert e.value.field == "vision_config.patch_size"
    with pytest.raises(GraphsimError) as e:
        VisionProcessor.from_config({**CONFIG["vision_config"], "min_pixels": 2_000_000})  # above the budget
    assert e.value.field == "vision_config.min_pixels"
    with pytest.raises(GraphsimError) as e:
        VisionProcessor.from_config({**CONFIG["vision_config"], "max_wh_ratio": 0.5})
    assert e.value.field == "vision_config.max_wh_ratio"
    limited = VisionProcessor.from_config({**CONFIG["vision_config"], "max_wh_ratio": 200})
    assert limited.image_tokens(2000, 10).n_tokens > 0
    with pytest.raises(GraphsimError) as e:
        limited.image_tokens(2010, 10)
    assert e.value.field == "width"


def test_total_tokens():
    assert VP.total_tokens([(224, 224), (1024, 768)]) == (169 + 475, 1521 + 4070)


SIDE = st.integers(1, 60_000)


@settings(max_examples=400, deadline=None)
@given(SIDE, SIDE)
def test_cap_never_exceeded(w, h):
    t = VP.image_tokens(w, h)
    check_invariants(t)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 2000), st.integers(1, 2000))
def test_tokens_monotone_in_area_at_fixed_aspect(a, b, k1, k2):
    lo, hi = sorted((k1, k2))
    t_lo, t_hi = VP.image_tokens(a * lo, b * lo), VP.image_tokens(a * hi, b * hi)
    assert t_lo.n_tokens <= t_hi.n_tokens
    assert t_lo.n_patches <= t_hi.n_patches
    assert (t_lo.grid_h, t_lo.grid_w) <= (t_hi.grid_h, t_hi.grid_w)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 20_000))
def test_floor_holds_for_moderate_aspect_ratios(w, h):
    # Only very elongated images can be forced below min_pixels by the token cap.
    if max(w, h) <= 4 * min(w, h):
        t = VP.image_tokens(w, h)
        assert t.resized_width * t.resized_height >= RULE.min_pixels
        # Aspect ratio kept to within one patch per side.
        assert abs(t.resized_width * h - t.resized_height * w) <= RULE.patch_size * (w + h)
