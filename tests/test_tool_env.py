"""Environments from users' files (task.environment: FILE.py:NAME): refused in one line before
any model is built when they do not define the protocol; the spec refuses what multi-turn
rollouts do not support yet; a training step runs with one on the built-in model."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from helpers import TINY

from gspo_cli.environments import resolve_environment
from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.rewards import with_rewards
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.step import setup, train_step

ECHO = '''
class Echo:
    """Answers every turn with a fixed hint until the model has taken `turns` turns."""

    def __init__(self, hint="try again", turns=2):
        self.hint, self.turns, self.seen = hint, turns, 0

    def start(self, prompt):
        return None

    def step(self, turn):
        self.seen += 1
        return (self.hint, False, 0.25) if self.seen < self.turns else (None, True, 1.0)
'''

NO_STEP = '''
class Half:
    def start(self, prompt):
        return None
'''


def test_an_environment_without_the_protocol_is_refused_in_one_line(tmp_path):
    f = tmp_path / "envs.py"
    f.write_text(NO_STEP + "\nbroken = 3\n")
    with pytest.raises(SpecError, match=r"task.environment: .*Half makes objects without step\(\)") as e:
        resolve_environment(f"{f}:Half")
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match="Missing is not defined in .*envs.py; its functions: Half"):
        resolve_environment(f"{f}:Missing")
    with pytest.raises(SpecError, match="'shell' is no built-in environment \\(python, code_feedback\\)"):
        resolve_environment("shell")
    with pytest.raises(SpecError, match="no such file"):
        resolve_environment(f"{tmp_path / 'nope.py'}:X")


def test_the_spec_refuses_what_multi_turn_does_not_support_yet():
    task = {**TINY["task"], "environment": "python"}
    for engine in ({"engine": "vllm"}, {"engine": "vllm-server", "server": {"url": "http://127.0.0.1:8000"}}):
        spec_from_dict({**TINY, "task": task, "rollout": {**TINY["rollout"], **engine}})  # rollout/vllm_turns.py
    with pytest.raises(SpecError, match="not supported with rollout.staleness: 1"):
        spec_from_dict({**TINY, "task": task, "rollout": {**TINY["rollout"], "staleness": 1}})
    with pytest.raises(SpecError, match="300 response tokens .* the built-in model's 256 positions"):
        spec_from_dict({**TINY, "task": task, "rollout": {**TINY["rollout"], "max_total_tokens": 300}})
    with pytest.raises(SpecError, match="environment_params: given but no task.environment"):
        spec_from_dict({**TINY, "task": {**TINY["task"], "environment_params": {"timeout_s": 1}}})
    with pytest.raises(SpecError, match="max_total_tokens: 8 is below max_new_tokens"):
        spec_from_dict({**TINY, "rollout": {**TINY["rollout"], "max_total_tokens": 8}})


def test_gspo_train_refuses_a_bad_environment_file_before_any_model(tmp_path):
    f = tmp_path / "envs.py"
    f.write_text(NO_STEP)
    raw = {**TINY, "output_dir": str(tmp_path / "runs"), "task": {**TINY["task"], "environment": f"{f}:Half"}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "train", str(spec)], capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(lines) == 1 and "Half makes objects without step()" in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_a_training_step_with_a_file_environment(tmp_path):
    f = tmp_path / "echo.py"
    f.write_text(ECHO)
    task = {**TINY["task"], "environment": f"{f}:Echo", "environment_params": {"hint": "again", "turns": 2}}
    # The environment's reward (Echo: 1.0 when it ends the rollout) beside the task's accuracy
    task["rewards"] = [{"function": "env", "weight": 0.5}, {"function": "math_accuracy", "correct": True}]
    rollout = {**TINY["rollout"], "prompts_per_step": 2, "max_new_tokens": 24, "tool_output_tokens": 4}
    raw = {**TINY, "output_dir": str(tmp_path), "task": task, "rollout": rollout}
    raw["arms"] = [a for a in TINY["arms"] if a["name"] == "gspo"]
    spec = spec_from_dict(raw)
    t = with_rewards(make_task(spec.task.name, spec.task.params), spec.task.rewards)
    ctx = setup(spec, spec.arms[0], 0, t, resolve_model_source(spec.model, t, log=lambda m: None))
    batches, seen = [], []
    real = ctx.engine.generate
    ctx.engine.generate = lambda prompts, problems=None: (
        seen.append(problems) or batches.append(real(prompts, problems=problems)) or batches[-1]
    )
    m = train_step(ctx, 1)
    b = batches[0]
    assert [p.prompt for p in seen[0]] == list(prompts_of(b, ctx))  # the rows' problems went to the engine
    env = [c.env_reward for c in b.completions]
    # Echo's rewards, summed: 0.25 for its hint, 1.0 more when it ends the rollout; none for a
    # row cut before its first turn ended (no step)
    for e, counts in zip(env, b.tool_counts):
        assert e in ((None,) if counts["tool_calls"] == 0 else (0.25, 1.25)), (e, counts)
    acc = [float(t.score(p, c).correct) for p, c in zip(seen[0], b.completions)]
    rewards = [0.5 * (e or 0.0) + a for e, a in zip(env, acc)]
    assert m["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
    given = [e for e in env if e is not None]
    assert m["reward/env"] == pytest.approx(sum(given) / len(given))  # the mean over the rows it applies to
    wrap = len(ctx.engine.wrap_ids[0]) + len(ctx.engine.wrap_ids[1])
    for i, counts in enumerate(b.tool_counts):
        # A row that stopped (EOS) within its 24 tokens got the hint ("again" cut to 4 tokens, said so)
        calls = counts["tool_calls"]
        assert calls <= 1 and counts["turns"] == calls + 1
        assert int(b.model_mask[i].sum()) <= 24
        if calls:
            assert (
                b.turns[i][1]["content"].startswith("agai") and "[output cut at 4 tokens]" in b.turns[i][1]["content"]
            )
            body = ctx.engine.tokenizer(b.turns[i][1]["content"], add_special_tokens=False).input_ids
            assert int(b.tool_mask[i].sum()) == wrap + len(body)
    assert sum(c["tool_calls"] for c in b.tool_counts) > 0  # the cold-started model ends its answers: hints went in
    assert m["tools/tool_calls_mean"] == pytest.approx(sum(c["tool_calls"] for c in b.tool_counts) / len(b.tool_counts))
    env = float(b.tool_mask.sum()) / float(b.response_mask.sum())
    assert m["tools/env_token_frac"] == pytest.approx(env, rel=1e-5)
    assert m["response/length_mean"] <= 24
    # The sampler's log-probs of the model's tokens, read across turns from one KV cache with the
    # tool output fed in between, are those of one full forward over the whole response.
    assert m["rollout/logprob_diff_max"] < 1e-4
    # samples.jsonl keeps the turns (model / tool) and the counts of each logged row
    assert ctx.samples
    for rec in ctx.samples:
        i = rec["index"]
        assert [t["role"] for t in rec["turns"]] == [t["role"] for t in b.turns[i]]
        assert rec["tools"] == b.tool_counts[i] and rec["length"] == int(b.model_mask[i].sum())


def test_r3_replays_engine_routes_that_cover_the_tool_output(tmp_path):
    """The multi-turn hf sampler records the route of every position it feeds, the tool
    output's included: before any update they are the trainer's own routes on every routed
    position (the tool's too), and the R3 update replays them."""
    from gspo_cli.train.micro import batch_logprobs

    f = tmp_path / "echo.py"
    f.write_text(ECHO)
    task = {**TINY["task"], "environment": f"{f}:Echo", "environment_params": {"hint": "again", "turns": 2}}
    rollout = {**TINY["rollout"], "prompts_per_step": 2, "max_new_tokens": 24, "tool_output_tokens": 4}
    arm = {"name": "r3", "preset": "paper-grpo", "routing_replay": "r3"}
    spec = spec_from_dict({**TINY, "output_dir": str(tmp_path), "task": task, "rollout": rollout, "arms": [arm]})
    t = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arms[0], 0, t, resolve_model_source(spec.model, t, log=lambda m: None))
    batches, routes = [], []
    real = ctx.engine.generate

    def generate(prompts, problems=None):
        batches.append(real(prompts, problems))
        with torch.no_grad():  # the trainer's own routes before the update, without replay, on every position
            routes.append(batch_logprobs(ctx, ctx.model, batches[-1], with_entropy=False, record=True)[1])
        return batches[-1]

    ctx.engine.generate = generate
    m = train_step(ctx, 1)
    b, natural = batches[0], routes[0]
    B, T = b.input_ids.shape
    assert b.engine_routes is not None and b.engine_routes.shape[1:3] == (B, T)
    assert m["moe/engine_route_diff_frac"] == 0.0  # measured on the model's tokens
    routed = b.attention_mask.bool().clone()
    routed[:, -1] = False  # the last column is never fed back: no route
    tool = torch.zeros_like(routed)
    tool[:, b.prompt_len :] = b.tool_mask.bool()
    assert int((tool & routed).sum()) > 0  # some tool output was routed
    same = (b.engine_routes.sort(-1).values == natural.sort(-1).values).all(-1).all(0)  # (B, T): every layer agrees
    assert bool(same[routed].all()) and bool(same[tool & routed].all())


def prompts_of(batch, ctx):
    """The prompts of a batch's rows, as the engine's tokenizer reads them back (left padding dropped)."""
    P = batch.prompt_len
    for ids, mask in zip(batch.input_ids[:, :P], batch.attention_mask[:, :P]):
        yield ctx.engine.tokenizer.decode(ids[mask > 0].tolist(), skip_special_tokens=True)


def test_a_changed_environment_file_is_another_run(tmp_path):
    from gspo_cli.runs import identity_changes
    from gspo_cli.train.resume import environment_fingerprint

    f = tmp_path / "echo.py"
    f.write_text(ECHO)
    before = environment_fingerprint(f"{f}:Echo")
    assert list(before) == [str(f.resolve())] and environment_fingerprint("python") == {}
    f.write_text(ECHO + "\n# changed\n")
    after = environment_fingerprint(f"{f}:Echo")
    base = {"behaviour_version": 1, "model": "m", "data": {"train": {"source": "s", "fingerprint": "x"}, "eval": {}}}
    assert identity_changes({**base, "environment": before}, {**base, "environment": before}) == []
    assert identity_changes({**base, "environment": before}, {**base, "environment": after}) == [
        f"another environment ({f.resolve()} changed)"
    ]


def test_the_arithmetic_tool_style_calls_python_and_copies_its_output():
    """Worked solutions of `style: tool` (the tools testbed's cold start): a python call whose
    output, run in the sandbox, is the answer, then the output block the cold start never
    trains on, then the answer boxed."""
    import random

    from gspo_cli.environments import RAW_WRAP, last_python_block, split_tool_output
    from gspo_cli.sandbox.programs import run_program
    from gspo_cli.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask(num_operands=3, max_operand=99, operators="+-*", style="tool")
    for p in task.train_problems(random.Random(0), 5):
        code = last_python_block(p.solution)
        assert run_program(code).stdout == f"{p.answer}\n"  # left to right, as the task evaluates
        parts = split_tool_output(p.solution)
        assert [tool for _, tool in parts] == [False, True, False]
        assert parts[1][0] == RAW_WRAP[0] + f"{p.answer}\n" + RAW_WRAP[1]
        assert task.score(p, parts[0][0] + parts[2][0]).correct  # the model's own text holds the answer


def test_gspo_samples_shows_the_turns_with_the_tool_output_set_apart(tmp_path):
    import json

    from typer.testing import CliRunner

    from gspo_cli.cli.app import app

    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text("{}")
    turns = [
        {"role": "model", "content": "```python\nprint(6*7)\n```"},
        {"role": "tool", "content": "42\n"},
        {"role": "model", "content": "\\boxed{42}"},
    ]
    rec = {"step": 1, "arm": "gspo", "seed": 0, "group": 0, "index": 0, "prompt": "6*7=?", "completion": "x"}
    rec.update(reward=1.0, correct=True, advantage=0.5, length=30, truncated=False, clip_frac=0.0, clipped=False)
    rec.update(masked_frac=None, turns=turns, tools={"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0})
    (d / "samples.jsonl").write_text(json.dumps(rec) + "\n")
    res = CliRunner().invoke(app, ["samples", str(d), "--plain"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[4:11] == [
        "--- model (turn 1)",
        "```python",
        "print(6*7)",
        "```",
        "--- tool output (turn 2)",
        "| 42",
        "--- model (turn 3)",
    ]
    res = CliRunner().invoke(app, ["samples", str(d)])  # Rich panels
    assert res.exit_code == 0 and "tool output (turn 2)" in res.output and "\\boxed{42}" in res.output


def test_gspo_compare_shows_the_tool_metrics(tmp_path):
    """--metrics tool_calls,tool_errors,env_tokens: each run's mean over its steps, then over seeds."""
    import json

    from synthetic_runs import write_run
    from typer.testing import CliRunner

    from gspo_cli.cli.app import app

    for seed, calls in enumerate((1.0, 2.0)):
        recs = [
            {
                "step": t,
                "reward/mean": 0.5,
                "tools/tool_calls_mean": calls * t,
                "tools/tool_errors_mean": 0.25,
                "tools/env_token_frac": 0.1 * seed,
            }
            for t in (1, 2)
        ]
        write_run(tmp_path, "gspo", seed, recs)
    exp = next(p for p in tmp_path.iterdir() if p.is_dir())
    args = ["compare", str(exp), "--format", "json", "--metrics", "tool_calls,tool_errors,env_tokens"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)["groups"][0]["metrics"]
    assert m["tool_calls"]["mean"] == pytest.approx((1.5 + 3.0) / 2)  # seed means 1.5 and 3
    assert m["tool_errors"]["mean"] == pytest.approx(0.25) and m["env_tokens"]["mean"] == pytest.approx(0.05)


STUCK = '''
import time


class Stuck:
    """Marks a file, then never returns from step() (a dead server, a deadlock)."""

    def __init__(self, marker):
        self.marker = marker

    def start(self, prompt):
        return None

    def step(self, turn):
        open(self.marker, "a").close()
        time.sleep(10**6)
'''


def _stuck_run(tmp_path, source=STUCK, **task):
    """`gspo train` of a spec whose environment (`source`'s Stuck: blocks in step()), started in a subprocess."""
    f = tmp_path / "stuck.py"
    f.write_text(source)
    marker = tmp_path / "blocked"
    env = {"environment": f"{f}:Stuck", "environment_params": {"marker": str(marker)}, **task}
    raw = {**TINY, "output_dir": str(tmp_path / "runs"), "task": {**TINY["task"], **env}}
    raw["rollout"] = {**TINY["rollout"], "max_new_tokens": 24}
    raw["arms"] = [a for a in TINY["arms"] if a["name"] == "gspo"]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "gspo_cli", "train", str(spec)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, marker, tmp_path / "runs/e2e/gspo/seed0/run.json"


def _wait_for(marker, proc, limit_s=240):
    deadline = time.monotonic() + limit_s
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    time.sleep(0.3)  # the trainer is now waiting on the blocked call


@pytest.mark.slow
def test_an_environment_that_sleeps_forever_is_ended_by_its_time_out(tmp_path):
    proc, marker, run_json = _stuck_run(tmp_path, environment_timeout_s=2)
    _wait_for(marker, proc)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert time.monotonic() - t0 < 30  # 2 s and the way out
    said = out + err  # the run's line (stdout) and the summary
    assert "step() did not return within 2 s (task.environment_timeout_s)" in said and "Traceback" not in said
    info = json.loads(run_json.read_text())
    assert info["status"] == "failed" and "did not return within 2 s" in info["error"]


@pytest.mark.slow
def test_sigterm_stops_a_run_whose_environment_blocks_within_the_grace(tmp_path):
    from gspo_cli.rollout.env_calls import STOP_GRACE_S

    proc, marker, run_json = _stuck_run(tmp_path)  # the default time-out, 120 s, never reached
    _wait_for(marker, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err
    assert time.monotonic() - t0 < STOP_GRACE_S + 10
    assert "stopped by SIGTERM: the environment's step() was still running" in err and "Traceback" not in out + err
    assert json.loads(run_json.read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_a_second_ctrl_c_stops_a_run_whose_environment_blocks_at_once(tmp_path):
    proc, marker, run_json = _stuck_run(tmp_path)
    _wait_for(marker, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 10
    assert "interrupted by a second Ctrl-C" in err and "Traceback" not in out + err
    assert json.loads(run_json.read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_an_environment_returning_a_wrong_type_mid_run_fails_the_run_in_one_line(tmp_path):
    proc, marker, run_json = _stuck_run(tmp_path, STUCK.replace("time.sleep(10**6)", 'return ("obs", False, "abc")'))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, out + err  # a run failure, not a spec error (2)
    assert "Traceback" not in out + err
    line = "task.environment: step() returned a reward str 'abc', not a number or None"
    assert line in out and json.loads(run_json.read_text())["error"].startswith(line + " (the rollout whose prompt")
