"""LLM judges (task.rewards[].judge) against a stub chat-completions server on
127.0.0.1: scores, retries, time-outs, garbage, the concurrency bound, templates, conversational
prompts, an unreachable URL, and the API key never written anywhere."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from helpers import free_port
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import RunError, SpecError, register_secret
from gspo_cli.metrics import describe
from gspo_cli.rewards import with_rewards
from gspo_cli.rewards.judge import record_unparsable
from gspo_cli.runs import RunDir
from gspo_cli.spec import RewardConfig
from gspo_cli.tasks import make_task
from gspo_cli.train.reporting import PlainReporter
from gspo_cli.train.stats import StepStats

ROWS = [
    {"prompt": "First: 2+2?", "answer": "4", "solution": "4"},
    {"prompt": "Second: 3+3?", "answer": "6", "solution": "6"},
    {"prompt": "Third: 1+1?", "answer": "2", "solution": "2"},
]
TEMPLATE = "Q: {prompt}\nA: {completion}\nReference: {answer}\nScore 0-10."


class Stub:
    """A chat-completions server: `reply(n, body)` -> (status, answer text or a dict for the whole
    JSON body, seconds to wait first, headers) for the n-th request (from 0). Records each request
    (arrival time, headers, body, path) and the most requests in flight at once."""

    def __init__(self, reply):
        self.reply, self.requests, self.lock = reply, [], threading.Lock()
        self.in_flight = self.max_in_flight = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    n = len(stub.requests)
                    stub.requests.append((time.monotonic(), dict(self.headers), body, self.path))
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    status, answer, delay, headers = stub.reply(n, body)
                    time.sleep(delay)
                    if isinstance(answer, dict):
                        payload = answer
                    else:
                        payload = {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on this one (a time-out)
                finally:
                    with stub.lock:
                        stub.in_flight -= 1

            def log_message(self, *args):
                pass

        Server = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 256})  # default 5: SYNs dropped
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def users(self) -> list[str]:
        return [body["messages"][-1]["content"] for _, _, body, _ in self.requests]


@pytest.fixture
def stub():
    made = []

    def start(reply):
        made.append(Stub(reply))
        return made[-1]

    yield start
    for s in made:
        s.close()


def ok(answer, delay=0.0):
    return lambda n, body: (200, answer(n, body) if callable(answer) else answer, delay, {})


@pytest.fixture
def data(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def judged(data, url, **judge):
    """The prompts task of `data`, scored by one judge at `url` (name grader)."""
    cfg = {"url": url, "model": "judge-model", "template": TEMPLATE, **judge}
    return with_rewards(
        make_task("prompts", {"source": str(data / "train.jsonl")}), [RewardConfig(judge=cfg, name="grader")]
    )


def score(task, completions, step=1):
    problems = task.eval_problems(len(completions))
    return [s.components.get("grader") for s in task.score_rollout(problems, completions, step=step)]


def test_scores_are_the_patterns_last_match_and_requests_are_openai_chat(data, stub, monkeypatch):
    answers = {"it is 4": "Steps 1, 2. Score: 9", "it is 7": "7/10, so 3.5", "it is 2": "Score: 10"}
    s = stub(ok(lambda n, body: answers[body["messages"][-1]["content"].split("\n")[1][3:]]))
    monkeypatch.setenv("JUDGE_KEY_TEST", "sk-test-123")
    task = judged(data, s.url, system="You grade.", api_key_env="JUDGE_KEY_TEST", max_tokens=32, temperature=0.5)
    assert score(task, ["it is 4", "it is 7", "it is 2"]) == [9.0, 3.5, 10.0]
    _, headers, body, path = next(r for r in s.requests if "First" in r[2]["messages"][-1]["content"])
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test-123"
    assert body == {
        "model": "judge-model",
        "messages": [
            {"role": "system", "content": "You grade."},
            {"role": "user", "content": "Q: First: 2+2?\nA: it is 4\nReference: 4\nScore 0-10."},
        ],
        "max_tokens": 32,
        "temperature": 0.5,
    }
    # a pattern with a group: the group of the last match
    task = judged(data, s.url, pattern=r"Score: (\d+)", unparsable=None)
    assert score(task, ["it is 4", "it is 7", "it is 2"]) == [9.0, None, 10.0]  # "7/10, so 3.5": no "Score:"
    assert "Authorization" not in s.requests[-1][1]  # no api_key_env: no key sent


def test_a_5xx_is_retried_after_backoff_and_the_right_value_kept(data, stub):
    s = stub(lambda n, body: (503, "busy", 0.0, {}) if n < 1 else (200, "Score: 6", 0.0, {}))
    assert score(judged(data, s.url), ["x"]) == [6.0]
    times = [t for t, *_ in s.requests]
    assert len(times) == 2 and times[1] - times[0] >= 1.0  # 2^0 s


def test_429_backs_off_by_retry_after_then_by_powers_of_two(data, stub):
    def reply(n, body):
        if n == 0:
            return 429, "slow down", 0.0, {"Retry-After": "1.5"}
        return (429, "slow down", 0.0, {}) if n == 1 else (200, "Score: 2", 0.0, {})

    s = stub(reply)
    assert score(judged(data, s.url), ["x"]) == [2.0]
    t = [t for t, *_ in s.requests]
    assert len(t) == 3 and 1.5 <= t[1] - t[0] < 3.0 and 2.0 <= t[2] - t[1] < 4.0  # Retry-After, then 2^1 s


def test_a_hang_is_retried_and_then_one_line_naming_the_judge_and_the_row(data, stub):
    s = stub(lambda n, body: (200, "Score: 4", 3.0 if n == 0 else 0.0, {}))  # the first request hangs
    assert score(judged(data, s.url, timeout_s=0.3), ["x"]) == [4.0]
    hang = stub(ok("Score: 4", delay=3.0))
    task = judged(data, hang.url, timeout_s=0.3, max_retries=1)
    t = time.monotonic()
    with pytest.raises(RunError) as err:
        score(task, ["x"])
    assert time.monotonic() - t < 5.0  # 0.3 s, 1 s back-off, 0.3 s: not the stub's 3 s twice
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"judge grader ({hang.url}/chat/completions): no answer after 2 tries")
    assert msg.endswith("(last: no answer within 0.3 s), for the row whose prompt starts 'First: 2+2?'")


def test_a_failure_ends_the_batch_without_scoring_row_by_row_again(data, stub, monkeypatch):
    s = stub(lambda n, body: (500, "down", 0.0, {}))
    with pytest.raises(RunError, match=r"no answer after 1 tries \(last: HTTP 500\)"):
        score(judged(data, s.url, max_retries=0), ["x", "y", "z"])
    assert len(s.requests) <= 3  # at most one per row (the first failure cancels the rest); never row by row again
    bad = stub(lambda n, body: (401, {"error": "bad key sk-secret-999"}, 0.0, {}))
    monkeypatch.setenv("JUDGE_KEY_401", "sk-secret-999")
    with pytest.raises(RunError, match=r"HTTP 401: .*\*\*\*") as err:  # not retried; the key never quoted
        score(judged(data, bad.url, api_key_env="JUDGE_KEY_401"), ["x"])
    assert "sk-secret-999" not in str(err.value) and len(bad.requests) == 1


# A 66-character key as OpenAI issues them, and its 401 answer, which quotes the key whole.
KEY66 = "sk-proj-" + "Q7vR2mXc9LkP4tWz8NbY3hJd6FsGa1Ue5KoTi0BnCq" + "Vy2xZr7WpMeH4sD9"
assert len(KEY66) == 66


def openai_401(key: str, at: int) -> dict:
    """A 401 body quoting `key` whose one JSON line has the key at column `at` (padded before it)."""
    message = (
        f"Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys."
    )
    body = {"id": "", "error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}
    body["id"] = "x" * (at - json.dumps(body).index(key))
    assert json.dumps(body).index(key) == at
    return body


def key_pieces(text: str, key: str = KEY66) -> list[str]:
    """Every run of 8 consecutive characters of `key` that `text` shows."""
    return sorted({key[i : i + 8] for i in range(len(key) - 7)} & {text[i : i + 8] for i in range(len(text) - 7)})


def test_a_401_quoting_the_key_shows_no_piece_of_it_wherever_the_line_is_cut(data, stub, monkeypatch):
    """The error line is cut at 200 characters: a key quoted at column 172 was cut before it was
    masked, and its first 28 characters showed."""
    monkeypatch.setenv("JUDGE_KEY_66", KEY66)
    said = []
    for at in (64, 150, 172, 190, 260):
        bad = stub(lambda n, body, at=at: (401, openai_401(KEY66, at), 0.0, {}))
        with pytest.raises(RunError, match="HTTP 401: ") as err:
            score(judged(data, bad.url, api_key_env="JUDGE_KEY_66"), ["x"])
        said.append(str(err.value))
        assert key_pieces(said[-1]) == [], at
    assert "Incorrect API key provided: ***. You can find" in said[0]  # the rest of the answer still shown
    # the key quoted cut or masked by the server: no run of 8 of its characters is shown either
    cut = stub(lambda n, body: (401, {"error": f"bad key {KEY66[:20]}****{KEY66[-4:]}"}, 0.0, {}))
    with pytest.raises(RunError) as err:
        score(judged(data, cut.url, api_key_env="JUDGE_KEY_66"), ["x"])
    assert key_pieces(str(err.value)) == [] and 'HTTP 401: {"error": "bad key ***"}' in str(err.value)


def test_a_registered_key_is_masked_in_run_json_and_progress_lines(tmp_path, capsys):
    register_secret(KEY66)
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    rd.update_info(status="failed", error=f"RuntimeError: token {KEY66[:30]}", traceback=[f"x = '{KEY66}'"])
    PlainReporter().log(f"[a/seed0] failed: {KEY66[5:45]} is wrong")
    written = rd.info_file.read_text() + capsys.readouterr().out
    assert key_pieces(written) == [] and rd.info()["error"] == "RuntimeError: token ***"
    assert "[a/seed0] failed: *** is wrong" in written


def test_garbage_answers_give_unparsable_and_are_counted(data, stub):
    answers = ["no idea", "", None, "Score: 5", "Score: 1e999", "Score: five"]
    s = stub(ok(lambda n, body: answers[int(body["messages"][-1]["content"].split("\n")[1][3:])]))
    task = judged(data, s.url, unparsable=-1.0, pattern=r"Score: (\S+)")
    problems = task.eval_problems(1) * 6
    got = [x.components.get("grader") for x in task.score_rollout(problems, [str(i) for i in range(6)], step=3)]
    assert got == [-1.0, -1.0, -1.0, 5.0, -1.0, -1.0]  # no match, empty, null content, infinite, no number
    task.score_rollout(problems[:2], ["0", "3"], step=0)  # an evaluation's scoring (step 0)
    stats = StepStats()
    record_unparsable(stats, task, 3)
    assert stats.reduce(DistInfo()) == {"judge/grader/unparsable_frac": 5 / 6}
    assert describe("judge/grader/unparsable_frac") == (
        "share of LLM judge grader's answers its pattern found no score in (scored `unparsable`)",
        "fraction",
    )
    assert task.rewards[0].call.unparsable == {}  # read once; the evaluation's step 0 forgotten
    skip = judged(data, s.url, unparsable=None, pattern=r"Score: (\S+)")  # null: the reward skips the row
    scores = skip.score_rollout(problems[:4], ["0", "1", "2", "3"])
    assert [x.rewarded for x in scores] == [False, False, False, True] and scores[3].reward == 5.0
    odd = stub(ok({"result": "Score: 3"}))  # not an OpenAI chat completion
    with pytest.raises(RunError, match="its answer is no chat completion"):
        score(judged(data, odd.url), ["x"])


def test_concurrency_bounds_the_requests_in_flight(data, stub):
    s = stub(ok("Score: 1", delay=0.1))
    task = judged(data, s.url, concurrency=4)
    problems = task.eval_problems(1) * 24
    t = time.monotonic()
    assert [x.reward for x in task.score_rollout(problems, ["x"] * 24)] == [1.0] * 24
    wall = time.monotonic() - t
    assert s.max_in_flight == 4 and wall >= 0.6  # 24 / 4 x 0.1 s at best


def test_a_caller_inside_an_event_loop_gets_the_batch_on_a_thread_of_its_own(data, stub):
    s = stub(ok("Score: 2"))
    task = judged(data, s.url)

    async def inside():  # e.g. a reward pool's loop calling the (synchronous) judge
        return score(task, ["x", "y"])

    assert asyncio.run(inside()) == [2.0, 2.0]
    missing = stub(lambda n, body: (404, {"detail": "Not Found"}, 0.0, {}))
    with pytest.raises(RunError, match=r"HTTP 404 \(is `url` the API's base, e.g. http://127.0.0.1:8000/v1\?\)"):
        score(judged(data, missing.url), ["x"])


def test_the_template_takes_columns_and_is_checked_before_training(data, stub):
    s = stub(ok("Score: 1"))
    score(judged(data, s.url, template="{completion} vs {answer} ({solution}) {{literal}}"), ["x"])
    assert s.users() == ["x vs 4 (4) {literal}"]
    with pytest.raises(SpecError) as err:
        judged(data, s.url, template="{completion} vs {reference}")
    assert str(err.value) == (
        "task.rewards[0].judge.template: {reference} is no placeholder: use {prompt}, {completion} or a column of "
        "the task's rows (theirs: answer, solution); write a literal brace as {{ or }}"
    )
    with pytest.raises(SpecError, match=r'template: \{"score"\} is no placeholder: .*write a literal brace as \{\{'):
        judged(data, s.url, template='Answer as {"score": N}: {completion}')  # JSON in a template: braces doubled
    with pytest.raises(SpecError, match=r"judge.template: not a format string \(.*\); write a literal brace as \{\{"):
        judged(data, s.url, template="Rate {completion")
    with pytest.raises(SpecError, match=r"\{0\} is no placeholder"):
        judged(data, s.url, template="{0}")
    assert len(s.requests) == 1  # refused before any request


def test_conversational_prompts_reach_the_template_as_text(tmp_path, stub):
    chat = [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "answer": "4"}
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    s = stub(ok("Score: 8"))
    cfg = RewardConfig(judge={"url": s.url, "model": "m", "template": TEMPLATE}, name="grader")
    task = with_rewards(make_task("prompts", {"source": str(tmp_path / "chat.jsonl")}), [cfg])
    assert [x.reward for x in task.score_rollout(task.eval_problems(1), ["It is 4."])] == [8.0]
    assert s.users() == ["Q: system: Be brief.\nuser: 2+2?\nA: It is 4.\nReference: 4\nScore 0-10."]


def spec_file(data, url, **judge) -> Path:
    spec = {
        "name": "judged",
        "model": {
            "name": "builtin:tiny-dense",
            "builtin": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
            "cold_start": {"steps": 5, "batch_size": 8},
        },
        "task": {
            "name": "prompts",
            "params": {"source": str(data / "train.jsonl")},
            "eval_size": 1,
            "rewards": [{"judge": {"url": url, "model": "m", "template": TEMPLATE, **judge}, "name": "grader"}],
        },
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
        "train": {"steps": 2, "eval_samples": 1, "sinks": ["tensorboard"], "log_samples_every": 1},
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (data / "judged.yaml").write_text(yaml.safe_dump(spec))
    return data / "judged.yaml"


def test_an_unreachable_judge_a_missing_key_or_httpx_fail_at_once_exit_2(data, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nobody listens
    t = time.monotonic()
    res = CliRunner().invoke(app, ["train", str(spec_file(data, url)), "-o", str(data / "out")])
    assert res.exit_code == 2, res.output
    assert f"task.rewards[0].judge.url: {url} refuses connections (is the judge's server running?)" in " ".join(
        res.output.split()
    )
    assert time.monotonic() - t < 10 and "cold start" not in res.output and "Traceback" not in res.output
    assert not (data / "out").exists()
    monkeypatch.delenv("GSPO_NO_SUCH_KEY", raising=False)
    res = CliRunner().invoke(app, ["train", str(spec_file(data, url, api_key_env="GSPO_NO_SUCH_KEY"))])
    assert res.exit_code == 2 and "the environment variable GSPO_NO_SUCH_KEY (the judge's API key) is not set" in (
        " ".join(res.output.split())
    )
    monkeypatch.setitem(sys.modules, "httpx", None)  # not installed
    res = CliRunner().invoke(app, ["train", str(spec_file(data, url))])
    assert res.exit_code == 2, res.output
    assert "task.rewards[0].judge: an LLM judge needs `pip install gspo-cli[judge]` (httpx)" in res.output


@pytest.mark.slow
def test_gspo_train_with_a_judge_logs_unparsable_and_never_writes_the_key(data, stub, monkeypatch):
    """A short run scored by the stub (odd-length completions: an answer without a score): the
    step's judge/grader/unparsable_frac is the stub's own count, and the key is in no file."""
    secret = "sk-never-written-7c1e9a"

    def reply(n, body):
        completion = body["messages"][-1]["content"].split("\nA: ", 1)[1].split("\nReference:")[0]
        return 200, "I cannot say" if len(completion) % 2 else "Score: 3", 0.0, {}

    s = stub(reply)
    monkeypatch.setenv("GSPO_JUDGE_KEY", secret)
    out = data / "out"
    res = CliRunner().invoke(app, ["train", str(spec_file(data, s.url, api_key_env="GSPO_JUDGE_KEY")), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert all(h["Authorization"] == f"Bearer {secret}" for _, h, _, _ in s.requests)
    # requests in order: the evaluation at step 0 (1 row), step 1 (8 rows), step 2 (8), the final evaluation (1)
    assert len(s.requests) == 18
    missed = [("I cannot say" == reply(0, body)[1]) for _, _, body, _ in s.requests]
    rd = RunDir(out / "judged/gspo/seed0")
    fracs = [m["judge/grader/unparsable_frac"] for m in rd.metrics()]
    assert fracs == [pytest.approx(sum(missed[1:9]) / 8), pytest.approx(sum(missed[9:17]) / 8)]
    assert (rd.path / "tensorboard").is_dir()
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) > 5 and not [p for p in written if secret.encode() in p.read_bytes()]
    assert secret not in res.output and "GSPO_JUDGE_KEY" in (rd.path / "spec.yaml").read_text()


@pytest.mark.slow
def test_gspo_train_against_a_401_quoting_the_key_shows_no_piece_of_it(data, stub, monkeypatch):
    """The judge answers 401 quoting the 66-character key where the error line is cut: the run
    fails in one line, and neither the output (plain and --json) nor any file shows 8 of its characters."""
    s = stub(lambda n, body: (401, openai_401(KEY66, 172), 0.0, {}))
    monkeypatch.setenv("GSPO_JUDGE_KEY", KEY66)
    out = data / "out"
    spec = spec_file(data, s.url, api_key_env="GSPO_JUDGE_KEY")
    res = CliRunner().invoke(app, ["train", str(spec), "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert "HTTP 401: " in res.output and "Traceback" not in res.output
    rd = RunDir(out / "judged/gspo/seed0")
    info = rd.info()
    assert info["status"] == "failed" and info["error"].startswith(f"judge grader ({s.url}/chat/completions): HTTP 401")
    as_json = CliRunner().invoke(app, ["train", str(spec), "-o", str(out), "--json", "--force"])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)[0]["summary"]["error"] == rd.info()["error"]
    written = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file())
    assert key_pieces(res.output) == key_pieces(as_json.output) == key_pieces(written) == []
