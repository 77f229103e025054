"""The isolated fuzz campaign: every generated input runs in its own forked process, watched for hangs (over
``--timeout`` seconds) and memory (peak RSS over ``--max-rss-gb``), and classified (tests/fuzz/targets.py).

    python tests/fuzz/campaign.py --examples 20000 --json fuzz.json      # the acceptance budget
    python tests/fuzz/campaign.py --examples 200 --family cli           # one family

Prints a table of outcomes by family and the distinct failure signatures; exits 1 when anything is not
``ok`` or a clean ``error``. The in-process property suite (tests/test_fuzz.py) uses the same strategies
and targets at a small budget in CI.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import select
import signal
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ -> `import fuzz`
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from fuzz import strategies as S  # noqa: E402
from fuzz import targets as T  # noqa: E402


def _preload() -> None:
    """Import what the targets use once, before forking, so every child starts warm (it still initialises
    JAX's backend itself: the parent never evaluates anything)."""
    import importlib

    for mod in ("graphsim", "graphsim.cli.app", "graphsim.cli.commands", "graphsim.sweep", "graphsim.exports.plots",
                "graphsim.exports.dot", "graphsim.exports.trace", "graphsim.cli.serve", "graphsim.serving.sim",
                "pandas", "pyarrow.parquet", "matplotlib.pyplot"):
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - an older tree may lack a module; the targets report what fails
            pass
    # generated inputs built once, not per child
    for warm in (S.base_samples, S.base_fpm_model, S.base_search_cache, T.base_results):
        try:
            warm()
        except Exception:  # noqa: BLE001
            pass

FAMILIES = {
    "api": (S.api_case(), lambda c: T.run_api(c)),
    "cli": (S.cli_case(), lambda c: T.run_cli(c["argv"], c["files"])),
    "config": (S.config_case(), lambda c: T.run_config(*c)),
    "hw_toml": (S.toml_text("hw"), lambda c: T.run_toml("hw", c)),
    "profile_toml": (S.toml_text("profile"), lambda c: T.run_toml("profile", c)),
    "sweep": (S.sweep_spec(), lambda c: T.run_sweep(c)),
    "sweep_file": (S.sweep_text(), lambda c: T.run_sweep(None, *c)),
    "fpm_model": (S.fpm_model_text(), lambda c: T.run_fpm_model(c)),
    "fpm_samples": (S.fpm_samples_case(), lambda c: T.run_fpm_samples(c)),
    "measured": (S.measured_case(), lambda c: T.run_measured(c)),
    "collect": (S.collect_case(), lambda c: T.run_collect(c)),
    "plot": (S.plot_case(), lambda c: T.run_plot(c)),
    "search": (S.search_case(), lambda c: T.run_search(c)),
    "serve_sim": (S.serve_sim_case(), lambda c: T.run_serve_sim(c)),
}
BAD = ("unnamed", "nonsense", "crash", "hang", "memory")


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmHWM:", "VmRSS:")):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def isolated(fn, case, timeout: float, max_rss_kb: int) -> tuple[str, str, float, int]:
    """Run ``fn(case)`` in a forked child: (outcome, detail, seconds, peak RSS kB)."""
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        try:
            out = fn(case)
        except BaseException as e:  # noqa: BLE001
            out = ("crash", f"{type(e).__name__}: {e}")
        os.write(w, json.dumps(out).encode()[:60000])
        os._exit(0)
    os.close(w)
    peak, data, verdict = 0, b"", None
    while True:
        ready, _, _ = select.select([r], [], [], 0.05)
        if ready:
            chunk = os.read(r, 65536)
            data += chunk
            if not chunk:
                break
        peak = max(peak, _rss_kb(pid))
        if peak > max_rss_kb:
            verdict = ("memory", f"peak RSS over {max_rss_kb // 2**20} GB")
        elif time.monotonic() - t0 > timeout:
            verdict = ("hang", f"still running after {timeout:g} s")
        if verdict:
            os.kill(pid, signal.SIGKILL)
            break
    os.waitpid(pid, 0)
    os.close(r)
    dt = time.monotonic() - t0
    if verdict:
        return verdict[0], verdict[1], dt, peak
    try:
        outcome, detail = json.loads(data.decode() or '["crash", "child died without a result"]')
    except ValueError:
        outcome, detail = "crash", "child wrote no result"
    return outcome, detail, dt, peak


def signature(detail: str) -> str:
    """A failure's family-independent shape: the message with numbers and quoted values blanked."""
    import re

    s = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", detail)
    return re.sub(r"-?\d[\d.e+_,]*", "N", s)[:160]


def campaign(families, examples: int, seed: int, timeout: float, max_rss_gb: float) -> dict:
    report: dict = {}
    for fam in families:
        strategy, fn = FAMILIES[fam]
        counts: collections.Counter = collections.Counter()
        sigs: dict = {}
        slowest = 0.0
        peak = 0

        @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), phases=[Phase.generate])
        @given(strategy)
        def one(case):
            nonlocal slowest, peak
            outcome, detail, dt, rss = isolated(fn, case, timeout, int(max_rss_gb * 2**20))
            counts[outcome] += 1
            slowest, peak = max(slowest, dt), max(peak, rss)
            if outcome in BAD:
                sig = f"{outcome}: {signature(detail)}"
                sigs.setdefault(sig, {"count": 0, "example": repr(case)[:400], "detail": detail[:400]})
                sigs[sig]["count"] += 1

        one._hypothesis_internal_use_seed = seed  # reproducible
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            one()
        report[fam] = {"inputs": sum(counts.values()), **dict(counts), "signatures": sigs,
                       "slowest_s": round(slowest, 2), "peak_rss_mb": round(peak / 1024), "seconds": round(time.monotonic() - t0, 1)}
        print(f"{fam:<13} {report[fam]['inputs']:>6} inputs  " + "  ".join(
            f"{k} {counts[k]}" for k in ("ok", "error", *BAD) if counts[k]) +
            f"  (slowest {slowest:.1f} s, peak {peak / 1024:.0f} MB, {report[fam]['seconds']} s)", flush=True)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=200, help="inputs in total (split evenly over the families)")
    p.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these families")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before an input counts as a hang")
    p.add_argument("--max-rss-gb", type=float, default=2.0)
    p.add_argument("--json", default=None, help="write the full report here")
    a = p.parse_args(argv)
    _preload()
    fams = a.family or sorted(FAMILIES)
    per = max(1, a.examples // len(fams))
    report = campaign(fams, per, a.seed, a.timeout, a.max_rss_gb)
    total = collections.Counter()
    for fam, r in report.items():
        for k in ("ok", "error", *BAD):
            total[k] += r.get(k, 0)
    print("total        " + "  ".join(f"{k} {total[k]}" for k in ("ok", "error", *BAD)))
    for fam, r in report.items():
        for sig, info in sorted(r["signatures"].items(), key=lambda kv: -kv[1]["count"]):
            print(f"  [{fam}] x{info['count']} {sig}\n      e.g. {info['example'][:200]}")
    if a.json:
        Path(a.json).write_text(json.dumps({"total": dict(total), "families": report}, indent=2, default=str))
    return 1 if any(total[k] for k in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
