"""A step's rollout and its scores, scoring overlapped with sampling where the engine allows.

With a reward pool in chunks mode (rewards/pool.py; task.reward_calls: chunks) the rows go
to its workers as they are sampled: the hf engine's compact decode loop hands over each row
when it stops (`generate(..., on_rows=)`), so the pool scores early rows while the longest
ones still decode; the rows left at the end
(those that ran to max_new_tokens, or all of them with `rollout.decode: generate` and the vLLM
engines, whose generate returns the batch at once) are sent when generation returns.
`time/score_s` is what scoring adds after generation: the wait for the pool's last answers
and the rewards that run in the trainer (shipped rewards, reward models, judges).
"""

from __future__ import annotations

import time

from gspo_cli import distributed


def start_scoring(task, rows: list, step: int):
    """An object with `add(rows, completions, completion_ids)` and `finish(completions,
    completion_ids) -> scores`: the task's own (`RewardedTask.scoring`), or one that scores the
    whole batch in `finish` (tasks scored by their own verifier)."""
    scoring = getattr(task, "scoring", None)
    return scoring(rows, step) if scoring is not None else _AtTheEnd(task, rows, step)


class _AtTheEnd:
    wants_rows = False

    def __init__(self, task, rows, step):
        self.task, self.rows, self.step = task, rows, step

    def add(self, rows, completions, completion_ids) -> None:
        pass

    def finish(self, completions, completion_ids=None):
        return self.task.score_rollout(self.rows, completions, completion_ids, self.step)


def generate_scored(engine, prompts: list, scoring, problems: list | None = None):
    """engine.generate(prompts), rows handed to `scoring.add` as they finish where it can;
    a multi-turn engine (`takes_problems`) also gets the rows' problems (its environments may read them)."""
    if getattr(engine, "takes_problems", False) and problems is not None:
        return engine.generate(prompts, problems=problems)
    if getattr(engine, "streams_rows", False) and getattr(scoring, "wants_rows", False):
        return engine.generate(prompts, on_rows=scoring.add)
    return engine.generate(prompts)


def sample_and_score(ctx, step: int, times: dict) -> tuple[list, object, list]:
    """(problems, batch, scores) of one round of sampling at training step `step`: the step's
    prompts (this process's share), G samples each, scored; adds to times' rollout and score."""
    spec, G = ctx.spec, ctx.spec.rollout.group_size
    t = time.time()
    problems = distributed.shard(ctx.task.train_problems(ctx.rng, spec.rollout.prompts_per_step), ctx.dist)
    rows = [p for p in problems for _ in range(G)]
    scoring = start_scoring(ctx.task, rows, step)
    with ctx.compute():
        batch = generate_scored(ctx.engine, [p.prompt for p in rows], scoring, rows)
    t1 = time.time()
    scores = scoring.finish(batch.completions, batch.completion_ids)
    times["time/rollout_s"] += t1 - t
    times["time/score_s"] += time.time() - t1
    return problems, batch, scores
