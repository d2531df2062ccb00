"""Calling the reward functions of one batch of rows (`RewardedTask.scoring`) and reading what
they return: TRL's keyword arguments (`row_columns`, conversational rows as messages), the
calls (in the trainer, or in the reward pool's workers: rewards/pool.py), and the check
that each call returned one number or None per row, as one line naming the reward and the row.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gspo_cli import user_code
from gspo_cli.errors import GspoError, RunError
from gspo_cli.rewards import pool, user_functions
from gspo_cli.tasks.base import Conversation, Problem, Score


@dataclass(frozen=True)
class Reward:
    """One resolved reward: its name in logs, weight, whether it decides correctness, and how
    to call it. `file`: the absolute path of a FILE.py function (fingerprinted in run.json)."""

    name: str
    weight: float
    correct: bool
    call: Callable[..., Any]  # user: TRL's fn; shipped: fn(problems, completions)
    shipped: bool = False
    file: str | None = None
    digest: str | None = None  # a reward model's weights digest (its `file`: the model's path)
    source: str | None = None  # what a reward pool worker loads (`load_source`); None: runs in the trainer


def row_columns(problem: Problem) -> dict[str, Any]:
    """The dataset columns a reward function gets for `problem` (besides the prompt): a
    `prompts` row's own columns, else the task's answer and reference solution."""
    columns = (problem.meta or {}).get("columns")
    if columns is not None:
        return dict(columns)
    return {"answer": problem.answer, "solution": problem.solution}


class Scoring:
    """The scores of one batch of rows of `task` (a RewardedTask: its `rewards`, `encode`).

    Each reward is called once on the whole batch, as TRL calls it: user and plugin functions
    in a worker of the reward pool when one runs (`pool.active()`), the others in the
    trainer meanwhile, all in `finish`. With a pool in `chunks` mode (task.reward_calls: chunks)
    rows handed to `add` as they are sampled go to the pool's workers at once, `finish` sends the
    rest in contiguous chunks, one per worker, and the answers are joined in row order. Each
    call's answer is checked against that call's own rows."""

    def __init__(self, task, problems, step: int):
        self.task, self.problems, self.step = task, list(problems), step
        self.pool = pool.active()
        self.pooled = [r for r in task.rewards if r.source is not None] if self.pool is not None else []
        self.sent: dict[int, tuple[str, list[int]]] = {}  # row -> (completion, ids) it was sent with
        self.calls: list[tuple[Reward, list[int], int]] = []  # (reward, rows, pool call id)

    @property
    def wants_rows(self) -> bool:
        """Whether rows handed over before the batch is complete are scored early (a pool in chunks mode)."""
        return bool(self.pooled) and self.pool.chunks

    def add(self, rows, completions, completion_ids) -> None:
        """Rows `rows` (indices into the problems) were sampled: send them to the pool now (chunks mode)."""
        if not self.wants_rows or not rows:
            return
        rows, completions, ids = list(rows), list(completions), [_ids(x) for x in completion_ids]
        for i, c, t in zip(rows, completions, ids):
            self.sent[i] = (c, t)
        step = -(-len(self.problems) // self.pool.size)  # rows per call: a burst of rows spreads over the workers
        for j in range(0, len(rows), step):
            self._submit(rows[j : j + step], completions[j : j + step], ids[j : j + step])

    def _submit(self, rows: list[int], completions: list[str], ids: list[list[int]]) -> None:
        problems = [self.problems[i] for i in rows]
        args = _arguments(problems, completions, ids, self.step)
        kwargs = _user_kwargs(*args[1:])
        for r in self.pooled:
            call = self.pool.submit(r.name, r.source, _text(problems[0]), kwargs, len(rows))
            self.calls.append((r, rows, call))

    def finish(self, completions, completion_ids=None) -> list[Score]:
        """The scores of every row, given every row's completion (and token ids)."""
        problems, completions = self.problems, list(completions)
        if completion_ids is None:
            encode = self.task.encode or (lambda text: [ord(ch) for ch in text])
            completion_ids = [encode(c) for c in completions]
        completion_ids = [_ids(x) for x in completion_ids]
        try:
            return self._finish(problems, completions, completion_ids)
        finally:
            if self.pool is not None:
                self.pool.discard(c for _, _, c in self.calls)

    def _finish(self, problems, completions, completion_ids) -> list[Score]:
        n = len(completions)
        if any(self.sent[i] != (completions[i], completion_ids[i]) for i in self.sent):
            self.pool.discard(c for _, _, c in self.calls)  # never expected: sent text differs from the batch's
            self.sent, self.calls = {}, []
        rest = [i for i in range(n) if i not in self.sent]
        if self.pooled and rest:
            k = min(self.pool.size, len(rest)) if self.pool.chunks else 1
            for j in range(k):  # contiguous chunks, one per worker (or the whole batch)
                rows = rest[j * len(rest) // k : (j + 1) * len(rest) // k]
                self._submit(rows, [completions[i] for i in rows], [completion_ids[i] for i in rows])
        texts = [_text(p) for p in problems]  # what error messages quote
        args = _arguments(problems, completions, completion_ids, self.step)
        got = {r.name: _called(r, args, texts) for r in self.task.rewards if r not in self.pooled}
        for r in self.pooled:
            got[r.name] = self._collected(r, n, texts)
        values = [_checked(r.name, got[r.name], texts) for r in self.task.rewards]
        scores = []
        for i in range(n):
            applied = {r.name: v[i] for r, v in zip(self.task.rewards, values) if v[i] is not None}
            total = sum(r.weight * applied[r.name] for r in self.task.rewards if r.name in applied)
            if not math.isfinite(total):
                raise RunError(
                    f"the weighted rewards of the row whose prompt starts {texts[i][:40]!r} sum to {total} "
                    f"(beyond a float's range): {applied}"
                )
            judge = next((applied.get(r.name) for r in self.task.rewards if r.correct), None)
            correct = judge is not None and judge >= 1
            scores.append(Score(reward=float(total), correct=correct, components=applied, rewarded=bool(applied)))
        return scores

    def _collected(self, r: Reward, n: int, texts: list[str]) -> list:
        """Reward r's answers from the pool, in row order (its calls read in order of their first
        row), each call's checked against its own rows."""
        values: list = [None] * n
        for _, rows, call in sorted((c for c in self.calls if c[0] is r), key=lambda c: c[1][0]):
            try:
                with user_code.user_call(f"reward {r.name}"):  # waiting on the pool: a stop abandons it
                    got = self.pool.result(call)
            except pool.RewardRaised as err:
                raise RunError(_raised_message(r.name, texts[rows[err.row]], err.text)) from None
            for i, v in zip(rows, _as_list(r.name, got, len(rows))):
                values[i] = v
        return values


def _text(problem: Problem) -> str:
    return problem.prompt if isinstance(problem.prompt, str) else str(problem.prompt)


def _arguments(problems, completions, completion_ids, step: int):
    """(problems, completions, completion_ids, prompts, columns, state) as reward functions get
    them: conversational rows as TRL hands them over (the prompt's messages, the completion as
    one message), `columns` every dataset column by name."""
    chat = [isinstance(p.prompt, Conversation) for p in problems]
    prompts = [list(p.prompt.messages) if c else p.prompt for p, c in zip(problems, chat)]
    completions = [[{"role": "assistant", "content": t}] if c else t for t, c in zip(completions, chat)]
    rows = [row_columns(p) for p in problems]
    columns = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r)}
    return problems, completions, list(completion_ids), prompts, columns, SimpleNamespace(global_step=step)


def _user_kwargs(completions, completion_ids, prompts, columns, state) -> dict[str, Any]:
    return dict(prompts=prompts, completions=completions, completion_ids=completion_ids, trainer_state=state, **columns)


def _called(r: Reward, args, texts: list[str]) -> Any:
    """Reward r on every row, in the trainer; RunError naming it and the row if it raises."""
    try:
        if r.shipped:  # our own verifiers (math-verify's signal.alarm among them): no mark
            return _call(r, *args)
        with user_code.user_call(f"reward {r.name}"):  # a stop signal abandons it at once
            return _call(r, *args)
    except GspoError:
        raise  # a judge's or reward model's own error: one line naming it and the row already
    except user_functions.RAISED as err:  # the user's function: one line, no traceback (sys.exit too)
        row = _failing_row(r, *args)
        raise RunError(_raised_message(r.name, texts[row], user_functions.error_line(err))) from None


def _ids(ids: Any) -> Any:
    """One completion's token ids as a list; ids marked `opaque_ids` (eval's NoTokenIds: no
    tokenizer known) kept as they are, so only a reward that reads them fails."""
    return ids if getattr(ids, "opaque_ids", False) else list(ids)


def _raised_message(name: str, text: str, message: str) -> str:
    return f"reward {name} raised on the row whose prompt starts {text[:40]!r}: {message}"


def _call(r: Reward, problems, completions, completion_ids, prompts, columns, state):
    if r.shipped:  # our own verifiers read the completion's text
        return r.call(problems, [c[0]["content"] if isinstance(c, list) else c for c in completions])
    kwargs = _user_kwargs(completions, completion_ids, prompts, columns, state)
    with user_functions.output_to_stderr():  # the trainer's stdout is its own (`--json`)
        return user_functions.call_rows(r.call, kwargs, len(completions))


def _failing_row(r: Reward, problems, completions, completion_ids, prompts, columns, state) -> int:
    """The first row on which `r` raises when called on that row alone (0 when none does:
    the function failed on the batch as a whole)."""
    for i in range(len(completions)):
        one = {k: v[i : i + 1] for k, v in columns.items()}
        try:
            _call(
                r,
                problems[i : i + 1],
                completions[i : i + 1],
                completion_ids[i : i + 1],
                prompts[i : i + 1],
                one,
                state,
            )
        except user_functions.RAISED:
            return i
    return 0


def _as_list(name: str, got: Any, n: int) -> list:
    """What one call of reward `name` on n rows returned, as a list of n values; RunError when it
    is not a list (a dict, a string, a number) or holds another count than the call's rows."""
    if isinstance(got, (Mapping, str, bytes)) or isinstance(got, user_functions.Opaque):
        raise RunError(f"reward {name} returned {_type_name(got)}, not a list of {n} numbers")
    try:
        got = list(got)
    except TypeError:
        raise RunError(f"reward {name} returned {_type_name(got)}, not a list of {n} numbers") from None
    if len(got) != n:
        raise RunError(f"reward {name} returned {len(got)} values for the {n} completions it was called on")
    return got


def _type_name(got: Any) -> str:
    return got.type_name if isinstance(got, user_functions.Opaque) else type(got).__name__


def _checked(name: str, got: Any, prompts: list[str]) -> list[float | None]:
    """`got` as one float or None per completion (NaN read as None, as TRL's nansum does; 0-d
    tensors and arrays read as their number); RunError naming the reward and the first bad row
    otherwise (an infinite value included)."""
    got = _as_list(name, got, len(prompts))
    out: list[float | None] = []
    for i, v in enumerate(got):
        if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):
            v = v.item()  # a 0-d tensor or array, as torch.tensor(...) in TRL reads it
        if v is None:
            out.append(None)
            continue
        what = f"{_shown(v)} ({_type_name(v)})"
        if isinstance(v, numbers.Real):
            try:
                f = float(v)
            except OverflowError:  # an int or a fraction beyond a float's range
                f, what = math.inf, f"a number too large for a float ({_type_name(v)})"
            if not math.isinf(f):
                out.append(None if math.isnan(f) else f)
                continue
        raise RunError(
            f"reward {name} returned {what}, not a finite number or None, for the row whose "
            f"prompt starts {prompts[i][:40]!r}"
        )
    return out


def _shown(v: Any) -> str:
    """v's repr for an error line: at most 60 characters (a huge int or text is never printed whole)."""
    if isinstance(v, int) and v.bit_length() > 160:
        return f"an int of {v.bit_length()} bits"
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001 - a value whose repr fails: its type says enough
        return "a value"
    return text if len(text) <= 60 else text[:57] + "..."
