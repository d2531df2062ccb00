"""task.reward_workers: reward functions in a pool of spawned worker processes, time-outs,
crashes, async rewards, and scoring overlapped with sampling."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import yaml
from helpers import TINY, tiny_model_dir
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import RunError
from gspo_cli.models.builtin import build_config, build_tokenizer
from gspo_cli.rewards import pool as reward_pool
from gspo_cli.rewards import with_rewards
from gspo_cli.rewards.pool import RewardPool, auto_workers, running
from gspo_cli.rollout import HFRolloutEngine
from gspo_cli.runs import RunDir
from gspo_cli.spec import BuiltinModelConfig, RewardConfig
from gspo_cli.tasks import make_task
from gspo_cli.train.scored_rollout import sample_and_score

ROOT = Path(__file__).resolve().parents[1]

REWARDS = '''
import asyncio, os, subprocess, sys, time

def shape(completions, completion_ids, prompts, kind, trainer_state, **kwargs):
    # deterministic per row: lengths, a column and the step, in distinct digits
    return [len(c) + 0.01 * len(i) + (0.5 if k == "a" else 0.0) + 1000 * trainer_state.global_step
            if k != "b" else None for c, i, k in zip(completions, completion_ids, kind)]

def first_char(completions, prompts, **kwargs):
    return [float(ord(c[0])) if c else float("nan") for c in completions]

def sleepy(completions, **kwargs):
    time.sleep(0.05 * len(completions))
    return [1.0] * len(completions)

def hang(completions, **kwargs):
    time.sleep(3600)

def boom(completions, prompts, **kwargs):
    for p in prompts:
        if p.startswith("Row 7"):
            raise ValueError("cannot judge row seven\\nsecond line")
    return [0.0] * len(completions)

async def slow_async(completions, **kwargs):
    for _ in completions:  # one row at a time within a call: only concurrent calls are fast
        await asyncio.sleep(0.2)
    return [float(len(c)) for c in completions]

def slow_once(completions, **kwargs):
    # the first call ever (seed 0's first step) outlasts the time-out; every later one is quick
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_once.done")
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(3600)
    return [float(ord(c[0])) if c else 0.0 for c in completions]

def rank(completions, **kwargs):
    # looks across its call, as a batch-wide reward does: each completion's rank by length
    order = sorted(range(len(completions)), key=lambda i: (len(completions[i]), completions[i]))
    out = [0.0] * len(completions)
    for r, i in enumerate(order):
        out[i] = float(r)
    return out

def pair(completions, **kwargs):
    return [1.0, 0.0]

async def call_size(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(completions))] * len(completions)

def as_dict(completions, **kwargs):
    return {5 + i: 1.0 for i in range(len(completions))}

def huge(completions, **kwargs):
    return [10**400 for _ in completions]

def overflowing(completions, **kwargs):
    return [1e308 for _ in completions]

def bye(completions, **kwargs):
    sys.exit(3)

def shouting(completions, **kwargs):
    raise ValueError("x" * 5_000_000)

def late_boom(completions, prompts, **kwargs):
    time.sleep(1.2)  # over half of the 2 s time-out: finding the row alone would outlast it
    if any(p.startswith("Row 1:") for p in prompts):
        raise ValueError("row one is bad")
    return [0.0] * len(completions)

def starts_sleep(completions, **kwargs):
    subprocess.Popen(["sleep", "7771"])  # never waited for
    return [1.0] * len(completions)

def runs_sleep(completions, **kwargs):
    subprocess.run(["sleep", "7772"])  # outlasts the call's time-out
    return [1.0] * len(completions)

def chatty(completions, **kwargs):
    print("chatty says hello")
    sys.stdout.flush()
    os.write(1, b"chatty writes to fd 1\\n")
    subprocess.run(["echo", "chatty runs echo"], check=True)
    return [1.0] * len(completions)

def exits(completions, trainer_state, **kwargs):
    if trainer_state.global_step == 2:
        os._exit(3)
    return [1.0 if "4" in c else 0.0 for c in completions]
'''


@pytest.fixture
def data(tmp_path):
    (tmp_path / "rewards.py").write_text(REWARDS)
    rows = [{"prompt": f"Row {i}: {i}+1?", "kind": "abc"[i % 3], "solution": f"{i + 1}"} for i in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def task_of(tmp_path, *names):
    cfgs = [RewardConfig(function=f"{tmp_path / 'rewards.py'}:{n}") for n in names]
    return with_rewards(make_task("prompts", {"source": str(tmp_path / "train.jsonl")}), cfgs)


def worker_pids() -> list[int]:
    """Live reward workers of this process (spawned children running the pool's worker)."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and any("spawn_main" in a for a in child.cmdline()):
                out.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def rows_of(task, n):
    problems = task.eval_problems(40)
    rows = [problems[i % len(problems)] for i in range(n)]
    completions = [f"{'x' * (i % 5)}{i}" for i in range(n)]
    return rows, completions


def test_auto_size_is_the_cores_torch_leaves_at_most_8():
    assert auto_workers(16, 4, omp_set=False) == 8  # 12 left, capped
    assert auto_workers(16, 13, omp_set=False) == 3
    assert auto_workers(2, 2, omp_set=False) == 1  # none left: still one (time-outs, crash isolation)
    assert auto_workers(16, 4, omp_set=True) == 1  # sweep --jobs 4: 4 cores per run, all torch's
    assert auto_workers(16, 2, omp_set=True) == 1  # --jobs 8


def test_pool_scores_equal_in_process_scores_in_order(data):
    task = task_of(data, "shape", "first_char")
    rows, completions = rows_of(task, 37)
    ids = [[ord(ch) % 7 for ch in c] + [1] for c in completions]
    want = task.score_rollout(rows, completions, ids, step=3)
    with running(3, 60) as pool:
        assert len(pool.pids()) == 3
        got = task.score_rollout(rows, completions, ids, step=3)
    with running(3, 60, chunks=True):
        # rows handed over out of order as they are sampled, the rest at the end
        scoring = task.scoring(rows, 3)
        scoring.add([30, 2, 5], [completions[i] for i in (30, 2, 5)], [ids[i] for i in (30, 2, 5)])
        scoring.add([36], [completions[36]], [ids[36]])
        streamed = scoring.finish(completions, ids)
        # a burst of rows (many stop at the same decode step) is spread over the workers
        scoring = task.scoring(rows, 3)
        scoring.add(list(range(30)), completions[:30], ids[:30])
        assert [len(r) for _, r, _ in scoring.calls] == [13, 13, 13, 13, 4, 4]  # ceil(37 / 3) rows a call, both rewards
        burst = scoring.finish(completions, ids)
        # a row handed over with another text than the batch's is scored again
        scoring = task.scoring(rows, 3)
        scoring.add([4], ["changed"], [[9]])
        redone = scoring.finish(completions, ids)
    for scores in (got, streamed, burst, redone):
        assert [(s.reward, s.components, s.correct, s.rewarded) for s in scores] == [
            (s.reward, s.components, s.correct, s.rewarded) for s in want
        ]
    # hand-checked rows: "0" (kind a, 2 ids), row 1 kind b (shape: None)
    assert want[0].components == {"shape": 1 + 0.02 + 0.5 + 3000, "first_char": 48.0}
    assert want[1].components == {"first_char": float(ord("x"))}


def test_four_workers_score_a_sleeping_reward_in_chunks_in_under_half_the_serial_time(data):
    task = task_of(data, "sleepy")
    rows, completions = rows_of(task, 64)
    with running(4, 60, chunks=True):
        task.score_rollout(rows[:4], completions[:4])  # the workers have imported the file
        t = time.time()
        scores = task.score_rollout(rows, completions)
        took = time.time() - t
    assert [s.reward for s in scores] == [1.0] * 64
    assert took < 0.5 * 64 * 0.05, took  # serial: 3.2 s; 4 workers: ~0.8 s


def test_a_hung_reward_times_out_in_one_line_and_its_worker_is_killed(data):
    task = task_of(data, "hang")
    rows, completions = rows_of(task, 2)
    with running(1, 2.0) as pool:
        pid = pool.pids()[0]
        t = time.time()
        with pytest.raises(RunError) as err:
            task.score_rollout(rows, completions)
        took = time.time() - t
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        msg = str(err.value)
        assert "reward hang took more than 2 s (task.reward_timeout_s)" in msg
        assert "the first whose prompt starts 'Row 0: 0+1?'" in msg and "\n" not in msg
        assert took < 2.0 + 8, took  # the import of the file, the time-out, a poll
        # the pool starts a fresh worker for the next call
        task = task_of(data, "first_char")
        assert [s.reward for s in task.score_rollout(rows, ["a", "b"])] == [97.0, 98.0]
    assert worker_pids() == []


@pytest.mark.parametrize(
    "name, message",
    [
        ("as_dict", "reward as_dict returned dict, not a list of 4 numbers"),
        (
            "huge",
            "reward huge returned a number too large for a float (int), not a finite number or None, for the row "
            "whose prompt starts 'Row 0: 0+1?'",
        ),
        ("overflowing", "the weighted rewards of the row whose prompt starts 'Row 0: 0+1?' sum to inf"),
        (
            "bye",
            "reward bye raised on the row whose prompt starts 'Row 0: 0+1?': SystemExit: the function called "
            "sys.exit(3)",
        ),
        ("shouting", "reward shouting raised on the row whose prompt starts 'Row 0: 0+1?': ValueError: xxxxx"),
    ],
)
def test_odd_values_and_exits_end_in_one_bounded_line_in_the_pool_and_the_trainer(data, name, message):
    task = task_of(data, name, "first_char") if name == "overflowing" else task_of(data, name)
    if name == "overflowing":  # 1e308 weighted twice: beyond a float
        task.rewards[0] = dataclasses.replace(task.rewards[0], weight=2.0)
    rows, completions = rows_of(task, 4)
    with pytest.raises(RunError) as inline:
        task.score_rollout(rows, completions)
    with running(2, 60), pytest.raises(RunError) as pooled:
        task.score_rollout(rows, completions)
    assert str(inline.value) == str(pooled.value)
    assert str(inline.value).startswith(message), str(inline.value)[:300]
    assert "\n" not in str(inline.value) and len(str(inline.value)) < 500


def test_a_reward_raising_late_reports_its_exception_not_a_time_out(data):
    task = task_of(data, "late_boom")
    rows, completions = rows_of(task, 2)
    with running(1, 2.0), pytest.raises(RunError) as err:
        task.score_rollout(rows, completions)
    assert str(err.value) == (
        "reward late_boom raised on 2 row(s), the first whose prompt starts 'Row 0: 0+1?' (the row not found "
        "within task.reward_timeout_s): ValueError: row one is bad"
    )


def sleeps(arg: str) -> list[int]:
    """Live `sleep ARG` processes on this machine (zombies and ones gone while listed skipped)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["cmdline"] == ["sleep", arg] and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out


def test_processes_a_reward_starts_end_with_its_worker(data):
    """A reward that leaves a `sleep` running at each call: none is left once the pool stops; a
    reward whose `subprocess.run` outlasts the time-out: its child ends with the killed worker."""
    task = task_of(data, "starts_sleep")
    rows, completions = rows_of(task, 4)
    with running(2, 60):
        for _ in range(3):
            assert [s.reward for s in task.score_rollout(rows, completions)] == [1.0] * 4
        assert len(sleeps("7771")) >= 3  # at least one per call, running while the pool runs
    deadline = time.time() + 5
    while sleeps("7771") and time.time() < deadline:
        time.sleep(0.1)
    assert sleeps("7771") == []
    task = task_of(data, "runs_sleep")
    with running(1, 2.0), pytest.raises(RunError, match="reward runs_sleep took more than 2 s"):
        task.score_rollout(rows, completions)
    deadline = time.time() + 5
    while sleeps("7772") and time.time() < deadline:
        time.sleep(0.1)
    assert sleeps("7772") == []


@pytest.mark.parametrize("workers", [0, 2])
def test_what_a_reward_prints_goes_to_stderr_never_stdout(data, workers, capfd):
    """`gspo train --json` prints its summary on stdout: a reward's print, its writes to file
    descriptor 1 and a program it runs go to stderr, in the pool and in the trainer."""
    task = task_of(data, "chatty")
    rows, completions = rows_of(task, 3)
    with running(workers, 60):
        print("before")
        assert [s.reward for s in task.score_rollout(rows, completions)] == [1.0] * 3
        print("after")
    out, err = capfd.readouterr()
    assert out == "before\nafter\n"
    for line in ("chatty says hello", "chatty writes to fd 1", "chatty runs echo"):
        assert line in err


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_json_on_stdout_stays_json_with_a_printing_reward(data, workers):
    spec = _spec(data, "chatty", task={"reward_workers": workers}, train={"steps": 1})
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "train", str(spec), "-o", str(data / "out"), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["status"] for r in json.loads(res.stdout)] == ["completed"]
    assert "chatty says hello" in res.stderr and "chatty runs echo" in res.stderr


def test_a_raising_reward_keeps_the_one_line_message_naming_the_row(data):
    task = task_of(data, "boom")
    rows, completions = rows_of(task, 12)
    with pytest.raises(RunError) as inline:
        task.score_rollout(rows, completions)
    with running(2, 60), pytest.raises(RunError) as pooled:
        task.score_rollout(rows, completions)
    want = "reward boom raised on the row whose prompt starts 'Row 7: 7+1?': ValueError: cannot judge row seven"
    assert str(inline.value) == str(pooled.value) == want


def test_async_rewards_in_chunks_run_their_rows_concurrently(data):
    task = task_of(data, "slow_async")
    rows, completions = rows_of(task, 32)
    with running(1, 60, chunks=True):
        task.score_rollout(rows[:1], completions[:1])  # the worker has started
        t = time.time()
        scores = task.score_rollout(rows, completions)
        took = time.time() - t
    assert [s.reward for s in scores] == [float(len(c)) for c in completions]
    assert took < 32 * 0.2 / 4, took  # serial: 6.4 s; concurrent: ~0.2 s


@pytest.mark.parametrize("workers", [0, 2])
def test_each_reward_is_called_once_on_the_whole_batch_as_trl_calls_it(data, workers):
    """A reward that looks across its call (a rank by length) gives in the pool what it gives in
    the trainer, and an async def reward is awaited once with every row (TRL's convention)."""
    task = task_of(data, "rank", "call_size")
    rows, completions = rows_of(task, 16)
    sent = []
    with running(workers, 60) as pool:
        if pool is not None:
            submit = pool.submit
            pool.submit = lambda *a: sent.append((a[0], a[4])) or submit(*a)  # (reward, rows)
        scores = task.score_rollout(rows, completions)
    assert sorted(sent) == ([("call_size", 16), ("rank", 16)] if workers else [])
    by_length = sorted(range(16), key=lambda i: (len(completions[i]), completions[i]))
    assert [s.components["rank"] for s in scores] == [float(by_length.index(i)) for i in range(16)]
    assert [s.components["call_size"] for s in scores] == [16.0] * 16


def test_every_call_s_count_is_checked_against_its_own_rows(data):
    """A reward that always returns [1.0, 0.0]: one line naming the rows of the call that got it
    wrong, in the trainer, in the pool, and in chunks whose counts would add up to the batch's."""
    task = task_of(data, "pair")
    rows, completions = rows_of(task, 4)
    with pytest.raises(RunError) as inline:
        task.score_rollout(rows, completions)
    with running(2, 60), pytest.raises(RunError) as pooled:
        task.score_rollout(rows, completions)
    want = "reward pair returned 2 values for the 4 completions it was called on"
    assert str(inline.value) == str(pooled.value) == want
    with running(1, 60, chunks=True), pytest.raises(RunError) as chunked:
        scoring = task.scoring(rows, 0)
        scoring.add([0], completions[:1], [[1]])  # a call on row 0, then one on rows 1-3: 2 + 2 values
        scoring.finish(completions, [[1]] * 4)
    assert str(chunked.value) == "reward pair returned 2 values for the 1 completions it was called on"


def test_workers_stop_with_the_pool_and_ignore_ctrl_c(data):
    pool = RewardPool(2, 60)
    try:
        pids = pool.pids()
        time.sleep(1.0)  # past their start
        for pid in pids:
            os.kill(pid, signal.SIGINT)  # a Ctrl-C reaches the whole process group
        task = task_of(data, "first_char")
        reward_pool._active = pool
        assert [s.reward for s in task.score_rollout(*rows_of(task, 2))] == [48.0, 120.0]
    finally:
        reward_pool._active = None
        pool.close()
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)
    assert worker_pids() == []


def _build_tiny():
    tok = build_tokenizer("0123456789+-=?\n")
    size = BuiltinModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(build_config("tiny-dense", size, tok)), tok


def _handing_over(**engine_kw):
    """(the batch, {row: (text, ids)} handed over to on_rows) of the tiny hf engine sampling 16
    rows that stop at a digit 0-3 or EOS (seed 3); each row handed over at most once."""
    model, tok = _build_tiny()
    stops = [tok.convert_tokens_to_ids(c) for c in "0123"] + [tok.eos_token_id]
    seen = {}

    def on_rows(rows, texts, ids):
        for i, t, x in zip(rows, texts, ids):
            assert i not in seen
            seen[i] = (t, x)

    eng = HFRolloutEngine(model.eval(), tok, max_new_tokens=12, temperature=1.0, stop_ids=stops, **engine_kw)
    torch.manual_seed(3)
    return eng.generate(["1+2=?\n", "31+4=?\n"] * 8, on_rows=on_rows), seen


def test_the_hf_engine_hands_over_rows_as_they_stop_as_the_batch_holds_them():
    for decode in ("compact", "generate"):
        b, seen = _handing_over(decode=decode)
        if decode == "generate":
            assert seen == {}  # all at once: scored when generate returns
            continue
        lengths = b.response_mask.sum(1).long().tolist()
        assert 0 < len(seen) < 16 and len(set(lengths)) > 2
        for i, (text, ids) in seen.items():
            assert (text, ids) == (b.completions[i], b.completion_ids[i])
            assert lengths[i] < max(lengths)  # handed over while longer rows still sampled


class _Streaming:
    """An engine that hands rows 0 and 1 over before returning the batch, as the hf engine's loop does."""

    streams_rows = True

    def generate(self, prompts, on_rows=None):
        self.on_rows = on_rows
        texts = [f"{i}x" for i in range(len(prompts))]
        ids = [[i] for i in range(len(prompts))]
        if on_rows is not None:
            on_rows([1, 0], [texts[1], texts[0]], [ids[1], ids[0]])
        return SimpleNamespace(completions=texts, completion_ids=ids)


@pytest.mark.parametrize("workers, chunks", [(0, False), (2, False), (2, True)])
def test_a_step_hands_rows_to_the_pool_while_it_samples_in_chunks(data, workers, chunks):
    ctx = SimpleNamespace(
        spec=SimpleNamespace(rollout=SimpleNamespace(group_size=2, prompts_per_step=3)),
        task=task_of(data, "first_char"),
        rng=random.Random(0),
        dist=DistInfo(),
        compute=contextlib.nullcontext,
        engine=_Streaming(),
    )
    times = {"time/rollout_s": 0.0, "time/score_s": 0.0}
    sent = []
    with running(workers, 60, chunks) as pool:
        if pool is not None:
            submit = pool.submit
            pool.submit = lambda *a: sent.append((a[2], a[4])) or submit(*a)  # (first prompt, rows)
        problems, batch, scores = sample_and_score(ctx, 1, times)
        if pool is not None:
            assert pool.calls == {}  # every call answered and forgotten
        if chunks:  # rows 1 and 0 while sampling (one call), then rows 2-5 in two chunks, one per worker
            assert sent == [(problems[0].prompt, 2), (problems[1].prompt, 2), (problems[2].prompt, 2)]
        elif workers:  # one call on the whole batch once it is sampled
            assert sent == [(problems[0].prompt, 6)]
    assert (ctx.engine.on_rows is not None) == chunks  # rows are handed over only to a pool in chunks mode
    assert len(problems) == 3 and [s.reward for s in scores] == [float(ord(str(i))) for i in range(6)]
    assert times["time/score_s"] > 0


def _spec(data, reward, **extra) -> Path:
    spec = {
        **TINY,
        "model": {"name": str(tiny_model_dir())},
        "task": {
            "name": "prompts",
            "params": {"source": str(data / "train.jsonl")},
            "eval_size": 2,
            "rewards": [{"function": f"{data}/rewards.py:{reward}"}],
            "reward_workers": 2,
            "reward_timeout_s": 60,
        },
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "train": {"steps": 3, "checkpoint_every": 1, "eval_every": 0, "eval_samples": 1},
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    for k, v in extra.items():
        spec[k] = {**spec.get(k, {}), **v}
    (data / "own.yaml").write_text(yaml.safe_dump(spec))
    return data / "own.yaml"


def test_a_worker_that_dies_ends_the_run_in_one_line_its_checkpoint_intact(data):
    res = CliRunner().invoke(app, ["train", str(_spec(data, "exits")), "-o", str(data / "out")])
    assert res.exit_code == 1, res.output
    assert "reward functions (exits): 2 worker process(es) (task.reward_workers)" in " ".join(res.output.split())
    line = next(x for x in res.output.splitlines() if "worker process died" in x)
    assert "reward exits's worker process died (exit code 3)" in line and "Traceback" not in res.output
    run = RunDir(data / "out/e2e/gspo/seed0")
    assert run.status() == "failed" and (run.checkpoints / "step_000001").is_dir()
    assert [m["step"] for m in run.metrics()] == [1]
    assert worker_pids() == []


@pytest.mark.slow
def test_sys_exit_in_a_reward_in_the_trainer_fails_the_run_in_one_line(data):
    spec = _spec(data, "bye", task={"reward_workers": 0}, train={"steps": 1})
    res = CliRunner().invoke(app, ["train", str(spec), "-o", str(data / "out")])
    assert res.exit_code == 1, res.output
    want = "reward bye raised on the row whose prompt starts"
    assert want in res.output and "Traceback" not in res.output
    run = RunDir(data / "out/e2e/gspo/seed0")
    assert run.status() == "failed"
    error = json.loads((run.path / "run.json").read_text())["error"]
    assert error.startswith(want) and error.endswith("SystemExit: the function called sys.exit(3)")


def test_staleness_one_scores_the_next_batch_in_the_pool(data):
    spec = _spec(data, "first_char", rollout={"staleness": 1}, train={"steps": 2})
    res = CliRunner().invoke(app, ["train", str(spec), "-o", str(data / "out")])
    assert res.exit_code == 0, res.output
    run = RunDir(data / "out/e2e/gspo/seed0")
    assert run.status() == "completed" and [m["step"] for m in run.metrics()] == [1, 2]
    assert all(m["reward/first_char"] >= 10 for m in run.metrics())  # ord() of a character: scored
    assert worker_pids() == []


@pytest.mark.slow
def test_workers_restarted_by_a_staleness_one_scoring_thread_outlive_it(data):
    """Seed 0's reward times out once: every worker is stopped, and seed 1's first scoring thread
    starts fresh ones. Those must not die when that thread ends (the kernel's parent-death signal
    follows the thread that started a process): seed 1 trains its three steps."""
    spec = _spec(
        data,
        "slow_once",
        rollout={"staleness": 1},
        train={"steps": 3},
        task={"reward_timeout_s": 3, "eval_size": 0},  # no evaluation: only scoring threads call the pool
    )
    spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), "seeds": [0, 1]}))
    res = CliRunner().invoke(app, ["train", str(spec), "-o", str(data / "out")])
    assert res.exit_code == 1, res.output
    assert "reward slow_once took more than 3 s (task.reward_timeout_s)" in " ".join(res.output.split())
    assert "worker process died" not in res.output
    assert RunDir(data / "out/e2e/gspo/seed0").status() == "failed"
    run = RunDir(data / "out/e2e/gspo/seed1")
    assert run.status() == "completed" and [m["step"] for m in run.metrics()] == [1, 2, 3]
    assert all(m["reward/slow_once"] >= 10 for m in run.metrics())  # ord() of a character: scored
    assert worker_pids() == []


@pytest.mark.slow
def test_ctrl_c_leaves_no_worker_behind(data):
    """`gspo train` in its own process, a reward sleeping in two workers, SIGINT: the run stops
    (exit 4 or 130) and every worker process is gone."""
    spec = _spec(data, "sleepy", train={"steps": 50})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gspo_cli", "train", str(spec), "-o", str(data / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline, workers = time.time() + 240, []
        while time.time() < deadline and not (data / "out/e2e/gspo/seed0/metrics.jsonl").exists():
            time.sleep(0.5)
        for child in psutil.Process(proc.pid).children(recursive=True):
            if any("spawn_main" in a for a in child.cmdline()):
                workers.append(child)
        assert len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)  # the whole process group, as a terminal does
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (4, 130), out
    time.sleep(1)
    assert all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in workers)


def test_rows_handed_over_from_chunks_are_indices_into_the_whole_batch():
    """rollout.sample_rows: each chunk's stopped rows are numbered as the joined batch holds them."""
    b, seen = _handing_over(sample_rows=5)
    assert seen and max(seen) >= 5  # rows of later chunks were handed over too
    for i, (text, ids) in seen.items():
        assert (text, ids) == (b.completions[i], b.completion_ids[i])
