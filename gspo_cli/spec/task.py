"""`task:` the training data (a task family, its parameters and source) and the evaluation data:
named evaluation sets, each its own task and source, or else a held-out split of the training
source (`eval_size` problems, removed from training)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.metrics import METRICS, SPREAD_SUFFIX, reward_std_key
from gspo_cli.spec.base import _check_dir_name, _Problems, _Strict

# Names a reward cannot take: reward/<name> would be a metric the trainer logs already, or a
# task's own verdict (math and code log reward/correct and reward/format).
TASK_COMPONENTS = ("correct", "format")


def source_problem(source: Any) -> str | None:
    """Why `source` cannot be a dataset, found without reading it (None: it may be one): not a
    string, a local path that does not exist, cannot be read, or a directory that no
    `save_to_disk` wrote. Everything else (format, schema) is the task's loader's to say."""
    if not isinstance(source, str) or not source:
        return f"expected a file path, synthetic or hub:<id> (got {source!r})"
    if source == "synthetic" or source.startswith("hub:"):
        return None
    path = Path(source).expanduser()
    if not path.exists():
        return f"no such file {source}"
    if not os.access(path, os.R_OK):
        return f"{source}: permission denied"
    if path.is_dir() and not any((path / f).is_file() for f in ("state.json", "dataset_dict.json")):
        return f"{source}: is a directory, not a dataset file or a save_to_disk directory"
    return None


def reserved_reward_names() -> list[str]:
    """What `task.rewards[].name` cannot be: every `reward/<x>` metric's x, and the tasks' own
    component names."""
    logged = [k.split("/", 1)[1] for k in METRICS if k.startswith("reward/")]
    return sorted({*logged, *TASK_COMPONENTS})


def reward_label(function: str | None, name: str | None = None, *, kind: str = "function") -> str:
    """A reward's name in logs (reward/<label>): `name`, else the function's own name (the part
    after the last `:`), else `reward_model` or `judge` by its `kind`. Also how `gspo compare`
    and `gspo plot` read a stored spec's rewards (`stored_reward_label`)."""
    if name is not None:
        return name
    if kind == "function" and function is not None:
        return str(function).rsplit(":", 1)[-1]
    return "reward_model" if kind == "model" else "judge"


def stored_reward_label(entry: dict) -> str | None:
    """The label of one `task.rewards` entry of a stored spec (a dict); None when it is no reward."""
    kind = "model" if entry.get("model") is not None else "judge" if entry.get("judge") is not None else "function"
    if kind == "function" and not entry.get("function"):
        return None
    return reward_label(entry.get("function"), entry.get("name"), kind=kind)


class RewardModelConfig(_Strict):
    """A Hugging Face sequence-classification model that scores prompt + completion (its logit;
    the first when it has several), with its own tokenizer and chat template; never trained."""

    path: str = Field(min_length=1, description="a local model directory or a hub id")
    batch_size: int = Field(8, ge=1, description="rows per forward")
    device: str | None = Field(None, description="where it runs: cpu, cuda, cuda:1, ... (default: model.device)")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="its weights' dtype (default: model.dtype)"
    )
    max_length: int = Field(
        4096, ge=1, description="prompt + completion tokens it reads (longer: truncated on the left)"
    )
    placement: Literal["every_rank", "rank0"] = Field(
        "every_rank",
        description="under torchrun: a copy on every process (each scores its own rows), or one on rank 0 that "
        "scores every process's rows",
    )


class JudgeConfig(_Strict):
    """An LLM judge behind an OpenAI-compatible chat-completions endpoint. The API key is read from
    the environment variable `api_key_env` when the run starts; it is never stored."""

    url: str = Field(min_length=1, description="the server's base URL, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(min_length=1, description="the `model` of each request")
    template: str = Field(
        min_length=1,
        description="the user message: {prompt}, {completion} and any dataset column by name, e.g. {answer}",
    )
    pattern: str = Field(
        r"(-?\d+(?:\.\d+)?)",
        description="a regular expression; the score is its first group (else the whole match) in the judge's "
        "answer, its last match",
    )
    unparsable: float | None = Field(
        0.0, description="the value of an answer the pattern does not match (null: the reward skips that row)"
    )
    api_key_env: str | None = Field(None, description="the environment variable holding the API key (none: no key)")
    system: str | None = Field(None, description="a system message before the template's")
    concurrency: int = Field(16, ge=1, description="requests in flight at once, per process")
    timeout_s: float = Field(60.0, gt=0, description="seconds one request may take before it is retried")
    max_retries: int = Field(4, ge=0, description="retries of a request that timed out or got 429/5xx (backoff 2^n s)")
    max_tokens: int = Field(256, ge=1, description="the judge's answer length")
    temperature: float = Field(0.0, ge=0, description="the judge's sampling temperature")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as err:
            raise ValueError(f"not a regular expression ({err})") from None
        return v


class RewardConfig(_Strict):
    """One reward: a function (TRL's convention: `fn(prompts, completions, completion_ids, **columns)`
    returning one float or None per completion), a reward model or an LLM judge; exactly one of
    `function`, `model` and `judge`. The rewards' weighted sum is what RL optimises."""

    function: str | None = Field(
        None,
        description="FILE.py:NAME (relative to the working directory), module:NAME, or the name of a shipped "
        "reward (math_accuracy, code_tests, env: the task.environment's own) or a plugin's (`gspo plugins` lists them)",
    )
    model: RewardModelConfig | None = Field(
        None, description="a sequence-classification reward model: a path, or {path, batch_size, device, ...}"
    )
    judge: JudgeConfig | None = Field(None, description="an LLM judge: {url, model, template, pattern, api_key_env}")
    weight: float = Field(1.0, description="its weight in the sum RL optimises")
    name: str | None = Field(
        None, description="logged as reward/<name> (default: the function's name, reward_model or judge)"
    )
    correct: bool = Field(False, description="this reward decides correctness (value >= 1) for pass@k; at most one")

    @field_validator("model", mode="before")
    @classmethod
    def _model_path(cls, v: Any) -> Any:
        return {"path": v} if isinstance(v, str) else v

    @field_validator("function")
    @classmethod
    def _function_form(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v or v != v.strip() or (":" in v and not all(v.rsplit(":", 1))):
            raise ValueError(f"expected FILE.py:NAME, module:NAME or a shipped reward's name (got {v!r})")
        target, _, name = v.rpartition(":")
        if target.endswith(".py"):  # stored absolute: sweeps, --resume and gspo eval find the same file
            return f"{Path(target).expanduser().absolute()}:{name}"
        return v

    @property
    def kind(self) -> str:
        """function, model or judge."""
        return "model" if self.model is not None else "judge" if self.judge is not None else "function"

    @property
    def label(self) -> str:
        """The reward's name in logs: `name`, else the function's own name (reward_model, judge)."""
        return reward_label(self.function, self.name, kind=self.kind)

    @model_validator(mode="after")
    def _label_ok(self):
        given = [k for k in ("function", "model", "judge") if getattr(self, k) is not None]
        if len(given) != 1:
            raise _Problems(
                "function: a reward is exactly one of function, model and judge"
                + (f" (got {' and '.join(given)})" if given else " (got none)")
            )
        label = self.label
        if not label or "/" in label or label != label.strip():
            raise _Problems(f"name: {label!r} cannot name a metric (no '/', not empty)")
        if label in reserved_reward_names():
            raise _Problems(
                f"name: {label!r} is a metric gspo logs already (reward/{label}); reserved: "
                f"{', '.join(reserved_reward_names())}; give the reward another name"
            )
        return self


def check_reward_names(rewards: list[RewardConfig], where: str = "rewards") -> list[str]:
    """Problems with a list of rewards: duplicate names, a name that is another's spread, two
    rewards deciding correctness."""
    problems = []
    labels = [r.label for r in rewards]
    for i, n in enumerate(labels):
        if n in labels[:i]:
            problems.append(f"{where}[{i}].name: duplicate name {n!r} (also {where}[{labels.index(n)}])")
        elif (stem := n.removesuffix(SPREAD_SUFFIX)) != n and stem in labels:  # reward/<stem>_std is taken
            problems.append(
                f"{where}[{i}].name: {n!r} would be logged as {reward_std_key(stem)}, the spread of reward "
                f"{stem!r}; give the reward another name"
            )
    judges = [i for i, r in enumerate(rewards) if r.correct]
    if len(judges) > 1:
        problems.append(
            f"{where}[{judges[1]}].correct: only one reward decides correctness (also {where}[{judges[0]}])"
        )
    return problems


class EvalSetConfig(_Strict):
    """One named evaluation set: scored at step 0, every `every` steps and at the end of
    training, logged as eval/<name>/<score>, and re-scored by `gspo eval RUN [--set NAME]`.
    Its problems are never trained on (matched by normalised text)."""

    name: str = Field(description="the set's name in logs, tables and figures, e.g. aime24")
    task: str = Field("math", description="task family that reads and scores it: math | code | prompts")
    params: dict[str, Any] = Field(description="that task's parameters; `source` (a file or hub:<id>) required")
    samples: int | None = Field(None, ge=1, description="K completions per problem (default: train.eval_samples)")
    max_tokens: int | None = Field(
        None, ge=1, description="new tokens per completion (default: rollout.max_new_tokens)"
    )
    size: int | None = Field(None, ge=1, description="score the first N problems only (default: all)")
    skip: int = Field(
        0, ge=0, description="leave out the source's first N problems (split one source into disjoint sets)"
    )
    every: int | None = Field(
        None, ge=0, description="steps between scorings (default: train.eval_every; 0: start/end)"
    )
    scored: bool = Field(
        True,
        description="false: its problems are kept out of training but it is never scored in this run "
        "(gspo tune's tuning runs hold the test set this way)",
    )
    rewards: list[RewardConfig] | None = Field(
        None,
        description="the set's own rewards (default: task.rewards, else the task's own verifier; [] on a math or "
        "code set: its own verifier); the set's columns reach them",
    )

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "evaluation set names")

    @model_validator(mode="after")
    def _source(self):
        if "source" not in self.params:
            raise _Problems("params.source: missing (the set's data: a file, save_to_disk directory or hub:<id>)")
        why = source_problem(self.params["source"])
        if why:
            raise _Problems(f"params.source: {why}")
        return self


class TaskConfig(_Strict):
    """The task family that trains and evaluates the policy (see docs/guides/tasks.md)."""

    name: str = Field(
        "arithmetic",
        description="task family: math, code, arithmetic, prompts (your own data, scored by task.rewards) or "
        "a plugin's (`gspo plugins` lists them)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(
        64, ge=0, description="without eval_sets: held-out problems of the training source (removed from training)"
    )
    eval_sets: list[EvalSetConfig] = Field(
        default_factory=list, description="named evaluation sets (they replace the held-out split)"
    )
    rewards: list[RewardConfig] = Field(
        default_factory=list,
        description="reward functions whose weighted sum RL optimises (empty: the task's own reward; the "
        "prompts task needs at least one)",
    )
    environment: str | None = Field(
        None,
        description="multi-turn rollouts with tools: python (a sandboxed interpreter), code_feedback (code "
        "problems: public tests' failures fed back, private tests rewarded) or your own, FILE.py:NAME "
        "(docs/guides/tools.md); none: one turn",
    )
    environment_params: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the environment, e.g. timeout_s: 2"
    )
    environment_timeout_s: float = Field(
        120.0,
        gt=0,
        description="seconds one call of the environment (start, step, finish) may take before the run ends",
    )
    reward_workers: int | None = Field(
        None,
        ge=0,
        description="processes that run FILE.py/module reward functions (0: in the trainer; default: the cores "
        "left after --jobs and torch's threads, at most 8)",
    )
    reward_timeout_s: float = Field(
        300.0, gt=0, description="seconds one reward call may take on one batch of rows before the run ends"
    )
    reward_calls: Literal["batch", "chunks"] = Field(
        "batch",
        description="how FILE.py/module reward functions are called: batch: once per reward on each step's "
        "rows (per process), as TRL calls them; chunks: on chunks of rows sent to the reward_workers as they "
        "are sampled (a slow reward overlaps sampling and spreads over the workers, but a function that "
        "looks across rows sees its chunk, and an async def function is called once per row)",
    )

    @model_validator(mode="after")
    def _check(self):
        # The training source is checked by its task's loader (before any model is built);
        # evaluation sources here, so a stored spec names every file it needs.
        problems = []
        names = [s.name for s in self.eval_sets]
        for i, n in enumerate(names):
            if n in names[:i]:
                problems.append(f"eval_sets[{i}].name: duplicate name {n!r} (also eval_sets[{names.index(n)}])")
        problems += check_reward_names(self.rewards)
        for i, s in enumerate(self.eval_sets):
            problems += check_reward_names(s.rewards or [], f"eval_sets[{i}].rewards")
        if not self.rewards and "prompts" in (self.name, *(s.task for s in self.eval_sets if not s.rewards)):
            problems.append("rewards: the prompts task is scored by reward functions only; list at least one")
        if self.environment_params and not self.environment:
            problems.append("environment_params: given but no task.environment")
        for i, r in enumerate(self.rewards):
            if r.function == "env" and not self.environment:
                problems.append(f"rewards[{i}].function: env is the environment's reward; no task.environment is set")
        if self.reward_calls == "chunks" and self.reward_workers == 0:
            problems.append("reward_calls: chunks sends rows to the reward_workers; reward_workers is 0")
        if self.environment == "code_feedback" and self.name != "code":
            problems.append(f"environment: code_feedback runs code problems' tests; task.name is {self.name}, not code")
        if problems:
            raise _Problems("\n".join(problems))
        return self
