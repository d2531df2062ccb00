"""Multi-turn rollouts in the hf engine (rollout/turns.py) with the built-in `python`
environment: a scripted model closes a ```python block, the sandbox runs it, its output comes
back as forced tokens, and the model continues. Token-in-token-out: the ids are the ones
sampled, plus the tool output's own, even where decoding and re-encoding would merge them."""

import socket
import threading
import time

import pytest
import torch
from sandbox_corpus import HOSTILE, use_level
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config

from gspo_cli.environments import RAW_WRAP, Observation, resolve_environment
from gspo_cli.rollout.hf import HFRolloutEngine
from gspo_cli.rollout.turns import MultiTurnEngine
from gspo_cli.sandbox import programs as sandbox
from gspo_cli.sandbox.programs import detect_isolation
from gspo_cli.tasks.base import character_vocabulary


def _tokenizer():
    """One token per character, plus "ab" (merged from "a" "b"): text "ab" re-encodes to one id."""
    chars = character_vocabulary("")
    vocab = {t: i for i, t in enumerate([*chars, "ab"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


class Scripted(torch.nn.Module):
    """A stand-in causal LM: row i samples script[i] token by token (then EOS); a fed token that is
    not the script's next one is the environment's and leaves the script where it is (so a script
    goes on with characters its tool output does not contain)."""

    def __init__(self, tok, scripts: list[list[int]]):
        super().__init__()
        self.config = Qwen3Config(
            vocab_size=len(tok), hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1
        )
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.scripts, self.k, self.eos, self.V = scripts, [0] * len(scripts), tok.eos_token_id, len(tok)
        self.forwards = 0

    def _target(self, i):
        s = self.scripts[i]
        return s[self.k[i]] if self.k[i] < len(s) else self.eos

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None, **kw):
        self.forwards += 1
        if input_ids.shape[1] == 1:
            for i, t in enumerate(input_ids[:, 0].tolist()):
                if attention_mask[i, -1] and t == self._target(i):
                    self.k[i] += 1
        logits = torch.full((input_ids.shape[0], 1, self.V), -1e9)
        for i in range(input_ids.shape[0]):
            logits[i, 0, self._target(i)] = 0.0
        return type("Out", (), {"logits": logits})()


def _engine(tok, scripts, **limits):
    base = HFRolloutEngine(
        Scripted(tok, scripts), tok, max_new_tokens=200, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    kw = dict(max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=32)
    env = resolve_environment("python", {"timeout_s": 1.0, "memory_mb": 128})
    return MultiTurnEngine(base, env, **{**kw, **limits})


def _ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def test_a_tool_call_runs_and_the_ids_are_token_in_token_out():
    tok = _tokenizer()
    a, b = _ids(tok, "a")[0], _ids(tok, "b")[0]
    assert _ids(tok, "ab") != [a, b]  # the round trip would merge them
    call = "Let me compute.\n```python\nprint(6*7)\n```"
    script0 = [a, b] + _ids(tok, call) + _ids(tok, "So 42.")
    script1 = _ids(tok, "No tool: 5.")
    engine = _engine(tok, [script0, script1])
    batch = engine.generate(["Q1? ", "Q2? "])
    eos = tok.eos_token_id
    inserted = _ids(tok, RAW_WRAP[0]) + _ids(tok, "42\n") + _ids(tok, RAW_WRAP[1])
    want0 = [a, b] + _ids(tok, call) + inserted + _ids(tok, "So 42.") + [eos]
    resp = batch.response_ids
    n0 = int(batch.response_mask[0].sum())
    assert resp[0, :n0].tolist() == want0  # exactly the sampled ids and the tool's, "a" "b" kept apart
    tool0 = [0] * (2 + len(_ids(tok, call))) + [1] * len(inserted) + [0] * (len(_ids(tok, "So 42.")) + 1)
    assert batch.tool_mask[0, :n0].tolist() == tool0
    assert batch.model_mask[0].sum() == n0 - len(inserted)
    n1 = int(batch.response_mask[1].sum())
    assert resp[1, :n1].tolist() == script1 + [eos] and batch.tool_mask[1].sum() == 0
    assert batch.completions[0] == "ab" + call + "\nSo 42." and batch.completions[1] == "No tool: 5."
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"] and batch.turns[0][1]["content"] == "42\n"
    assert batch.tool_counts[0] == {"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
    assert batch.tool_counts[1] == {"turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}
    assert batch.truncated.tolist() == [False, False]
    # Every position is attended once; the prompt's left padding is not.
    assert batch.attention_mask[:, batch.prompt_len :].sum() == n0 + n1


def test_long_output_is_cut_and_says_so_and_limits_count_the_models_tokens():
    tok = _tokenizer()
    call = "```python\nprint('x' * 500)\n```"
    engine = _engine(tok, [_ids(tok, call) + _ids(tok, "done")], tool_output_tokens=10, max_new_tokens=len(call) + 2)
    batch = engine.generate(["Q "])
    out = batch.turns[0][1]["content"]
    assert out.startswith("x" * 10) and out.endswith("[output cut at 10 tokens]\n")
    # max_new_tokens counts the model's tokens only: the call, then 2 more of "done", cut there
    assert int(batch.model_mask[0].sum()) == len(call) + 2 and bool(batch.truncated[0])
    assert int(batch.tool_mask[0].sum()) > 10


def test_hostile_tool_code_comes_back_as_an_error_never_a_hang():
    tok = _tokenizer()
    names = ["loop", "flood", "memory_bomb", "fork_bomb"]
    scripts = [
        _ids(tok, f"```python\n{HOSTILE[n]}\n```") + _ids(tok, "%%") for n in names
    ]  # no character of any output
    t0 = time.monotonic()
    batch = _engine(tok, scripts).generate(["Q "] * len(names))
    elapsed = time.monotonic() - t0  # each program stopped at its limit: the 1 s time-out at most, and the kill
    counts = {n: c for n, c in zip(names, batch.tool_counts)}
    outs = {n: t[1]["content"] for n, t in zip(names, batch.turns)}
    level = detect_isolation().level  # the isolation level these ran at (root, rootless or basic)
    assert all(c["tool_calls"] == 1 and c["tool_errors"] == 1 for c in counts.values()), (level, counts)
    assert counts["loop"]["tool_timeouts"] == 1 and outs["loop"].startswith("TimeoutError")
    assert outs["flood"].endswith("[output cut at 32 tokens]\n") and outs["memory_bomb"].startswith("MemoryError")
    assert all(t[2]["content"] == "%%" for t in batch.turns)  # the model went on after each
    assert elapsed < 30, elapsed  # a bound far above the ~2 s it takes, far below a hang


TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_chat_model_gets_the_tool_message_its_template_writes():
    """With a chat template the turn ends at the stop token; the observation goes in the text
    the template writes around a tool message, the next assistant header after it."""
    from gspo_cli.models.prompts import PromptFormat

    tok = _tokenizer()
    tok.chat_template = TEMPLATE
    eos = tok.eos_token_id
    turn = _ids(tok, "```python\nprint(6*7)\n```") + [eos]
    base = HFRolloutEngine(
        Scripted(tok, [turn + _ids(tok, "%%")]),
        tok,
        max_new_tokens=200,
        temperature=1.0,
        stop_ids=[eos],
        prompt_format=PromptFormat().formatter(tok),
    )
    env = resolve_environment("python", {"timeout_s": 1.0})
    engine = MultiTurnEngine(
        base, env, max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=32
    )
    assert engine.wrap == ("<|tool|>", "</s><|assistant|>")
    batch = engine.generate(["Q"])
    inserted = _ids(tok, "<|tool|>") + _ids(tok, "42\n") + _ids(tok, "</s><|assistant|>")
    assert eos in inserted  # the template's own end of the tool message, as the tokenizer reads it
    want = turn + inserted + _ids(tok, "%%") + [eos]
    n = int(batch.response_mask[0].sum())
    assert batch.response_ids[0, :n].tolist() == want
    assert batch.tool_mask[0, :n].tolist() == [0] * len(turn) + [1] * len(inserted) + [0] * 3
    prompt = batch.input_ids[0, : batch.prompt_len][batch.attention_mask[0, : batch.prompt_len] > 0]
    assert prompt.tolist() == _ids(tok, "<|user|>Q</s><|assistant|>")
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"] and not batch.truncated[0]


# Qwen2.5's ChatML as its tokenizer renders tool results: consecutive tool messages share one
# user turn, each in <tool_response> tags; every turn ends "<|im_end|>\n".
CHATML = (
    "{%- for message in messages %}"
    "{%- if message.role in ['system', 'user', 'assistant'] %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_chatml_model_sees_exactly_what_its_template_renders_around_a_tool_message():
    """The model's turn ends at <|im_end|>; the template then writes "\\n" before the tool
    message's turn. The ids a two-turn rollout ends with are the template's rendering of the
    same conversation (then the model's last turn), token for token: the "\\n" after
    <|im_end|> was missing."""
    from gspo_cli.models.prompts import PromptFormat

    tok = _tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token, tok.chat_template = "<|im_end|>", CHATML
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = "```python\nprint(6*7)\n```"
    base = HFRolloutEngine(
        Scripted(tok, [_ids(tok, call) + [end] + _ids(tok, "It is 42.")]),
        tok,
        max_new_tokens=200,
        temperature=1.0,
        stop_ids=[end],
        prompt_format=PromptFormat().formatter(tok),
    )
    env = resolve_environment("python", {"timeout_s": 1.0})
    engine = MultiTurnEngine(
        base, env, max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=32
    )
    assert engine.wrap == (
        "\n<|im_start|>user\n<tool_response>\n",
        "\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    batch = engine.generate(["What is 6*7?"])
    n = batch.prompt_len + int(batch.response_mask[0].sum())
    got = batch.input_ids[0, :n][batch.attention_mask[0, :n] > 0].tolist()
    assert batch.turns[0][1]["content"] == "42\n"
    messages = [
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": batch.turns[0][1]["content"]},  # the observation as it came ("42\\n")
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_end|>\n<|im_start|>user\n<tool_response>" in rendered
    assert got == _ids(tok, rendered + "It is 42.<|im_end|>")


class Rewarding:
    """Rewards by the prompt: "A" 0.5 on its first turn, then done with 0.25; "B" 1.0 on every
    turn, never done (a limit ends it: finish() gets the turn step did not see, and gives 2.0
    when it reads "##"); "C" no reward at all."""

    def start(self, prompt):
        self.kind, self.seen, self.finished = prompt.strip(), 0, []

    def step(self, turn):
        self.seen += 1
        if self.kind == "A":
            return ("ok", False, 0.5) if self.seen == 1 else (None, True, 0.25)
        return ("ok", False, 1.0 if self.kind == "B" else None)

    def finish(self, turn):
        self.finished.append(turn)
        return 2.0 if turn == "##" else None


def test_the_environments_rewards_are_summed_and_travel_with_the_completion():
    import pickle

    tok = _tokenizer()
    eos = tok.eos_token_id
    turn = _ids(tok, "%") + [eos]
    scripts = [turn * 2, turn * 3, turn * 2 + _ids(tok, "##")]
    base = HFRolloutEngine(Scripted(tok, scripts), tok, max_new_tokens=50, temperature=1.0, stop_ids=[eos])
    envs = []
    engine = MultiTurnEngine(
        base,
        lambda: envs.append(Rewarding()) or envs[-1],
        max_new_tokens=50,
        max_total_tokens=100,
        max_turns=3,
        max_tool_calls=5,
        tool_output_tokens=8,
    )
    batch = engine.generate(["A", "C", "B"])
    # A: 0.5 + 0.25, ended by its environment (no finish); C: no reward, its third turn ended by
    # max_turns (finish sees it); B: 1.0 + 1.0 for the turns stepped, 2.0 from finish("##")
    assert [c.env_reward for c in batch.completions] == [0.75, None, 4.0]
    assert [e.finished for e in envs] == [[], ["%"], ["##"]]
    assert [c["turns"] for c in batch.tool_counts] == [2, 3, 3]
    assert batch.completions[2] == "%\n%\n##" and isinstance(batch.completions[2], str)
    back = pickle.loads(pickle.dumps(batch.completions[0]))  # as reward pools and workers get it
    assert back == "%\n%" and back.env_reward == 0.75


def test_code_feedback_in_the_engine_feeds_failures_back_and_rewards_the_fixed_program():
    from gspo_cli.tasks.base import Problem
    from gspo_cli.tasks.code_judge import TestCase

    tok = _tokenizer()
    read = "a,b=map(int,input().split())\n"
    wrong, right = f"```python\n{read}print(a*b)\n```", f"%\n```python\n{read}print(a+b)\n```"
    tests = (TestCase("1 2\n", "3\n"), TestCase("5 5\n", "10\n"))
    problem = Problem(id="sum", prompt="Print a+b.\n", answer="", meta={"tests": tests})
    base = HFRolloutEngine(
        Scripted(tok, [_ids(tok, wrong + right)]), tok, max_new_tokens=200, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    env = resolve_environment("code_feedback", {"attempts": 3, "timeout_s": 1.0})
    engine = MultiTurnEngine(
        base, env, max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=100
    )
    batch = engine.generate([problem.prompt], problems=[problem])
    feedback = (
        "Attempt 1 of 3 failed (2 left). 1 of 1 public tests failed.\nTest 1: input:\n1 2\nexpected:\n3\ngot:\n2\n"
    )
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"]
    assert batch.turns[0][1]["content"] == feedback
    # the fixed program passes the public test and ends the rollout; the private test (5 5 -> 10) rewards it
    assert batch.completions[0].env_reward == 1.0 and not batch.truncated[0]
    assert batch.tool_counts[0] == {"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}


@pytest.fixture(params=["root", "rootless", "basic"])
def level(request):
    """The sandbox switched to one isolation level (skipped where that level does not work here)."""
    yield use_level(request.param).level
    sandbox.reset_isolation()


def test_tool_code_cannot_open_a_network_connection(level):
    """At the root and rootless levels the tool's program runs in a network namespace of its
    own (a loopback that is down): a connection to a server on the host's loopback fails and
    comes back as an error observation. The test id names the level that ran; basic cannot
    block the network and is skipped, saying so."""
    if level == "basic":
        pytest.skip("isolation level basic: no network namespace, the sandbox cannot block the network")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        port = srv.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)\nprint('connected')"
        obs = resolve_environment("python", {"timeout_s": 2.0})().step(f"```python\n{code}\n```")
        assert obs.error and not obs.done and "connected" not in obs.text, (level, obs)
        assert obs.text.startswith("OSError: [Errno 101] Network is unreachable"), (level, obs.text)
        with pytest.raises(socket.timeout):
            srv.accept()  # nothing reached the host


def test_a_finish_that_returns_no_number_is_one_line():
    from gspo_cli.errors import RunError

    class Bad:
        def start(self, prompt):
            return None

        def step(self, turn):
            return ("ok", False, None)

        def finish(self, turn):
            return "lots"

    tok = _tokenizer()
    base = HFRolloutEngine(
        Scripted(tok, [_ids(tok, "%")]), tok, max_new_tokens=50, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    engine = MultiTurnEngine(
        base, Bad, max_new_tokens=50, max_total_tokens=100, max_turns=1, max_tool_calls=1, tool_output_tokens=8
    )
    # one line, naming the rollout it came from
    with pytest.raises(
        RunError,
        match=r"^task.environment: finish\(\) returned str, not a number or None "
        r"\(the rollout whose prompt starts 'Q'\)$",
    ):
        engine.generate(["Q"])


class Blocking:
    """An environment whose `method` never returns (a dead server, a deadlock)."""

    method = "step"

    def start(self, prompt):
        if self.method == "start":
            time.sleep(10**6)
        return None

    def step(self, turn):
        time.sleep(10**6)


def _blocking_engine(method, **kw):
    tok = _tokenizer()
    base = HFRolloutEngine(
        Scripted(tok, [_ids(tok, "6*7")] * 2), tok, max_new_tokens=20, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    env = type("Env", (Blocking,), {"method": method})
    limits = dict(max_new_tokens=20, max_total_tokens=40, max_turns=2, max_tool_calls=1, tool_output_tokens=8)
    return MultiTurnEngine(base, env, **limits, **kw)


@pytest.mark.parametrize("method", ["start", "step"])
def test_an_environment_that_never_returns_ends_the_run_at_its_time_out(method):
    from gspo_cli.errors import RunError

    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        _blocking_engine(method, timeout_s=0.5).generate(["6*7=?", "2+2=?"])
    assert time.monotonic() - t0 < 5
    assert str(err.value) == (
        f"task.environment: {method}() did not return within 0.5 s (task.environment_timeout_s) for the rollout "
        "whose prompt starts '6*7=?'; the call was abandoned and the run stopped"
    )


def test_a_stop_signal_abandons_a_blocked_environment_after_the_grace(monkeypatch):
    from gspo_cli.errors import InterruptedRun
    from gspo_cli.rollout import env_calls
    from gspo_cli.train.watch import StopFlag

    monkeypatch.setattr(env_calls, "STOP_GRACE_S", 0.5)
    stop = StopFlag()
    threading.Timer(0.3, stop.set, ["SIGTERM"]).start()  # a signal while step() blocks
    t0 = time.monotonic()
    with pytest.raises(InterruptedRun, match=r"^stopped by SIGTERM: the environment's step\(\) was still running"):
        _blocking_engine("step", stop=stop).generate(["6*7=?"])  # the default time-out: 120 s
    assert 0.8 <= time.monotonic() - t0 < 5  # the grace after the signal, not the time-out


BAD_RETURNS = {
    "step": lambda self, turn: ("obs", False, "abc"),
    "observation": lambda self, turn: Observation(text=123),
    "start": lambda self, prompt: 12345,
}


@pytest.mark.parametrize(
    "bad, line",
    [
        ("step", "step() returned a reward str 'abc', not a number or None"),
        ("observation", "step() returned an observation of type int 123, not a string or None"),
        ("start", "start() returned int 12345; it returns None (the task's prompt), a string, or a list of"),
    ],
)
def test_an_environment_returning_the_wrong_types_fails_the_run_in_one_line(bad, line):
    from gspo_cli.errors import RunError

    methods = {"start": lambda self, prompt: None, "step": lambda self, turn: ("ok", True, 1.0)}
    methods["start" if bad == "start" else "step"] = BAD_RETURNS[bad]
    tok = _tokenizer()
    base = HFRolloutEngine(
        Scripted(tok, [_ids(tok, "6*7")]), tok, max_new_tokens=20, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    limits = dict(max_new_tokens=20, max_total_tokens=40, max_turns=2, max_tool_calls=1, tool_output_tokens=8)
    engine = MultiTurnEngine(base, type("Wrong", (), methods), **limits)
    with pytest.raises(RunError) as err:  # the run fails (exit 1): the spec was fine
        engine.generate(["6*7=?"])
    assert str(err.value).startswith(f"task.environment: {line}") and "\n" not in str(err.value)


def test_an_environment_that_raises_fails_the_run_without_waiting_for_a_blocked_one():
    from gspo_cli.errors import RunError

    class RaisesOrBlocks:
        def start(self, prompt):
            self.prompt = prompt
            return None

        def step(self, turn):
            if self.prompt.startswith("2"):
                time.sleep(10**6)
            raise ValueError("no such tool\n" + "x" * 10_000)

    tok = _tokenizer()
    base = HFRolloutEngine(
        Scripted(tok, [_ids(tok, "6*7")] * 2), tok, max_new_tokens=20, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    limits = dict(max_new_tokens=20, max_total_tokens=40, max_turns=2, max_tool_calls=1, tool_output_tokens=8)
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        MultiTurnEngine(base, RaisesOrBlocks, **limits).generate(["2+2=?", "6*7=?"])
    assert time.monotonic() - t0 < 5  # not the 120 s time-out of the blocked call
    assert str(err.value) == (
        "task.environment: step() raised ValueError: no such tool (the rollout whose prompt starts '6*7=?')"
    )
