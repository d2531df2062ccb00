"""`gspo eval`: score a run, checkpoint or model on a task's held-out problems, or score
completions made elsewhere."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from gspo_cli.cli.common import _fail, _show_warning, err_console
from gspo_cli.errors import GspoError, SpecError


def eval_(
    target: Annotated[
        Optional[str],
        typer.Argument(
            help="run directory, checkpoint or model directory, hub id, or "
            "`builtin:<kind>`; with --completions: a run (for its task) or nothing"
        ),
    ] = None,
    completions: Annotated[
        Optional[Path],
        typer.Option(
            "--completions",
            "-c",
            help="score this JSONL of {\"id\", \"completion\"} lines instead of sampling (no model)",
        ),
    ] = None,
    task: Annotated[Optional[str], typer.Option("--task", "-t", help="task name (default: the run's)")] = None,
    dataset: Annotated[
        Optional[str],
        typer.Option(
            "--dataset",
            "-d",
            help="the task's data: a .jsonl/.json/.parquet file or `hub:<id>` (sets task.params.source)",
        ),
    ] = None,
    reward: Annotated[
        Optional[list[str]],
        typer.Option(
            "--reward",
            "-r",
            help="repeatable: a reward function as task.rewards names one (FILE.py:NAME, module:NAME, a shipped "
            "or plugin reward) or a YAML mapping such as '{function: r.py:acc, correct: true}'; replaces the "
            "run's task.rewards (a prompts task needs at least one)",
        ),
    ] = None,
    tokenizer: Annotated[
        Optional[str],
        typer.Option(
            "--tokenizer",
            help="with --completions: the model directory or hub id whose tokenizer gives reward functions their "
            "completion_ids (default: the run's)",
        ),
    ] = None,
    eval_set: Annotated[
        Optional[str], typer.Option("--set", help="a run's evaluation set to re-score (default: all of task.eval_sets)")
    ] = None,
    checkpoint: Annotated[
        Optional[str], typer.Option("--checkpoint", help="a run's checkpoint, e.g. step_000050 (default: the latest)")
    ] = None,
    samples: Annotated[
        Optional[int],
        typer.Option("--samples", "-k", help="completions per problem, K (default: the run's eval_samples, else 1)"),
    ] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="default: the run's, else 1.0")] = None,
    top_p: Annotated[float, typer.Option("--top-p", help="nucleus sampling")] = 1.0,
    no_tools: Annotated[
        bool, typer.Option("--no-tools", help="a run with task.environment: sample in one turn, without the tool")
    ] = False,
    max_tokens: Annotated[
        Optional[int],
        typer.Option("--max-tokens", help="new tokens per completion (default: the run's max_new_tokens, else 1024)"),
    ] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", "-n", help="evaluate the first N problems only")] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            "-o",
            help="write results here (default: the run directory, else `results/eval/<completions file or model>`)",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="sampling seed")] = 0,
    batch_size: Annotated[
        Optional[int],
        typer.Option("--batch-size", help="sequences per generate call (default: 64 with hf, all at once with vllm)"),
    ] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="e.g. cuda (default: the run's, else cpu)")] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, bfloat16 or float16")] = None,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="hf (transformers' generate) or vllm (needs vLLM "
            "installed; prompts, stops and sampling as in training)",
        ),
    ] = "hf",
    vllm_arg: Annotated[
        Optional[list[str]],
        typer.Option(
            "--vllm-arg",
            help="KEY=VALUE, repeatable: a vllm.LLM "
            "argument (YAML value) over the run's rollout.vllm, e.g. "
            "gpu_memory_utilization=0.9",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines")] = False,
) -> None:
    """Score a checkpoint or model (avg@K, pass@k, maj@K, failure shares, rating) on a task's
    held-out problems, or score completions made elsewhere; writes eval_problems.jsonl and
    eval_summary.json.

    Example: `gspo eval results/quickstart/gspo/seed0 -k 8`
    """
    from gspo_cli.eval import results as evr
    from gspo_cli.eval import run as ev
    from gspo_cli.eval.sets import select_sets
    from gspo_cli.eval.targets import completions_tokenizer
    from gspo_cli.runs import RunDir
    from gspo_cli.tasks.base import problems_digest

    warnings.showwarning = _show_warning
    log = (lambda msg: None) if quiet else (lambda msg: err_console.print(msg, markup=False, highlight=False))
    try:
        if target is None and completions is None:
            raise SpecError("TARGET: give a run, checkpoint or model to sample from, or --completions FILE")
        if dtype is not None and dtype not in ("float32", "bfloat16", "float16"):
            raise SpecError(f"--dtype: {dtype!r} is not float32, bfloat16 or float16")
        rewards = ev.parse_rewards(reward)
        if completions is not None:
            resolved = ev.resolve_run(target) if target is not None else None
            scored = ev.resolve_task(resolved.spec if resolved else None, task, dataset, rewards)
            tok = completions_tokenizer(scored, tokenizer, resolved, log)
            results, summary = ev.evaluate_completions(completions, scored, limit, tok)
        else:
            if tokenizer is not None:
                raise SpecError("--tokenizer: only with --completions (a model's own tokenizer gives its token ids)")
            resolved = ev.resolve_target(target, checkpoint)
            sampling = ev.Sampling(
                samples=samples,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_tokens,
                seed=seed,
                batch_size=batch_size,
                device=device,
                dtype=dtype,
                engine=engine,
                vllm_args=ev.parse_key_values(vllm_arg, "--vllm-arg"),
                tools=not no_tools,
            )
            named = [] if task or dataset or resolved.spec is None else select_sets(resolved.spec, eval_set, rewards)
            if eval_set is not None and not named:
                raise SpecError("--set: needs a run directory as TARGET, without --task/--dataset")
            if named:  # a run with evaluation sets: each scored on its own, into eval_sets/<name>/
                for s in named:
                    per_set = replace(sampling, samples=samples or s.samples, max_tokens=max_tokens or s.max_tokens)
                    changed = RunDir(resolved.run_dir).eval_set_change(s.name, s.source, problems_digest(s.problems))
                    if changed:  # said even with --quiet: the scores mean something else
                        err_console.print(f"warning: {changed}", markup=False, highlight=False, soft_wrap=True)
                    results, summary = ev.evaluate_model(resolved, s.task, per_set, limit or len(s.problems), log=log)
                    summary["set"] = s.name
                    if changed:
                        summary["set_changed"] = changed
                    written = evr.write_results((out or resolved.run_dir) / "eval_sets" / s.name, results, summary)
                    evr.render(summary, Console())
                    err_console.print(f"wrote {written}", markup=False, highlight=False)
                return
            results, summary = ev.evaluate_model(
                resolved, ev.resolve_task(resolved.spec, task, dataset, rewards), sampling, limit, log=log
            )
        written = evr.write_results(out or evr.default_out_dir(resolved, completions), results, summary)
    except GspoError as err:
        _fail(err)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None
    evr.render(summary, Console())
    err_console.print(f"wrote {written} and {written.with_name(evr.PROBLEMS_FILE).name}", markup=False, highlight=False)
