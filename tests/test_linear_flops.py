"""Linear layers charge 2 FLOPs per active parameter per token: for every layer of every shipped model, the
FLOPs of its GEMM-shaped ops (projections, block-diagonal and per-head GEMMs, routers, compressors, expert
GEMMs) over one uncached prompt equal 2 x the layer's linear parameters from the weight inventory, each
weighted by how often a token uses it. Closed form: a k x n weight applied to T rows costs 2·k·n·T FLOPs
(shared/STYLE.md: "tests build the expected result from a closed form (flops=2*m*k*n)")."""
from __future__ import annotations

import numpy as np
import pytest

import graphsim as gs
from graphsim.core.ir import COMPONENTS

N = 4096  # divisible by every compression ratio of the shipped models (1, 2, 4, 128): per-entry weights exact
FLOPS = [k for k, c in enumerate(COMPONENTS) if c.startswith("flops_")]


def _graph_flops_by_layer(model, request: str = f"prefill:{N}") -> dict[int, float]:
    c = gs.compile_plan(model, gs.Plan([request]), "gb200")
    comps = c.schedule().components[0]
    out: dict[int, float] = {}
    for i, op in enumerate(c.graph.ops):
        p = op.param_dict
        if op.layer is None or not (("k" in p and "n" in p) or op.kind == "moe_experts"):
            continue
        out[op.layer] = out.get(op.layer, 0.0) + float(comps[i, FLOPS].sum())
    return out


def _uses_per_token(model, name: str) -> float:
    """How many times one token applies weight ``name``: routed experts top_k/E of the stacked experts; a
    projection applied per compressed entry (V4.1's index-K ``wk``) 1/m; everything else once."""
    cfg = model.cfg
    if ".experts" in name and ".shared" not in name:
        e = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "experts")
        k = getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "top_k")
        return k / e
    if name.endswith(".indexer.wk") and hasattr(model, "layers"):
        layer = int(name.split(".")[1])
        return 1.0 / model.layers[layer].ratio
    return 1.0


def _linear_params_by_layer(model) -> dict[int, float]:
    """Σ linear parameters x uses per token, per layer, from the resident inventory. Linear = matrices:
    norm vectors, biases, sinks, tables (gathered, not multiplied), compressor position terms and hash
    routing tables are not."""
    specs = getattr(model.sem, "weight_specs", None) if hasattr(model, "sem") else None
    if specs is not None:
        items = [(s.name, s.elems, len(s.shape) >= 2 and s.role != "table"
                  and not s.name.endswith((".gate_norm", ".ape", ".tid2eid", ".embed"))) for s in specs(model.cfg)]
    else:  # Llama / DeepSeek-V3 inventories: one tensor per projection, norms gathered in `norms`, biases apart
        items = [(t.name, t.elems, not t.name.endswith(("norms", "_bias"))) for t in model.weights()]
    out: dict[int, float] = {}
    for name, elems, linear in items:
        if not linear or not name.startswith("layers."):
            continue
        layer = int(name.split(".")[1])
        out[layer] = out.get(layer, 0.0) + elems * _uses_per_token(model, name)
    return out


CASES = [(m, f"prefill:{N}") for m in ("llama-3.1-70b", "deepseek-v3", "deepseek-v4-flash", "deepseek-v4.1-flash")]
# decode too where every weight is applied once per token (MLA decode takes the absorbed, per-head path);
# V4.1's per-entry wk makes a single decode step's count depend on the context's parity
CASES += [(m, f"decode:8191x{N}") for m in ("llama-3.1-70b", "deepseek-v3", "deepseek-v4-flash")]


@pytest.mark.parametrize("name,request_", CASES)
def test_layer_flops_are_twice_active_params(name, request_):
    model = gs.load_model(name)
    flops = _graph_flops_by_layer(model, request_)
    params = _linear_params_by_layer(model)
    assert sorted(flops) == sorted(params)
    for layer in params:
        per_token = flops[layer] / N
        assert per_token == pytest.approx(2 * params[layer], rel=1e-12), (name, layer)


def test_block_diagonal_gemm_charges_every_copy():
    """V4.1 wo_a: 8 groups of 4096 -> 1024 (V41_FACTS §12): 2·8·4096·1024 FLOPs per token, reads the
    whole 32768-wide input and writes 8192 outputs (bf16)."""
    c = gs.compile_plan("deepseek-v4.1-flash", gs.Plan(["prefill:1000"]), "gb200")
    s = c.schedule()
    i = c.graph.op_index["layers.5.attn.wo_a"]
    comp = dict(zip(COMPONENTS, s.components[0, i]))
    assert comp["flops_bf16"] == 2 * 8 * 4096 * 1024 * 1000
    assert comp["bytes_act"] == (8 * 4096 + 8 * 1024) * 2 * 1000
    assert comp["bytes_weight"] == 8 * 4096 * 1024 * 2


def test_absorbed_mla_decode_charges_every_head():
    """DeepSeek-V3 absorbed decode: q_absorb (W_UK) and o_absorb (W_UV) are per-head GEMMs over 128 heads,
    2·128·128·512 FLOPs each per token (V41_FACTS §13 shapes): together 2 x wkv_b's parameters."""
    c = gs.compile_plan("deepseek-v3", gs.Plan(["decode:4096x8"]), "gb200")
    s = c.schedule()
    for op in ("q_absorb", "o_absorb"):
        i = c.graph.op_index[f"layers.5.{op}"]
        assert float(np.sum(s.components[0, i, FLOPS])) == 2 * 128 * 128 * 512 * 8
