"""Vision towers of the Hugging Face multimodal families (Qwen3-VL dense and MoE, Qwen3.5, Kimi K2.5, Llama 4,
Gemma 3, Gemma 4): parameters against the model cards and the HF module shapes, image tokens against each
processor's formula (``smart_resize``, ``navit_resize_image``, ``get_best_fit``, Gemma's resizes), the tower's cost
in prefill, and text-only requests unchanged. Test data: graphsim/configs/hf (see its NOTICE.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import numpy as np
import pytest

import graphsim as gs
from graphsim.cli import main
from graphsim.core.errors import GraphsimError
from graphsim.core.ir import COMPONENT_INDEX
from graphsim.models import load_model
from graphsim.models.decoder import Decoder
from graphsim.models.vision_tower import VisionTower, tower
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


@pytest.mark.parametrize("model", ["Qwen--Qwen3-8B", "deepseek-v3", "deepseek-v4-flash", "llama-3.1-70b"])
def test_models_without_a_tower_still_refuse_images(model):
    """One line naming request.image, for every family without a tower (DeepSeek-V4-Flash's text-only config
    once crashed here: its model shares V4.1's builder, whose configs carry a vision field; found by
    tests/test_fuzz.py's config family)."""
    m = load_model(path(model)) if "--" in model else load_model(model)
    with pytest.raises(GraphsimError, match=r"^request\.image: .*no vision tower"):
        gs.compile_plan(m, gs.Plan(["prefill:100+img:224x224"]), "h200")


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
    # a vision_config of a layout graphsim does not model names its tower in the refusal; the text model loads
    cfg = {**raw("meta-llama--Llama-4-Scout-17B-16E-Instruct"), "vision_config": {"model_type": "mllama_vision_model"}}
    m = load_model(cfg)
    assert "llama4 vision tower in vision_config is not modelled" in m.vision()
    assert vision_params(m) == 0
    # a SigLIP vision_config outside Gemma 3 is not taken for Gemma 3's tower
    assert tower({"model_type": "paligemma", "vision_config": raw("google--gemma-3-27b-it")["vision_config"]}) is None


def stage_flops(c) -> float:
    """Tensor-core (BF16) FLOPs of the ``vision`` stage at the first sweep point."""
    vis = [i for i, o in enumerate(c.graph.ops) if o.stage == "vision"]
    return float(c.schedule().components[0, vis, COMPONENT_INDEX["flops_bf16"]].sum())


# ---- Llama 4 (Llama4VisionModel + vision_adapter + multi_modal_projector) ---------------------------------------

LLAMA4 = ["meta-llama--Llama-4-Scout-17B-16E-Instruct", "meta-llama--Llama-4-Maverick-17B-128E-Instruct"]


def llama4_closed_form(v: dict, text_hidden: int) -> int:
    """Parameters from transformers modeling_llama4.py's module shapes: patch_embedding.linear (3·14² x h, no bias),
    class_embedding (h), positional_embedding_vlm ((336/14)² + 1 = 577 x h), layernorm_pre/post (2h each); per
    layer q/k/v/o (h x h + h each), fc1 (h x f + f), fc2 (f x h + h), two LayerNorms (4h); vision_adapter.mlp fc1
    (intermediate_size x projector_input_dim) and fc2 (projector_input_dim x projector_output_dim), no biases;
    multi_modal_projector.linear_1 (vision_output_dim x text hidden, no bias)."""
    h, f = v["hidden_size"], v["intermediate_size"]
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
    return (v["num_channels"] * v["patch_size"] ** 2 * h + h + ((v["image_size"] // v["patch_size"]) ** 2 + 1) * h
            + 4 * h + v["num_hidden_layers"] * layer + f * v["projector_input_dim"]
            + v["projector_input_dim"] * v["projector_output_dim"] + v["vision_output_dim"] * text_hidden)


@pytest.mark.parametrize("name", LLAMA4)
def test_llama4_tower_matches_the_checkpoint_tensors(name):
    m, cfg = load_model(path(name)), raw(name)
    # the checkpoint's vision tensors (a per-module listing of Llama-4-Scout-17B-16E, the same vision_config for both):
    # class_embedding 1,408 + positional_embedding_vlm 812,416 + patch_embedding.linear 827,904 + layernorm_pre/post
    # 4 x 1,408 + 34 x (q/k/v/o 4 x (1,982,464 + 1,408) + fc1 7,929,856 + 5,632 + fc2 7,929,856 + 1,408 + norms
    # 4 x 1,408 = 23,807,872) + vision_adapter fc1 23,068,672 + fc2 16,777,216 + multi_modal_projector 20,971,520
    assert vision_params(m) == llama4_closed_form(cfg["vision_config"], 5120) == 871_932_416
    text = load_model({k: v for k, v in cfg.items() if k != "vision_config"})
    c, t = m.param_counts(), text.param_counts()
    assert c["total_params"] == t["total_params"] + vision_params(m)
    assert c["active_params_with_embeddings"] == t["active_params_with_embeddings"]
    assert m.vision() == "" and text.vision() != ""


def test_llama4_scout_total_is_its_card():
    # Llama 4 model card: Scout "17B active, 109B total" (whole billions): 107.77 B of text (48 layers of attention,
    # 16 experts + a shared expert, untied embeddings) + 0.87 B of vision = 108.64 B; the text alone rounds to 108
    c = load_model(path("meta-llama--Llama-4-Scout-17B-16E-Instruct")).param_counts()
    assert c["total_params"] == 108_641_793_536 and round(c["total_params"] / 1e9) == 109
    assert round((c["total_params"] - c["vision_params"]) / 1e9) == 108


def llama4_tiles(width: int, height: int, tile: int = 336, max_patches: int = 16) -> int:
    """transformers' image_processing_llama4_fast.get_best_fit, in float32 as torch runs it -> ViT tiles (the
    canvas's tiles, plus the global tile when there is more than one)."""
    grids = [(a, n // a) for n in range(1, max_patches + 1) for a in range(1, n + 1) if n % a == 0]
    res = np.array([(a * tile, b * tile) for a, b in grids], dtype=np.float32)
    scales = np.minimum(res[:, 0] / np.float32(height), res[:, 1] / np.float32(width))
    up = scales[scales >= 1]
    pick = up.min() if len(up) else scales[scales < 1].max()
    cand = [g for g, s in zip(grids, scales) if s == pick]
    n = min(a * b for a, b in cand)
    return n + (1 if n > 1 else 0)


@pytest.mark.parametrize("w,h", SIZES + [(336, 336), (672, 672), (337, 336), (5000, 300)])
def test_llama4_image_tokens_follow_its_processor(w, h):
    t = load_model(path("meta-llama--Llama-4-Scout-17B-16E-Instruct")).image_processor().image_tokens(w, h)
    tiles = llama4_tiles(w, h)
    # a tile: 24 x 24 patches + the class token in the ViT, (24 / 2)² = 144 <|patch|> tokens after the pixel shuffle
    assert (t.n_patches, t.n_tokens) == (577 * tiles, 144 * tiles)


def test_llama4_known_sizes():
    proc = load_model(path("meta-llama--Llama-4-Scout-17B-16E-Instruct")).image_processor()
    assert proc.image_tokens(336, 336).n_tokens == 144  # one tile, no global tile
    # 672x672: a 2x2 canvas + the global tile = 5 ViT sequences of 577, 5 x 144 image tokens (aiconfigurator's
    # Llama 4 encoder tests count the same 5 sequences and 720 output tokens)
    assert (proc.image_tokens(672, 672).n_patches, proc.image_tokens(672, 672).n_tokens) == (2885, 720)
    # 1024x768: the smallest canvas that holds it without downscaling is 3 x 4 tiles (scale 1.3125): 13 tiles
    assert proc.canvas(1024, 768) == (3, 4) and proc.image_tokens(1024, 768).n_tokens == 13 * 144


def test_llama4_reads_its_preprocessor_config(tmp_path):
    (tmp_path / "config.json").write_text((DATA / f"{LLAMA4[0]}_config.json").read_text())
    # a deployment capping images at 4 tiles (the checkpoint's preprocessor_config.json says max_patches 16)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_patches": 4, "resize_to_max_canvas": False,
                                                                   "size": {"height": 336, "width": 336}}))
    proc = load_model(str(tmp_path)).image_processor()
    assert proc.source == "preprocessor_config.json" and proc.max_patches == 4
    # 1024x768 no longer fits a canvas without downscaling: 2x2 (scale 0.656) + the global tile
    assert proc.image_tokens(1024, 768).n_tokens == 144 * llama4_tiles(1024, 768, max_patches=4) == 5 * 144
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 336, "width": 448}}))
    with pytest.raises(GraphsimError, match="square"):
        load_model(str(tmp_path))


def test_llama4_vision_flops_closed_form(capsys):
    """Tensor-core FLOPs at tp=1: the unfold patch embedding (576 patches a tile, 588 pixels each), 34 x (q/k/v/o,
    fc1/fc2 on 577 positions a tile, attention over 577² pairs a tile), the adapter's fc1/fc2 and the projector on
    144 tokens a tile."""
    m = load_model(path("meta-llama--Llama-4-Scout-17B-16E-Instruct"))
    v = m.cfg.vision
    c = compile_(m, ["prefill:500+img:1024x768+img:336x336"])
    tiles = 13 + 1
    P, I, h, f = 577 * tiles, 144 * tiles, 1408, 5632
    want = (2 * 576 * tiles * 588 * h + 34 * (2 * P * (4 * h * h + 2 * h * f) + 4 * h * tiles * 577 ** 2)
            + 2 * I * (5632 * 4096 + 4096 * 4096 + 4096 * 5120))
    assert (v.tile_positions, v.merge) == (577, 2)
    assert stage_flops(c) == pytest.approx(want, rel=1e-12)
    # per-tile attention: several tiles in one request never attend across tiles (full_pairs would be 14x the pairs)
    assert c.plan.requests[0].image_tokens == I and c.plan.requests[0].length == 500 + I
    assert main(["estimate", "--model", "meta-llama/Llama-4-Scout-17B-16E-Instruct", "--hw", "h200", "--tp", "8",
                 "--request", "prefill:1000+img:672x672", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["identity"]["requests"] == ["prefill:1000+img:720tok/2885patches"]
    assert {s["stage"]: s["busy_s"] for s in d["stages"]}["vision"] > 0


# ---- Gemma 3 (SigLIP + Gemma3MultiModalProjector) ---------------------------------------------------------------

GEMMA3 = "google--gemma-3-27b-it"


def test_gemma3_tower_matches_the_technical_report():
    m = load_model(path(GEMMA3))
    v = raw(GEMMA3)["vision_config"]
    h, f = v["hidden_size"], v["intermediate_size"]
    # SigLIP (modeling_siglip.py): Conv2d patch embedding 3·14²·h + h, position_embedding (896/14)² = 4096 x h,
    # 27 x (layer_norm1/2 4h, q/k/v/out_proj 4(h² + h), fc1 hf + f, fc2 fh + h), post_layernorm 2h
    siglip = 3 * 14 ** 2 * h + h + 4096 * h + 27 * (4 * h + 4 * (h * h + h) + (h * f + f) + (f * h + h)) + 2 * h
    # Gemma3MultiModalProjector: mm_input_projection_weight (h x 5376), mm_soft_emb_norm (h)
    projector = h * 5376 + h
    assert vision_params(m) == siglip + projector == 423_060_336
    # Gemma 3 Technical Report, Table 1: vision encoder 417M (416.87 M); 27B embedding parameters 1,416M, the
    # 262,208 x 5376 vocabulary embedding with the projection matrix (1,409.6 M + 6.2 M)
    assert round(siglip / 1e6) == 417 and round((262_208 * 5376 + h * 5376) / 1e6) == 1416
    c = m.param_counts()
    # google/gemma-3-27b-it on Hugging Face: "27.4B params"; the text model alone is 27.01 B
    assert round(c["total_params"] / 1e8) == 274 and round((c["total_params"] - vision_params(m)) / 1e8) == 270


def test_gemma3_images_are_896_squares():
    proc = load_model(path(GEMMA3)).image_processor()
    for w, h in SIZES:  # every image is resized to 896 x 896: 64² patches, pooled 4 x 4 to mm_tokens_per_image
        t = proc.image_tokens(w, h)
        assert (t.n_patches, t.n_tokens) == (4096, 256)


def test_gemma3_refuses_pan_and_scan(tmp_path):
    (tmp_path / "config.json").write_text((DATA / f"{GEMMA3}_config.json").read_text())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_pan_and_scan": True, "image_seq_length": 256}))
    with pytest.raises(GraphsimError, match="Pan & Scan"):
        load_model(str(tmp_path))


def test_gemma3_vision_flops_closed_form():
    """Two images in one request: attention within each image's 4096 patches (2 x 4096² pairs), no RoPE; the
    projector on 256 tokens an image."""
    m = load_model(path(GEMMA3))
    c = compile_(m, ["prefill:300+img:1024x768+img:640x480"])
    P, I, h, f = 2 * 4096, 2 * 256, 1152, 4304
    want = 2 * P * 588 * h + 27 * (2 * P * (4 * h * h + 2 * h * f) + 4 * h * 2 * 4096 ** 2) + 2 * I * h * 5376
    assert stage_flops(c) == pytest.approx(want, rel=1e-12)
    assert not any(o.name.endswith("rope2d") for o in c.graph.ops if o.stage == "vision")


# ---- Gemma 4 (Gemma4VisionModel + embed_vision) ------------------------------------------------------------------

GEMMA4 = "google--gemma-4-26B-A4B"


def gemma4_closed_form(v: dict, text_hidden: int) -> tuple[int, int]:
    """(tower, embed_vision) from transformers modeling_gemma4.py: patch_embedder.input_proj (3·p² x h, no bias),
    position_embedding_table (2 x position_embedding_size x h); per layer four RMSNorms (4h), q/k/v/o (h x h each,
    no bias), q_norm and k_norm (head_dim each; v_norm has no scale), gate/up/down (3hf); std_bias and std_scale (2h);
    embed_vision.embedding_projection (h x text hidden; its norm has no scale)."""
    h, f, hd = v["hidden_size"], v["intermediate_size"], v["head_dim"]
    layer = 4 * h + 4 * h * h + 2 * hd + 3 * h * f
    tower_ = 3 * v["patch_size"] ** 2 * h + 2 * v["position_embedding_size"] * h + v["num_hidden_layers"] * layer + 2 * h
    return tower_, h * text_hidden


@pytest.mark.parametrize("name,text_hidden", [(GEMMA4, 2816), ("nvidia--Gemma-4-26B-A4B-NVFP4", 2816),
                                              ("nvidia--Gemma-4-31B-IT-NVFP4", 5376)])
def test_gemma4_tower_is_its_closed_form(name, text_hidden):
    cfg = raw(name)
    vit = tower(cfg)
    tw, proj = gemma4_closed_form(cfg["vision_config"], text_hidden)
    assert sum(t.elems for t in vit.weights()) == tw + proj
    # Gemma 4 model card: "a ~550M parameter vision encoder" (26B A4B and 31B): 569.6 M
    assert tw == 569_550_384 and abs(tw / 550e6 - 1) < 0.04
    # the text model (per-type attention, K=V global layers) is not modelled yet: loading still says so
    with pytest.raises(GraphsimError, match="Gemma 4's per-type attention"):
        load_model(path(name))


def gemma4_resize(width: int, height: int, p: int = 16, k: int = 3, soft: int = 280) -> tuple[int, int]:
    """transformers' image_processing_gemma4.get_aspect_ratio_preserving_size (floats, as it runs) -> (w', h')."""
    max_patches = soft * k * k
    factor = math.sqrt(max_patches * p * p / (height * width))
    side = k * p
    th, tw = math.floor(factor * height / side) * side, math.floor(factor * width / side) * side
    if th == 0:
        th, tw = side, min(math.floor(width / height) * side, (max_patches // k ** 2) * side)
    elif tw == 0:
        tw, th = side, min(math.floor(height / width) * side, (max_patches // k ** 2) * side)
    return tw, th


def gemma4_model():
    """The Gemma 4 tower on a text model graphsim loads (Gemma 4's own text layers are not modelled): Gemma 3 27B's
    text config under the gemma4 model_type, with gemma-4-26B-A4B's vision_config."""
    g4 = raw(GEMMA4)
    return load_model({"model_type": "gemma4", "text_config": raw(GEMMA3)["text_config"],
                       "vision_config": g4["vision_config"], "vision_soft_tokens_per_image": 280})


@pytest.mark.parametrize("w,h", [s for s in SIZES if max(s) < 48 * min(s)] + [(3000, 17), (17, 3000)])
def test_gemma4_image_tokens_follow_its_processor(w, h):
    t = gemma4_model().image_processor().image_tokens(w, h)
    rw, rh = gemma4_resize(w, h)
    assert (t.resized_width, t.resized_height) == (rw, rh)
    assert t.n_patches == (rw // 16) * (rh // 16) <= 2520 and t.n_tokens == t.n_patches // 9 <= 280


def test_gemma4_known_sizes_and_budget(tmp_path):
    proc = gemma4_model().image_processor()
    # 1024x768 at 280 soft tokens: factor sqrt(2520·256 / 786432) = 0.9057 -> 912 x 672, 57 x 42 = 2394 patches
    t = proc.image_tokens(1024, 768)
    assert (t.resized_width, t.resized_height, t.n_patches, t.n_tokens) == (912, 672, 2394, 266)
    assert proc.image_tokens(4096, 4096).n_tokens == 256  # 768 x 768: 48² patches pooled 3 x 3
    with pytest.raises(GraphsimError, match="max_soft_tokens"):
        type(proc).from_preprocessor({"max_soft_tokens": 300})


def test_gemma4_vision_flops_closed_form():
    """One image: input_proj on its patches, 27 x (q/k/v/o, gated MLP 3hf, attention over the image's patches), the
    embedding projection on its soft tokens."""
    m = gemma4_model()
    c = compile_(m, ["prefill:200+img:1024x768"])
    p, t, h, f = 2394, 266, 1152, 4304
    want = 2 * p * 768 * h + 27 * (2 * p * (4 * h * h + 3 * h * f) + 4 * h * p * p) + 2 * t * h * 5376
    assert stage_flops(c) == pytest.approx(want, rel=1e-12)


# ---- every new family: decode runs no tower, text-only requests unchanged, memory counts the group ---------------

@pytest.mark.parametrize("make", [lambda: load_model(path(LLAMA4[0])), lambda: load_model(path(GEMMA3)), gemma4_model],
                         ids=["llama4", "gemma3", "gemma4"])
def test_new_towers_leave_text_and_decode_alone(make):
    m = make()
    t = Decoder(attrs.evolve(m.cfg, vision=None, processor=None), "text", m.quant, m.kv_format)  # the text model
    reqs = ["prefill:2000", "decode:4096x16"]
    a, b = compile_(m, reqs), compile_(t, reqs)
    assert "vision" not in a.graph.stages and [o.name for o in a.graph.ops] == [o.name for o in b.graph.ops]
    assert a.report().forward_s == b.report().forward_s
    assert "vision" not in compile_(m, ["decode:2768x8"]).graph.stages
    assert "vision" in compile_(m, ["prefill:100+img:640x480"]).graph.stages


@pytest.mark.parametrize("model_id,elems", [("meta-llama/Llama-4-Scout-17B-16E-Instruct", 871_932_416),
                                            ("google/gemma-3-27b-it", 423_060_336)])
def test_memory_counts_the_new_vision_groups(capsys, model_id, elems):
    assert main(["memory", "--model", model_id, "--context", "4096", "--json"]) == 0
    assert "vision" in capsys.readouterr().out
    m = load_model(model_id)
    assert sum(t.nbytes for t in m.weights() if t.group == "vision") == 2 * elems  # BF16
