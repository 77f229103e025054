"""DSpark speculative decoding, DeepSeek-V4.1-Flash on GB200: tokens/s per user and per GPU with DSpark off
and on, for a high- and a low-acceptance drafter, at batch 1, 16, 64, 256 and 8K context.

Mapping: one replica on 4 GB200 GPUs, tp=4 with the routed experts over the same 4 GPUs (ep=4): decode at
these batches is bound by weight and expert traffic, and TP gives every GPU a quarter of it.

With DSpark on, the verify length k of each batch is chosen by ``graphsim.serving.speculative.schedule_verify`` on
the step-time curve of one compiled program (verify forward + commit + drafter); E = expected tokens a request
emits per step (accepted drafts + the target's own token). Both programs are compiled once and serve every
batch size: the batch is a workload array, not a new graph.
"""
from __future__ import annotations

import graphsim as gs
from graphsim.serving.speculative import DecodeBatch, StepCurve, price_verify, schedule_verify

CONTEXT = 8192
BATCHES = (1, 16, 64, 256)
PROFILES = {"high": [0.9, 0.85, 0.8, 0.75, 0.7], "low": [0.5, 0.4, 0.3, 0.2, 0.1]}
MAPPING = gs.ParallelMapping(tp=4, ep=4)


def rows(batches=BATCHES, profiles=PROFILES, context=CONTEXT, hw="gb200"):
    """(batch, profile, DSpark-off result, DSpark-on result) per batch and acceptance profile."""
    model = gs.load_model("deepseek-v4.1-flash")
    on = StepCurve.compile(model, hw, [context], mapping=MAPPING, policies=gs.Policies(dspark="on"))
    off = StepCurve.compile(model, hw, [context], mapping=MAPPING, policies=gs.Policies(dspark="off"))
    out = []
    for n in batches:
        for name, a in profiles.items():
            batch = DecodeBatch.uniform(context, n, a)
            out.append((n, name, price_verify(off, batch, 0), schedule_verify(on, batch)))
    return out


def main(**kw) -> list:
    table = rows(**kw)
    print(f"DeepSeek-V4.1-Flash decode, {CONTEXT // 1024}K context, GB200 x{MAPPING.gpus} ({MAPPING})")
    print(f"{'batch':>5} {'accept':>6} | {'off tok/s/user':>14} {'tok/s/GPU':>9} | {'k':>2} {'E':>5} {'step ms':>8} "
          f"{'verify/draft ms':>15} {'on tok/s/user':>13} {'tok/s/GPU':>9} | {'speed-up':>8}")
    for n, name, off, on in table:
        print(f"{n:5d} {name:>6} | {off.tokens_per_s_per_user[0]:14.1f} {off.tokens_per_s_per_gpu:9.0f} | "
              f"{int(on.k[0]):2d} {on.expected_emitted[0]:5.2f} {on.step_time * 1e3:8.3f} "
              f"{on.stages['verify'] * 1e3:7.3f}/{on.stages['draft'] * 1e3:<7.3f} {on.tokens_per_s_per_user[0]:13.1f} "
              f"{on.tokens_per_s_per_gpu:9.0f} | {on.throughput / off.throughput:7.2f}x")
    print("E = expected emitted tokens per request and step (prefix acceptance, bonus token included);\n"
          "ITL is bursty: each step delivers 1..6 tokens at once, mean gap = step / E.")
    if any(on.throughput < off.throughput for *_, off, on in table):
        print("speed-up < 1: even the best k loses to plain decode there (k = 0 still runs the drafter and the\n"
              "extra verify positions touch more experts); a serving scheduler switches DSpark off for such batches.")
    return table


if __name__ == "__main__":
    main()
