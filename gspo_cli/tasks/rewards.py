"""Reward functions named in `task.rewards`, called with TRL's convention.

A function is `FILE.py:NAME`, `module:NAME`, the name of a reward we ship (`SHIPPED`) or of
one an installed package registers (`plugins`, group gspo_cli.rewards). User and plugin
functions are called exactly as TRL's GRPOTrainer calls them, so one written for TRL runs
unchanged:

    fn(prompts=[...], completions=[...], completion_ids=[[...], ...], trainer_state=state, **columns)

one value per completion, `columns` every other dataset column by name (one value per row).
A value is a number or None ("does not apply to this row"). The reward RL optimises is the
weighted sum over the rewards that apply (TRL's nansum); a row none applies to gets 0 (advantage 0).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gspo_cli.errors import GspoError, RunError, SpecError
from gspo_cli.tasks import environments, reward_pool
from gspo_cli.tasks.base import Conversation, Problem, Score, Task
from gspo_cli.tasks.judge import make_judge
from gspo_cli.tasks.math_answer import answers_match, extract_answer
from gspo_cli.tasks.plugins import REWARDS_GROUP, load_plugin, plugin_names

# A shipped reward is built for the task it scores: factory(task) -> fn(problems, completions).
ShippedFactory = Callable[[Task], Callable[[Sequence[Problem], Sequence[str]], list[float]]]


def _math_accuracy(task: Task) -> Callable[[Sequence[Problem], Sequence[str]], list[float]]:
    """1 when the completion's final answer (\\boxed{}, else "the answer is X") matches the
    problem's `answer`, as the math task judges it; else 0."""

    def fn(problems, completions):
        return [float(answers_match(p.answer, extract_answer(c))) for p, c in zip(problems, completions)]

    return fn


def _code_tests(task: Task) -> Callable[[Sequence[Problem], Sequence[str]], list[float]]:
    """1 when the program passes every test of the code task's problem; else 0."""
    if task.name != "code":
        raise SpecError(f"task.rewards: code_tests judges code problems; task.name is {task.name}")

    def fn(problems, completions):
        return [float(s.correct) for s in task.score_batch(problems, completions)]

    return fn


SHIPPED: dict[str, ShippedFactory] = {"math_accuracy": _math_accuracy, "code_tests": _code_tests}
SHIPPED["env"] = environments.env_reward  # the task.environment's own reward


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


def resolve_rewards(configs: Sequence[Any], task: Task, model: Any = None) -> list[Reward]:
    """The `task.rewards` entries (`RewardConfig`s) as callables, each file, module and name
    checked now (before any model is built). SpecError naming `task.rewards[i].function` and
    what was found when one cannot be loaded. `model`: the spec's ModelConfig (a reward model's
    default device and dtype)."""
    out = []
    for i, cfg in enumerate(configs):
        where = f"task.rewards[{i}].function"
        if cfg.kind == "model":  # loaded now, before the policy (reward_model.py)
            from gspo_cli.tasks.reward_model import RewardModel

            defaults = (model.device, model.dtype) if model is not None else (None, None)
            rm = RewardModel(cfg.model, f"task.rewards[{i}].model.path", *defaults)
            out.append(Reward(cfg.label, cfg.weight, cfg.correct, rm, file=rm.what, digest=rm.digest))
            continue
        if cfg.kind == "judge":  # an LLM judge (judge.py): its template and server checked now
            judge = make_judge(cfg.judge, cfg.label, f"task.rewards[{i}].judge", _column_names(task))
            out.append(Reward(cfg.label, cfg.weight, cfg.correct, judge))
            continue
        if cfg.function in SHIPPED:
            call, shipped, file = SHIPPED[cfg.function](task), True, None
        elif ":" not in cfg.function:
            call, shipped, file = _plugin_reward(cfg.function, where), False, None
        else:
            call, file = _load_function(cfg.function, where)
            shipped = False
        source = (
            None
            if shipped or cfg.function is None
            else f"{file}:{cfg.function.rsplit(':', 1)[1]}"
            if file
            else cfg.function
        )
        out.append(Reward(cfg.label, cfg.weight, cfg.correct, call, shipped, file, source=source))
    return out


def _column_names(task: Task) -> set[str]:
    """Every dataset column the rows of `task` hand a reward (`row_columns`)."""
    rows = task.train_pool if task.train_pool is not None else task.eval_problems(1)
    return {k for p in rows for k in row_columns(p)}


def load_source(source: str) -> Callable:
    """The function a `Reward.source` names (in a reward pool worker): FILE.py:NAME (an absolute
    path), module:NAME or a plugin's name."""
    where = f"reward {source}"
    return _plugin_reward(source, where) if ":" not in source else _load_function(source, where)[0]


def _plugin_reward(name: str, where: str) -> Callable:
    """The reward function an installed package registers as `name` (a plugin: TRL's convention)."""
    try:
        fn = load_plugin(REWARDS_GROUP, name)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None
    if fn is None:
        plugins = plugin_names(REWARDS_GROUP)
        raise SpecError(
            f"{where}: {name!r} is no shipped reward ({', '.join(SHIPPED)})"
            + (f" nor plugin reward ({', '.join(plugins)})" if plugins else "")
            + "; user code is FILE.py:NAME or module:NAME"
        )
    return fn


def _load_function(function: str, where: str) -> tuple[Callable, str | None]:
    target, name = function.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise SpecError(f"{where}: no such file {target}")
        module_name = "gspo_rewards_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - the user's file: one line, naming it
            raise SpecError(f"{where}: {target} fails to import ({type(err).__name__}: {err})") from None
        file = str(path.resolve())
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as err:
            raise SpecError(f"{where}: no module {target!r} ({err})") from None
        except Exception as err:  # noqa: BLE001 - the user's module: one line, naming it
            raise SpecError(f"{where}: module {target} fails to import ({type(err).__name__}: {err})") from None
        file = None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        what = "is not callable" if fn is not None else "is not defined"
        raise SpecError(f"{where}: {name} {what} in {target}; its functions: {', '.join(found) or 'none'}")
    return fn, file


def file_fingerprints(rewards: Sequence[Reward]) -> dict[str, str]:
    """{absolute path: 16 hex digits of sha256 of its content} of every FILE.py reward, and
    {a reward model's path: its weights' digest}."""
    return {
        r.file: r.digest or hashlib.sha256(Path(r.file).read_bytes()).hexdigest()[:16]
        for r in rewards
        if r.file is not None
    }


def row_columns(problem: Problem) -> dict[str, Any]:
    """The dataset columns a reward function gets for `problem` (besides the prompt): a
    `prompts` row's own columns, else the task's answer and reference solution."""
    columns = (problem.meta or {}).get("columns")
    if columns is not None:
        return dict(columns)
    return {"answer": problem.answer, "solution": problem.solution}


class RewardedTask(Task):
    """`task`'s problems, scored by reward functions instead of its own verifier."""

    # text -> token ids, for scoring texts without their ids (evaluation sets its tokenizer's)
    encode: Callable[[str], list[int]] | None = None
    # the training step that `score_batch` (evaluation) hands reward functions as trainer_state.global_step
    step: int = 0

    def __init__(self, task: Task, rewards: list[Reward]):
        self.inner, self.rewards = task, rewards
        self.name = task.name
        self.judged = any(r.correct for r in rewards)  # without a judge: no pass@k
        self.train_pool = task.train_pool

    # Problems: the inner task's, exclusions included.
    def exclude(self, problems, what: str = "the evaluation sets") -> int | None:
        removed = self.inner.exclude(problems, what)
        self.excluded, self.train_pool = self.inner.excluded, self.inner.train_pool
        return removed

    def trainable(self, problem: Problem) -> bool:
        return self.inner.trainable(problem)

    def train_problems(self, rng, n):
        return self.inner.train_problems(rng, n)

    def eval_problems(self, n):
        return self.inner.eval_problems(n)

    def fingerprint(self) -> str:
        return self.inner.fingerprint()

    def data_fingerprint(self) -> str:
        return self.inner.data_fingerprint()

    def content_fingerprint(self) -> str:
        return self.inner.content_fingerprint()

    def corpus_text(self, rng, n: int = 256) -> str:
        return self.inner.corpus_text(rng, n)

    def score(self, problem: Problem, completion: str) -> Score:
        return self.score_rollout([problem], [completion])[0]

    def score_batch(self, problems, completions) -> list[Score]:
        from gspo_cli.tasks.reward_model import scoring_alone

        with scoring_alone():  # evaluation: this process's rows only (a rank0 reward model gathers none)
            return self.score_rollout(problems, completions, step=self.step)

    def score_rollout(self, problems, completions, completion_ids=None, step: int = 0) -> list[Score]:
        """Scores of completions[i] for problems[i]: the weighted sum of the rewards that apply
        (components: each reward's value, by name). `completion_ids`: the token ids of each
        completion (None: encoded with `self.encode`, else each character's code point).
        RunError naming the reward and the row when a function raises or returns what is not
        one number or None per completion."""
        return self.scoring(problems, step).finish(completions, completion_ids)

    def scoring(self, problems, step: int = 0) -> "Scoring":
        """Scoring of one completion per row of `problems`, rows handed over as they are sampled."""
        return Scoring(self, problems, step)


class Scoring:
    """The scores of one batch of rows. With a reward pool running (`reward_pool.active()`),
    rows handed to `add` as they are sampled go to the pool's workers at once (pooled rewards:
    user and plugin functions); `finish` sends the rows not sent yet in contiguous chunks, one
    per worker, runs the other rewards in the trainer meanwhile, and joins the answers in row
    order. Without a pool, every reward runs in the trainer, in `finish`."""

    def __init__(self, task: RewardedTask, problems, step: int):
        self.task, self.problems, self.step = task, list(problems), step
        self.pool = reward_pool.active()
        self.pooled = [r for r in task.rewards if r.source is not None] if self.pool is not None else []
        self.sent: dict[int, tuple[str, list[int]]] = {}  # row -> (completion, ids) it was sent with
        self.calls: list[tuple[Reward, list[int], int]] = []  # (reward, rows, pool call id)

    @property
    def wants_rows(self) -> bool:
        """Whether rows handed over before the batch is complete are scored early (a pool runs)."""
        return bool(self.pooled)

    def add(self, rows, completions, completion_ids) -> None:
        """Rows `rows` (indices into the problems) were sampled: send them to the pool now."""
        if not self.pooled or not rows:
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
            k = min(self.pool.size, len(rest))
            for j in range(k):  # contiguous chunks, one per worker
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
            judge = next((applied.get(r.name) for r in self.task.rewards if r.correct), None)
            correct = judge is not None and judge >= 1
            scores.append(Score(reward=float(total), correct=correct, components=applied, rewarded=bool(applied)))
        return scores

    def _collected(self, r: Reward, n: int, texts: list[str]) -> Any:
        """Reward r's answers from the pool, in row order (its calls read in order of their first row)."""
        values: list = [None] * n
        counts = []
        for _, rows, call in sorted((c for c in self.calls if c[0] is r), key=lambda c: c[1][0]):
            try:
                got = self.pool.result(call)
            except reward_pool.RewardRaised as err:
                raise RunError(_raised_message(r.name, texts[rows[err.row]], err.text)) from None
            try:
                got = list(got)
            except TypeError:
                return got  # not a list: `_checked` says so
            counts.append(len(got))
            for i, v in zip(rows, got):
                values[i] = v
        if sum(counts) != n:
            return [None] * sum(counts)  # `_checked`: returned m values for n completions
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
        return _call(r, *args)
    except GspoError:
        raise  # a judge's or reward model's own error: one line naming it and the row already
    except Exception as err:  # noqa: BLE001 - the user's function: one line, no traceback
        row = _failing_row(r, *args)
        message = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        raise RunError(_raised_message(r.name, texts[row], message)) from None


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
    return reward_pool.call_rows(r.call, kwargs, len(completions))


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
        except Exception:  # noqa: BLE001 - found it
            return i
    return 0


def _checked(name: str, got: Any, prompts: list[str]) -> list[float | None]:
    """`got` as one float or None per completion (NaN read as None, as TRL's nansum does; 0-d
    tensors and arrays read as their number); RunError naming the reward and the first bad row
    otherwise (an infinite value included)."""
    n = len(prompts)
    try:
        got = list(got)
    except TypeError:
        raise RunError(f"reward {name} returned {type(got).__name__}, not a list of {n} numbers") from None
    if len(got) != n:
        raise RunError(f"reward {name} returned {len(got)} values for {n} completions")
    out: list[float | None] = []
    for i, v in enumerate(got):
        if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):
            v = v.item()  # a 0-d tensor or array, as torch.tensor(...) in TRL reads it
        if v is None:
            out.append(None)
        elif isinstance(v, numbers.Real) and not math.isinf(v):
            out.append(None if math.isnan(float(v)) else float(v))
        else:
            raise RunError(
                f"reward {name} returned {v!r} ({type(v).__name__}), not a finite number or None, for the row whose "
                f"prompt starts {prompts[i][:40]!r}"
            )
    return out
