"""The talk notes' serving claims for DeepSeek-V4.1-Flash (seed 003), checked on an agent multi-turn trace with
graphsim's request-level simulator (issue 27):

(a) the SWA-on-disk design of V4 (global KV and the SWA state on disk for 72 h) against the three-tier design (the
    SWA state in a host-memory pool of 10 % of every machine's DRAM that lives for minutes, the global KV on disk):
    persistent bytes, hit rates per tier, TTFT percentiles;
(b) CED + bounded replay against full recompute when a prefix hit has lost its SWA state.

Every step is priced by graphsim's compiled V4.1 program (SOL view: a bound on what an engine can reach); the
numbers are whatever the simulation finds. Run: python examples/three_tier_cache.py
"""
import graphsim as gs
from graphsim.serving import Deployment, simulate, synthetic

# agent sessions: a shared 4k system prompt, a 6k first message, 3-12 turns each re-reading the whole history plus
# the model's answer and a tool result; the next turn comes 20-60 s later (a tool call, a user reading)
trace = synthetic(requests=1500, rate=0.25, seed=11,
                  input={"dist": "lognormal", "mean": 6000, "cv": 0.8, "max": 60000},
                  output={"dist": "lognormal", "mean": 400, "cv": 1.0, "max": 4000},
                  sessions={"turns": {"dist": "uniform", "low": 3, "high": 12},
                            "think_s": {"dist": "lognormal", "mean": 40, "cv": 1.0},
                            "tool_tokens": {"dist": "lognormal", "mean": 1500, "cv": 1.0}, "system_tokens": 4000})
dep = Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4))
print(f"trace: {len(trace):,} requests in {trace.arrival_s[-1] / 60:.1f} min; its own prefix reuse "
      f"{trace.prefix_reuse():.1%} of input tokens\n")


def row(name, res):
    s = res.summary
    c, lat = s["cache"], s["latency"]
    tiers = {t["name"]: t for t in c["tiers"]}
    disk, host = tiers["disk"], tiers["host"]
    print(f"{name:<28}{disk['gib_hours']:>10.1f}{disk['peak_gib']:>10.1f}{host['gib_hours']:>9.2f}"
          f"{c['hit_ratio']:>8.1%}{c['hit_tokens']['hbm'] / 1e6:>8.1f}{c['hit_tokens']['host'] / 1e6:>7.1f}"
          f"{c['hit_tokens']['disk'] / 1e6:>7.1f}{c['replays']:>8,}{c['recomputed_hit_tokens'] / 1e6:>8.1f}"
          f"{lat['ttft_ms']['p50']:>8.1f}{lat['ttft_ms']['p99']:>8.1f}")


head = (f"{'':<28}{'disk':>10}{'disk':>10}{'host':>9}{'hit':>8}{'-- hit Mtok --':>22}{'SWA':>8}{'recomp':>8}"
        f"{'TTFT':>8}{'TTFT':>8}\n{'design':<28}{'GiB-h':>10}{'peak GiB':>10}{'GiB-h':>9}{'ratio':>8}{'hbm':>8}"
        f"{'host':>7}{'disk':>7}{'replays':>8}{'Mtok':>8}{'p50 ms':>8}{'p99 ms':>8}")
print("(a) where the SWA state lives\n" + head)
base = simulate(trace, dep, cache_design="swa-on-disk", validate=0)
three = simulate(trace, dep, cache_design="three-tier", validate=0)
row("V4: SWA on disk", base)
row("V4.1: three-tier", three)
b = {t["name"]: t for t in base.summary["cache"]["tiers"]}["disk"]["gib_hours"]
t = {t["name"]: t for t in three.summary["cache"]["tiers"]}["disk"]["gib_hours"]
print(f"persistent (disk) bytes x time, three-tier / SWA-on-disk: {t / b:.3f}\n")

print("(b) a hit without its SWA state (three-tier; a small HBM pool so sessions come back from the tiers)\n" + head)
small = Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4), hbm_kv_gib=0.5)
short = simulate(trace, small, cache_design="three-tier", validate=0)
recompute = simulate(trace, Deployment("deepseek-v4.1-flash", "gb200", gs.ParallelMapping(tp=4),
                                       gs.Policies(encoder_replay="off"), hbm_kv_gib=0.5),
                     cache_design="three-tier", validate=0)
row("bounded replay (W=128)", short)
row("full recompute on a miss", recompute)
print(f"\nTTFT mean, recompute / bounded replay: "
      f"{recompute.summary['latency']['ttft_ms']['mean'] / short.summary['latency']['ttft_ms']['mean']:.2f}; "
      f"Little's law error {three.checks['littles_law']['relative_error']:.1e}")
