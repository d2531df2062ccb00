"""Multi-turn rollouts with tools (`task.environment`): the bookkeeping every engine shares
(TurnTaking: turns, limits, tool messages, the batch). The samplers built on it: the hf engine's
(MultiTurnEngine, rollout/turns.py) and the vLLM engines' (rollout/vllm_turns.py).

The model samples until its turn ends: a stop id, or (raw prompts, the built-in model's
format) a closed ```python block. The row's environment (environments/) reacts to the
turn's text; its observation, cut to `rollout.tool_output_tokens` (saying so), is tokenised on
its own and fed to the model as forced tokens, inside a fixed wrapper (raw prompts:
"\\n```output\\n" ... "```\\n", the observation ending in a newline) or the chat template's
tool message (the template's text after the turn's stop token, around a tool message and up to
the next assistant header, rendered once); then the model continues. One KV cache serves every
turn: rows advance one position per forward, sampling or reading their queued tool tokens, so each
row's ids are exactly what the model sampled plus the tool output's own ids, never a
re-tokenisation of earlier turns (token-in-token-out).

Limits: `rollout.max_new_tokens` counts the model's tokens over all turns, `max_total_tokens`
model and tool tokens together (both cut the row: `truncated`); `max_turns` model turns and
`max_tool_calls` observations (a row that reaches either ends at that turn; a turn cut
mid-call is `truncated`). The batch's `tool_mask` marks the tool tokens: no loss, ratio or
statistic counts them (RolloutBatch.model_mask).

Every call of an environment (start, step, finish) is bounded by `task.environment_timeout_s` and
watched for stop signals (rollout/env_calls.py): a blocking environment never hangs the run.

The environment's rewards (step's, and finish's when a limit ended the rollout) are summed
per row and handed on with the completion (`EnvCompletion.env_reward`: the reward `env`).
`generate(prompts, problems)`: an environment whose `start` takes `problem` gets the row's.
With the base engine's routing recorder (R3) every forward's routes are kept: each forward
feeds every row one position (sampled or tool output), so `engine_routes` covers tool positions.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch

from gspo_cli.environments import (
    PY_BLOCK,
    RAW_WRAP,
    EnvCompletion,
    Observation,
    as_observation,
    as_reward,
    as_start,
    takes_problem,
)
from gspo_cli.errors import RunError, SpecError
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.rollout.env_calls import EnvironmentCalls, prompt_start
from gspo_cli.tasks.base import Conversation

_SLOT = "\u2063TOOL_OUTPUT\u2063"  # stands for the observation while the template is rendered
_TURN = "\u2063MODEL_TURN\u2063"  # and this for the model's turn before it


@dataclass
class _Row:
    env: object
    prompt: object = ""  # the task's prompt (messages name the rollout by it)
    ids: list[int] = field(default_factory=list)  # response ids so far (model and tool)
    tool: list[int] = field(default_factory=list)  # 1 where ids[j] is the environment's
    logp: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    forced: collections.deque = field(default_factory=collections.deque)
    turn_start: int = 0  # where the model's current turn began in `ids`
    model_tokens: int = 0
    done: bool = False
    truncated: bool = False
    turns: list[dict] = field(default_factory=list)
    counts: dict = field(
        default_factory=lambda: dict.fromkeys(("turns", "tool_calls", "tool_errors", "tool_timeouts"), 0)
    )
    reward: float | None = None  # the sum of the environment's rewards so far
    stepped: int = 0  # model turns step() has seen
    env_ended: bool = False  # the environment ended the rollout (else a limit did: finish())


class TurnTaking:
    """What every multi-turn engine shares around its base engine (tokenizer, prompt format, stop
    ids): each row's environment and first prompt, the end of a model turn, the tool message
    inserted after it, the limits, and the batch. Engines differ only in how they sample."""

    streams_rows = False  # rows are handed over whole, never early (not the hf base's, via __getattr__)
    takes_problems = True  # generate(prompts, problems): environments may read the row's problem

    def __init__(
        self,
        base,
        make_env,
        *,
        max_new_tokens,
        max_total_tokens,
        max_turns,
        max_tool_calls,
        tool_output_tokens,
        timeout_s: float = 120.0,
        stop=None,
    ):
        self.base, self.make_env = base, make_env
        self.calls = EnvironmentCalls(timeout_s, stop)  # every call of the environments, bounded
        self.tokenizer = base.tokenizer
        self.max_new_tokens, self.max_total_tokens = max_new_tokens, max_total_tokens
        self.max_turns, self.max_tool_calls, self.tool_output_tokens = max_turns, max_tool_calls, tool_output_tokens
        self.raw = not base.format.use_template
        tok = self.tokenizer
        stops = [tok.decode([i], skip_special_tokens=False) for i in base.stop_ids]
        self.wrap = RAW_WRAP if self.raw else tool_message_wrap(base.format, stops)
        self.wrap_ids = [tok(w, add_special_tokens=False).input_ids for w in self.wrap]

    def __getattr__(self, name):  # everything else (sleep, top_p, ...) is the base engine's
        return getattr(self.base, name)

    def _start(self, prompts: list, problems: list | None) -> tuple[list[_Row], list[list[int]]]:
        """A fresh environment per row, and the ids of each row's first prompt (the
        environment's `start` may replace the task's, and may read the row's problem)."""
        rows = [_Row(env=self.make_env(), prompt=p) for p in prompts]
        problems = problems if problems is not None else [None] * len(prompts)
        starts = self.calls.run(
            "start()",
            [_start_call(r.env, p, q) for r, p, q in zip(rows, prompts, problems)],
            prompts,
            one_at_a_time=True,  # in row order, as ever: an environment may draw from a shared generator
        )
        firsts = [p if s is None else Conversation(s) if isinstance(s, list) else s for p, s in zip(prompts, starts)]
        tok = self.tokenizer
        return rows, [tok(t, add_special_tokens=False).input_ids for t in self.base.format(firsts)]

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else self.base.stop_ids[0]

    @staticmethod
    def _left_padded(prompt_ids: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        P = max(map(len, prompt_ids))
        ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompt_ids], device=device)
        attn = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
        return ids, attn

    def _after_token(self, r: _Row, ev: list[str]) -> bool:
        """The limits after token `r.ids[-1]` (`ev`: what it ended, `_turn_end`); True when the
        row's environment must now answer its turn."""
        if r.model_tokens >= self.max_new_tokens or len(r.ids) >= self.max_total_tokens:
            r.done, r.truncated = True, ev != ["stop"]  # a stop on the last token allowed ends it
            r.forced.clear()
            self._close_turn(r)
        elif ev:
            self._close_turn(r)
            c = r.counts
            if c["turns"] >= self.max_turns or c["tool_calls"] >= self.max_tool_calls:
                r.done, r.truncated = True, ev == ["call"]  # no more turns: a call left unanswered
            else:
                return True
        return False

    def _answer(self, rows: list[_Row], ended: list[int]) -> None:
        """The environments of rows `ended` react to their last turns (several at once)."""
        for i in ended:
            rows[i].stepped = rows[i].counts["turns"]
        calls = [_step_call(rows[i].env, rows[i].turns[-1]["content"]) for i in ended]
        for i, obs in zip(ended, self.calls.run("step()", calls, [rows[i].prompt for i in ended])):
            self._after_turn(rows[i], obs)

    def _finish(self, rows: list[_Row]) -> None:
        """finish(turn) of the environments of rows a limit ended (those that define it)."""
        ended = [r for r in rows if not r.env_ended and callable(getattr(r.env, "finish", None))]
        unseen = [
            r.turns[-1]["content"] if r.counts["turns"] > r.stepped and r.turns[-1]["role"] == "model" else None
            for r in ended
        ]
        got = self.calls.run(
            "finish()", [_finish_call(r.env, t) for r, t in zip(ended, unseen)], [r.prompt for r in ended]
        )
        for r, v in zip(ended, got):
            _add_reward(r, _reward(v, r.prompt))

    def _text(self, r: _Row) -> str:
        return self.tokenizer.decode(r.ids[r.turn_start :], skip_special_tokens=True)

    def _turn_end(self, r: _Row, t: int, stops: set) -> list[str]:
        """["stop"] or ["call"] when token `t` ended the model's turn, else []."""
        if t in stops:
            return ["stop"]
        if self.raw and "`" in self.tokenizer.decode([t]) and PY_BLOCK.search(self._text(r)):
            return ["call"]
        return []

    def _close_turn(self, r: _Row) -> None:
        """Record the model's turn in progress (if any) as a finished one."""
        if len(r.ids) > r.turn_start and not r.tool[-1]:
            r.turns.append({"role": "model", "content": self._text(r)})
            r.counts["turns"] += 1
            r.turn_start = len(r.ids)

    def _after_turn(self, r: _Row, obs: Observation) -> None:
        """The environment's answer to the turn `r` just closed: the tool message queued, or the row done."""
        _add_reward(r, None if obs is None else obs.reward)
        if obs is None or obs.done or obs.text is None:
            r.done, r.truncated, r.env_ended = True, False, True
            return
        c = r.counts
        c["tool_calls"] += 1
        c["tool_errors"] += int(obs.error)
        c["tool_timeouts"] += int(obs.timeout)
        end = "\n" if self.raw else ""  # the fixed wrapper closes on a line of its own
        body = self.tokenizer(obs.text, add_special_tokens=False).input_ids
        if len(body) > self.tool_output_tokens:
            note = f"\n[output cut at {self.tool_output_tokens} tokens]{end}"
            body = body[: self.tool_output_tokens] + self.tokenizer(note, add_special_tokens=False).input_ids
        elif end and not obs.text.endswith(end):
            body += self.tokenizer(end, add_special_tokens=False).input_ids
        insert = self.wrap_ids[0] + body + self.wrap_ids[1]
        r.turns.append({"role": "tool", "content": self.tokenizer.decode(body, skip_special_tokens=False)})
        r.forced.extend(insert[: max(0, self.max_total_tokens - len(r.ids))])
        if not r.forced:
            r.done = r.truncated = True

    def _batch(self, rows: list[_Row], ids, attn, pad: int, *, logprobs: bool, entropy: bool) -> RolloutBatch:
        """The batch of finished `rows` after their prompts `ids` (left-padded, `attn`): the
        sampler's log-probs (0 on tool tokens) and entropies where asked for."""
        C = max(len(r.ids) for r in rows)
        dev = ids.device

        def grid(vals, fill):
            return [v + [fill] * (C - len(v)) for v in vals]

        resp = torch.tensor(grid([r.ids for r in rows], pad), device=dev)
        real = torch.tensor(grid([[1] * len(r.ids) for r in rows], 0), device=dev)
        batch = RolloutBatch(
            input_ids=torch.cat([ids, resp], 1),
            attention_mask=torch.cat([attn, real], 1),
            response_mask=real.float(),
            prompt_len=ids.shape[1],
            completions=[
                EnvCompletion("\n".join(t["content"] for t in r.turns if t["role"] == "model"), r.reward) for r in rows
            ],
            truncated=torch.tensor([r.truncated for r in rows]),
            tool_mask=torch.tensor(grid([r.tool for r in rows], 0), device=dev).float(),
            turns=[r.turns for r in rows],
            tool_counts=[r.counts for r in rows],
        )
        if logprobs:
            batch.engine_logp = torch.tensor(grid([r.logp for r in rows], 0.0), device=dev)
        if entropy:
            batch.engine_entropy = torch.tensor(grid([r.entropy for r in rows], 0.0), device=dev)
        return batch


def _add_reward(r: _Row, value: float | None) -> None:
    if value is not None:
        r.reward = (r.reward or 0.0) + value


def _reward(value, prompt) -> float | None:
    """finish()'s return value as a reward; RunError (the run fails, one line naming the rollout's
    prompt) for what is no number."""
    try:
        return as_reward(value)
    except TypeError:
        raise RunError(
            f"task.environment: finish() returned {type(value).__name__}, not a number or None (the rollout "
            f"whose prompt starts {prompt_start(prompt)})"
        ) from None


def _start_call(env, prompt, problem):
    """The call of `env.start` for one rollout (with its problem when start takes one)."""
    if takes_problem(env):
        return lambda: as_start(env.start(prompt, problem=problem), "task.environment")
    return lambda: as_start(env.start(prompt), "task.environment")


def _step_call(env, text: str):
    return lambda: as_observation(env.step(text), "task.environment")


def _finish_call(env, text: str | None):
    return lambda: env.finish(text)


def tool_message_wrap(fmt, stop_texts: list[str] = ()) -> tuple[str, str]:
    """(before, after) the observation in the chat template's tool message, with the next
    assistant header after it: the text a template adds after a model turn that ended at its
    stop id. The model's turn ends with the stop token itself (`stop_texts`: the stop ids'
    texts), so what the template writes after that token (ChatML's newline after <|im_end|>)
    opens `before`. SpecError when the template renders earlier turns differently once a tool
    message follows (the wrap would not be a suffix)."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _TURN}]
    kw = fmt.template_kwargs
    apply = fmt.tokenizer.apply_chat_template
    try:
        before = apply(msgs, tokenize=False, **kw)
        after = apply([*msgs, {"role": "tool", "content": _SLOT}], tokenize=False, add_generation_prompt=True, **kw)
    except Exception as err:  # noqa: BLE001 - the checkpoint's template
        raise SpecError(
            f"task.environment: the chat template cannot render a tool message ({type(err).__name__}: {err})"
        ) from None
    if not after.startswith(before) or after.count(_SLOT) != 1 or before.count(_TURN) != 1:
        raise SpecError("task.environment: the chat template renders earlier turns differently after a tool message")
    pre, post = after[len(before) :].split(_SLOT)
    return _after_stop(before.split(_TURN)[1], stop_texts) + pre, post


def _after_stop(tail: str, stop_texts) -> str:
    """What the template writes after a model turn's stop token: `tail` (its text after the
    turn's content) past the longest stop text it starts with; all of it when it starts with
    none (the template ends a turn without the token the model stops at)."""
    stop = max((t for t in stop_texts if t and tail.startswith(t)), key=len, default="")
    return tail[len(stop) :]
