"""rollout.staleness k: a worker process samples step s+k's batch from the weights after step
s-1 while step s trains (k = 1 and 4 here). pi_old must be that stale sampler, a resumed run
(after SIGTERM, or kill -9) must equal an uninterrupted one, and the worker must never outlive
the run."""

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
    "train": {"steps": 4, "checkpoint_every": 0, "eval_every": 2, "log_samples_every": 1},
}
# staleness 4: six steps, so that two of them train batches four versions old.
RAW4 = {**RAW, "rollout": {**RAW["rollout"], "staleness": 4}, "train": {**RAW["train"], "steps": 6}}
RAWS = {1: RAW, 4: RAW4}


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
def references(tmp_path_factory):
    """k -> (result, RunDir) of the uninterrupted run at staleness k, trained once on first use."""
    done = {}

    def get(k):
        if k not in done:
            out = tmp_path_factory.mktemp(f"stale-ref{k}")
            (res,) = train_experiment(spec_from_dict({**RAWS[k], "output_dir": str(out)}), reporter=quiet_reporter())
            done[k] = res, RunDir(out / "e2e/grpo_rr/seed0")
        return done[k]

    return get


@pytest.fixture(scope="module")
def reference(references):
    return references(1)


def test_split_threads():
    assert split_threads(1) == (1, 1)
    assert split_threads(2) == (1, 1)
    assert split_threads(3) == (2, 1)
    assert split_threads(16) == (8, 8)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4])
def test_staleness_k_trains_and_leaves_no_worker(references, k):
    res, rd = references(k)
    assert res.status == "completed"
    metrics = rd.metrics()
    steps = RAWS[k]["train"]["steps"]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    # Steps 1..k train batches of the initial weights (lag 0..k-1); every later one is k versions stale.
    lags = [min(s - 1, k) for s in range(1, steps + 1)]
    assert [m["rollout/staleness"] for m in metrics] == lags
    assert [m["rollout/staleness_max"] for m in metrics] == lags
    assert [m["rollout/staleness_mean"] for m in metrics] == [float(x) for x in lags]
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
        assert m["perf/rollout_wait_s"] >= 0 and m["time/rollout_s"] > 0
    # Steps 1..steps-k copy the weights for step s+k's batch (a few ms); later ones request nothing.
    syncs = [m["time/weight_sync_s"] > 0 for m in metrics]
    assert syncs == [s <= steps - k for s in range(1, steps + 1)]
    versions = {(r["step"], r["policy_version"]) for r in rd.samples()}
    assert versions == {(s, max(0, s - 1 - k)) for s in range(1, steps + 1)}
    # The log-prob check at step 1 compares the sampler with a full forward of its own weights.
    assert metrics[0]["rollout/logprob_diff_max"] < 1e-4
    assert not multiprocessing.active_children()
    assert worker_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4])
def test_sigterm_then_resume_is_identical(tmp_path, references, k):
    _, ref_rd = references(k)
    spec = spec_from_dict({**RAWS[k], "output_dir": str(tmp_path)})
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    rd = RunDir(tmp_path / "e2e/grpo_rr/seed0")
    with pytest.raises(InterruptedRun, match="stopped by SIGTERM after step 2"):
        train_run(spec, spec.arms[0], 0, task, source, reporter=quiet_reporter(), stop=TripAfter(rd, 2))
    assert rd.status() == "interrupted" and rd.latest_checkpoint().name == "step_000002"
    assert worker_children() == []
    state = torch.load(rd.latest_checkpoint() / "trainer_state.pt", weights_only=False)
    # The batches of steps 3 .. 2+k: k = 1, step 3's, sampled by the weights after step 1; k = 4,
    # steps 3-5 requested at step 1 (the initial weights), step 6's at step 2 (after step 1).
    pending = state[stale_mod.CHECKPOINT_KEY]
    want = [(3, 1)] if k == 1 else [(3, 0), (4, 0), (5, 0), (6, 1)]
    assert [(p["step"], p["version"]) for p in pending] == want
    assert all(p["batch"] is not None and len(p["problems"]) == 4 for p in pending)
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
def test_kill_9_then_resume_at_staleness_4_is_identical(tmp_path, references):
    """SIGKILL leaves no checkpoint of its own: `--resume` continues from the last scheduled one
    (after step 2, holding the batches of steps 3-6) and ends as the uninterrupted run did."""
    _, ref_rd = references(4)
    raw = {**RAW4, "output_dir": str(tmp_path / "out"), "train": {**RAW4["train"], "checkpoint_every": 2}}
    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    rd = RunDir(tmp_path / "out/e2e/grpo_rr/seed0")
    cmd = [sys.executable, "-m", "gspo_cli", "train", str(spec_file), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while len(rd.metrics()) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal landed")
    assert proc.returncode == -9 and rd.latest_checkpoint().name == "step_000002"
    deadline = time.time() + 10  # the worker dies with its parent (PR_SET_PDEATHSIG)
    while group_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert group_processes(proc.pid) == []
    resume = [sys.executable, "-m", "gspo_cli", "train", "--resume", str(rd.path), "--quiet"]
    rerun = subprocess.run(resume, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert rd.info()["resumes"] == 1
    assert strip(rd.metrics()) == strip(ref_rd.metrics())
    assert [e["scores"] for e in rd.evals()] == [e["scores"] for e in ref_rd.evals()]


@pytest.mark.slow
def test_a_dying_worker_with_k_batches_in_flight_ends_every_thread(tmp_path):
    """Staleness 3: the worker dies with three requests outstanding; the step fails in one
    line, every scoring thread ends, nothing is left behind."""
    raw = {**RAW, "output_dir": str(tmp_path), "rollout": {**RAW["rollout"], "staleness": 3}}
    spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    ctx = setup(spec, spec.arms[0], 0, task, source)
    with StaleRollouts(ctx, source=source, seed=0) as stale:
        os.kill(stale.sampler.proc.pid, 9)
        with pytest.raises(RunError, match="exited unexpectedly with code -9"):
            stale.step(ctx, 1)
        threads = [t.thread for t in stale.scoring.values()]
        assert len(threads) == 3
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert worker_children() == []


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
@pytest.mark.parametrize("k", [1, 3])
def test_killed_worker_is_a_run_error_not_a_hang(tmp_path, k):
    spec = spec_from_dict({**RAW, "output_dir": str(tmp_path)})
    args = WorkerArgs(source=tiny_model_dir(), model_cfg=spec.model, rollout_cfg=spec.rollout, seed=0, threads=1)
    with AsyncSampler(args, {}, slots=k) as sampler:
        os.kill(sampler.proc.pid, 9)
        for step in range(1, k + 1):  # k requests outstanding, from one published version
            sampler.request(step, 0, ["1+1="], check=False)
        with pytest.raises(RuntimeError, match="requests outstanding already"):
            sampler.request(k + 1, 0, ["1+1="], check=False)
        with pytest.raises(RuntimeError, match="outstanding request reads"):
            sampler.publish({}, version=k)  # slot k % k = 0, still read by the requests
        with pytest.raises(RunError, match="exited unexpectedly with code -9"):
            sampler.wait()
    assert worker_children() == []


def test_unsupported_combinations_are_spec_errors():
    with pytest.raises(SpecError, match=r"rollout.staleness: 9 is above 8: the worker holds one copy of the weights"):
        spec_from_dict({**RAW, "rollout": {**RAW["rollout"], "staleness": 9}})  # above MAX_STALENESS, and why
    assert spec_from_dict(RAW4).rollout.staleness == 4
    with pytest.raises(SpecError, match="staleness: 4 .* engine: vllm"):
        spec_from_dict({**RAW4, "rollout": {**RAW4["rollout"], "engine": "vllm"}})
    with pytest.raises(SpecError, match="staleness: 1 .* engine: vllm"):
        spec_from_dict({**RAW, "rollout": {**RAW["rollout"], "engine": "vllm"}})
    arm = {**RAW["arms"][0], "mismatch": {"mode": "token_tis"}}
    with pytest.raises(SpecError, match=r"arms\[0\].mismatch.mode: .*staleness"):
        spec_from_dict({**RAW, "arms": [arm]})
    spec = spec_from_dict(RAW)
    check_supported(spec, 1)
    with pytest.raises(SpecError, match="rollout.staleness: 1 is not supported with several processes"):
        check_supported(spec, 2)
    with pytest.raises(SpecError, match="rollout.staleness: 4 is not supported with several processes"):
        check_supported(spec_from_dict(RAW4), 2)
    check_supported(spec_from_dict(TINY), 2)  # staleness 0: anything goes
