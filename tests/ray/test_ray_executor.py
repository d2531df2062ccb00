"""`--executor ray` on a local Ray cluster: the tiny sweep and 2 rounds of --until-decided give the
local executor's metrics and decision; `gspo tune` trains its tuning and final rounds as Ray tasks; a
failing run is reported with its log's last line, Ctrl-C stops the runs with a checkpoint and
leaves no process behind, and the rerun resumes them; `--address` trains on a cluster started
beforehand with `ray start --head` and leaves it running."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _rows(path: Path) -> list[dict]:
    """A metrics or eval file's records less wall times and memory (the machine's, not the run's)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/")) and k != "time_s"} for r in rows]


def test_a_tiny_sweep_through_ray_has_the_local_executors_metrics(tmp_path, env, tiny_spec, gspo):
    compared = {"baseline": "grpo", "arm": "gspo"}  # analysis only: for --until-decided below
    on_ray = tiny_spec(tmp_path / "ray.yaml", tmp_path / "ray", comparison=compared)
    r = gspo(["sweep", str(on_ray), "--executor", "ray", "--json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(x["run"], x["seed"], x["status"]) for x in json.loads(r.stdout)] == [
        ("grpo", 0, "completed"),
        ("gspo", 0, "completed"),  # seed by seed, as the plan orders them
        ("grpo", 1, "completed"),
        ("gspo", 1, "completed"),
    ]
    local = tiny_spec(tmp_path / "local.yaml", tmp_path / "local", comparison=compared)
    r = gspo(["sweep", str(local), "--jobs", "2", "-q"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    for arm in ("grpo", "gspo"):
        for seed in (0, 1):
            a, b = (tmp_path / where / "tiny" / arm / f"seed{seed}" for where in ("local", "ray"))
            assert _rows(a / "metrics.jsonl") == _rows(b / "metrics.jsonl"), (arm, seed)
            assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl"), (arm, seed)

    # --until-decided, 2 looks: seeds 0 and 1 are there (skipped), the second round trains seed 2
    # as Ray tasks and decides as the local executor does
    decided = ["--until-decided", "--max-seeds", "3"]
    r = gspo(["sweep", str(on_ray), "--executor", "ray", *decided], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("already completed; skipping") == 8  # seeds 0-1 in the first round, again in the second
    r = gspo(["sweep", str(local), "--jobs", "2", *decided], env)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (json.loads((tmp_path / where / "tiny/until_decided.json").read_text()) for where in ("local", "ray"))
    assert len(a["looks"]) == 2 and a == b
    assert (tmp_path / "ray/tiny/gspo/seed2/eval.jsonl").exists()


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


def _steps(run: Path) -> list[int]:
    try:
        return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return []


def test_ctrl_c_stops_the_runs_with_a_checkpoint_leaves_no_process_and_a_rerun_resumes(tmp_path, env, tiny_spec, gspo):
    import signal
    import subprocess
    import sys
    import time

    import psutil
    from helpers import TINY

    spec = tiny_spec(
        tmp_path / "s.yaml",
        tmp_path / "out",
        seeds=[0],
        arms=[TINY["arms"][0]],
        train={"steps": 300, "checkpoint_every": 2, "eval_every": 0},
    )
    run = tmp_path / "out/tiny/grpo/seed0"
    cmd = [sys.executable, "-m", "gspo_cli", "sweep", str(spec), "--executor", "ray"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not (len(_steps(run)) >= 6 and list((run / "checkpoints").glob("*"))) and time.time() - t0 < 240:
            time.sleep(0.2)
        started = psutil.Process(first.pid).children(recursive=True)
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 4, err[-3000:]
    assert "stopping (Ctrl-C): cancelling 1 task(s)" in err
    time.sleep(2)
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline()[:4] for p in left]  # Ray's processes and the run: all gone
    files = str(tmp_path / "out/tiny/.ray")  # the run's `gspo train` reads its spec from there
    assert not [p for p in psutil.process_iter(["cmdline"]) if files in " ".join(p.info["cmdline"] or [])]
    stopped_at = max(_steps(run))
    assert stopped_at < 300

    r = gspo(["sweep", str(spec), "--executor", "ray"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info.get("resumes") == 1, info


def test_address_trains_on_a_running_cluster_and_leaves_it_running(tmp_path, env, tiny_spec, gspo):
    """`--address HOST:PORT`: the runs are tasks of a cluster started beforehand with `ray start
    --head` (their `gspo train` processes are its workers' children; the command starts no Ray of
    its own), with the command's model cache; the cluster still runs afterwards."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    import psutil
    from helpers import TINY

    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip(f"no ray command beside {sys.executable} (the ray extra installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head_log = tmp_path / "head.log"
    own_cache = tmp_path / "head-cache"  # the cluster's own: the runs must use the command's instead
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false"]
        + ["--block"],
        env={**env, "GSPO_CACHE_DIR": str(own_cache)},
        stdout=open(head_log, "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        t0 = time.time()
        while "will now block" not in head_log.read_text() and time.time() - t0 < 120 and head.poll() is None:
            time.sleep(0.5)
        assert head.poll() is None and "will now block" in head_log.read_text(), head_log.read_text()[-2000:]
        cluster = psutil.Process(head.pid)

        spec = tiny_spec(tmp_path / "s.yaml", tmp_path / "out", arms=[TINY["arms"][0]])
        address = f"127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "gspo_cli",
            "sweep",
            str(spec),
            "--executor",
            "ray",
            "--address",
            address,
            "--json",
        ]
        sweep = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        own, trained_by_cluster = set(), set()
        while sweep.poll() is None:
            for p in psutil.Process(sweep.pid).children(recursive=True):
                own.add(_name(p))
            for p in cluster.children(recursive=True):  # a run's `gspo train SPEC`: its spec file
                line = _cmdline(p)
                if "gspo_cli" in line and "train" in line:
                    trained_by_cluster.add(line[line.index("train") + 1])
            time.sleep(0.3)
        out, err = sweep.communicate(timeout=60)
        assert sweep.returncode == 0, err[-3000:]
        assert f"ray: the cluster at {address}, 2 CPU(s)" in err
        assert [(x["run"], x["seed"], x["status"]) for x in json.loads(out)] == [
            ("grpo", 0, "completed"),
            ("grpo", 1, "completed"),
        ]
        assert len(trained_by_cluster) == 2, trained_by_cluster  # both runs' processes: the cluster's
        assert not own & {"raylet", "gcs_server"}, own  # no Ray of the command's own
        assert not own_cache.exists() or not any(own_cache.iterdir())  # the command's cold start served them
        assert head.poll() is None and cluster.children()  # the cluster goes on
    finally:
        members = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        _, alive = psutil.wait_procs(members, timeout=60)
        for p in alive:
            p.kill()
        head.wait(timeout=60)
    assert not alive, [p.pid for p in alive]


def _name(p) -> str:
    try:
        return p.name()
    except Exception:  # gone meanwhile
        return ""


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:
        return []


def test_tune_trains_its_tuning_and_final_rounds_as_ray_tasks_and_a_resume_trains_nothing(tmp_path, env, gspo):
    from helpers import TINY, tiny_tune_spec

    spec = tiny_tune_spec(
        tmp_path / "tune.yaml",
        tmp_path / "out",
        model={**TINY["model"], "cold_start": {"steps": 20, "batch_size": 32, "lr": 1e-2}},
        executor={"kind": "ray", "ray": {"num_cpus": 1}},
    )
    r = gspo(["tune", str(spec)], env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    root = tmp_path / "out/tune"
    assert r.stderr.count("ray: a local cluster") == 2, r.stderr[-3000:]  # the tuning round, then the final one
    runs = sorted(p.parent for p in root.glob("*/*/seed*/run.json"))
    assert [str(p.relative_to(root)) for p in runs] == [
        "final/grpo/seed0", "final/grpo/seed1", "final/gspo/seed0", "final/gspo/seed1",
        "tuning/grpo,clip_high=0.2/seed100", "tuning/grpo,clip_high=0.3/seed100",
        "tuning/gspo,clip_high=0.0003/seed100", "tuning/gspo,clip_high=0.0006/seed100",
    ]  # fmt: skip
    for run in runs:
        assert json.loads((run / "run.json").read_text())["status"] == "completed", run
    state = json.loads((root / "tune_state.json").read_text())
    assert state["next"] == "report" and len(state["tuning"]) == 4 and len(state["final"]) == 4
    assert state["selected"] == json.loads((root / "tune.json").read_text())["selected"]

    again = gspo(["tune", str(spec), "--resume"], env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("already completed; skipping") == 8
    assert f"resuming the tune: both rounds completed ({root / 'tune_state.json'})" in again.stderr
