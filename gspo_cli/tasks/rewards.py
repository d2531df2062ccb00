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
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.tasks import environments
from gspo_cli.tasks.base import Problem, Score, Task
from gspo_cli.tasks.judge import make_judge
from gspo_cli.tasks.math_answer import answers_match, extract_answer
from gspo_cli.tasks.plugins import REWARDS_GROUP, load_plugin, plugin_names
from gspo_cli.tasks.reward_calls import Reward, Scoring, row_columns

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
