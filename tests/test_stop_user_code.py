"""A stop signal (SIGINT/SIGTERM) while the user's code runs in the main thread (a slow reward
function) abandons that call at once with its step (InterruptedRun: exit 4, the last checkpoint
kept), instead of waiting for it and then a whole step."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from gspo_cli.errors import InterruptedRun
from gspo_cli.train.watch import stop_on_signals
from gspo_cli.user_code import user_call

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _signal_soon(sig=signal.SIGTERM, after=0.3):
    threading.Timer(after, os.kill, (os.getpid(), sig)).start()


def test_a_slow_reward_is_abandoned_at_the_signal():
    t0 = time.monotonic()
    with stop_on_signals() as stop, pytest.raises(InterruptedRun) as err:
        with user_call("reward slow_judge"):
            _signal_soon()
            time.sleep(30)  # a reward that takes 30 s
    assert time.monotonic() - t0 < 5 and stop.signal_name == "SIGTERM"
    assert str(err.value) == (
        "stopped by SIGTERM while reward slow_judge ran: the call was abandoned and this step is lost; its run "
        "keeps the last checkpoint: rerun the same command to resume"
    )


def test_a_reward_that_swallows_the_stop_is_stopped_when_it_returns():
    with stop_on_signals(), pytest.raises(InterruptedRun, match="while reward stubborn ran"):
        with user_call("reward stubborn"):
            _signal_soon()
            try:
                time.sleep(30)
            except Exception:  # noqa: BLE001 - a user's catch-all
                pass
    # the next call of user code is not stopped by the old signal
    with user_call("reward next"):
        pass


def test_outside_user_code_a_signal_only_sets_the_flag():
    with stop_on_signals() as stop:
        _signal_soon(after=0.0)
        deadline = time.monotonic() + 5
        while not stop and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stop.signal_name == "SIGTERM"


def test_a_user_reward_called_by_the_trainer_is_marked_and_a_shipped_one_is_not(monkeypatch):
    from gspo_cli.rewards import calls
    from gspo_cli.user_code import _running

    seen = []
    monkeypatch.setattr(calls, "_call", lambda r, *a: seen.append((r.name, list(_running))) or [1.0])
    user = calls.Reward("judge", 1.0, False, call=None)
    shipped = calls.Reward("correct", 1.0, True, call=None, shipped=True)
    calls._called(user, (), ["p"])
    calls._called(shipped, (), ["p"])
    assert seen == [("judge", ["reward judge"]), ("correct", [])]


SLOW = """
import pathlib, time

def slow(prompts, completions, **kw):
    pathlib.Path({marker!r}).write_text("in")
    time.sleep(300)
    return [1.0] * len(completions)
"""


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])  # in the trainer, and in a reward pool's worker
def test_sigterm_during_a_300_s_reward_stops_the_run_in_seconds(tmp_path, workers):
    import json
    import subprocess

    import yaml
    from helpers import TINY

    marker = tmp_path / "in_reward"
    (tmp_path / "slow.py").write_text(SLOW.format(marker=str(marker)))
    task = {**TINY["task"], "rewards": [{"function": f"{tmp_path / 'slow.py'}:slow"}], "reward_workers": workers}
    raw = {**TINY, "output_dir": str(tmp_path / "runs"), "task": task, "train": {"steps": 3, "eval_every": 0}}
    raw["arms"] = [a for a in TINY["arms"] if a["name"] == "gspo"]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "gspo_cli", "train", str(tmp_path / "spec.yaml")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, out + err
    assert time.monotonic() - t0 < 20
    assert "stopped by SIGTERM while reward slow ran: the call was abandoned" in out + err
    assert "Traceback" not in out + err
    info = json.loads((tmp_path / "runs/e2e/gspo/seed0/run.json").read_text())
    assert info["status"] == "interrupted"


def test_until_decided_stopped_mid_round_exits_4_and_trains_no_further_round(tmp_path, monkeypatch):
    """A SIGTERM while a round trains: the round's runs finish as run.json says (completed), no
    further round starts, exit 4 with one plain line."""
    import yaml
    from helpers import TINY
    from synthetic_runs import write_run
    from typer.testing import CliRunner

    from gspo_cli.cli.app import app
    from gspo_cli.train import sweep as sw

    rounds = []

    def run_plan(runs, *, jobs, force, log, executor=None, stop=None):
        rounds.append(sorted({r.seed for r in runs}))
        out = []
        for r in runs:
            if not (r.path / "run.json").is_file():
                evals = [{"step": 2, "task": "arith", "scores": {"avg@4": 0.3 + 0.01 * r.seed}}]
                write_run(tmp_path, r.name, r.seed, [], evals=evals)
            out.append(
                {"run": r.name, "seed": r.seed, "status": "completed", "exit": 0, "wall_s": 0, "path": str(r.path)}
            )
        os.kill(os.getpid(), signal.SIGTERM)  # the user stops the sweep while the round ends
        time.sleep(0.2)
        return out

    monkeypatch.setattr(sw, "run_plan", run_plan)
    arms = [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}]
    raw = {**TINY, "name": "exp", "output_dir": str(tmp_path), "seeds": [0, 1, 2], "arms": arms}
    raw["comparison"] = {"baseline": "grpo", "arm": "gspo"}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "exp.yaml"), "--until-decided", "--max-seeds", "6"])
    assert res.exit_code == 4, res.output
    assert rounds == [[0, 1, 2]]  # no round after the signal
    assert res.stderr.strip() == (
        "--until-decided: stopped by SIGTERM during a round; completed runs are kept: rerun the same command to resume"
    )
