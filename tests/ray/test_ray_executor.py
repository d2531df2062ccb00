"""`--executor ray` on a local Ray cluster: the tiny sweep gives the local executor's metrics."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _rows(path: Path) -> list[dict]:
    """A metrics or eval file's records less wall times and memory (the machine's, not the run's)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/")) and k != "time_s"} for r in rows]


def test_a_tiny_sweep_through_ray_has_the_local_executors_metrics(tmp_path, env, tiny_spec, gspo):
    on_ray = tiny_spec(tmp_path / "ray.yaml", tmp_path / "ray")
    r = gspo(["sweep", str(on_ray), "--executor", "ray", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(x["run"], x["seed"], x["status"]) for x in json.loads(r.stdout)] == [
        ("grpo", 0, "completed"),
        ("grpo", 1, "completed"),
        ("gspo", 0, "completed"),
        ("gspo", 1, "completed"),
    ]
    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local")
    r = gspo(["sweep", str(local), "--jobs", "2", "-q"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    for arm in ("grpo", "gspo"):
        for seed in (0, 1):
            a, b = (tmp_path / where / "tiny" / arm / f"seed{seed}" for where in ("local", "ray"))
            assert _rows(a / "metrics.jsonl") == _rows(b / "metrics.jsonl"), (arm, seed)
            assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl"), (arm, seed)


def test_a_failing_run_is_reported_with_its_logs_last_line_and_exit_1(tmp_path, env, tiny_spec, gspo):
    from helpers import TINY

    reward = tmp_path / "bad.py"
    reward.write_text(
        "def reward(prompts, completions, completion_ids, **kwargs):\n"
        "    raise RuntimeError('reward service unreachable')\n"
    )
    task = {**TINY["task"], "rewards": [{"function": f"{reward}:reward", "correct": True}]}
    spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", seeds=[0], arms=[TINY["arms"][0]], task=task)
    r = gspo(["sweep", str(spec), "--executor", "ray"], env)
    assert r.returncode == 1, r.stderr[-3000:]
    failed = [x for x in r.stderr.splitlines() if x.startswith("[grpo/seed0] failed (exit 1)")]
    assert failed and failed[0].endswith("RuntimeError: reward service unreachable"), r.stderr[-3000:]
