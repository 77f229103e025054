"""DeepSeek-V4.1-Flash model semantics against the golden numbers of shared/spec/V41_FACTS.md (§ cited)."""
from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path

import pytest

from graphsim.core.errors import GraphsimError
from graphsim.core.ir import fmt
from graphsim.models import deepseek_v41 as m
from graphsim.models.deepseek_v41 import V41Config

CONFIG = Path(__file__).resolve().parents[1] / "graphsim" / "configs" / "deepseek-v4.1-flash.json"
MiB = 2**20


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(CONFIG.read_text())


@pytest.fixture(scope="module")
def cfg(raw) -> V41Config:
    return V41Config.from_dict(raw)


def modified(raw: dict, **text) -> V41Config:
    d = copy.deepcopy(raw)
    d["text_config"].update(text)
    return V41Config.from_dict(d)


def by_layer(cfg):
    return {li.layer: li for li in m.layer_table(cfg)}


def within(value, golden, rel=0.01):
    return abs(value - golden) <= rel * golden


# ---- config parsing --------------------------------------------------------------------------------


def test_config_fields_come_from_the_file(cfg):
    # §1 official config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (40, 5120, 129280)
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.num_experts_per_tok) == (384, 1, 6)
    assert (cfg.num_attention_heads, cfg.head_dim, cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank) == (64, 512, 1280, 8, 1024)
    assert len(cfg.compress_ratios) == 43 and cfg.n_dspark_blocks == 3
    assert cfg.dense_format == "fp8_b32x32_ue8m0" and cfg.expert_format == "fp4_ue8m0_32"  # §8
    assert cfg.vision is not None and cfg.vision.patch_dim == 588 and cfg.vision.aligner_in == 9216  # §12


def test_derived_dimensions(cfg):
    assert (cfg.hc_mix_rows, cfg.hc_mix_cols) == (24, 20480)  # §12 mHC fn [24, 20480]
    assert cfg.engram_lookup_rows == 24 and cfg.engram_lookup_dim == 6144  # §6 24 rows × 256
    assert cfg.engram_proj_out == 25600  # §6 6,144 -> 5,120 × 5
    assert cfg.q_dim == 32768 and cfg.wo_a_in_per_group == 4096  # §12


def test_flat_dict_is_accepted(raw, cfg):
    flat = {**raw["text_config"], "quantization_config": raw["quantization_config"], "vision_config": raw["vision_config"]}
    assert V41Config.from_dict(flat) == cfg


@pytest.mark.parametrize("field", ["hidden_size", "kv_source_layer_ids", "engram_num_embeddings", "compress_ratios"])
def test_missing_field_is_named(raw, field):
    d = copy.deepcopy(raw)
    del d["text_config"][field]
    with pytest.raises(GraphsimError) as e:
        V41Config.from_dict(d)
    assert e.value.field == f"text_config.{field}"


@pytest.mark.parametrize("field,value", [("hidden_size", "5120"), ("hidden_size", True), ("hidden_size", 5120.0),
                                         ("index_source_layer_ids", [2, "8"]), ("routed_scaling_factor", "1.5")])
def test_wrong_type_is_named(raw, field, value):
    d = copy.deepcopy(raw)
    d["text_config"][field] = value
    with pytest.raises(GraphsimError) as e:
        V41Config.from_dict(d)
    assert e.value.field == f"text_config.{field}"


def test_missing_vision_and_quant_fields_are_named(raw):
    d = copy.deepcopy(raw)
    del d["vision_config"]["intermediate_size"]
    with pytest.raises(GraphsimError, match="vision_config.intermediate_size"):
        V41Config.from_dict(d)
    d = copy.deepcopy(raw)
    del d["quantization_config"]
    with pytest.raises(GraphsimError, match="quantization_config"):
        V41Config.from_dict(d)


@pytest.mark.parametrize(
    "change,field",
    [
        (dict(kv_source_layer_ids=[1, 8, 14, 20]), "kv_source_layer_ids"),  # layer 1 is SWA-only (ratio 0)
        (dict(index_source_layer_ids=[2, 14, 20, 24]), "index_source_layer_ids"),  # misses KV source 8
        (dict(kv_source_layer_ids=[8, 14, 20]), "compress_ratios"),  # layers 2..7 have no owner
        (dict(candidate_source_layer_id=24), "candidate_source_layer_id"),  # not a KV source
        (dict(compress_ratios=[0, 0] + [2] * 18 + [1] * 20), "compress_ratios"),  # DSpark entries missing
        (dict(compress_ratios=[0, 0] + [2] * 18 + [1] * 20 + [0, 0, 2]), "compress_ratios"),  # DSpark not SWA
        (dict(compress_ratios=[0, 0] + [2] * 10 + [4] * 8 + [1] * 20 + [0, 0, 0]), "compress_ratios"),  # ratio != owner's
        (dict(kv_source_layer_ids=[2, 8, 8, 20]), "kv_source_layer_ids"),
        (dict(engram_num_embeddings=[384006168]), "engram_num_embeddings"),
    ],
)
def test_inconsistent_configs_raise(raw, change, field):
    with pytest.raises(GraphsimError) as e:
        modified(raw, **change)
    assert e.value.field == f"text_config.{field}"


# ---- layer roles (§2, §10) -------------------------------------------------------------------------


def test_path_counts(cfg):
    assert m.path_counts(cfg) == {"swa_only": 2, "full": 4, "reindex": 4, "reuse": 30}  # §2, §10


def test_dspark_entries_are_not_trunk_layers(cfg):
    table = m.layer_table(cfg)  # §1: the 3 trailing compress_ratios entries are DSpark blocks
    assert len(table) == 40 and [li.layer for li in table] == list(range(40))


def test_kv_owner_differs_from_topk_producer(cfg):
    li = by_layer(cfg)[29]  # §2: layer 29 reads KV owned by 20 and Top-K produced by 28
    assert (li.path, li.kv_owner, li.topk_producer) == ("reuse", 20, 28)


def test_reuse_right_after_the_decoder_full_layer(cfg):
    t = by_layer(cfg)
    for layer in (21, 22, 23):  # §2: Reuse takes the latest Top-K of its KV group, i.e. layer 20's
        assert (t[layer].path, t[layer].kv_owner, t[layer].topk_producer) == ("reuse", 20, 20)


def test_roles_per_layer(cfg):
    t = by_layer(cfg)
    assert [i for i, li in t.items() if li.path == "swa_only"] == [0, 1]  # §2
    assert [i for i, li in t.items() if li.path == "full"] == [2, 8, 14, 20]  # §2
    assert [i for i, li in t.items() if li.path == "reindex"] == [24, 28, 32, 36]  # §2
    assert [t[i].ratio for i in (2, 8, 14, 20)] == [2, 2, 2, 1]  # §2 Encoder Full m=2, Decoder Full m=1
    assert all(t[i].kv_owner == t[i].topk_producer == i for i in (2, 8, 14, 20))  # Full: produces both
    assert all((t[i].kv_owner, t[i].topk_producer) == (20, i) for i in (24, 28, 32, 36))  # Reindex: own Top-K
    assert all(t[i].kv_owner is None and t[i].topk_producer is None for i in (0, 1))
    assert [t[i].kv_owner for i in (3, 9, 15, 19)] == [2, 8, 14, 14]
    assert [i for i, li in t.items() if li.candidate_source] == [20]  # §3
    assert [i for i, li in t.items() if li.candidate_limited] == [24, 28, 32, 36]  # §3 Decoder Reindex
    assert [i for i, li in t.items() if li.engram] == [1, 14]  # §12 Engram before blocks 1 and 14


def test_encoder_decoder_split(cfg):
    t = m.layer_table(cfg)  # §1: Encoder 0-19, Decoder 20-39
    assert [li.layer for li in t if li.stage == "encoder"] == list(range(20))
    assert [li.layer for li in t if li.stage == "decoder"] == list(range(20, 40))
    assert cfg.replay_start_layer == 21  # §12 late_layer_start = max(kv_source_layer_ids) + 1


def test_roles_follow_a_modified_config(raw):
    # Move an Encoder owner: 8 -> 10. Layer 8 becomes Reuse of layer 2; 10 becomes Full.
    c = modified(raw, kv_source_layer_ids=[2, 10, 14, 20], index_source_layer_ids=[2, 10, 14, 20, 24, 28, 32, 36])
    t = by_layer(c)
    assert (t[8].path, t[8].kv_owner, t[8].topk_producer) == ("reuse", 2, 2)
    assert (t[10].path, t[11].kv_owner) == ("full", 10)
    assert m.path_counts(c) == {"swa_only": 2, "full": 4, "reindex": 4, "reuse": 30}

    # A second Decoder owner at 26 and an extra Reindex at 30.
    c = modified(raw, kv_source_layer_ids=[2, 8, 14, 20, 26],
                 index_source_layer_ids=[2, 8, 14, 20, 24, 26, 28, 30, 32, 36])
    t = by_layer(c)
    assert (t[25].kv_owner, t[25].topk_producer) == (20, 24)
    assert (t[27].kv_owner, t[27].topk_producer) == (26, 26)
    assert (t[29].kv_owner, t[29].topk_producer) == (26, 28)
    assert (t[31].kv_owner, t[31].topk_producer) == (26, 30)
    assert m.path_counts(c) == {"swa_only": 2, "full": 5, "reindex": 5, "reuse": 28}
    assert m.kv_bytes_per_token(c) == 890 + 356  # one more m=1 owner: +(288+68)/1
    assert c.replay_start_layer == 27

    # Engram moved to other layers: flags and inventory follow.
    c = modified(raw, engram_layer_ids=[3, 30])
    assert [li.layer for li in m.layer_table(c) if li.engram] == [3, 30]
    assert {t.module for t in m.weight_inventory(c) if t.group == "engram"} == {"layers.3.engram", "layers.30.engram"}

    # Encoder compressed at m=4: every count follows the ratios.
    c = modified(raw, compress_ratios=[0, 0] + [4] * 18 + [1] * 20 + [0, 0, 0])
    assert m.kv_capacity(c, 1000).global_entries == 3 * 250 + 1000
    assert m.kv_bytes_per_token(c) == 3 * 356 / 4 + 356


# ---- KV capacity (§8) ------------------------------------------------------------------------------


def test_entry_bytes(cfg):
    assert m.main_kv_entry_bytes(cfg) == 288  # §8 512 × (0.5 + 1/16)
    assert m.index_k_entry_bytes(cfg) == 68  # §8 128 × (0.5 + 1/32)
    assert m.swa_entry_bytes(cfg) == 512  # §8 SWA FP8
    assert m.compressor_state_row_bytes(cfg) == 2 * 512 * 4  # §12 partial-group state [2,512] fp32


def test_kv_golden_at_1m(cfg):
    k = m.kv_capacity(cfg, 1_048_576)
    assert k.global_entries == 2_621_440  # §8
    assert dict(k.entries) == {2: 524_288, 8: 524_288, 14: 524_288, 20: 1_048_576}
    assert k.main_kv_bytes == 2_621_440 * 288 and k.index_k_bytes == 2_621_440 * 68
    assert k.global_bytes / MiB == 890.0  # §8 890.00 MiB global
    assert k.swa_bytes / MiB == 2.5  # §8 2.50 MiB SWA
    assert (k.global_bytes + k.swa_bytes) / MiB == 892.5  # §8 892.50 MiB
    # §12 [2,512] fp32 kv and score buffers per m=2 owner (3 owners), allocated per request
    assert k.partial_group_bytes == 3 * 2 * 2 * 512 * 4
    assert k.total == 892.5 * MiB + 3 * 8192


def test_global_slope(cfg):
    assert m.kv_bytes_per_token(cfg) == 890  # §8 slope 890 B/token
    a, b = m.kv_capacity(cfg, 2_000_000), m.kv_capacity(cfg, 2_000_002)
    assert (b.global_bytes - a.global_bytes) / 2 == 890


@pytest.mark.parametrize("n", [0, 1, 2, 3, 127, 128, 129, 255, 256, 257, 1_000_001, 1_048_575, 1_048_577])
def test_entries_floor_per_owner(cfg, n):
    k = m.kv_capacity(cfg, n)  # §8 C(N) = 3·⌊N/2⌋ + N, floored per owner (not ⌊2.5·N⌋)
    assert k.global_entries == 3 * (n // 2) + n
    assert k.main_kv_bytes + k.index_k_bytes == (3 * (n // 2) + n) * 356
    # §8/§12: each m=2 owner holds a [2,512] fp32 kv and score buffer per request (N > 0); m=1 none.
    assert k.partial_group_bytes == (n > 0) * 3 * 2 * 2 * 512 * 4


def test_odd_n_is_not_proportional(cfg):
    k = m.kv_capacity(cfg, 129)  # §4/§10 boundary 129; 2.5·129 = 322.5 would be the proportional slip
    assert k.global_entries == 3 * 64 + 129 == 321


@pytest.mark.parametrize("n", [0, 1, 64, 127, 128, 129, 4096, 1_048_576])
def test_swa_saturates_at_window(cfg, n):
    k = m.kv_capacity(cfg, n)  # §8 M_SWA = 40 · min(N,128) · 512
    assert k.swa_bytes == 40 * min(n, 128) * 512
    if n >= 128:
        assert k.swa_bytes == 2.5 * MiB


def test_dspark_swa_blocks(cfg):
    assert m.kv_capacity(cfg, 1000, dspark=True).swa_bytes == 43 * 128 * 512  # §1/§9: 3 SWA-only blocks
    assert m.kv_capacity(cfg, 100, dspark=True).swa_bytes == 43 * 100 * 512


def test_bad_n_tokens(cfg):
    for bad in (-1, 1.5, True):
        with pytest.raises(GraphsimError, match="n_tokens"):
            m.kv_capacity(cfg, bad)


# ---- Engram (§6) -----------------------------------------------------------------------------------


def test_engram_bytes(cfg):
    assert m.engram_table_bytes(cfg) == 202_758_032_400  # §6
    assert m.engram_table_bytes(cfg) / 2**30 == pytest.approx(188.83, abs=0.005)  # §6 ≈ 188.83 GiB
    assert m.engram_lookup_bytes_per_token(cfg) == 6_336  # §6 per module
    assert len(cfg.engram_layer_ids) * m.engram_lookup_bytes_per_token(cfg) == 12_672  # §6 both modules


def test_engram_tables_in_inventory_count_all_rows(cfg):
    tables = [t for t in m.weight_inventory(cfg) if t.role == "table"]
    assert len(tables) == 2 and all(t.group == "engram" and t.format.name == "fp8_e8m0_32" for t in tables)
    assert sum(t.elems for t in tables) == (384_006_168 + 384_016_682) * 256  # §6: whole table, not rows touched
    assert sum(t.nbytes for t in tables) == 202_758_032_400
    wkv = [t for t in m.weight_inventory(cfg) if t.name.endswith("engram.wkv")]
    assert all(t.elems == 6144 * 25600 for t in wkv)  # §12 157.3 M params per module
    assert wkv[0].elems / 1e6 == pytest.approx(157.3, abs=0.05)


# ---- Weights (§8, §12) -----------------------------------------------------------------------------


def test_param_totals(cfg):
    s = m.param_summary(cfg)  # §12: 551.6 B trunk + 196.9 B Engram + 14.2 B DSpark + 0.5 B vision ≈ 763 B
    assert within(s.trunk_with_embed, 551.6e9)  # the facts' "trunk" includes embedding + head
    assert within(s.group("engram"), 196.9e9)
    assert within(s.group("dspark"), 14.2e9)
    assert round(s.group("vision") / 1e9, 1) == 0.5  # "≈ 0.5 B" has one significant digit (see docstring)
    assert within(s.total, 763e9)


def test_active_params(cfg):
    s = m.param_summary(cfg)  # §12: ≈ 377 M per layer, ≈ 15.1 B over 40 layers, ≈ 7.9 B over layers 0-20
    assert within(s.active_per_layer, 377e6)
    assert within(s.active_trunk, 15.1e9)
    assert within(sum(s.active_by_layer[: cfg.replay_start_layer]), 7.9e9)
    assert len(s.active_by_layer) == 40


def test_module_sizes(cfg):
    inv = {t.name: t for t in m.weight_inventory(cfg)}
    attn = sum(inv[f"layers.5.attn.{w}"].elems for w in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b"))
    assert attn / 1e6 == pytest.approx(126.6, abs=0.05)  # §12 ≈ 126.6 M attention params per layer
    expert = sum(inv[f"layers.5.ffn.experts.{w}"].elems for w in ("w1", "w2", "w3")) / 384
    assert expert / 1e6 == pytest.approx(35.4, abs=0.05)  # §12 35.4 M per expert
    assert inv["layers.5.hc_attn.fn"].elems == 24 * 20480 and inv["layers.5.hc_ffn.fn"].format.name == "fp32"


def test_inventory_formats_and_roles(cfg):
    inv = {t.name: t for t in m.weight_inventory(cfg)}
    f = lambda n: inv[n].format.name  # noqa: E731
    assert f("layers.5.attn.wq_a") == f("layers.5.attn.wo_b") == "fp8_b32x32_ue8m0"  # §8 dense FP8 32×32
    assert f("layers.5.attn.wo_a") == "bf16"  # §12
    assert f("layers.5.ffn.experts.w1") == "fp4_ue8m0_32"  # §8/§12 experts FP4
    assert f("layers.5.ffn.shared_experts.w2") == "fp8_b32x32_ue8m0"
    assert f("embed.weight") == f("head.weight") == "bf16"
    # §12 compressor: m=2 owners wkv+wgate fp32; the m=1 owner a plain bf16 wkv; none elsewhere.
    assert f("layers.2.attn.compressor.wkv") == f("layers.2.attn.compressor.wgate") == "fp32"
    assert f("layers.20.attn.compressor.wkv") == "bf16" and "layers.20.attn.compressor.wgate" not in inv
    comp = sorted({int(n.split(".")[1]) for n in inv if ".compressor." in n})
    assert comp == [2, 8, 14, 20]
    # §12 indexer: wq_b FP8 + weights_proj bf16 on all 8 index sources, wk + norm only on owners.
    assert sorted({int(n.split(".")[1]) for n in inv if n.startswith("layers.") and n.endswith("indexer.wq_b")}) == [
        2, 8, 14, 20, 24, 28, 32, 36]
    assert sorted({int(n.split(".")[1]) for n in inv if n.endswith("indexer.wk")}) == [2, 8, 14, 20]
    assert f("layers.24.attn.indexer.wq_b") == "fp8_b32x32_ue8m0" and f("layers.24.attn.indexer.weights_proj") == "bf16"
    # every trunk layer keeps its own attention and MoE (Reuse does not skip the layer, §2)
    assert all(f"layers.{i}.attn.wq_b" in inv and f"layers.{i}.ffn.experts.w2" in inv for i in range(40))
    # DSpark: SWA-only blocks with 128 experts, Markov and confidence heads (§12)
    assert not any(n.startswith("dspark") and (".compressor." in n or ".indexer." in n) for n in inv)
    assert inv["dspark.blocks.0.ffn.experts.w1"].elems == 128 * 5120 * 2304
    assert inv["dspark.main_proj"].elems == 3 * 5120 * 5120
    assert inv["dspark.confidence.proj"].elems == 5120 + 256 and f("dspark.confidence.proj") == "fp32"
    assert {t.group for t in inv.values()} == {"embed", "trunk", "engram", "dspark", "vision"}
    assert all(t.resident for t in inv.values())
    assert len(inv) == len(m.weight_inventory(cfg))  # names unique


def test_inventory_is_independent_of_workload(cfg):
    # §10 resident memory: weights never shrink with work; the inventory takes no workload at all.
    assert list(inspect.signature(m.weight_inventory).parameters) == ["cfg"]
    before = m.weight_inventory(cfg)
    for n in (1, 128, 1_048_576):
        m.kv_capacity(cfg, n, dspark=True)
    assert m.weight_inventory(cfg) == before
    assert m.param_summary(cfg).total == sum(t.elems for t in before)


def test_text_only_config_has_no_vision_group(raw):
    d = copy.deepcopy(raw)
    del d["vision_config"]
    c = V41Config.from_dict(d)
    assert c.vision is None and "vision" not in dict(m.param_summary(c).params)


def test_resident_bytes_include_scales(cfg):
    s = m.param_summary(cfg)
    inv = m.weight_inventory(cfg)
    experts = [t for t in inv if ".ffn.experts." in t.name and t.group == "trunk"]
    assert sum(t.nbytes for t in experts) == sum(t.elems for t in experts) * (0.5 + 1 / 32)
    assert s.group_bytes("engram") > m.engram_table_bytes(cfg)
    assert fmt("fp8_b32x32_ue8m0").bytes_per_elem == 1 + 1 / 1024
