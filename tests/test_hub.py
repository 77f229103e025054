"""Issue 29 item 2: models named by their Hugging Face id — the local HF cache first (huggingface_hub's layout and
environment), then graphsim's bundled snapshot of public configs (and its aliases); no network call; one line when
neither has it. Launch lines and reports carry the id."""
from __future__ import annotations

import json
import shutil

import pytest

import graphsim as gs
from graphsim.core.errors import GraphsimError
from graphsim.models.hub import BUNDLED, aliases, bundled_ids, hub_cache, resolve


def _weight_bytes(model) -> float:
    return sum(t.nbytes for t in model.weights())


def _params(model) -> int:
    return model.param_counts()["total_params"]


def _cache(tmp_path, model_id: str, cfg: dict, commit: str = "abc123", quant: dict | None = None):
    """A Hugging Face cache entry as huggingface_hub lays it out: refs/main -> snapshots/<commit>/config.json."""
    repo = tmp_path / "hub" / ("models--" + model_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))
    if quant is not None:
        (snap / "hf_quant_config.json").write_text(json.dumps(quant))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return tmp_path / "hub"


def test_bundled_ids_load_as_their_files(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    m = gs.load_model("deepseek-ai/DeepSeek-V3")
    f = gs.load_model(str(BUNDLED / "deepseek-ai--DeepSeek-V3_config.json"))
    assert m.name == m.hf_id == "deepseek-ai/DeepSeek-V3" and _params(m) == _params(f)
    assert resolve("deepseek-ai/DeepSeek-V3") == (BUNDLED / "deepseek-ai--DeepSeek-V3_config.json", "bundled")
    # an NVFP4 checkpoint brings its hf_quant_config.json sidecar along
    q = gs.load_model("nvidia/DeepSeek-V3.1-NVFP4")
    assert _weight_bytes(q) < 0.65 * _weight_bytes(m)  # FP4 experts (409 vs 685 GB)


def test_aliases_name_the_same_architecture(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    al = aliases()
    assert all(BUNDLED.joinpath(to.replace("/", "--") + "_config.json").is_file() and why for to, why in al.values())
    a = gs.load_model("meta-llama/Llama-3.1-70B-Instruct")
    b = gs.load_model("meta-llama/Meta-Llama-3.1-70B")
    assert a.hf_id == "meta-llama/Llama-3.1-70B-Instruct" and _params(a) == _params(b)
    assert "meta-llama/Llama-3.1-70B-Instruct" in bundled_ids() and "Qwen/Qwen3-VL-2B-Instruct" in bundled_ids()


def test_the_local_cache_comes_first(monkeypatch, tmp_path):
    # a cached config differing from the bundled one (fewer layers) is the one loaded
    cfg = json.loads((BUNDLED / "meta-llama--Meta-Llama-3.1-8B_config.json").read_text())
    cfg["num_hidden_layers"] = 4
    cache = _cache(tmp_path, "meta-llama/Meta-Llama-3.1-8B", cfg)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    path, where = resolve("meta-llama/Meta-Llama-3.1-8B")
    assert where == "cache" and path.parent.name == "abc123"
    small = gs.load_model("meta-llama/Meta-Llama-3.1-8B")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    full = gs.load_model("meta-llama/Meta-Llama-3.1-8B")
    assert small.num_layers() == 4 and full.num_layers() == 32
    # HF_HOME/hub when HF_HUB_CACHE is unset (huggingface_hub's order)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub_cache() == tmp_path / "hub" and resolve("meta-llama/Meta-Llama-3.1-8B")[1] == "cache"


def test_a_cached_checkpoint_reads_its_quant_sidecar(monkeypatch, tmp_path):
    cfg = json.loads((BUNDLED / "nvidia--DeepSeek-V3.1-NVFP4_config.json").read_text())
    quant = json.loads((BUNDLED / "nvidia--DeepSeek-V3.1-NVFP4_hf_quant_config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(_cache(tmp_path, "someone/V3-fp4", cfg, quant=quant)))
    cached = gs.load_model("someone/V3-fp4")
    bundled = gs.load_model("nvidia/DeepSeek-V3.1-NVFP4")
    assert _weight_bytes(cached) == _weight_bytes(bundled)


def test_unknown_ids_fail_in_one_line_without_network(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(GraphsimError, match=r"huggingface-cli download nobody/none config.json") as e:
        gs.load_model("nobody/none")
    assert "\n" not in str(e.value) and "no network call" in str(e.value)
    with pytest.raises(GraphsimError, match="did you mean deepseek-ai/DeepSeek-V3"):
        gs.load_model("DeepSeek-AI/deepseek-v3")
    # a path that exists is a path, not an id
    d = tmp_path / "org" / "name"
    d.mkdir(parents=True)
    shutil.copy(BUNDLED / "Qwen--Qwen3-8B_config.json", d / "config.json")
    assert gs.load_model(str(d)).hf_id is None


def test_shipped_names_know_their_repository_and_the_cli_lists_the_snapshot(capsys):
    assert gs.load_model("deepseek-v3").hf_id == "deepseek-ai/DeepSeek-V3"
    assert gs.load_model("deepseek-v4.1-flash").hf_id is None
    from graphsim.cli import main

    assert main(["models", "--hub"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids == list(bundled_ids()) and "deepseek-ai/DeepSeek-V3" in ids
    assert main(["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--ep", "8", "--request",
                 "decode:1024x8", "--view", "sol"]) == 0
    assert "graphsim deepseek-ai/DeepSeek-V3 on" in capsys.readouterr().out
