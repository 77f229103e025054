"""Decoder bounded replay: prefill SOL speed-up of the `sglang` profile over `off` for DeepSeek-V4.1-Flash
on GB200 (TP4), next to the token x layer ratio 40N / (21N + 19·min(N,128)) it approaches for long prompts."""
import graphsim as gs

model = gs.load_model("deepseek-v4.1-flash")
mapping = gs.ParallelMapping(tp=4)
rows = []
print(f"{'N':>8} {'off ms':>10} {'sglang ms':>10} {'speed-up':>9} {'tok×layer ratio':>16} {'paper ms':>10} {'speed-up':>9}")
for n in (128, 1024, 8192, 32768, 131072):
    t = {}
    for profile in ("off", "sglang", "paper"):
        plan = gs.Plan([f"prefill:{n}"], mapping, gs.Policies(decoder_replay=profile))
        t[profile] = gs.compile_plan(model, plan, "gb200").report().forward_s
    ratio = 40 * n / (21 * n + 19 * min(n, 128))
    print(f"{n:>8} {t['off'] * 1e3:>10.2f} {t['sglang'] * 1e3:>10.2f} {t['off'] / t['sglang']:>8.3f}x {ratio:>15.3f}x "
          f"{t['paper'] * 1e3:>10.2f} {t['off'] / t['paper']:>8.3f}x")
print("\nWhy below the token x layer ratio: work replay does not shorten weighs more than its token share —"
      "\nthe Encoder's three Full indexer scans and layer 20's scan grow with N² (they stay), the global-KV"
      "\nprojection covers every position, every layer reads its weights once per forward whatever its token"
      "\ncount (dominant near N = 128, where the speed-up is 1), and the embedding/head. The vendor's measured"
      "\n1.56x on 8xH200 (SGLang --enable-decoder-swa-bounded-replay) is end-to-end, not SOL.")
