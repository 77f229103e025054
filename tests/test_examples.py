"""Every shipped example runs (the sweep and local FPM examples at a reduced size by their own tests)."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = sorted(p for p in (pathlib.Path(__file__).parent.parent / "examples").glob("*.py"))
RUN_ELSEWHERE = {"run_sweep.py": "run at a reduced size by tests/test_sweep.py",
                 "local_fpm.py": "run with --quick by tests/test_fpm.py (the full grid takes minutes)"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    if path.name in RUN_ELSEWHERE:
        pytest.skip(RUN_ELSEWHERE[path.name])
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip(), "an example prints what it computed"
