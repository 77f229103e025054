"""Engram tables on the host (Grace memory) vs in HBM, DeepSeek-V4.1-Flash on GB200 (TP4): is the row
prefetch over NVLink-C2C hidden under compute, and by how much is it exposed, as prefetch distance varies?"""
import graphsim as gs
from graphsim.serving.studies import prefetch_study

mapping = gs.ParallelMapping(tp=4)
for label, reqs in (("prefill 32K", ["prefill:32768"]), ("decode 64 x 8K", ["decode:8192x64"])):
    print(f"{label}: forward with tables in HBM vs on host, per prefetch distance (blocks ahead)")
    print(f"  {'distance':>8} {'HBM ms':>10} {'host ms':>10} {'copy ms':>9} {'exposed ms':>11}  hidden")
    for row in prefetch_study("deepseek-v4.1-flash", "gb200", reqs, mapping, distances=(0, 1, 2, 4)):
        copy = sum(r.copy_s for r in row.copies)
        print(f"  {row.distance:>8} {row.forward_hbm_s * 1e3:>10.3f} {row.forward_s * 1e3:>10.3f} {copy * 1e3:>9.3f} "
              f"{row.exposed_s * 1e3:>11.3f}  {'yes' if row.hidden else 'no'}")
