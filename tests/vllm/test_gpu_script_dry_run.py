"""`make gpu-check`'s paper-shape script, its CPU dry run: the same path (a random Qwen3-MoE
with a dense first layer built from a config, the trainer, a colocated vLLM engine) at tiny
sizes in fp32, so the first GPU it meets runs code that has run."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_paper_shape.py"


@pytest.mark.slow
def test_paper_shape_script_dry_run_prints_a_passing_table():
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = {line[:32].strip(): line[32:].split() for line in res.stdout.splitlines() if line.endswith(("yes", "NO"))}
    assert rows["steps done"][0] == "3"
    # fp32 engine and trainer at the same weights: the gap is float rounding
    assert float(rows["engine/trainer logp gap mean"][0]) < 1e-4
    assert all(r[-1] == "yes" for r in rows.values()), res.stdout
