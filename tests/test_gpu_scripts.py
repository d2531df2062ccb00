"""`make gpu-check`'s scripts on the CPU with the hf engine (their vLLM dry run is in
tests/vllm): the first GPU they meet runs code that has run. Both print the log-prob gap
between the sampler (generate's own log-probs) and a full trainer forward at the same weights;
in fp32 on one CPU that gap is float rounding, so a wrong temperature or stale weights fail here."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(*args: str) -> str:
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


@pytest.mark.slow
def test_paper_shape_script_with_the_hf_engine_replays_generates_routes():
    out = _run(str(BENCH / "gpu_paper_shape.py"), "--dry-run", "--engine", "hf")
    rows = {line[:32].strip(): line[32:].split() for line in out.splitlines() if line.endswith(("yes", "NO"))}
    assert rows["steps done"][0] == "3"
    assert float(rows["engine/trainer logp gap mean"][0]) < 1e-5
    # R3 on generate's own routes: the trainer's replayed forward takes exactly those experts
    assert float(rows["moe/engine_route_diff_frac"][0]) == 0.0
    # gspo plan's figures sit beside the measured ones (on the CPU: the plan alone)
    assert float(rows["gspo plan GiB, update"][0]) > 0
    assert all(r[-1] == "yes" for r in rows.values()), out


@pytest.mark.slow
def test_gpu_check_runs_the_hf_engine_on_the_cpu():
    out = _run(
        str(BENCH / "gpu_check.py"), "--device", "cpu", "--engines", "hf", "--steps", "2",
        "--dtype", "float32", "--models", "tiny-moe",
    )  # fmt: skip
    line = next(row for row in out.splitlines() if row.startswith("tiny-moe"))
    fields = line.split()
    assert fields[1:3] == ["hf", "2"]
    gap_mean, gap_max = float(fields[5]), float(fields[6])
    assert gap_mean < 1e-5 and gap_max < 1e-3, line
