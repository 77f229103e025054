"""Launch output (issue 29 item 1): for a ranked deployment, the commands and config files that run it on SGLang,
vLLM, TensorRT-LLM (``trtllm-serve`` and its YAML) and Dynamo — one per pool, the disaggregation router / proxy and
a benchmark command — with every flag taken from one table per engine (:data:`TABLES`), each row naming the
graphsim concept, the flag or key, its documented constraint, the engine version it was checked against and its
source. docs/search.md prints the same tables.

A policy is emitted only with the flags it requires and only where the engine runs it: two-batch overlap needs an
MoE all-to-all (SGLang ``--moe-a2a-backend``, vLLM a DeepEP ``--all2all-backend``), so a dense model gets none; a
layout an engine cannot express (vLLM's EP is TP x DP or nothing, TensorRT-LLM's attention DP has no attention TP)
makes that engine ``launchable: false`` with the reason, and the commands are still written for the nearest layout
the engine has. Nothing here is invented: what no documented flag expresses is a note.
"""
from __future__ import annotations

import json
import math

import attrs

from ..driver.pipeline import Policies

ENGINES = ("sglang", "vllm", "trtllm", "dynamo")

#: the engine release each table was checked against
VERSIONS = {
    "sglang": "SGLang 0.5 (python/sglang/srt/server_args.py on main, 2025-26; sglang-router 0.2)",
    "vllm": "vLLM 0.12 (vllm/config/parallel.py, vllm/config/vllm.py, vllm/engine/arg_utils.py; docs.vllm.ai v0.12.0)",
    "trtllm": "TensorRT-LLM 1.3 (tensorrt_llm/llmapi/llm_args.py; trtllm-serve --config, called "
              "--extra_llm_api_options in 1.0)",
    "dynamo": "NVIDIA Dynamo 1.x (docs.nvidia.com/dynamo: frontend, SGLang / vLLM / TensorRT-LLM backends)",
}


@attrs.frozen
class Flag:
    """One row of an engine's table: the graphsim concept, the flag (or YAML key) that expresses it, its documented
    constraint (what it requires, what it cannot combine with, the model families it applies to), and the source."""

    concept: str
    flag: str
    constraint: str
    source: str


_SG_ARGS = "python/sglang/srt/server_args.py (ServerArgs, check_server_args); docs.sglang.io 'Server Arguments'"
_SG_EP = "docs.sglang.io/advanced_features/expert_parallelism.html; server_args.py"
_SG_PD = "docs.sglang.io/advanced_features/pd_disaggregation.html"
_SG_SPEC = "docs.sglang.io/advanced_features/speculative_decoding.html"
_VL_ARGS = "vllm/engine/arg_utils.py (EngineArgs); docs.vllm.ai/en/v0.12.0/configuration/engine_args"
_VL_EP = "docs.vllm.ai/en/v0.12.0/serving/expert_parallel_deployment/; vllm/config/parallel.py (ParallelConfig)"
_VL_DBO = ("docs.vllm.ai/en/stable/design/dbo/ ('only targets DP+EP deployments'); vllm/config/vllm.py "
           "VllmConfig.__post_init__ (use_ubatching asserts a DeepEP all2all backend)")
_VL_PD = "docs.vllm.ai/en/v0.12.0/features/nixl_connector_usage/"
_TR_ARGS = "tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs); nvidia.github.io/TensorRT-LLM 'trtllm-serve'"
_TR_PAR = "nvidia.github.io/TensorRT-LLM/features/parallel-strategy.html"
_TR_PD = "nvidia.github.io/TensorRT-LLM/features/disagg-serving.html; examples/disaggregated/README.md"
_DY = "docs.nvidia.com/dynamo (backends/sg-lang/reference-guide, backends/v-llm-configuration, " \
      "backends/tensor-rt-llm-configuration, components/frontend)"

#: SGLang ``python -m sglang.launch_server`` (and its router and benchmark)
SGLANG = (
    Flag("server", "python -m sglang.launch_server", "one server per replica (all its GPUs)", _SG_ARGS),
    Flag("checkpoint", "--model-path", "Hugging Face id or local path", _SG_ARGS),
    Flag("tp x dp ranks", "--tp-size", "SGLang's TP size spans the DP-attention ranks: tp_size = tp x dp", _SG_ARGS),
    Flag("attention dp", "--dp-size", "with --enable-dp-attention: attention TP = tp_size / dp_size", _SG_ARGS),
    Flag("attention dp", "--enable-dp-attention", "requires --dp-size > 1", _SG_ARGS),
    Flag("ep", "--ep-size", "MoE only; divides tp_size (moe_tp = tp_size / ep_size); with --moe-a2a-backend deepep "
         "or mooncake it is forced to tp_size", _SG_EP),
    Flag("pp", "--pp-size", "pipeline stages", _SG_ARGS),
    Flag("MoE all-to-all", "--moe-a2a-backend", "MoE only; none (default: all-gather / all-reduce dispatch, hybrid "
         "EP-TP), deepep (sets ep_size = tp_size; needs the DeepEP kernels)", _SG_EP),
    Flag("MoE all-to-all", "--deepep-mode", "with --moe-a2a-backend deepep: normal (prefill; disables CUDA graphs), "
         "low_latency (decode), auto", _SG_EP),
    Flag("overlap = two-batch", "--enable-two-batch-overlap", "check_server_args: 'When enabling two batch overlap, "
         "moe_a2a_backend cannot be none' — MoE with an all-to-all backend only (dense models: none)", _SG_ARGS),
    Flag("attention_precision = fp8", "--kv-cache-dtype", "fp8_e4m3 (an FP8 KV cache)", _SG_ARGS),
    Flag("decode batch", "--max-running-requests", "requests per replica (all DP ranks)", _SG_ARGS),
    Flag("step tokens", "--chunked-prefill-size", "tokens a prefill step schedules per replica (divided over DP "
         "ranks with --enable-dp-attention); -1 disables chunking", _SG_ARGS),
    Flag("memory fraction", "--mem-fraction-static", "computed at launch when not given (no fixed default): emitted "
         "only when --engine-set memory_fraction sets it", _SG_ARGS),
    Flag("CUDA graphs", "--cuda-graph-max-bs", "decode batches up to it replay a graph", _SG_ARGS),
    Flag("CUDA graphs", "--disable-cuda-graph", "graph_max_batch = 0", _SG_ARGS),
    Flag("MTP-K", "--speculative-algorithm", "EAGLE (DeepSeek MTP heads; NEXTN is an alias); models with MTP layers",
         _SG_SPEC),
    Flag("MTP-K", "--speculative-num-steps", "K", _SG_SPEC),
    Flag("MTP-K", "--speculative-eagle-topk", "1 (a chain)", _SG_SPEC),
    Flag("MTP-K", "--speculative-num-draft-tokens", "K + 1 with topk 1",
         _SG_SPEC),
    Flag("disaggregated pool", "--disaggregation-mode", "prefill or decode; needs a transfer backend and a router",
         _SG_PD),
    Flag("disaggregated pool", "--disaggregation-transfer-backend", "mooncake (default) or nixl", _SG_PD),
    Flag("endpoint", "--host", "", _SG_ARGS),
    Flag("endpoint", "--port", "", _SG_ARGS),
    Flag("router", "python -m sglang_router.launch_router", "--pd-disaggregation with one --prefill URL per prefill "
         "replica and one --decode URL per decode replica; --worker-urls for aggregated replicas",
         _SG_PD + "; docs.sglang.io/advanced_features/router.html"),
    Flag("router", "--pd-disaggregation", "with --prefill / --decode", _SG_PD),
    Flag("router", "--prefill", "a prefill server URL (repeatable)", _SG_PD),
    Flag("router", "--decode", "a decode server URL (repeatable)", _SG_PD),
    Flag("router", "--worker-urls", "aggregated replicas' URLs", "docs.sglang.io/advanced_features/router.html"),
    Flag("benchmark", "python -m sglang.bench_serving", "--backend sglang --host --port --model --dataset-name random "
         "--random-input-len "
         "--random-output-len --random-range-ratio 1 (fixed lengths) --num-prompts --max-concurrency",
         "docs.sglang.io/developer_guide/bench_serving.html"),
)

#: vLLM ``vllm serve`` (and its proxy and benchmark)
VLLM = (
    Flag("checkpoint", "vllm serve", "MODEL: Hugging Face id or local path; one server per replica", _VL_ARGS),
    Flag("tp", "--tensor-parallel-size", "attention and dense TP inside a DP rank", _VL_ARGS),
    Flag("attention dp", "--data-parallel-size", "one engine core per DP rank; MoE layers are sharded over "
         "tp x dp ranks", _VL_EP),
    Flag("ep", "--enable-expert-parallel", "MoE only; EP size = tp x dp (x pcp) — no other EP size exists: a "
         "priced ep between 1 and tp x dp is not launchable", _VL_EP),
    Flag("MoE all-to-all", "--all2all-backend", "allgather_reducescatter (default), deepep_high_throughput "
         "(prefill), deepep_low_latency (decode); DeepEP needs its kernels", _VL_EP),
    Flag("overlap = two-batch", "--enable-dbo", "dual-batch overlap: DP+EP MoE deployments only, with "
         "--all2all-backend deepep_low_latency or deepep_high_throughput (VllmConfig asserts it)", _VL_DBO),
    Flag("pp", "--pipeline-parallel-size", "pipeline stages", _VL_ARGS),
    Flag("cp (prefill)", "--prefill-context-parallel-size", "ParallelConfig: 'PCP does not support data parallelism "
         "yet' (dp = 1)", "vllm/config/parallel.py (ParallelConfig.prefill_context_parallel_size)"),
    Flag("attention_precision = fp8", "--kv-cache-dtype", "fp8", _VL_ARGS),
    Flag("decode batch", "--max-num-seqs", "requests per DP rank (each DP rank runs its own engine core)", _VL_ARGS),
    Flag("step tokens", "--max-num-batched-tokens", "tokens per step per engine core (chunked prefill is always on "
         "in V1)", _VL_ARGS),
    Flag("memory fraction", "--gpu-memory-utilization", "fraction of each GPU's memory for weights, activations and "
         "KV (default 0.92)", "vllm/config/cache.py (CacheConfig)"),
    Flag("CUDA graphs", "--compilation-config", "{\"max_cudagraph_capture_size\": N} when graph_max_batch differs "
         "from vLLM's 512", "vllm/config/compilation.py; VllmConfig._set_cudagraph_sizes"),
    Flag("CUDA graphs", "--enforce-eager", "graph_max_batch = 0", _VL_ARGS),
    Flag("MTP-K", "--speculative-config", "{\"method\": \"mtp\", \"num_speculative_tokens\": K}; models with MTP "
         "layers", "vllm/config/speculative.py (SpeculativeMethod 'mtp'); docs.vllm.ai speculative decoding"),
    Flag("disaggregated pool", "--kv-transfer-config", "{\"kv_connector\": \"NixlConnector\", \"kv_role\": "
         "\"kv_both\"} on prefill and decode servers, plus a proxy", _VL_PD),
    Flag("endpoint", "--port", "", _VL_ARGS),
    Flag("endpoint", "--host", "", _VL_ARGS),
    Flag("proxy", "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "run from a vLLM source "
         "checkout: --port --prefiller-hosts --prefiller-ports --decoder-hosts --decoder-ports", _VL_PD),
    Flag("proxy", "--prefiller-hosts", "", _VL_PD),
    Flag("proxy", "--prefiller-ports", "", _VL_PD),
    Flag("proxy", "--decoder-hosts", "", _VL_PD),
    Flag("proxy", "--decoder-ports", "", _VL_PD),
    Flag("benchmark", "vllm bench serve", "--host --port --model --dataset-name random --random-input-len "
         "--random-output-len "
         "--num-prompts --max-concurrency --ignore-eos", "docs.vllm.ai/en/v0.11.2/cli/bench/serve/"),
)

#: TensorRT-LLM ``trtllm-serve MODEL --config FILE.yaml`` (LLM API keys in the YAML)
TRTLLM = (
    Flag("checkpoint", "trtllm-serve", "MODEL: Hugging Face id or local path; --backend pytorch", _TR_ARGS),
    Flag("tp x dp ranks", "tensor_parallel_size", "with enable_attention_dp every rank is its own attention DP rank "
         "(attention TP 1): tp > 1 with dp > 1 has no key", _TR_PAR),
    Flag("attention dp", "enable_attention_dp", "attention_dp_size = tensor_parallel_size", _TR_PAR),
    Flag("ep", "moe_expert_parallel_size", "MoE only; moe_expert_parallel_size x moe_tensor_parallel_size = "
         "tensor_parallel_size", _TR_PAR),
    Flag("moe tp", "moe_tensor_parallel_size", "MoE only; tp x dp / ep", _TR_PAR),
    Flag("pp", "pipeline_parallel_size", "pipeline stages", _TR_ARGS),
    Flag("decode batch", "max_batch_size", "requests per rank under attention DP", _TR_ARGS),
    Flag("step tokens", "max_num_tokens", "the scheduler's token budget per iteration", _TR_ARGS),
    Flag("chunked prefill", "enable_chunked_prefill", "default false: prompts packed whole within max_num_tokens",
         _TR_ARGS),
    Flag("memory fraction", "kv_cache_config.free_gpu_memory_fraction", "KV takes this fraction of the memory left "
         "after the model loads (default 0.9)", _TR_ARGS),
    Flag("attention_precision = fp8", "kv_cache_config.dtype", "fp8", _TR_ARGS),
    Flag("CUDA graphs", "cuda_graph_config", "{enable_padding, max_batch_size}; null disables graphs", _TR_ARGS),
    Flag("MTP-K", "speculative_config", "{decoding_type: MTP, num_nextn_predict_layers: K}; DeepSeek-style MTP layers",
         "nvidia.github.io/TensorRT-LLM llm-api reference MTPDecodingConfig"),
    Flag("disaggregated pool", "cache_transceiver_config", "{backend: DEFAULT | UCX | NIXL} on context and generation "
         "servers", _TR_PD),
    Flag("disaggregated pool", "disable_overlap_scheduler", "true on context (prefill) servers", _TR_PD),
    Flag("overlap = two-batch", "(none)", "no documented two-batch / dual-batch overlap key: not launchable as priced",
         _TR_ARGS),
    Flag("endpoint", "--host", "", _TR_ARGS),
    Flag("endpoint", "--port", "", _TR_ARGS),
    Flag("endpoint", "--backend", "pytorch", _TR_ARGS),
    Flag("endpoint", "--config", "the YAML of LLM API options (--extra_llm_api_options in 1.0)", _TR_ARGS),
    Flag("router", "trtllm-serve disaggregated", "-c disagg_config.yaml: hostname, port, backend, context_servers "
         "and generation_servers {num_instances, urls}", _TR_PD),
    Flag("router", "-c", "the disaggregated server's YAML", _TR_PD),
    Flag("benchmark", "python -m tensorrt_llm.serve.scripts.benchmark_serving",
         "--backend openai --host --port --model --dataset-name random --random-ids --random-input-len "
         "--random-output-len --num-prompts --max-concurrency --ignore-eos",
         "nvidia.github.io/TensorRT-LLM 'Run benchmarking with trtllm-serve'"),
)

#: NVIDIA Dynamo: a frontend plus one worker per pool, each a backend's own arguments
DYNAMO = (
    Flag("router", "python -m dynamo.frontend", "--http-port: the OpenAI endpoint and router in front of the workers",
         _DY),
    Flag("router", "--http-port", "", _DY),
    Flag("worker", "python -m dynamo.sglang", "takes SGLang's own server arguments; --disaggregation-mode "
         "prefill for a prefill worker", _DY),
    Flag("worker", "python -m dynamo.vllm", "takes vLLM's EngineArgs (--model ..., --kv-transfer-config with the "
         "NixlConnector on both pools); --disaggregation-mode prefill / decode", _DY),
    Flag("worker", "python -m dynamo.trtllm", "--model-path, --extra-engine-args FILE.yaml (the LLM API YAML), "
         "--disaggregation-mode prefill / decode", _DY),
    Flag("worker", "--disaggregation-mode", "prefill or decode", _DY),
    Flag("worker", "--extra-engine-args", "TensorRT-LLM worker: the LLM API YAML", _DY),
    Flag("worker", "--model-path", "TensorRT-LLM worker: the checkpoint", _DY),
)

TABLES = {"sglang": SGLANG, "vllm": VLLM, "trtllm": TRTLLM, "dynamo": DYNAMO}

#: graphsim policy -> the flag that turns it on, where the engine has one (kept for callers of the old mapping;
#: the constraints are in the tables)
SGLANG_POLICY_FLAGS = {("overlap", "two-batch"): "--enable-two-batch-overlap",
                       ("attention_precision", "fp8"): "--kv-cache-dtype fp8_e4m3"}
VLLM_POLICY_FLAGS = {("overlap", "two-batch"): "--enable-dbo", ("attention_precision", "fp8"): "--kv-cache-dtype fp8"}

#: ports the written commands use (hosts are named prefill-I / decode-I / server-I: edit them)
PORT_SERVER, PORT_PREFILL, PORT_DECODE, PORT_FRONT = 30000, 30000, 30001, 8000
_IMPLEMENTATION = (("fusion", "mHC fusion"), ("decoder_replay", "decoder bounded replay"),
                   ("engram", "Engram table residency"), ("engram_shard", "Engram row sharding"),
                   ("engram_proj", "Engram projection split"), ("sp", "sequence parallelism"))


@attrs.frozen
class Pool:
    """One pool of a deployment: its role (``server`` aggregated, ``prefill`` / ``decode``), mapping, batch (requests
    per replica), policies and replica count."""

    role: str
    mapping: object
    batch: int
    policies: Policies
    replicas: int


def tables_markdown() -> str:
    """The four tables as docs/search.md prints them (a test holds the doc to this text)."""
    names = {"sglang": "SGLang (`python -m sglang.launch_server`)", "vllm": "vLLM (`vllm serve`)",
             "trtllm": "TensorRT-LLM (`trtllm-serve MODEL --config FILE.yaml`; YAML keys)",
             "dynamo": "Dynamo (`python -m dynamo.frontend` + a worker per pool)"}
    out = []
    for e, rows in TABLES.items():
        out += [f"**{names[e]}** — checked against {VERSIONS[e]}", "",
                "| graphsim | flag / key | constraint | source |", "|---|---|---|---|"]
        for r in rows:
            cell = r.constraint.replace("|", "\\|") or "–"
            out.append(f"| {r.concept} | `{r.flag}` | {cell} | {r.source} |")
        out.append("")
    return "\n".join(out)


def is_moe(model) -> bool:
    """Whether the model routes experts (the engines' MoE flags apply only then)."""
    cfg = getattr(model, "cfg", None)
    for name in ("experts", "n_routed_experts", "num_experts", "num_local_experts"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return True
    moes = getattr(cfg, "moes", None)
    return bool(moes()) if callable(moes) else False


def checkpoint(model) -> tuple[str, str | None]:
    """The id the commands load (``model.hf_id`` where the model has one) and the note when it is a placeholder."""
    hf = getattr(model, "hf_id", None)
    if hf:
        return str(hf), None
    return model.name, f"{model.name}: give the checkpoint's path or Hugging Face id"


def pools_of(row: dict) -> list[Pool]:
    """A search row's pools: one aggregated server pool, or prefill then decode."""
    if row["mode"] != "disagg":
        return [Pool("server", row["_dmap"], int(row["decode_batch"]), row["_policies"],
                     int(row.get("decode_replicas", 1)))]
    return [Pool("prefill", row["_pmap"], int(row["prefill_batch"]), row["_prefill_policies"],
                 int(row["prefill_replicas"])),
            Pool("decode", row["_dmap"], int(row["decode_batch"]), row["_policies"], int(row["decode_replicas"]))]


def _terms(name: str, terms, hbm_bytes):
    """The engine terms the flags carry: the search's own (with its --engine-set) for its engine, else the engine's
    documented defaults on this GPU."""
    from .engines import ENGINES as TERMS

    if terms is not None and terms.name == name:
        return terms
    t = TERMS[name]
    return t.on(hbm_bytes) if hbm_bytes else t.on(math.inf)


def _json(d: dict) -> str:
    return "'" + json.dumps(d, separators=(", ", ": ")) + "'"


class _Out:
    """What one engine's builder collects: command tokens per pool, reasons it cannot run the priced deployment,
    and notes."""

    def __init__(self):
        self.reasons: list[str] = []
        self.notes: list[str] = []

    def cannot(self, why: str) -> None:
        if why not in self.reasons:
            self.reasons.append(why)


def _common_reasons(out: _Out, engine: str, pool: Pool, moe: bool) -> None:
    """Reasons every engine shares: two-batch overlap on a dense model, DSpark."""
    pol = pool.policies
    if pol.overlap == "two-batch" and not moe:
        out.cannot(f"{pool.role}: overlap=two-batch was priced, but {engine}'s two-batch overlap overlaps the MoE "
                   "all-to-all and this model has no routed experts (the command runs without it)")
    if pol.dspark == "on":
        out.cannot(f"{pool.role}: DSpark drafting was priced and has no upstream {engine} flag (the command runs "
                   "without it)")


def _sglang(pool: Pool, ckpt: str, moe: bool, t, out: _Out) -> list[str]:
    m, pol = pool.mapping, pool.policies
    world = m.tp * m.dp
    c = ["python -m sglang.launch_server", f"--model-path {ckpt}", f"--tp-size {world}"]
    if m.dp > 1:
        c += [f"--dp-size {m.dp}", "--enable-dp-attention"]
    deepep = moe and m.ep > 1 and m.ep == world
    if moe and m.ep > 1:
        c.append(f"--ep-size {m.ep}")
        if deepep:
            mode = {"prefill": "normal", "decode": "low_latency"}.get(pool.role, "auto")
            c += ["--moe-a2a-backend deepep", f"--deepep-mode {mode}"]
        else:
            c.append("--moe-a2a-backend none")
            out.notes.append(f"SGLang {pool.role}: ep={m.ep} of {world} ranks runs hybrid EP-TP (moe_tp = "
                             f"{world // m.ep}) with all-gather dispatch: DeepEP forces ep = tp_size")
    if m.pp > 1:
        c.append(f"--pp-size {m.pp}")
    if m.cp > 1:
        out.cannot(f"{pool.role}: cp={m.cp} (context-parallel prefill) has no documented SGLang flag")
    if pol.overlap == "two-batch" and moe:
        if deepep:
            c.append("--enable-two-batch-overlap")
        else:
            out.cannot(f"{pool.role}: two-batch overlap needs --moe-a2a-backend other than none, and SGLang's "
                       f"all-to-all backends set ep = tp_size = {world}, not the priced ep={m.ep}")
    if pol.attention_precision == "fp8":
        c.append("--kv-cache-dtype fp8_e4m3")
    c.append(f"--max-running-requests {pool.batch}")
    c.append(f"--chunked-prefill-size {t.step_tokens if t.step_tokens is not None and t.chunked_prefill else -1}")
    if t.memory_fraction < 1.0:
        c.append(f"--mem-fraction-static {t.memory_fraction:g}")
    c.append(f"--cuda-graph-max-bs {t.graph_max_batch}" if t.graph_max_batch > 0 else "--disable-cuda-graph")
    if pol.mtp:
        k = pol.mtp
        c += ["--speculative-algorithm EAGLE", f"--speculative-num-steps {k}", "--speculative-eagle-topk 1",
              f"--speculative-num-draft-tokens {k + 1}"]
    if pool.role in ("prefill", "decode"):
        c += [f"--disaggregation-mode {pool.role}", "--disaggregation-transfer-backend nixl"]
    return c


def _vllm(pool: Pool, ckpt: str, moe: bool, t, out: _Out) -> list[str]:
    m, pol = pool.mapping, pool.policies
    world = m.tp * m.dp
    c = ["vllm serve", ckpt, f"--tensor-parallel-size {m.tp}"]
    if m.dp > 1:
        c.append(f"--data-parallel-size {m.dp}")
    if m.pp > 1:
        c.append(f"--pipeline-parallel-size {m.pp}")
    if m.cp > 1:
        if m.dp == 1:
            c.append(f"--prefill-context-parallel-size {m.cp}")
        else:
            out.cannot(f"{pool.role}: cp={m.cp} with dp={m.dp}: vLLM's prefill context parallelism does not support "
                       "data parallelism")
    ep_on = moe and m.ep > 1 and m.ep == world
    if moe and 1 < m.ep < world:
        out.cannot(f"{pool.role}: vLLM sets EP = TP x DP = {world} with --enable-expert-parallel (or no EP): "
                   f"ep={m.ep} cannot be launched; the command runs the MoE TP-sharded over {world} ranks")
    dbo = pol.overlap == "two-batch" and moe
    if dbo and not (ep_on and m.dp > 1):
        out.cannot(f"{pool.role}: --enable-dbo needs DP + EP with a DeepEP all-to-all (dp > 1 and ep = tp x dp); "
                   f"the priced tp={m.tp} dp={m.dp} ep={m.ep} is not that")
        dbo = False
    if ep_on:
        c.append("--enable-expert-parallel")
        if dbo:
            backend = "deepep_high_throughput" if pool.role == "prefill" else "deepep_low_latency"
        else:
            backend = "allgather_reducescatter"
        c.append(f"--all2all-backend {backend}")
        if dbo:
            c.append("--enable-dbo")
    if pol.attention_precision == "fp8":
        c.append("--kv-cache-dtype fp8")
    c.append(f"--max-num-seqs {max(1, math.ceil(pool.batch / m.dp))}")
    if t.step_tokens is not None:
        c.append(f"--max-num-batched-tokens {t.step_tokens}")
    c.append(f"--gpu-memory-utilization {t.memory_fraction:g}")
    if t.graph_max_batch == 0:
        c.append("--enforce-eager")
    elif t.graph_max_batch != 512:
        c.append("--compilation-config " + _json({"max_cudagraph_capture_size": t.graph_max_batch}))
    if pol.mtp:
        c.append("--speculative-config " + _json({"method": "mtp", "num_speculative_tokens": pol.mtp}))
    if pool.role in ("prefill", "decode"):
        c.append("--kv-transfer-config " + _json({"kv_connector": "NixlConnector", "kv_role": "kv_both"}))
    return c


def _trtllm_config(pool: Pool, moe: bool, t, out: _Out) -> dict:
    m, pol = pool.mapping, pool.policies
    world = m.tp * m.dp
    if m.tp > 1 and m.dp > 1:
        out.cannot(f"{pool.role}: TensorRT-LLM's enable_attention_dp gives every rank its own attention DP rank "
                   f"(attention TP 1): tp={m.tp} inside dp={m.dp} has no key; the YAML runs attention DP over {world}")
    if m.cp > 1:
        out.cannot(f"{pool.role}: cp={m.cp} (context-parallel prefill) has no documented TensorRT-LLM key checked here")
    if pol.overlap == "two-batch" and moe:
        out.cannot(f"{pool.role}: TensorRT-LLM documents no two-batch overlap key (the YAML runs without it)")
    d: dict = {"tensor_parallel_size": world, "pipeline_parallel_size": m.pp}
    if m.dp > 1:
        d["enable_attention_dp"] = True
    if moe:
        d["moe_expert_parallel_size"] = m.ep
        d["moe_tensor_parallel_size"] = world // m.ep
    d["max_batch_size"] = max(1, math.ceil(pool.batch / m.dp))
    if t.step_tokens is not None:
        d["max_num_tokens"] = t.step_tokens
    d["enable_chunked_prefill"] = bool(t.chunked_prefill)
    kv: dict = {"free_gpu_memory_fraction": t.memory_fraction}
    if pol.attention_precision == "fp8":
        kv["dtype"] = "fp8"
    d["kv_cache_config"] = kv
    d["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": t.graph_max_batch} \
        if t.graph_max_batch > 0 else None
    if pol.mtp:
        d["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": pol.mtp}
    if pool.role in ("prefill", "decode"):
        d["cache_transceiver_config"] = {"backend": "DEFAULT"}
    if pool.role == "prefill":
        d["disable_overlap_scheduler"] = True
    return d


def to_yaml(d: dict, indent: int = 0) -> str:
    """A small YAML writer for the configs here (mappings, lists of scalars, scalars; strings JSON-quoted where
    YAML could misread them) — no YAML package is needed to write them."""
    lines = []
    pad = " " * indent
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(to_yaml(v, indent + 2).rstrip("\n"))
        elif isinstance(v, (list, tuple)):
            lines.append(f"{pad}{k}:")
            lines += [f"{pad}  - {_scalar(x)}" for x in v]
        else:
            lines.append(f"{pad}{k}: {_scalar(v)}")
    return "\n".join(lines) + "\n"


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return f"{v:g}" if isinstance(v, float) else str(v)
    s = str(v)
    return s if s.replace("_", "").replace("-", "").replace(".", "").replace("/", "").isalnum() and \
        not s[:1].isdigit() and s.lower() not in ("true", "false", "null", "yes", "no", "on", "off") else json.dumps(s)


def _hosts(pool: Pool) -> list[str]:
    return [f"{pool.role}-{i}" for i in range(pool.replicas)]


def _port(pool: Pool) -> int:
    return {"prefill": PORT_PREFILL, "decode": PORT_DECODE}.get(pool.role, PORT_SERVER)


def _tag(pool: Pool, extra: str = "") -> str:
    return (f"# {pool.role}: {pool.replicas} replica(s) of {pool.mapping.gpus} GPU(s), one command per replica "
            f"(hosts {', '.join(_hosts(pool))}){extra}")


def launch_flags(model, row: dict, *, traffic=None, terms=None, hbm_bytes: float | None = None) -> dict:
    """The launch output of one deployment row (``search``'s rows; docs/json.md ``best[].launch``): per engine the
    commands (one per pool, each after a ``# role`` line), the router / proxy, a benchmark command, whether the
    engine runs the priced deployment (``launchable``) and why not (``reasons``), the config files the commands
    name (``configs``), and notes. ``traffic``: the search's traffic (the benchmark's lengths); ``terms``: the
    engine terms the search ran under (its engine's flags carry them; the others get their documented defaults on
    a GPU of ``hbm_bytes``)."""
    moe = is_moe(model)
    ckpt, placeholder = checkpoint(model)
    pools = pools_of(row)
    disagg = row["mode"] == "disagg"
    outs = {e: _Out() for e in ENGINES}
    res: dict = {"model": ckpt, "engines": dict(VERSIONS)}
    cmds: dict = {e: [] for e in ENGINES}
    configs: dict = {}
    workers: dict = {"sglang": [], "vllm": [], "trtllm": []}
    notes: set = set()
    if placeholder:
        notes.add(placeholder)
    for pool in pools:
        pol = pool.policies
        for e in ("sglang", "vllm", "trtllm"):
            _common_reasons(outs[e], e, pool, moe)
        port = _port(pool)
        sg = _sglang(pool, ckpt, moe, _terms("sglang", terms, hbm_bytes), outs["sglang"])
        cmds["sglang"].append(_tag(pool) + "\n" + " ".join(sg + ["--host 0.0.0.0", f"--port {port}"]))
        workers["sglang"].append(sg[1:])
        vl = _vllm(pool, ckpt, moe, _terms("vllm", terms, hbm_bytes), outs["vllm"])
        cmds["vllm"].append(_tag(pool) + "\n" + " ".join(vl + [f"--port {port}"]))
        workers["vllm"].append([f"--model {ckpt}"] + vl[2:])
        cfg = _trtllm_config(pool, moe, _terms("trtllm", terms, hbm_bytes), outs["trtllm"])
        name = f"trtllm_{pool.role}.yaml"
        configs[name] = to_yaml(cfg)
        cmds["trtllm"].append(_tag(pool, f"; {name} beside it") + "\n" + " ".join(
            ["trtllm-serve", ckpt, "--backend pytorch", "--host 0.0.0.0", f"--port {port}", f"--config {name}"]))
        workers["trtllm"].append([f"--model-path {ckpt}", f"--extra-engine-args {name}"])
        if pol.overlap == "serial":
            notes.add("overlap=serial prices every collective exposed (a bound); the engines overlap by default")
        for f, what in _IMPLEMENTATION:
            if getattr(pol, f) != getattr(Policies(), f):
                notes.add(f"{what} ({f}={getattr(pol, f)}) is an engine implementation choice with no documented "
                          "flag")
    if max(p.mapping.gpus for p in pools) > 4:  # GB200 / GB300 trays hold 4 GPUs, HGX boards 8
        notes.add("each command runs one replica on all its GPUs: where a replica spans nodes, add the engine's "
                  "multi-node arguments (SGLang --nnodes / --node-rank / --dist-init-addr, vLLM's multi-node data "
                  "parallel or Ray, TensorRT-LLM under mpirun / srun with trtllm-llmapi-launch)")
    res.update({e: cmds[e] for e in ("sglang", "vllm", "trtllm")})
    router = _routers(pools, disagg, configs, notes)
    # Dynamo wraps the first backend that runs the priced deployment
    base = next((e for e in ("sglang", "vllm", "trtllm") if not outs[e].reasons), None)
    if base is None:
        outs["dynamo"].cannot("no backend Dynamo wraps (SGLang, vLLM, TensorRT-LLM) runs the priced deployment; "
                              "the workers below use SGLang's")
    base = base or "sglang"
    dyn = [f"# frontend: the router and OpenAI endpoint\npython -m dynamo.frontend --http-port {PORT_FRONT}"]
    for pool, args in zip(pools, workers[base]):
        args = [a for a in args if not a.startswith("--disaggregation-mode")]  # vLLM keeps its NIXL connector
        if pool.role in ("prefill", "decode"):
            args.append(f"--disaggregation-mode {pool.role}")
        dyn.append(_tag(pool, f"; the {base} backend") + "\n" + " ".join([f"python -m dynamo.{base}"] + args))
    res["dynamo"] = dyn
    notes.add("Dynamo: start its infrastructure (per its docs) before the frontend and workers; the workers "
              f"use the {base} backend")
    router["dynamo"] = dyn[0].split("\n", 1)[1]
    res["router"] = router
    res["benchmark"] = _benchmarks(ckpt, pools, traffic, router, notes)
    res["launchable"] = {e: not outs[e].reasons for e in ENGINES}
    res["reasons"] = {e: list(outs[e].reasons) for e in ENGINES}
    res["configs"] = configs
    for e in ENGINES:
        notes.update(outs[e].notes)
    res["notes"] = sorted(notes)
    return res


def _routers(pools: list[Pool], disagg: bool, configs: dict, notes: set) -> dict:
    """The router / proxy per engine (None where one server takes the traffic)."""
    out: dict = {"sglang": None, "vllm": None, "trtllm": None}
    if disagg:
        pre, dec = pools
        pu = [f"http://{h}:{PORT_PREFILL}" for h in _hosts(pre)]
        du = [f"http://{h}:{PORT_DECODE}" for h in _hosts(dec)]
        out["sglang"] = " ".join(["python -m sglang_router.launch_router --pd-disaggregation"]
                                 + [f"--prefill {u}" for u in pu] + [f"--decode {u}" for u in du]
                                 + ["--host 0.0.0.0", f"--port {PORT_FRONT}"])
        out["vllm"] = " ".join([
            "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", f"--port {PORT_FRONT}",
            "--prefiller-hosts " + " ".join(_hosts(pre)), "--prefiller-ports " + " ".join([str(PORT_PREFILL)] *
                                                                                           pre.replicas),
            "--decoder-hosts " + " ".join(_hosts(dec)), "--decoder-ports " + " ".join([str(PORT_DECODE)] *
                                                                                       dec.replicas)])
        notes.add("vLLM's disaggregation proxy is the documented example script of its NixlConnector guide: run it "
                  "from a vLLM source checkout")
        configs["trtllm_disagg.yaml"] = to_yaml({
            "hostname": "0.0.0.0", "port": PORT_FRONT, "backend": "pytorch",
            "context_servers": {"num_instances": pre.replicas, "urls": [u[7:] for u in pu]},
            "generation_servers": {"num_instances": dec.replicas, "urls": [u[7:] for u in du]}})
        out["trtllm"] = "trtllm-serve disaggregated -c trtllm_disagg.yaml"
    elif pools[0].replicas > 1:
        urls = [f"http://{h}:{PORT_SERVER}" for h in _hosts(pools[0])]
        out["sglang"] = " ".join(["python -m sglang_router.launch_router --worker-urls"] + urls
                                 + ["--host 0.0.0.0", f"--port {PORT_FRONT}"])
        notes.add(f"vLLM and TensorRT-LLM: {pools[0].replicas} aggregated replicas need an HTTP load balancer in "
                  "front (neither documents one of its own for this)")
    return out


def _benchmarks(ckpt: str, pools: list[Pool], traffic, router: dict, notes: set) -> dict:
    """A benchmark command per engine at the row's lengths and the concurrency the decode pool holds."""
    if traffic is None:
        return {}
    if len(traffic.isl) == 1:
        isl, osl = int(traffic.isl[0]), int(traffic.osl[0])
    else:
        w = sum(traffic.weight)
        isl = round(sum(a * x for a, x in zip(traffic.weight, traffic.isl)) / w)
        osl = round(sum(a * x for a, x in zip(traffic.weight, traffic.osl)) / w)
        notes.add(f"benchmark: one random length pair, the traffic's weighted means ISL {isl} / OSL {osl} (the "
                  f"search priced {len(traffic.isl)} classes)")
    dec = pools[-1]
    conc = dec.batch * dec.replicas
    n = max(5 * conc, 100)
    out = {}
    for e in ("sglang", "vllm", "trtllm", "dynamo"):
        port = PORT_FRONT if router.get(e) else _port(pools[0])
        host = "localhost" if router.get(e) else _hosts(pools[0])[0]
        if e == "sglang":
            c = ["python -m sglang.bench_serving --backend sglang", f"--host {host} --port {port}", f"--model {ckpt}"]
        elif e == "trtllm":
            c = ["python -m tensorrt_llm.serve.scripts.benchmark_serving --backend openai",
                 f"--host {host} --port {port}", f"--model {ckpt}", "--random-ids"]
        else:
            c = ["vllm bench serve", f"--host {host} --port {port}", f"--model {ckpt}"]
        c += ["--dataset-name random", f"--random-input-len {isl}", f"--random-output-len {osl}"]
        if e == "sglang":
            c.append("--random-range-ratio 1")
        c += [f"--num-prompts {n}", f"--max-concurrency {conc}"]
        if e != "sglang":
            c.append("--ignore-eos")
        out[e] = " ".join(c)
    return out


def launch_files(launch: dict) -> dict:
    """The files ``--launch-dir`` writes for one deployment's launch output: a shell script per engine and pool,
    the router / proxy and benchmark scripts, the TensorRT-LLM YAMLs, and a README listing them."""
    files: dict = {}
    for e in ENGINES:
        for cmd in launch[e]:
            head, body = cmd.split("\n", 1)
            role = head[2:].split(":", 1)[0]
            files[f"{e}_{role}.sh"] = f"#!/bin/sh\n{head}\n{body}\n"
        r = launch["router"].get(e)
        if r and e != "dynamo":
            files[f"{e}_router.sh"] = f"#!/bin/sh\n# {e} router / proxy in front of the pools\n{r}\n"
        b = launch["benchmark"].get(e)
        if b:
            files[f"{e}_bench.sh"] = f"#!/bin/sh\n# {e}: benchmark at the deployment's lengths and concurrency\n{b}\n"
    files.update(launch["configs"])
    lines = [f"# Launch files for {launch['model']}", "",
             "Written by `graphsim search --launch-dir` (graphsim.serving.launch; docs/search.md has the flag tables "
             "with their sources). Hosts are named prefill-I / decode-I / server-I: replace them with yours.", ""]
    for e in ENGINES:
        ok = launch["launchable"][e]
        lines.append(f"## {e} — {'launchable' if ok else 'NOT launchable as priced'}")
        lines.append(f"checked against {launch['engines'][e]}")
        lines += [f"- not launchable: {w}" for w in launch["reasons"][e]]
        lines += [f"- `{name}`" for name in sorted(files) if name.startswith(e + "_")]
        lines.append("")
    if launch["notes"]:
        lines.append("## notes")
        lines += [f"- {n}" for n in launch["notes"]]
    files["README.md"] = "\n".join(lines) + "\n"
    return files


def write_launch_dir(folder, launches: list[dict]) -> list[str]:
    """Write each ranked deployment's launch files under ``folder`` (the first in ``folder`` itself, rank K >= 2
    in ``folder/rank-K``), every file atomically; returns the paths written."""
    from pathlib import Path

    from ..core.outputs import output_path, write_text

    root = Path(folder)
    written = []
    for k, launch in enumerate(launches, 1):
        d = output_path(root if k == 1 else root / f"rank-{k}", field="launch_dir", folder=True)
        for name, text in launch_files(launch).items():
            written.append(write_text(d / name, text, field="launch_dir"))
    return written


__all__ = ["DYNAMO", "ENGINES", "Flag", "Pool", "SGLANG", "SGLANG_POLICY_FLAGS", "TABLES", "TRTLLM", "VERSIONS",
           "VLLM", "VLLM_POLICY_FLAGS", "checkpoint", "is_moe", "launch_files", "launch_flags", "pools_of",
           "tables_markdown", "to_yaml", "write_launch_dir"]
