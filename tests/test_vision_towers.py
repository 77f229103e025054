"""Vision towers of the Hugging Face multimodal families (Qwen3-VL dense and MoE, Qwen3.5): parameters against the
model cards and the HF module shapes, image tokens against the Qwen-VL processor's formula (``smart_resize``), the
tower's cost in prefill, and text-only requests unchanged. Test data: graphsim/configs/hf (see its NOTICE.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENT_INDEX
from graphsim.models import load_model
from graphsim.models.vision_tower import VisionTower
from graphsim.core.plan import Request
from graphsim.core.vision import QwenVLProcessor

DATA = Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "hf"
VL = ["Qwen--Qwen3-VL-2B-Instruct", "Qwen--Qwen3-VL-4B-Instruct", "Qwen--Qwen3-VL-8B-Instruct",
      "Qwen--Qwen3-VL-32B-Instruct", "Qwen--Qwen3-VL-30B-A3B-Instruct", "Qwen--Qwen3-VL-235B-A22B-Instruct"]
QWEN35 = ["Qwen--Qwen3.5-27B", "Qwen--Qwen3.5-35B-A3B", "Qwen--Qwen3.5-122B-A10B", "Qwen--Qwen3.5-397B-A17B"]


def path(name: str) -> str:
    return str(DATA / f"{name}_config.json")


def raw(name: str) -> dict:
    return json.loads((DATA / f"{name}_config.json").read_text())


def vision_params(model) -> int:
    return sum(t.elems for t in model.weights() if t.group == "vision")


def vit_closed_form(v: dict) -> int:
    """The tower's parameters from transformers' modeling_qwen3_vl.py module shapes (biases included):
    Conv3d patch embed, pos_embed, depth x (2 LayerNorms, qkv, proj, linear_fc1, linear_fc2), the merger
    (LayerNorm(h), 4h x 4h, 4h x out) and one merger per deepstack index (LayerNorm(4h))."""
    h, f, o = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    m = h * v["spatial_merge_size"] ** 2
    patch = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2 * h + h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    merger = (m * m + m) + (m * o + o)
    return (patch + v["num_position_embeddings"] * h + v["depth"] * block + merger + 2 * h
            + len(v["deepstack_visual_indexes"]) * (merger + 2 * m))


# ---- parameters -------------------------------------------------------------------------------------------


def test_qwen3_vl_2b_within_3_percent_of_its_card():
    # Qwen/Qwen3-VL-2B-Instruct: the Hugging Face page gives "Model size 2B params" (whole billions) and the
    # model is quoted as "2.1B params"; no published figure has more digits, so the precise figure is computed
    # from the HF modeling code's module shapes: text model 1,720,574,976 (Qwen3 decoder, tied embeddings) +
    # vision tower 406,957,056 (vit_closed_form) = 2,127,532,032.
    c = load_model(path("Qwen--Qwen3-VL-2B-Instruct")).param_counts()
    assert abs(c["total_params"] / 2.1275e9 - 1) < 0.03, c
    assert round(c["total_params"] / 1e9) == 2  # HF's "2B params"
    assert c["total_params"] == 2_127_532_032 and c["vision_params"] == 406_957_056
    # the text model alone (what graphsim counted before) is 19 % under: the test fails without the tower
    assert c["active_params_with_embeddings"] == 1_720_574_976


def test_qwen3_vl_8b_matches_the_checkpoint_tensors():
    # OpenExplorer/Qwen3-VL-8B-Instruct model card, "Parameter counts are calculated from the tensors stored in the
    # upstream checkpoint": total 8.767B, vision model (ViT) 576.4M, language model 8.191B
    m = load_model(path("Qwen--Qwen3-VL-8B-Instruct"))
    c = m.param_counts()
    assert abs(c["total_params"] / 8.767e9 - 1) < 0.001
    assert abs(vision_params(m) / 576.4e6 - 1) < 0.001
    assert abs((c["total_params"] - vision_params(m)) / 8.191e9 - 1) < 0.001


@pytest.mark.parametrize("name", VL + QWEN35 + ["Qwen--Qwen3-VL-32B-Thinking", "nvidia--Qwen3.5-122B-A10B-NVFP4",
                                                "nvidia--Qwen3.6-27B-NVFP4", "nvidia--Qwen3.6-35B-A3B-NVFP4"])
def test_every_qwen_tower_is_its_closed_form_in_the_vision_group(name):
    m = load_model(path(name))
    cfg = raw(name)
    assert vision_params(m) == vit_closed_form(cfg["vision_config"])
    # the tower adds to total parameters, never to a text token's active ones
    text = load_model({k: v for k, v in cfg.items() if k != "vision_config"})
    c, t = m.param_counts(), text.param_counts()
    assert c["total_params"] == t["total_params"] + vision_params(m)
    assert c["active_params_per_token"] == t["active_params_per_token"]
    assert m.vision() == "" and text.vision() != ""


def test_deepstack_mergers_only_where_the_config_has_them():
    names = {t.name.rsplit(".", 1)[0] for t in load_model(path("Qwen--Qwen3-VL-2B-Instruct")).weights()}
    assert {f"vision.deepstack_merger_list.{k}" for k in range(3)} <= names  # deepstack_visual_indexes [5, 11, 17]
    names = {t.name for t in load_model(path("Qwen--Qwen3.5-27B")).weights()}
    assert not any("deepstack" in n for n in names)  # Qwen3.5: deepstack_visual_indexes []


# Computed from the HF modeling code's module shapes (graphsim's count; the test above holds the tower to its
# closed form). Published figures with more than whole-billion digits: 8B (OpenExplorer card, 8.767B), 2B ("2.1B").
TABLE = {"Qwen--Qwen3-VL-2B-Instruct": 2.128, "Qwen--Qwen3-VL-4B-Instruct": 4.438, "Qwen--Qwen3-VL-8B-Instruct": 8.767,
         "Qwen--Qwen3-VL-32B-Instruct": 33.357, "Qwen--Qwen3-VL-30B-A3B-Instruct": 31.071,
         "Qwen--Qwen3-VL-235B-A22B-Instruct": 235.670}


@pytest.mark.parametrize("name", VL)
def test_counts_table(name):
    assert load_model(path(name)).param_counts()["total_params"] / 1e9 == pytest.approx(TABLE[name], abs=5e-4)


def test_memory_reports_the_vision_group(capsys):
    assert main(["memory", "--model", "Qwen/Qwen3-VL-2B-Instruct", "--context", "4096", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    text = json.dumps(d)
    assert "vision" in text
    m = load_model(path("Qwen--Qwen3-VL-2B-Instruct"))
    assert sum(t.nbytes for t in m.weights() if t.group == "vision") == 2 * 406_957_056  # BF16


# ---- image tokens -----------------------------------------------------------------------------------------


def smart_resize(height: int, width: int, factor: int = 32, min_pixels: int = 65536, max_pixels: int = 16777216):
    """transformers' image_processing_qwen2_vl.smart_resize, in floats as HF runs it (the reference)."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


SIZES = [(1024, 768), (1920, 1080), (640, 480), (400, 300), (32, 32), (8000, 6000), (3000, 17), (4096, 4096),
         (4097, 4096), (255, 257), (1000, 333), (2048, 3072), (16, 3000), (7680, 4320)]


@pytest.mark.parametrize("w,h", SIZES)
def test_image_tokens_follow_the_processor_formula(w, h):
    proc = load_model(path("Qwen--Qwen3-VL-2B-Instruct")).image_processor()
    rh, rw = smart_resize(h, w)
    t = proc.image_tokens(w, h)
    assert (t.resized_width, t.resized_height) == (rw, rh)
    assert t.n_patches == (rh // 16) * (rw // 16) and t.n_tokens == t.n_patches // 4


def test_known_sizes():
    proc = load_model(path("Qwen--Qwen3-VL-8B-Instruct")).image_processor()
    # 400x300 -> resized 384x288, grid 18x24 = 432 patches (a Qwen3-VL walkthrough of the HF processor,
    # amdrajeevp1/onnxruntime-genai QWEN3_VL_VISION_ARCHITECTURE.md); 108 image tokens after the 2x2 merger
    t = proc.image_tokens(400, 300)
    assert (t.resized_width, t.resized_height, t.n_patches, t.n_tokens) == (384, 288, 432, 108)
    assert proc.image_tokens(1024, 768).n_tokens == 768  # 32x24 factor-32 cells
    assert proc.image_tokens(32, 32).n_tokens == 64  # upscaled to the 256x256 floor (shortest_edge 65536)
    with pytest.raises(GraphsimError):
        proc.image_tokens(201, 1)  # the processor rejects aspect ratios above 200


def test_requests_of_a_vl_model_use_its_processor(capsys):
    assert main(["estimate", "--model", "Qwen/Qwen3-VL-2B-Instruct", "--hw", "h200", "--request",
                 "prefill:1000+img:1024x768+img:400x300", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["identity"]["requests"] == ["prefill:1000+img:876tok/3504patches"]  # 768 + 108, 3072 + 432
    assert d["tokens"]["prefill_tokens"] == 1876
    # DeepSeek-V4.1-Flash keeps its own processor (14-pixel patches, 3x3 aligner): 475 tokens for 1024x768
    assert Request.parse("prefill:1000+img:1024x768").image_tokens == 475


def test_preprocessor_config_beside_the_config_is_read(tmp_path):
    (tmp_path / "config.json").write_text((DATA / "Qwen--Qwen3-VL-2B-Instruct_config.json").read_text())
    # a deployment that caps images at 1280 28x28 cells' worth of pixels (Qwen2-VL's max_pixels convention)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 3136, "longest_edge": 1003520}, "patch_size": 16, "temporal_patch_size": 2,
         "merge_size": 2}))
    proc = load_model(str(tmp_path)).image_processor()
    assert proc.source == "preprocessor_config.json" and proc.max_pixels == 1003520
    rh, rw = smart_resize(1080, 1920, max_pixels=1003520)
    assert proc.image_tokens(1920, 1080).n_tokens == (rh // 32) * (rw // 32) < 2040  # 2040 at the defaults
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14, "merge_size": 2}))
    with pytest.raises(GraphsimError, match="patch_size 14"):
        load_model(str(tmp_path))


def test_processor_bounds_are_checked():
    with pytest.raises(GraphsimError):
        QwenVLProcessor.from_preprocessor({"size": {"shortest_edge": 10, "longest_edge": 5}})


# ---- the tower's cost in prefill ----------------------------------------------------------------------------


def compile_(model, requests, mapping=gs.ParallelMapping()):
    proc = model.image_processor()
    reqs = [Request.parse(r, proc) for r in requests]
    return gs.compile_plan(model, gs.Plan(reqs, mapping), "h200")


def test_vision_flops_closed_form():
    """Tensor-core FLOPs of the tower at tp=1: patch embed, depth x (qkv, attention over n² pairs, proj, fc1, fc2),
    the merger and the deepstack mergers on the image tokens."""
    m = load_model(path("Qwen--Qwen3-VL-2B-Instruct"))
    v: VisionTower = m.cfg.vision
    c = compile_(m, ["prefill:500+img:1024x768"])
    s = c.schedule()
    vis = [i for i, o in enumerate(c.graph.ops) if o.stage == "vision"]
    got = s.components[0, vis, COMPONENT_INDEX["flops_bf16"]].sum()
    n, t, h, f, mm = 3072, 768, v.hidden, v.inter, v.merged
    want = (2 * n * v.patch_dim * h + v.depth * (2 * n * (4 * h * h + 2 * h * f) + 4 * h * n * n)
            + (1 + v.deepstack) * 2 * t * (mm * mm + mm * v.out_hidden))
    assert got == pytest.approx(want, rel=1e-12)
    # the embedding waits for the tower; the ViT is a real share of this prefill
    sched, g = c.schedule(), c.graph
    vis_end = max(sched.finish[0, i] for i in vis)
    assert sched.start[0, g.op_index["embed"]] >= vis_end
    busy = c.report().stages["vision"]["busy_s"]
    assert 0.1 * c.report().forward_s < busy < c.report().forward_s


def test_vision_cost_grows_with_the_image_and_splits_over_tp():
    m = load_model(path("Qwen--Qwen3-VL-8B-Instruct"))
    small = compile_(m, ["prefill:500+img:640x480"]).report().stages["vision"]["busy_s"]
    large = compile_(m, ["prefill:500+img:1920x1080"]).report().stages["vision"]["busy_s"]
    assert large > 4 * small  # 6.8x the patches, attention quadratic in them
    tp4 = compile_(m, ["prefill:500+img:1920x1080"], gs.ParallelMapping(tp=4)).report().stages["vision"]["busy_s"]
    assert tp4 < large


@pytest.mark.parametrize("name", ["Qwen--Qwen3-VL-2B-Instruct", "Qwen--Qwen3-VL-30B-A3B-Instruct", "Qwen--Qwen3.5-27B"])
def test_text_only_requests_are_unchanged(name):
    cfg = raw(name)
    vl, text = load_model(path(name)), load_model({k: v for k, v in cfg.items() if k != "vision_config"})
    reqs = ["prefill:2000", "decode:4096x16"]
    a, b = compile_(vl, reqs), compile_(text, reqs)
    assert "vision" not in a.graph.stages and [o.name for o in a.graph.ops] == [o.name for o in b.graph.ops]
    assert a.report().forward_s == b.report().forward_s
    # and a decode step after an image runs no tower
    assert "vision" not in compile_(vl, ["decode:2768x8"]).graph.stages


def test_models_without_a_tower_still_refuse_images():
    with pytest.raises(GraphsimError, match="no vision tower"):
        gs.compile_plan(load_model(path("Qwen--Qwen3-8B")), gs.Plan(["prefill:100+img:224x224"]), "h200")


def test_python_plans_count_images_with_the_models_processor():
    # Plan(["...+img:WxH"]) names no model: compile_plan recounts the sizes with the model's processor
    m = load_model(path("Qwen--Qwen3-VL-2B-Instruct"))
    c = gs.compile_plan(m, gs.Plan(["prefill:1000+img:1024x768+img:400x300", "decode:2000x4"]), "h200")
    r = c.plan.requests[0]
    assert (r.image_tokens, r.image_patches, r.length) == (876, 3504, 1876)
    assert c.plan.requests[1] == Request.parse("decode:2000x4")
    # explicit counts and DeepSeek-V4.1 (the default processor) are left as given
    e = gs.compile_plan(m, gs.Plan(["prefill:1000+img:100tok/400patches"]), "h200")
    assert e.plan.requests[0].image_tokens == 100
    assert Request.parse("prefill:1000+img:1024x768") == Request("prefill", 1475, image_tokens=475, image_patches=4070)


# ---- Kimi K2.5 (MoonViT-3D + patchmerger projector) ------------------------------------------------------------

KIMI = ["moonshotai--Kimi-K2.5", "nvidia--Kimi-K2.5-NVFP4", "nvidia--Kimi-K2.6-NVFP4", "nvidia--Kimi-K2.7-Code-NVFP4"]


def moonvit_closed_form(v: dict, text_hidden: int) -> tuple[int, int]:
    """(tower, projector) parameters from vLLM kimi_k25_vit.py's module shapes, biases included: Conv2d patch embed,
    pos_emb (64 x 64 x h), vt_num_hidden_layers x (norm0, norm1, wqkv, wo, fc0, fc1), final_layernorm; projector
    pre_norm LayerNorm(h), linear_1 (4h x 4h), linear_2 (4h x text hidden)."""
    h, f, m = v["vt_hidden_size"], v["vt_intermediate_size"], 4 * v["vt_hidden_size"]
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    tower = (3 * v["patch_size"] ** 2 * h + h + v["init_pos_emb_height"] * v["init_pos_emb_width"] * h
             + v["vt_num_hidden_layers"] * block + 2 * h)
    return tower, 2 * h + (m * m + m) + (m * text_hidden + text_hidden)


@pytest.mark.parametrize("name", KIMI)
def test_kimi_tower_is_its_closed_form(name):
    m, cfg = load_model(path(name)), raw(name)
    tower, projector = moonvit_closed_form(cfg["vision_config"], cfg["text_config"]["hidden_size"])
    assert vision_params(m) == tower + projector == 471_143_920
    # Kimi K2.5 model card: "Vision Encoder: MoonViT, Parameters of Vision Encoder: 400M" (rounded): 416.9 M
    assert abs(tower / 400e6 - 1) < 0.05
    text = load_model({k: v for k, v in cfg.items() if k != "vision_config"})
    assert m.param_counts()["total_params"] == text.param_counts()["total_params"] + vision_params(m)
    assert m.param_counts()["active_params_with_embeddings"] == text.param_counts()["active_params_with_embeddings"]


def navit_resize(width: int, height: int, p: int = 14, merge: int = 2, limit: int = 16384, side: int = 512):
    """Kimi K2.5's media_utils.navit_resize_image (floats, as it runs): -> (patches, tokens) of the padded grid."""
    s1 = math.sqrt(limit / (max(1.0, width // p) * max(1.0, height // p)))
    scale = min(1.0, s1, side * p / width, side * p / height)
    w, h = min(max(1, int(width * scale)), side * p), min(max(1, int(height * scale)), side * p)
    f = merge * p
    th, tw = (h + (f - h % f) % f) // f, (w + (f - w % f) % f) // f
    return th * tw * merge * merge, th * tw


@pytest.mark.parametrize("w,h", SIZES)
def test_kimi_image_tokens_follow_its_processor(w, h):
    t = load_model(path("moonshotai--Kimi-K2.5")).image_processor().image_tokens(w, h)
    assert (t.n_patches, t.n_tokens) == navit_resize(w, h)


def test_kimi_prices_its_tower_and_leaves_text_alone(capsys):
    assert main(["estimate", "--model", "moonshotai/Kimi-K2.5", "--hw", "h200", "--tp", "8", "--ep", "8", "--request",
                 "prefill:1000+img:1024x768", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["identity"]["requests"] == ["prefill:1000+img:1036tok/4144patches"]  # 1036x784 padded: 74x56 patches
    assert {s["stage"]: s["busy_s"] for s in d["stages"]}["vision"] > 0
    cfg = raw("moonshotai--Kimi-K2.5")
    vl, text = load_model(path("moonshotai--Kimi-K2.5")), load_model({k: v for k, v in cfg.items() if k != "vision_config"})
    mapping = gs.ParallelMapping(tp=8, ep=8)
    a, b = (compile_(x, ["prefill:2000", "decode:4096x16"], mapping) for x in (vl, text))
    assert a.report().forward_s == b.report().forward_s and "vision" not in a.graph.stages


def test_kimi_reads_media_proc_cfg_beside_the_config(tmp_path):
    (tmp_path / "config.json").write_text((DATA / "moonshotai--Kimi-K2.5_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": {"in_patch_limit": 4096,
                                                                                      "merge_kernel_size": [2, 2]}}))
    proc = load_model(str(tmp_path)).image_processor()
    assert proc.source == "preprocessor_config.json" and proc.in_patch_limit == 4096
    assert proc.image_tokens(4096, 4096).n_tokens == navit_resize(4096, 4096, limit=4096)[1] < navit_resize(4096, 4096)[1]


def test_an_unmodelled_tower_is_named_when_images_are_refused():
    # the bundled Llama 4 configs carry no vision_config; a full one (as on the Hub) names its tower in the refusal
    cfg = {**raw("meta-llama--Llama-4-Scout-17B-16E-Instruct"), "vision_config": {"model_type": "llama4_vision_model"}}
    m = load_model(cfg)
    assert "llama4 vision tower in vision_config is not modelled" in m.vision()
    assert vision_params(m) == 0
