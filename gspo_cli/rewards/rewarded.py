"""A task whose problems are scored by reward functions instead of its own verifier."""

from __future__ import annotations

from collections.abc import Callable

from gspo_cli.rewards.calls import Reward, Scoring
from gspo_cli.tasks.base import Problem, Score, Task


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
        from gspo_cli.rewards.model import scoring_alone

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
