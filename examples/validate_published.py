"""Reproduce the published DeepSeek-V3/R1 serving setups (shared/reference/measurements.md) and compare:
graphsim's speed-of-light (SOL) throughput, the published figure, measured/SOL (the end-to-end efficiency),
then the same with the practitioner efficiency profile (hw/data/profiles/practitioner.toml) and how close
that derated estimate lands. SOL must never be below a measurement: that would mean a cost is missing.

Two more tables: published attention kernels (shared/reference/hardware.md: the FP8 FMHA of a 128K
DeepSeek prefill on GB300 and GB200) against the SOL of the same op, which must not be slower; and the
GB300 / GB200 ratio graphsim predicts for decode and prefill at 8K and 128K.

Each case states its workload as the source gives it; where the source leaves something open the
assumption is written next to it. Run: ``python examples/validate_published.py`` (a few seconds).
"""
from __future__ import annotations

import attrs

import graphsim as gs
from graphsim.lowering.evaluate import evaluate_reference, unit_time


@attrs.frozen
class Case:
    name: str
    hw: str
    mapping: gs.ParallelMapping
    requests: tuple  #: the replica's batch per forward
    published: float  #: tokens/s in the unit below
    unit: str  #: "node" (8 GPUs) or "GPU"
    counts: str  #: "input" (prefill tokens) or "output" (decode tokens)
    note: str
    overlap: str = "two-batch"
    amortized_prefill: tuple = ()  #: co-located prefill whose time is spread over the decode steps
    #: physical routed experts: 256 + redundant copies for load balancing (stored, so they cost memory; top-8
    #: routing is unchanged, so FLOPs are too — each physical expert takes 1/experts of the pairs)
    experts: int = 256


TBO = "two-batch overlap"
CASES = (
    Case("DeepSeek prefill (H800, EP32/DP32)", "h800", gs.ParallelMapping(dp=32, ep=32), ("prefill:4096x128",),
         62_713, "node", "input",
         "DeepSeek profile data: 16,384 tokens per GPU as 4 prompts of 4,096; 256 + 32 redundant experts (9 per GPU); "
         "FP8 GEMMs and dispatch, BF16 combine; " + TBO, experts=288),
    Case("DeepSeek decode (H800, EP128/DP128)", "h800", gs.ParallelMapping(dp=128, ep=128), ("decode:4096x16384",),
         18_598, "node", "output",
         "DeepSeek profile data: batch 128 per GPU at KV 4,096, 16 nodes; " + TBO + " (the published tokens include "
         "accepted MTP drafts; graphsim decodes one token per step, so measured / SOL overstates the efficiency)"),
    Case("SGLang prefill 1K (H100, EP32/DP32)", "h100", gs.ParallelMapping(dp=32, ep=32), ("prefill:1024x512",),
         57_674, "node", "input", "4 nodes; assumed 16,384 tokens per GPU (16 prompts of 1,024); 288 experts; " + TBO,
         experts=288),
    Case("SGLang prefill 2K (H100, EP32/DP32)", "h100", gs.ParallelMapping(dp=32, ep=32), ("prefill:2048x256",),
         54_543, "node", "input", "4 nodes; assumed 16,384 tokens per GPU (8 prompts of 2,048); 288 experts; " + TBO,
         experts=288),
    Case("SGLang prefill 4K (H100, EP32/DP32)", "h100", gs.ParallelMapping(dp=32, ep=32), ("prefill:4096x128",),
         50_302, "node", "input", "4 nodes; assumed 16,384 tokens per GPU (4 prompts of 4,096); 288 experts; " + TBO,
         experts=288),
    Case("SGLang decode (H100, EP72/DP72)", "h100", gs.ParallelMapping(dp=72, ep=72), ("decode:2000x18432",),
         22_282, "node", "output",
         "9 nodes; batch 256 per GPU at KV length 2,000; 256 + 32 redundant experts (4 per GPU); " + TBO, experts=288),
    Case("TensorRT-LLM max throughput (8xH200, DP8/EP8)", "h200", gs.ParallelMapping(dp=8, ep=8),
         ("decode:2048x1024",), 1_436, "GPU", "output",
         "batch 128 per GPU (concurrency 1,024), ISL 1K / OSL 2K: decode at the mean context 1K + 2K/2; each "
         "request's 1K prefill (in-flight batching on the same GPUs) is spread over its 2K decode steps; no overlap",
         overlap="none", amortized_prefill=("prefill:1024x1024", 2048)),
)


@attrs.frozen
class Row:
    case: Case
    sol: float  #: tokens/s in the case's unit
    derated: float

    @property
    def efficiency(self) -> float:
        """measured / SOL."""
        return self.case.published / self.sol

    @property
    def derated_ratio(self) -> float:
        """measured / derated estimate (1.0 = the profile lands on the measurement)."""
        return self.case.published / self.derated


def _seconds(compiled, profile) -> float:
    """Forward time of the compiled plan at its workload under ``profile`` (None = SOL)."""
    ut = unit_time(compiled.hw.rates(profile))
    overhead = profile.op_overhead_s if profile else 0.0
    return float(evaluate_reference(compiled.program, compiled.plan.workload(), ut, overhead).forward[0])


def throughput(case: Case, model, profile=None, compiled=None) -> float:
    """Tokens/s (the case's counts, per node or per GPU) of the case under ``profile``."""
    c = compiled or gs.compile_plan(model, gs.Plan(case.requests, case.mapping, gs.Policies(overlap=case.overlap)),
                                    case.hw)
    t = _seconds(c, profile)
    plan = c.plan
    kind = "prefill" if case.counts == "input" else "decode"
    tokens = sum(r.count * r.new_tokens for r in plan.requests if r.kind == kind)
    if case.amortized_prefill:
        spec, steps = case.amortized_prefill
        pre = gs.compile_plan(model, gs.Plan([spec], case.mapping, gs.Policies(overlap=case.overlap)), case.hw)
        t += _seconds(pre, profile) / steps  # one prefill of the whole batch per `steps` decode steps
    per_gpu = tokens / t / case.mapping.gpus
    return per_gpu * (8 if case.unit == "node" else 1)


def v3_model(experts: int = 256):
    """DeepSeek-V3 with ``experts`` physical routed experts (redundant copies included)."""
    from graphsim.core.config import load_config

    cfg = load_config("deepseek-v3")
    return gs.load_model({**cfg, "n_routed_experts": experts, "_name": "deepseek-v3"})


def validate(cases=CASES) -> list[Row]:
    prof = gs.load_profile("practitioner")
    rows = []
    for case in cases:
        model = v3_model(case.experts)
        c = gs.compile_plan(model, gs.Plan(case.requests, case.mapping, gs.Policies(overlap=case.overlap)), case.hw)
        rows.append(Row(case, throughput(case, model, None, c), throughput(case, model, prof, c)))
    return rows


def table(rows: list[Row]) -> str:
    head = ("| case | published | graphsim SOL | measured / SOL | practitioner estimate | measured / estimate |\n"
            "|---|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        u = f"{r.case.counts} tok/s/{r.case.unit}"
        lines.append(f"| {r.case.name} | {r.case.published:,.0f} {u} | {r.sol:,.0f} | {r.efficiency:.2f} | "
                     f"{r.derated:,.0f} | {r.derated_ratio:.2f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Attention kernels: one op of one layer against a published kernel time
# ---------------------------------------------------------------------------------------------------

@attrs.frozen
class KernelCase:
    name: str
    hw: str
    model: str
    request: str
    op: str  #: the op of the compiled graph the kernel implements
    published_s: float
    source: str
    policies: tuple = ()  #: Policies fields, e.g. (("attention_precision", "fp8"),)


FMHA = ("issue #10 and shared/reference/hardware.md (GB300 notes: FMHA 1.35x GB200 at 128K): FP8 FMHA for "
        "DeepSeek-V3's 128K causal prefill, one layer, all 128 heads on one GPU")
KERNEL_CASES = (
    KernelCase("DeepSeek-V3 FP8 FMHA, 128K prefill, 1 layer (GB300)", "gb300", "deepseek-v3", "prefill:131072",
               "layers.3.attn_prefill", 205e-3, FMHA, (("attention_precision", "fp8"),)),
    KernelCase("DeepSeek-V3 FP8 FMHA, 128K prefill, 1 layer (GB200)", "gb200", "deepseek-v3", "prefill:131072",
               "layers.3.attn_prefill", 277e-3, FMHA, (("attention_precision", "fp8"),)),
)


@attrs.frozen
class KernelRow:
    case: KernelCase
    sol_s: float
    bound: str  #: the roofline unit that bounds the op (compute, sfu, hbm, ...)


def validate_kernels(cases=KERNEL_CASES) -> list[KernelRow]:
    rows = []
    for k in cases:
        c = gs.compile_plan(k.model, gs.Plan([k.request], policies=gs.Policies(**dict(k.policies))), k.hw)
        s = c.schedule()
        i = c.graph.op_index[k.op]
        rows.append(KernelRow(k, float(s.duration[0, i]), s.bound(0)[i]))
    return rows


def kernel_table(rows: list[KernelRow]) -> str:
    lines = ["| kernel | published | graphsim SOL | bound by | SOL / published |", "|---|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r.case.name} | {r.case.published_s * 1e3:,.0f} ms | {r.sol_s * 1e3:,.1f} ms | {r.bound} | "
                     f"{r.sol_s / r.case.published_s:.2f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# GB300 vs GB200
# ---------------------------------------------------------------------------------------------------

RATIO_SETUPS = (
    ("DeepSeek-V3, TP8, FP8 attention", "deepseek-v3", gs.ParallelMapping(tp=8), (("attention_precision", "fp8"),)),
    ("DeepSeek-V4.1-Flash, TP4", "deepseek-v4.1-flash", gs.ParallelMapping(tp=4), ()),
)
RATIO_WORKLOADS = (("prefill 8K", "prefill:8192"), ("prefill 128K", "prefill:131072"),
                   ("decode 8K x 64", "decode:8192x64"), ("decode 128K x 8", "decode:131072x8"))


def gb300_over_gb200(setups=RATIO_SETUPS, workloads=RATIO_WORKLOADS) -> list[tuple]:
    """(setup, workload, GB200 forward s, GB300 forward s) for every pair."""
    out = []
    for label, model, mapping, pol in setups:
        for wname, req in workloads:
            t = {hw: float(gs.compile_plan(model, gs.Plan([req], mapping, gs.Policies(**dict(pol))), hw)
                           .schedule().forward[0]) for hw in ("gb200", "gb300")}
            out.append((label, wname, t["gb200"], t["gb300"]))
    return out


def ratio_table(rows: list[tuple]) -> str:
    lines = ["| setup | workload | GB200 forward | GB300 forward | GB200 / GB300 |", "|---|---|---:|---:|---:|"]
    for label, w, a, b in rows:
        lines.append(f"| {label} | {w} | {a * 1e3:,.2f} ms | {b * 1e3:,.2f} ms | {a / b:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    rows = validate()
    print(table(rows))
    print()
    for r in rows:
        print(f"- {r.case.name}: {r.case.note}")
    low = [r.case.name for r in rows if r.sol < r.case.published]
    assert not low, f"SOL below a measurement (a cost is missing or a peak too high): {low}"
    kernels = validate_kernels()
    print()
    print(kernel_table(kernels))
    slow = [r.case.name for r in kernels if r.sol_s > r.case.published_s]
    assert not slow, f"SOL slower than a published kernel (a rate is wrong): {slow}"
    print()
    print(ratio_table(gb300_over_gb200()))
