"""vLLM under torchrun: one engine per process (vLLM's external launcher), each sampling its
own share of the groups, synced from its own copy of the weights every step, closed at the
end of each run without ending the trainer's process group."""

import json
import subprocess
import sys

import pytest
import yaml
from vllm_tiny import TINY

from gspo_cli.errors import SpecError
from gspo_cli.rollout import make_engine
from gspo_cli.runs import RunDir
from gspo_cli.spec import RolloutConfig

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def test_two_processes_train_with_an_engine_each(tmp_path, tiny_source):
    """Two arms one after the other: the second run builds new engines after the first run's
    were closed, which fails if closing an engine destroyed the trainer's process group.
    Evaluation samples on rank 0 alone while rank 1 waits: an engine that waited for the
    other process's engine would hang here (the timeout)."""
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "arms": [
            {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
            {"name": "grpo", "preset": "paper-grpo", "mini_batches": 2},
        ],
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    res = subprocess.run(
        TORCHRUN + ["-m", "gspo_cli", "train", str(spec), "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["arm"], r["status"]) for r in json.loads(res.stdout)] == [("gspo", "completed"), ("grpo", "completed")]
    for arm in ("gspo", "grpo"):
        rd = RunDir(tmp_path / "out" / "vllm" / arm / "seed0")
        metrics = rd.metrics()
        assert [m["step"] for m in metrics] == [1, 2]
        for m in metrics:
            # The max over both processes of |engine - trainer| log-prob: each engine samples
            # from its trainer's weights of that step, step 2 after an update (a stale engine
            # gives 1e-2 or more; see test_vllm_engine).
            assert m["rollout/logprob_diff_max"] < 1e-4, (arm, m)
            assert m["response/length_mean"] > 1
        assert [e["step"] for e in rd.evals()] == [0, 2]


def test_sharded_weights_are_refused_with_one_line():
    """FSDP keeps 1/world of the weights per process; a colocated engine per process would
    need them gathered on every process every step (not built yet)."""
    with pytest.raises(SpecError, match="model.sharding: fsdp is not supported") as err:
        make_engine(RolloutConfig(**TINY["rollout"]), None, None, model_dir="unused", synced=True)
    assert "\n" not in str(err.value)
