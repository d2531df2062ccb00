"""The environment protocol of multi-turn rollouts (`task.environment`): what answers the model
between turns, and how what it returns is read.

One object per rollout (row), made by calling the registered class or factory
with `task.environment_params` as keyword arguments:

    class MyEnv:
        def __init__(self, **params): ...
        def start(self, prompt: str) -> str | list[dict] | None:
            # the first messages: None keeps the task's prompt, a string replaces it, a list of
            # {"role", "content"} messages is rendered through the chat template.
            # `start(self, prompt, problem)`: also gets the task's Problem (its tests, answer, meta)
        def step(self, turn: str) -> tuple[str | None, bool, float | None] | Observation:
            # react to one model turn (its text): (observation, done, reward); an observation
            # of None, or done, ends the rollout
        def finish(self, turn: str | None) -> float | None:  # optional
            # the rollout ended by a limit (max_turns, max_tool_calls, max_new_tokens,
            # max_total_tokens), not by the environment: `turn` is the text of the model's
            # last turn when step() did not see it, else None; returns a reward (or None)

`turn` is the text of the model's last turn only. The observation goes back to the model as
a tool message (rollout/turns.py). The rollout's environment reward is the sum of the rewards
step() and finish() returned (None when all were None); it travels with the completion
(`EnvCompletion.env_reward`) and reaches the RL reward through the shipped reward `env`
(`task.rewards: [{function: env}]`, rewards/shipped.py), weighted and summed with the others.

Built in: `python`, tool-integrated reasoning: the last fenced ```python block of a turn runs
in the sandbox (gspo_cli/sandbox) as a fresh process, nothing kept between calls (a variable
defined in one call is gone in the next); its stdout comes back, or the error's last line, or
the time-out. A turn without a block ends the rollout. `code_feedback` (environments/code_feedback.py):
code problems, the public tests' failures fed back, the private tests the reward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from gspo_cli.errors import RunError

PY_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)  # a closed tool call of the built-in format
RAW_WRAP = ("\n```output\n", "```\n")  # the built-in model's tool message (the observation ends in a newline)
_RAW_TOOL = re.compile(re.escape(RAW_WRAP[0]) + ".*?" + re.escape(RAW_WRAP[1]), re.DOTALL)


def split_tool_output(text: str) -> list[tuple[str, bool]]:
    """`text` (a worked solution in the built-in format) as [(part, is_tool_output)]: each
    "```output\n...\n```\n" block, wrapper included, is the environment's. The cold start
    tokenises the parts apart, as rollouts do, and trains on the model's parts only."""
    out, at = [], 0
    for m in _RAW_TOOL.finditer(text):
        out += [(text[at : m.start()], False), (m.group(0), True)]
        at = m.end()
    return [(t, tool) for t, tool in [*out, (text[at:], False)] if t]


@dataclass(frozen=True)
class Observation:
    """What `step` returns (a plain (observation, done, reward) tuple works too); `error` and
    `timeout` are counted per response (tools/tool_errors_mean, tools/tool_timeouts_mean)."""

    text: str | None
    done: bool = False
    reward: float | None = None
    error: bool = False
    timeout: bool = False


class EnvCompletion(str):
    """A multi-turn completion (the model's turns, joined): text wherever a completion is
    text, carrying the rollout's environment reward (`env_reward`, None when the environment
    gave none) to the reward `env`, through training and evaluation alike."""

    env_reward: float | None

    def __new__(cls, text: str, env_reward: float | None = None):
        obj = super().__new__(cls, text)
        obj.env_reward = env_reward
        return obj

    def __reduce__(self):  # pickled with its reward (reward pools, staleness workers)
        return (EnvCompletion, (str(self), self.env_reward))


def env_reward(task) -> Callable[[Any, Any], list[float | None]]:
    """The shipped reward `env` (rewards/shipped.py; `task` unused): each completion's environment
    reward, the sum of what step() and finish() returned (None, "does not apply": none given,
    or a completion sampled without an environment, e.g. `gspo eval --no-tools`)."""
    return lambda problems, completions: [getattr(c, "env_reward", None) for c in completions]


def takes_problem(env) -> bool:
    """Whether `env.start` accepts the problem (a parameter named `problem`, or **kwargs)."""
    import inspect

    try:
        params = inspect.signature(env.start).parameters
    except (TypeError, ValueError):
        return False
    return "problem" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def as_observation(out: Any, where: str) -> Observation:
    """`step`'s return value as an Observation. What is not (str | None, done, number | None) or
    an Observation of those types fails the run (RunError, one line naming `where` and the part):
    the environment broke mid-run, the spec was fine."""
    if isinstance(out, Observation):
        text, done, reward = out.text, out.done, out.reward
    elif isinstance(out, tuple) and len(out) == 3:
        text, done, reward = out
    else:
        raise RunError(f"{where}: step() returned {_kind(out)}, not (observation, done, reward)")
    if text is not None and not isinstance(text, str):
        raise RunError(f"{where}: step() returned an observation of type {_kind(text)}, not a string or None")
    try:
        reward = as_reward(reward)
    except TypeError:
        raise RunError(f"{where}: step() returned a reward {_kind(reward)}, not a number or None") from None
    if isinstance(out, Observation):
        return out if reward == out.reward else Observation(text, out.done, reward, out.error, out.timeout)
    return Observation(text, bool(done), reward)


def as_reward(value: Any) -> float | None:
    """An environment's reward as a float (None stays None); TypeError for what is no real number
    (a string, even "1.5", is not one)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise TypeError(type(value).__name__)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(type(value).__name__) from None


def as_start(out: Any, where: str) -> str | list[dict] | None:
    """`start`'s return value: None, a string, or a list of {"role", "content"} messages with
    string values; anything else fails the run (RunError, one line naming `where`)."""
    if out is None or isinstance(out, str):
        return out
    if (
        isinstance(out, list)
        and out
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in out
        )
    ):
        return out
    raise RunError(
        f"{where}: start() returned {_kind(out)}; it returns None (the task's prompt), a string, or a list "
        'of {"role", "content"} messages'
    )


def _kind(value: Any) -> str:
    """A value as messages name it: its type, and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:40] + '...'}"


def last_python_block(text: str) -> str | None:
    """The code of the last closed ```python block of `text`, or None."""
    found = PY_BLOCK.findall(text)
    return found[-1] if found else None
