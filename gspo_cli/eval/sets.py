"""Evaluation sets: what a run is scored on, kept apart from what it trains on.

A spec names its sets in `task.eval_sets` (each its own task, source, K, max tokens and
schedule). Without any, the set is a held-out split of the training source, named after the
task: the first `task.eval_size` problems of a dataset, or the synthetic generator's hash
split. Either way no evaluation problem is ever trained on: `plan_data` removes every one
from the training task (`Task.exclude`, matched by `tasks.base.normalize_text`) and says how
many it removed; the built-in cold start draws from that same reduced training task.

A set is scored by its own `rewards` when it lists them, else by the training rewards
(`task.rewards`), else by its task's own verifier (`set_rewards`); its reward functions are
loaded with it, before any model is built.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.eval.scores import policy_results, problem_records, summarize
from gspo_cli.eval.seeding import eval_seed, fixed_draws
from gspo_cli.metrics import eval_key
from gspo_cli.rewards import with_rewards
from gspo_cli.runs import plural
from gspo_cli.spec import EvalSetConfig, ExperimentSpec
from gspo_cli.tasks import Problem, Task, make_task
from gspo_cli.tasks.base import problem_key
from gspo_cli.tasks.prompts import PromptsTask


@dataclass
class EvalSet:
    name: str  # eval/<name>/<score> in logs
    task: Task
    problems: list[Problem]
    samples: int  # K
    max_tokens: int
    every: int  # steps between scorings (0: only at step 0 and at the end)
    source: str  # what the problems come from, for logs and run.json
    held_out: bool = False  # the fallback split of the training source
    scored: bool = True  # False: kept out of training, never scored in this run

    def due(self, step: int, last: int) -> bool:
        """Scored at step 0, every `every` steps and at the last step (never when not `scored`)."""
        return self.scored and (step == 0 or step == last or bool(self.every and step % self.every == 0))

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "source": self.source,
            "problems": len(self.problems),
            "samples": self.samples,
            "max_tokens": self.max_tokens,
            "every": self.every,
            **({"held_out": True} if self.held_out else {}),
            **({"scored": False} if not self.scored else {}),
            # scored by reward functions: their names (run.json data.eval_sets says which score the set)
            **({"rewards": [r.name for r in self.task.rewards]} if hasattr(self.task, "rewards") else {}),
        }


def named_set(cfg: EvalSetConfig, index: int, spec: ExperimentSpec, rewards: list | None = None) -> EvalSet:
    """The set `task.eval_sets[index]`, its task built and its problems read, scored by
    `set_rewards` (`rewards`, e.g. gspo eval --reward, replace them), every reward function
    loaded now. A SpecError of its task (unknown task, unreadable file, a file in another task's
    schema, an unloadable reward of its own) names the set's field."""
    field = f"task.eval_sets[{index}]"
    own = cfg.rewards is not None and rewards is None
    scored_by = rewards if rewards is not None else set_rewards(cfg, spec)

    def named(msg: str) -> str:  # the task speaks of task.params; here they are the set's
        msg = msg.replace("task.params.", f"{field}.params.", 1).replace("task.name:", f"{field}.task:", 1)
        return msg.replace("task.rewards[", f"{field}.rewards[", 1) if own else msg

    if cfg.task == "prompts" and not scored_by:
        raise SpecError(
            f"{field}.rewards: a prompts set is scored by reward functions only; list at least one, or leave "
            "rewards out for task.rewards"
        )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task = with_rewards(make_task(cfg.task, dict(cfg.params)), scored_by)
            problems = task.eval_problems((cfg.size or _all(task, spec)) + cfg.skip)[cfg.skip :]
    except SpecError as err:
        raise SpecError(named(str(err))) from None
    for w in caught:
        warnings.warn(named(str(w.message)), w.category, stacklevel=2)
    if not problems:
        raise SpecError(f"{field}.params.source: {cfg.params['source']}: no problems to evaluate")
    return EvalSet(
        name=cfg.name,
        task=task,
        problems=problems,
        samples=cfg.samples or spec.train.eval_samples,
        max_tokens=cfg.max_tokens or spec.rollout.max_new_tokens,
        every=spec.train.eval_every if cfg.every is None else cfg.every,
        source=str(cfg.params["source"]),
        scored=cfg.scored,
    )


def set_rewards(cfg: EvalSetConfig, spec: ExperimentSpec) -> list:
    """What scores an evaluation set: its own `rewards` when it lists them (`[]`: its task's own
    verifier), else the training rewards (task.rewards; none: its task's own verifier)."""
    return list(cfg.rewards) if cfg.rewards is not None else list(spec.task.rewards)


def _all(task: Task, spec: ExperimentSpec) -> int:
    size = getattr(task, "num_problems", None)
    return size if size is not None else spec.task.eval_size  # a generator: eval_size problems


def plan_data(spec: ExperimentSpec, task: Task) -> tuple[list[EvalSet], dict[str, Any]]:
    """The run's evaluation sets, with every one of their problems removed from `task`'s
    training data (in place), and what to record about it (run.json `data`).

    SpecError when a set cannot be read, or when no training problem would be left."""
    train_source = str(spec.task.params.get("source", "synthetic"))
    if spec.task.eval_sets:
        sets = [named_set(cfg, i, spec) for i, cfg in enumerate(spec.task.eval_sets)]
        what = "the evaluation sets (" + ", ".join(s.name for s in sets) + ")"
        excluded = task.exclude([p for s in sets for p in s.problems], what)
        note = None
    else:
        held = task.eval_problems(spec.task.eval_size)
        sets = [
            EvalSet(
                name=task.name,
                task=task,
                problems=held,
                samples=spec.train.eval_samples,
                max_tokens=spec.rollout.max_new_tokens,
                every=spec.train.eval_every,
                source=train_source,
                held_out=True,
            )
        ]
        if task.train_pool is not None:  # a dataset: the held-out rows leave the training pool
            pool = len(task.train_pool)
            try:
                excluded = task.exclude(held, "the held-out split")
            except SpecError:
                raise SpecError(
                    f"task.eval_size: holding out {plural(len(held), 'problem')} leaves none of the {pool} of "
                    f"{train_source} to train on; lower task.eval_size or name task.eval_sets"
                ) from None
            note = f"the first {plural(len(held), 'problem')} of {train_source}, removed from training"
        else:  # a generator's hash split is disjoint from its training draws already
            excluded = None
            note = f"{plural(len(held), 'problem')} of the generator's held-out hash split (never drawn for training)"
        note = f"no task.eval_sets: evaluating on a held-out split of the training source: {note}"
    info = {
        "train_source": train_source,
        "train_problems": len(task.train_pool) if task.train_pool is not None else None,
        "excluded_from_training": excluded,
        "eval_sets": {s.name: s.describe() for s in sets},
        **({"note": note} if note else {}),
    }
    return sets, info


def data_lines(info: dict[str, Any]) -> list[str]:
    """What `plan_data` decided, as lines for the terminal."""
    sets = ", ".join(
        f"{name} ({d['task']}, {plural(d['problems'], 'problem')} x {d['samples']})"
        for name, d in info["eval_sets"].items()
    )
    pool = info["train_problems"]
    excluded = info["excluded_from_training"]
    lines = [
        f"training data: {info['train_source']}"
        + (f" ({plural(pool, 'problem')})" if pool is not None else " (generated)")
        + (
            (
                f"; {plural(excluded, 'evaluation problem')} excluded"
                if excluded
                else "; no evaluation problem among them"
            )
            if excluded is not None
            else "; evaluation problems filtered out as drawn"
        ),
        f"evaluation sets: {sets}",
    ]
    if info.get("note"):
        lines.append(info["note"])
    return lines


@contextlib.contextmanager
def max_tokens(engine, n: int):
    """The engine samples at most `n` new tokens inside the block (hf and vLLM engines)."""
    gen = getattr(engine, "gen_config", None)
    holder, attr = (gen, "max_new_tokens") if gen is not None else (engine, "max_new_tokens")
    old = getattr(holder, attr, None)
    if old is None:
        yield
        return
    setattr(holder, attr, n)
    try:
        yield
    finally:
        setattr(holder, attr, old)


def score_set(engine, s: EvalSet) -> tuple[dict[str, float], dict[str, list]]:
    """Sample set `s` (its K, its max tokens) with `engine` and score it: its scores (see
    `eval.scores`) and its per-problem record (`problem_records`)."""
    with max_tokens(engine, s.max_tokens):
        results = policy_results(engine, s.task, s.problems, s.samples)
    return summarize(results, judged=getattr(s.task, "judged", True)), problem_records(results)


def score_and_log(
    engine, sets: list[EvalSet], step: int, log_eval: Callable[[dict], None], sinks=(), seed: int | None = None
) -> None:
    """Score each set with `engine` and log it: `log_eval` gets one eval.jsonl record per set
    (named sets carry `set`; the held-out split keeps its task's name, as runs always had), with
    its per-problem `problems` record; every sink gets eval/<set>/<score> at `step` (reward
    functions' `trainer_state.global_step`). With the run's `seed` each set samples from random
    numbers fixed by (seed, step, set name) and leaves torch's generators as it found them
    (`eval.seeding`): arms at equal seed share them."""
    for s in sets:
        if not s.problems:
            continue
        t = time.time()
        if hasattr(s.task, "step"):  # reward functions see trainer_state.global_step = the step evaluated
            s.task.step = step
        draws = fixed_draws(engine, eval_seed(seed, step, s.name)) if seed is not None else contextlib.nullcontext()
        with draws:
            scores, problems = score_set(engine, s)
        record = {"step": step, "task": s.task.name, "n": len(s.problems), "samples": s.samples}
        if not s.held_out:
            record["set"] = s.name
        log_eval({**record, "scores": scores, "time_s": round(time.time() - t, 3), "problems": problems})
        for sink in sinks:
            sink.log({eval_key(s.name, k): v for k, v in scores.items()}, step)


def select_sets(spec: ExperimentSpec, name: str | None, rewards: list | None = None) -> list[EvalSet]:
    """A run's named evaluation sets, or only the one called `name` (`gspo eval RUN --set`),
    scored as in training or by `rewards` (--reward) when given. SpecError when the run has
    none, or none of that name."""
    cfgs = list(spec.task.eval_sets)
    if not cfgs:
        if name is not None:
            raise SpecError("--set: the run has no task.eval_sets (it evaluates on its held-out split); drop --set")
        return []
    names = [c.name for c in cfgs]
    if name is not None and name not in names:
        raise SpecError(f"--set: no evaluation set {name!r}; the run's sets: {', '.join(names)}")
    return [named_set(c, i, spec, rewards) for i, c in enumerate(cfgs) if name in (None, c.name)]


def cold_start_task(task: Task, problems: list[Problem]) -> tuple[Task, str]:
    """The task a built-in model that is scored on `problems` of `task` is cold-started on, and
    a line saying so. A generator (synthetic) task: itself, its held-out split never being drawn
    for training. A dataset: never the data it is scored on, but the task family's synthetic
    generator with `problems` excluded (a new cold start, cached under its own key); a family
    without a generator (prompts: your own data) its dataset's other rows, those with a
    reference completion. SpecError (one line) when no such row is left."""
    if task.train_pool is None:
        return task, f"cold start: {task.name}, synthetic problems (its held-out split is never trained on)"
    inner = getattr(task, "inner", task)  # scored by reward functions: the data is the inner task's
    if isinstance(inner, PromptsTask):
        return _prompts_cold_start(inner, problems)
    synthetic = make_task(task.name, {})
    synthetic.exclude(problems, "the evaluated dataset")
    return synthetic, (
        f"cold start: {task.name}, synthetic problems, not the evaluated dataset "
        f"(its {plural(len(problems), 'problem')} excluded)"
    )


def _prompts_cold_start(task: PromptsTask, problems: list[Problem]) -> tuple[Task, str]:
    """A copy of the prompts `task` without the evaluated `problems`, for the built-in model's
    cold start on its other rows' `solution` (or `completion`) column."""
    rest = copy.copy(task)
    keys = {problem_key(p) for p in problems}
    rest.excluded = task.excluded | keys
    rest.train_pool = [p for p in task.train_pool if problem_key(p) not in keys and p.solution is not None]
    if not rest.train_pool:
        with_solution = sum(p.solution is not None for p in task.train_pool)
        why = (
            "no row has a `solution` (or `completion`) column to learn from: add one, or evaluate a pretrained model"
            if not with_solution
            else f"all {with_solution} rows with a `solution` (or `completion`) are evaluated: evaluate fewer "
            "(--limit N), the others cold-start it"
        )
        raise SpecError(
            f"TARGET: a built-in model is cold-started on reference completions of rows it is not scored on, and {why}"
        )
    line = (
        f"cold start: prompts, the {plural(len(rest.train_pool), 'row')} of the dataset with a reference completion "
        f"that are not evaluated (its {plural(len(problems), 'problem')} excluded)"
    )
    return rest, line
