"""rollout.staleness 1: a worker process samples step k+1's batch from the weights after step
k-1 while step k trains. pi_old must be that stale sampler, a resumed run must equal an
uninterrupted one, and the worker must never outlive the run."""

import copy
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
import yaml
from helpers import TINY, max_gap, models_in_float64, tiny_model_dir
from safetensors.torch import load_file

from gspo_cli.errors import InterruptedRun, RunError, SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.rollout import response_logprobs
from gspo_cli.rollout.async_worker import AsyncSampler, WorkerArgs
from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train import staleness as stale_mod
from gspo_cli.train.loop import StopFlag, train_experiment, train_run
from gspo_cli.train.reporting import quiet_reporter
from gspo_cli.train.staleness import StaleRollouts, check_supported, split_threads
from gspo_cli.train.step import setup

# grpo_rr: an MoE arm with routing replay r2, so pi_old's routes come from the worker too.
RAW = {
    **TINY,
    "arms": [TINY["arms"][1]],
    "rollout": {**TINY["rollout"], "staleness": 1},
    "train": {"steps": 4, "checkpoint_every": 0, "eval_every": 2},
}


def strip(records):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in records]


def worker_children() -> list[psutil.Process]:
    """Live children of this process started by multiprocessing's spawn (our workers; the
    resource tracker, started the same way, runs a different entry point)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and any("spawn_main" in a for a in child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


class TripAfter(StopFlag):
    """Acts like a SIGTERM that arrives during step `n`."""

    def __init__(self, rd, n):
        super().__init__()
        self.rd, self.n = rd, n

    def __bool__(self):
        if len(self.rd.metrics()) >= self.n:
            self.signal_name = "SIGTERM"
        return self.signal_name is not None


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("stale-ref")
    (res,) = train_experiment(spec_from_dict({**RAW, "output_dir": str(out)}), reporter=quiet_reporter())
    rd = RunDir(out / "e2e/grpo_rr/seed0")
    return res, rd


def test_split_threads():
    assert split_threads(1) == (1, 1)
    assert split_threads(2) == (1, 1)
    assert split_threads(3) == (2, 1)
    assert split_threads(16) == (8, 8)


@pytest.mark.slow
def test_staleness_one_trains_and_leaves_no_worker(reference):
    res, rd = reference
    assert res.status == "completed"
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # Step 1's batch comes from the initial weights it trains; every later one is one step stale.
    assert [m["rollout/staleness"] for m in metrics] == [0, 1, 1, 1]
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
        assert m["perf/rollout_wait_s"] >= 0 and m["time/rollout_s"] > 0
    # Steps 1-3 copy the weights for the next step's batch (a few ms); the last step has no next batch.
    assert all(m["time/weight_sync_s"] > 0 for m in metrics[:3]) and metrics[3]["time/weight_sync_s"] == 0
    # The log-prob check at step 1 compares the sampler with a full forward of its own weights.
    assert metrics[0]["rollout/logprob_diff_max"] < 1e-4
    assert not multiprocessing.active_children()
    assert worker_children() == []


@pytest.mark.slow
def test_sigterm_then_resume_is_identical(tmp_path, reference):
    _, ref_rd = reference
    spec = spec_from_dict({**RAW, "output_dir": str(tmp_path)})
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    rd = RunDir(tmp_path / "e2e/grpo_rr/seed0")
    with pytest.raises(InterruptedRun, match="stopped by SIGTERM after step 2"):
        train_run(spec, spec.arms[0], 0, task, source, reporter=quiet_reporter(), stop=TripAfter(rd, 2))
    assert rd.status() == "interrupted" and rd.latest_checkpoint().name == "step_000002"
    assert worker_children() == []
    state = torch.load(rd.latest_checkpoint() / "trainer_state.pt", weights_only=False)
    pending = state[stale_mod.CHECKPOINT_KEY]  # step 3's batch, sampled by the weights after step 1
    assert (pending["step"], pending["version"]) == (3, 1)
    (res,) = train_experiment(spec, reporter=quiet_reporter())
    assert res.status == "completed" and rd.info()["resumes"] == 1
    assert strip(rd.metrics()) == strip(ref_rd.metrics())
    assert rd.evals() and [e["scores"] for e in rd.evals()] == [e["scores"] for e in ref_rd.evals()]
    final, ref_final = (load_file(r.latest_checkpoint() / "model.safetensors") for r in (rd, ref_rd))
    assert final.keys() == ref_final.keys()
    assert all(torch.equal(final[k], ref_final[k]) for k in final)
    assert worker_children() == []


def group_processes(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


@pytest.mark.slow
def test_ctrl_c_of_the_cli_stops_cleanly_then_resumes(tmp_path, reference):
    """Ctrl-C reaches the whole process group, worker included: the trainer still checkpoints
    and exits 4, nothing of the group survives, and the rerun finishes as if never stopped."""
    _, ref_rd = reference
    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(yaml.safe_dump({**RAW, "output_dir": str(tmp_path / "out")}))
    rd = RunDir(tmp_path / "out/e2e/grpo_rr/seed0")
    cmd = [sys.executable, "-m", "gspo_cli", "train", str(spec_file), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while len(rd.metrics()) < 1 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal landed")
    assert proc.returncode == 4, err
    assert "stopped by SIGINT" in err and "Traceback" not in err
    deadline = time.time() + 10  # the worker exits on its own once its parent is gone
    while group_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert group_processes(proc.pid) == []
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert strip(rd.metrics()) == strip(ref_rd.metrics())


@pytest.mark.slow
def test_pi_old_is_the_stale_sampling_policy(tmp_path, monkeypatch):
    """Step 2 trains a batch sampled by the initial weights: its pi_old equals a full forward
    of those weights (and the worker's check forward), not one of the weights after step 1."""
    raw = {**RAW, "output_dir": str(tmp_path), "rollout": {**RAW["rollout"], "logprob_check_every": 1}}
    spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    ctx = setup(spec, spec.arms[0], 0, task, source)
    seen = []  # (batch, the weights that trained it before its updates)
    real_learn = stale_mod.learn

    def spy(ctx_, batch, scores, step, **kw):
        seen.append((batch, copy.deepcopy(ctx_.model.state_dict())))
        return real_learn(ctx_, batch, scores, step, **kw)

    monkeypatch.setattr(stale_mod, "learn", spy)
    with StaleRollouts(ctx, source=source, seed=0) as stale:
        m1 = stale.step(ctx, 1)
        m2 = stale.step(ctx, 2)
    assert (m1["rollout/staleness"], m2["rollout/staleness"]) == (0, 1)
    (_, w0), (batch, w1) = seen
    mask = batch.response_mask > 0
    model = ctx.model

    def forward(weights):
        model.load_state_dict(weights)
        with torch.no_grad():
            return response_logprobs(model, batch, spec.rollout.temperature).logp

    stale_logp, current_logp = forward(w0), forward(w1)
    # The worker samples with its own float32 model: the floor is the same forward in float64,
    # and the worker's log-probs (sampled, and its check forward) are within 10x of it.
    models_in_float64(model)
    floor = max_gap(stale_logp[mask], forward(w0)[mask])
    assert 0 < floor < 1e-5, floor
    assert max_gap(batch.engine_logp[mask], stale_logp[mask]) <= 10 * floor
    assert max_gap(batch.check_logp[mask], stale_logp[mask]) <= 10 * floor
    # The update between them moved these log-probs well beyond that tolerance.
    assert (batch.engine_logp - current_logp).abs()[mask].max().item() > 1e-3
    assert m2["rollout/logprob_diff_max"] <= 10 * floor
    assert worker_children() == []


def test_worker_failure_is_one_line_run_error(tmp_path):
    spec = spec_from_dict({**RAW, "output_dir": str(tmp_path)})
    args = WorkerArgs(
        source=str(tmp_path / "no-model"), model_cfg=spec.model, rollout_cfg=spec.rollout, seed=0, threads=1
    )
    with AsyncSampler(args, {"w": torch.zeros(2)}) as sampler:
        sampler.request(1, 0, ["1+1="], check=False)
        with pytest.raises(RunError, match=r"rollout worker .* failed: SpecError: model.name: .*no-model") as err:
            sampler.wait()
        assert "\n" not in str(err.value)
    assert worker_children() == []


@pytest.mark.slow
def test_killed_worker_is_a_run_error_not_a_hang(tmp_path):
    spec = spec_from_dict({**RAW, "output_dir": str(tmp_path)})
    args = WorkerArgs(source=tiny_model_dir(), model_cfg=spec.model, rollout_cfg=spec.rollout, seed=0, threads=1)
    with AsyncSampler(args, {}) as sampler:
        os.kill(sampler.proc.pid, 9)
        sampler.request(1, 0, ["1+1="], check=False)
        with pytest.raises(RunError, match="exited unexpectedly with code -9"):
            sampler.wait()
    assert worker_children() == []


def test_unsupported_combinations_are_spec_errors():
    with pytest.raises(SpecError, match="rollout.staleness"):
        spec_from_dict({**RAW, "rollout": {**RAW["rollout"], "staleness": 2}})
    with pytest.raises(SpecError, match="staleness: 1 .* engine: vllm"):
        spec_from_dict({**RAW, "rollout": {**RAW["rollout"], "engine": "vllm"}})
    arm = {**RAW["arms"][0], "mismatch": {"mode": "token_tis"}}
    with pytest.raises(SpecError, match=r"arms\[0\].mismatch.mode: .*staleness"):
        spec_from_dict({**RAW, "arms": [arm]})
    spec = spec_from_dict(RAW)
    check_supported(spec, 1)
    with pytest.raises(SpecError, match="rollout.staleness: 1 is not supported with several processes"):
        check_supported(spec, 2)
    check_supported(spec_from_dict(TINY), 2)  # staleness 0: anything goes
