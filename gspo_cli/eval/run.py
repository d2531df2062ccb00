"""`gspo eval`: resolve what to evaluate, sample (or read) completions, score, write, render.

A target is a run directory (its latest checkpoint, or `--checkpoint`), a checkpoint
directory, a model directory, a hub id or a built-in model; or, with no model at all, a
JSONL file of completions made elsewhere. Results go to `eval_problems.jsonl` (one line per
problem) and `eval_summary.json`, in the run directory unless told otherwise.

The completions path imports neither torch nor transformers: model code is imported only
when a model is evaluated.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.eval.results import summary_of
from gspo_cli.eval.scores import ProblemResult, sample_completions, score_problems, tool_use
from gspo_cli.eval.sets import cold_start_task
from gspo_cli.eval.targets import Target, parse_rewards, resolve_run, resolve_target, resolve_task  # noqa: F401
from gspo_cli.files import iter_lines
from gspo_cli.runs import plural
from gspo_cli.spec import VLLM_RESERVED_KWARGS, ExperimentSpec, ModelConfig, RolloutConfig, TaskConfig
from gspo_cli.tasks import Task

DEFAULT_MAX_TOKENS = 1024  # without a spec to say otherwise: room for a short chain of thought


@dataclass
class Sampling:
    """How completions are drawn; None fields take the run's spec values, else the defaults."""

    samples: int | None = None
    temperature: float | None = None
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int = 0
    batch_size: int | None = None  # sequences per generate call; None: 64 with hf, all at once with vllm
    device: str | None = None
    dtype: str | None = None
    engine: str = "hf"  # hf: transformers' generate; vllm: a vLLM engine
    vllm_args: dict[str, Any] | None = None  # extra vllm.LLM arguments, over the run's rollout.vllm
    tools: bool = True  # a run with task.environment: multi-turn with its tool, as training samples


def eval_size(task: Task, spec: ExperimentSpec | None, limit: int | None) -> int:
    """Problems to evaluate: --limit, else the whole dataset, else the spec's held-out size."""
    if limit is not None:
        return limit
    size = getattr(task, "num_problems", None)
    return size if size is not None else (spec.task.eval_size if spec else TaskConfig().eval_size)


def evaluate_model(
    target: Target, task: Task, sampling: Sampling, limit: int | None, log: Callable[[str], None] = print
) -> tuple[list[ProblemResult], dict[str, Any]]:
    """Sample from the target's model on the task's held-out problems and score them.

    Returns the per-problem results and the summary (scores plus what was evaluated, how).
    """
    _check_sampling(sampling, limit)
    spec = target.spec
    problems = task.eval_problems(eval_size(task, spec, limit))
    if not problems:
        raise SpecError(f"--task: {task.name} has no evaluation problems (eval_size 0?)")
    K = sampling.samples or (spec.train.eval_samples if spec else 1)
    temperature = sampling.temperature or (spec.rollout.temperature if spec else 1.0)
    max_tokens = sampling.max_tokens or (spec.rollout.max_new_tokens if spec else DEFAULT_MAX_TOKENS)

    # Imported only now: torch and transformers take seconds, and usage errors should not wait.
    import torch

    from gspo_cli.models import load_model, resolve_model_source
    from gspo_cli.models.builtin import cold_start_info, cold_start_line
    from gspo_cli.models.prompts import PromptFormat
    from gspo_cli.rollout import HFRolloutEngine, with_environment

    cfg = spec.model if spec else ModelConfig(name=target.source)
    cfg = cfg.model_copy(update={k: v for k, v in (("device", sampling.device), ("dtype", sampling.dtype)) if v})
    rollout = spec.rollout if spec else RolloutConfig()
    vllm_args = {**rollout.vllm, **(sampling.vllm_args or {})}
    if sampling.engine == "vllm":
        if temperature > 2:
            raise SpecError(f"--temperature: {temperature} is above 2, the most vLLM samples at")
        from gspo_cli.rollout.vllm_settings import import_vllm

        import_vllm("--engine")  # before any model is built or loaded: a missing vLLM is the first thing to say
    tools = bool(spec and spec.task.environment and sampling.tools)
    if tools and sampling.top_p < 1:
        raise SpecError("task.environment: multi-turn sampling needs --top-p 1 (or --no-tools)")
    source, cold = target.source, None
    if source.startswith("builtin:"):  # cold-started on other data than it is scored on
        cold_task, line = cold_start_task(task, problems)
        log(line)
        source = resolve_model_source(cfg.model_copy(update={"name": source}), cold_task, log=log)
        cold = cold_start_info(source)
        if cold:
            log(cold_start_line(cold))
    t0 = time.time()
    # Prompts and stops as in training: the run's prompt fields (defaults for a bare model).
    if sampling.engine == "vllm":  # seeded by sampling.seed
        engine = _vllm_engine(source, cfg.dtype, rollout, temperature, max_tokens, sampling, vllm_args)
        if tools:  # the run's environment and turn limits, as in training (rollout/vllm_turns.py)
            engine = with_environment(engine, spec)
    else:
        lm = load_model(source, cfg, training=False)  # sampling only: weights in the dtype asked for
        torch.manual_seed(sampling.seed)
        engine = HFRolloutEngine(
            lm.model,
            lm.tokenizer,
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_p=sampling.top_p,
            decode=rollout.decode,
            prompt_format=PromptFormat.from_rollout(rollout).formatter(lm.tokenizer),
        )
        if tools:  # the run's environment and turn limits, as in training (rollout/turns.py)
            engine = with_environment(engine, spec)
    log(f"sampling {plural(len(problems), 'problem')} x {K} from {source} ({sampling.engine})")
    batch_size = sampling.batch_size or (None if sampling.engine == "vllm" else 64)
    seen = engine.format([p.prompt for p in problems])  # as the model sees them: eval rows keep them
    counts: list[dict] = []  # per completion: turns, tool calls, errors, time-outs
    try:
        completions = sample_completions(
            engine,
            problems,
            K,
            batch_size,
            progress=lambda done, total: log(f"  {done}/{total} completions"),
            counts=counts,
        )
    finally:
        close = getattr(engine, "close", None)  # a vLLM engine holds its memory until closed
        if close is not None:
            close()
    results = score_problems(task, problems, completions, seen, tokenizer=engine.tokenizer)
    info = {
        "model": source,
        "checkpoint": target.checkpoint,
        "run_dir": str(target.run_dir) if target.run_dir else None,
        "sampling": {
            "samples": K,
            "temperature": temperature,
            "top_p": sampling.top_p,
            "max_tokens": max_tokens,
            "seed": sampling.seed,
        },
        "engine": sampling.engine,
        **({"tools": spec.task.environment} if tools else {}),
        # a run with an environment, with or without it (--no-tools: one turn, no calls)
        **({"tool_use": tool_use(counts)} if spec and spec.task.environment else {}),
        **({"vllm_args": vllm_args} if sampling.engine == "vllm" else {}),
        **({"cold_start": cold} if cold else {}),
    }
    return results, summary_of(task, results, info, time.time() - t0)


def evaluate_completions(
    path: Path, task: Task, limit: int | None, tokenizer=None
) -> tuple[list[ProblemResult], dict[str, Any]]:
    """Score a JSONL file of completions made elsewhere against the task's problems.

    Each line: {"id": ..., "completion": "..."} (several lines per problem give several
    samples) or {"id": ..., "completions": [...]}. Problems may have different numbers of
    samples (see `gspo_cli.eval.scores`: avg@K is a mean of per-problem means, pass@k uses each
    problem's own count). Ids the task does not know, and problems without completions, are
    warned about and left out. SpecError when the file is unreadable or nothing matches.
    `tokenizer` (see `targets.completions_tokenizer`) gives reward functions their
    `completion_ids`; without one, reading them ends the evaluation in one line.
    """
    _check_sampling(Sampling(), limit)
    by_id = load_completions(path)
    # A synthetic task's held-out list grows as a fixed prefix sequence: ask for enough of it
    # to cover a run that evaluated more problems than the default.
    problems = task.eval_problems(max(eval_size(task, None, None), len(by_id)))
    known = {p.id for p in problems}
    chosen = [p for p in problems if p.id in by_id]
    if not chosen:
        hint = f"; the task's ids look like {problems[0].id!r}" if problems else ""
        raise SpecError(
            f"--completions: none of the {len(by_id)} ids in {path} is a problem of task {task.name} "
            f"(first id {next(iter(by_id))!r}{hint})"
        )
    unknown = [i for i in by_id if i not in known]
    if unknown:
        warnings.warn(
            f"--completions: {len(unknown)} ids in {path} are not problems of task {task.name} "
            f"(e.g. {unknown[0]!r}); left out",
            stacklevel=2,
        )
    missing = len(problems) - len(chosen)
    if missing:
        warnings.warn(
            f"--completions: {missing} of {plural(len(problems), 'problem')} have no completions in {path}; left out",
            stacklevel=2,
        )
    chosen = chosen[:limit] if limit else chosen
    t0 = time.time()
    results = score_problems(task, chosen, [by_id[p.id] for p in chosen], tokenizer=tokenizer)
    info = {"completions_file": str(path), "problems_without_completions": missing, "unknown_ids": len(unknown)}
    if tokenizer is not None:  # whose token ids reward functions got as completion_ids
        info["tokenizer"] = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    return results, summary_of(task, results, info, time.time() - t0)


def load_completions(path: Path) -> dict[str, list[str]]:
    """Completions by problem id (ids as strings, file order kept)."""
    if not path.exists():
        raise SpecError(f"--completions: no such file {path}")
    out: dict[str, list[str]] = {}
    for lineno, line in enumerate(iter_lines(path, "--completions"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpecError(f"--completions: {path}:{lineno}: not JSON ({err.msg})") from None
        texts = obj.get("completions", [obj.get("completion")]) if isinstance(obj, dict) else None
        if (
            not isinstance(obj, dict)
            or obj.get("id") is None
            or not isinstance(texts, list)
            or not all(isinstance(t, str) for t in texts)
        ):
            raise SpecError(
                f'--completions: {path}:{lineno}: expected {{"id": ..., "completion": "..."}} '
                'or {"id": ..., "completions": [...]}'
            )
        out.setdefault(str(obj["id"]), []).extend(texts)
    if not out:
        raise SpecError(f"--completions: {path} holds no completions")
    return out


def parse_key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    """["key=value", ...] as a dict, each value read as YAML (0.9 a float, true a bool, text
    a string). SpecError naming `flag` for an item without '=' or an empty key."""
    import yaml

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{flag}: expected KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def _vllm_engine(
    source: str,
    dtype: str,
    rollout: RolloutConfig,
    temperature: float,
    max_tokens: int,
    sampling: Sampling,
    vllm_args: dict[str, Any],
):
    """A vLLM engine sampling from `source` as training's does (the run's prompt format, the
    checkpoint's stop ids, neutral sampling but for `sampling.top_p`), without loading the
    weights into transformers: vLLM loads them itself. SpecError (one line) for a source that
    is not a model."""
    from types import SimpleNamespace

    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from gspo_cli.models.loading import quiet_transformers
    from gspo_cli.models.prompts import PromptFormat, stop_token_ids
    from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine

    quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(source)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as err:  # hub/network/parse failures all mean "cannot use this name"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SpecError(f"TARGET: cannot load {source!r} (offline and not cached, or not a model): {first}") from None
    try:  # what transformers puts in model.generation_config: the file, else derived from config.json
        generation = GenerationConfig.from_pretrained(source)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return VLLMRolloutEngine(
        None,
        tokenizer,
        model_dir=source,
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=sampling.top_p,
        dtype=dtype,
        seed=sampling.seed,
        engine_kwargs=vllm_args,
        stop_ids=stop_token_ids(SimpleNamespace(generation_config=generation), tokenizer),
        prompt_format=PromptFormat.from_rollout(rollout).formatter(tokenizer),
        model_config=config,
    )


def _check_sampling(s: Sampling, limit: int | None) -> None:
    vllm = s.engine == "vllm"
    reserved = [k for k in (s.vllm_args or {}) if k in VLLM_RESERVED_KWARGS]
    checks = [
        ("--engine", s.engine in ("hf", "vllm"), f"{s.engine!r} is not hf or vllm"),
        ("--device", not vllm or s.device is None, "vLLM places the model itself; leave it out with --engine vllm"),
        ("--vllm-arg", vllm or not s.vllm_args, "needs --engine vllm"),
        ("--vllm-arg", not reserved, f"{', '.join(reserved)}: set by gspo-cli itself"),
        ("--samples", s.samples is None or s.samples >= 1, "must be >= 1"),
        ("--temperature", s.temperature is None or s.temperature > 0, "must be > 0"),
        ("--top-p", 0 < s.top_p <= 1, "must be in (0, 1]"),
        ("--max-tokens", s.max_tokens is None or s.max_tokens >= 1, "must be >= 1"),
        ("--batch-size", s.batch_size is None or s.batch_size >= 1, "must be >= 1"),
        ("--limit", limit is None or limit >= 1, "must be >= 1"),
    ]
    for flag, ok, msg in checks:
        if not ok:
            raise SpecError(f"{flag}: {msg}")
