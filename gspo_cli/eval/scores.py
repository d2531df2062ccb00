"""Held-out evaluation: per-problem verdicts and the scores made from them.

Scores over the problems, problem i with its own number n_i >= 1 of samples (files of
completions made elsewhere are uneven: failed generations, deduplication, merged shards);
K is the largest n_i, and every n_i = K when we sample ourselves:

- ``avg@K``  the mean over problems of each problem's share of correct samples (with equal
  n_i: mean correctness over all samples, the mean of pass@1 estimates);
- ``pass@k`` the unbiased estimator (Chen et al., 2021) of each problem with its own n_i,
  averaged over the problems with n_i >= k, for k = 1, 2, 4, ... <= K, and K; problems with
  fewer than k samples cannot estimate pass@k and are left out of it (`pass_k_problems`
  counts who entered each k);
- ``maj@K``  share of problems whose most common final answer is correct (tasks that can
  extract one, e.g. math; answers are normalised first, ties go to the earliest);
- ``timeout_frac`` / ``runtime_error_frac`` share of all samples with that failure, for tasks
  whose verdicts record it (code);
- ``rating`` an Elo-style estimate when problems carry a numeric rating/difficulty.

Torch is imported only to sample: scoring a file of completions needs no model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from math import comb
from typing import Any

from gspo_cli.metrics import SPREAD_SUFFIX, eval_reward_score
from gspo_cli.tasks import Problem, Score, Task

FAILURE_COMPONENTS = ("timeout", "runtime_error")
RATING_RANGE = (0.0, 4000.0)  # Codeforces-like scale; estimates are clamped to it


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k). Requires 1 <= k <= n."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_ks(samples: int) -> list[int]:
    """The k reported for K samples: powers of two up to K, and K itself."""
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    return sorted(set(ks) | {samples})


@dataclass
class ProblemResult:
    """One problem's completions and their verdicts."""

    problem: Problem
    completions: list[str]
    scores: list[Score]
    extracted: list[str | None] | None = None  # normalised final answers, for tasks that have them
    prompt: str | None = None  # the text the model continued (chat template applied); None: the task's prompt

    @property
    def correct(self) -> list[bool]:
        return [s.correct for s in self.scores]

    def majority_correct(self) -> bool:
        """Whether the most common extracted answer is a correct one (no answer: wrong)."""
        votes = Counter(a for a in self.extracted or [] if a is not None)
        if not votes:
            return False
        winner = votes.most_common(1)[0][0]  # Counter keeps first-seen order among ties
        return self.correct[self.extracted.index(winner)]

    def record(self) -> dict[str, Any]:
        """The line written to eval_problems.jsonl."""
        out = {
            "id": self.problem.id,
            "prompt": self.prompt if self.prompt is not None else self.problem.prompt,
            "answer": self.problem.answer,
            "completions": self.completions,
            "correct": self.correct,
            "rewards": [s.reward for s in self.scores],
        }
        if any(s.detail for s in self.scores):  # code: per sample, each test's verdict and stderr
            out["details"] = [s.detail for s in self.scores]
        if self.extracted is not None:
            out["extracted"] = self.extracted
            out["majority_correct"] = self.majority_correct()
        rating = problem_rating(self.problem)  # not all of meta: code problems keep their tests there
        if rating is not None:
            out["rating"] = rating
        return out


def score_problems(
    task: Task, problems: list[Problem], completions: list[list[str]], prompts: list[str] | None = None, tokenizer=None
) -> list[ProblemResult]:
    """Verdicts for `completions[i]` (n_i >= 1 samples) of `problems[i]`; `prompts[i]`, when
    given, is the text the model saw for problem i (kept in its record); `tokenizer`, when
    given, the sampler's (reward functions get the completions' token ids from it).

    Every sample goes to the task in one `score_batch` call (code: programs judged in parallel).
    Without a tokenizer, given now or before, reward functions get `NoTokenIds` as each
    completion's ids: reading them ends the evaluation in one line, never character codes.
    """
    if tokenizer is not None:
        use_tokenizer(task, tokenizer)
    elif hasattr(task, "encode") and task.encode is None:
        task.encode = lambda text: NO_TOKEN_IDS
    flat_p = [p for p, cs in zip(problems, completions) for _ in cs]
    flat_c = [c for cs in completions for c in cs]
    flat_s = list(task.score_batch(flat_p, flat_c))
    extract: Callable[[str], str | None] | None = getattr(task, "extract_answer", None)
    out, i = [], 0
    for j, (p, cs) in enumerate(zip(problems, completions)):
        out.append(
            ProblemResult(
                problem=p,
                completions=list(cs),
                scores=flat_s[i : i + len(cs)],
                extracted=[extract(c) for c in cs] if extract else None,
                prompt=prompts[j] if prompts is not None else None,
            )
        )
        i += len(cs)
    return out


def summarize(results: list[ProblemResult], judged: bool = True) -> dict[str, float]:
    """The scores of the module docstring. Each problem needs >= 1 sample (a ValueError
    otherwise); the counts may differ between problems. No problems gives {}. Scored by reward
    functions: `reward_mean` and each reward's `reward_<name>` (mean over the samples it
    applies to), and without a reward that judges correctness (`judged` False) nothing else."""
    if not results:
        return {}
    counts = [len(r.completions) for r in results]
    if min(counts) < 1:
        raise ValueError("every problem needs at least one sample")
    rewards = reward_means([s for r in results for s in r.scores])
    if not judged:
        return rewards
    K = max(counts)
    n = len(results)
    correct = [sum(r.correct) for r in results]
    out: dict[str, float] = {f"avg@{K}": sum(c / m for c, m in zip(correct, counts)) / n}
    for k in pass_ks(K):
        entered = [(m, c) for m, c in zip(counts, correct) if m >= k]
        out[f"pass@{k}"] = sum(pass_at_k(m, c, k) for m, c in entered) / len(entered)
    if results[0].extracted is not None:
        out[f"maj@{K}"] = sum(r.majority_correct() for r in results) / n
    for name in FAILURE_COMPONENTS:
        if any(name in s.components for r in results for s in r.scores):
            out[f"{name}_frac"] = sum(s.components.get(name, 0.0) > 0 for r in results for s in r.scores) / sum(counts)
    rated = [(d, c / m) for r, c, m in zip(results, correct, counts) if (d := problem_rating(r.problem)) is not None]
    if rated:
        rating = elo_rating([d for d, _ in rated], sum(s for _, s in rated))
        if rating is not None:
            out["rating"] = rating
    return {**out, **rewards}


def reward_means(scores: list[Score]) -> dict[str, float]:
    """`reward_mean` and `reward_std` (the weighted sum) over `scores`, and per reward function
    `reward_<name>`, its mean over the scores it applies to, with `reward_<name>_std` beside it,
    the sample standard deviation over them (0 with one), as training logs reward/<name> and
    reward/<name>_std; {} for a task scored by its own verifier."""
    if not scores or all(s.rewarded is None for s in scores):
        return {}
    out = {"reward_mean": _mean([s.reward for s in scores]), "reward_std": _std([s.reward for s in scores])}
    for k in dict.fromkeys(k for s in scores for k in s.components):
        applied = [s.components[k] for s in scores if k in s.components]
        out[eval_reward_score(k)] = _mean(applied)
        out[eval_reward_score(k) + SPREAD_SUFFIX] = _std(applied)
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _std(values: list[float]) -> float:
    """Sample standard deviation (n - 1), as training's reward/std; 0 for fewer than 2 values."""
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def sample_counts(results: list[ProblemResult]) -> dict[str, dict[str, int]]:
    """How many samples the scores rest on: `samples_per_problem` {n: problems with n
    samples} and `pass_k_problems` {"pass@k": problems with >= k samples, which entered it}."""
    counts = [len(r.completions) for r in results]
    per = {str(m): counts.count(m) for m in sorted(set(counts))}
    entered = {f"pass@{k}": sum(m >= k for m in counts) for k in pass_ks(max(counts))} if counts else {}
    return {"samples_per_problem": per, "pass_k_problems": entered}


def problem_rating(problem: Problem) -> float | None:
    """A problem's numeric difficulty rating (`rating`, else `difficulty` in its meta), if any."""
    for key in ("rating", "difficulty"):
        v = (problem.meta or {}).get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def elo_rating(
    difficulties: list[float],
    solved: float,
    lo: float = RATING_RANGE[0],
    hi: float = RATING_RANGE[1],
    tol: float = 1e-6,
) -> float | None:
    """The rating R at which the Elo expected number of solves, sum_i 1 / (1 + 10^((d_i - R)/400)),
    equals `solved` (fractional solves allowed: the mean success over samples). The expectation
    rises with R, so bisection finds it; the result is clamped to [lo, hi] (everything solved
    gives hi, nothing solved gives lo). None without difficulties."""
    if not difficulties:
        return None

    def expected(r: float) -> float:
        return sum(1.0 / (1.0 + 10 ** ((d - r) / 400.0)) for d in difficulties)

    if solved <= expected(lo):
        return lo
    if solved >= expected(hi):
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected(mid) < solved else (lo, mid)
    return (lo + hi) / 2


def evaluate_samples(task: Task, problems: list[Problem], completions: list[list[str]]) -> dict[str, float]:
    """Scores for `completions[i]` (n_i samples) of `problems[i]` (see `summarize`)."""
    return summarize(score_problems(task, problems, completions), judged=getattr(task, "judged", True))


ONE_TURN = {"turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}  # a single-turn row's counts


def tool_use(counts: list[dict]) -> dict[str, float]:
    """Per-response means of the rows' tool counts, as training logs them (tools/<name>_mean)."""
    n = max(len(counts), 1)
    return {f"{k}_mean": round(sum(c.get(k, 0) for c in counts) / n, 4) for k in ONE_TURN}


def sample_completions(
    engine,
    problems: list[Problem],
    samples: int,
    batch_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    counts: list[dict] | None = None,
) -> list[list[str]]:
    """`samples` completions per problem from `engine`, `batch_size` sequences per generate call
    (all at once when None); `progress(done, total)` after each call. `counts`, when given, gets
    each completion's tool counts (`RolloutBatch.tool_counts`; one turn and no calls for a
    single-turn engine)."""
    import torch

    prompts = [p.prompt for p in problems for _ in range(samples)]
    step = batch_size or max(len(prompts), 1)
    completions: list[str] = []
    with torch.no_grad():
        for i in range(0, len(prompts), step):
            if getattr(engine, "takes_problems", False):  # multi-turn: environments may read the problem
                rows = [p for p in problems for _ in range(samples)][i : i + step]
                batch = engine.generate(prompts[i : i + step], problems=rows)
            else:
                batch = engine.generate(prompts[i : i + step])
            completions += batch.completions
            if counts is not None:
                got = getattr(batch, "tool_counts", None)
                counts += got if got is not None else [dict(ONE_TURN) for _ in batch.completions]
            if progress:
                progress(len(completions), len(prompts))
    return [completions[i * samples : (i + 1) * samples] for i in range(len(problems))]


class UnknownTokenIds(Exception):
    """A reward function read `completion_ids` where no tokenizer is known (the reward's own
    exception, so the run's error names the reward and the row as for any other)."""


class NoTokenIds:
    """A completion's `completion_ids` where no tokenizer is known (`gspo eval --completions`
    without --tokenizer or a run): a reward function that reads them (len, iteration,
    indexing, truth value) raises UnknownTokenIds, one line naming the fix, where passing
    anything else (character codes) would silently mean something else."""

    WHY = (
        "completion_ids: no tokenizer is known to turn these completions into token ids "
        "(gspo eval --completions: give --tokenizer MODEL, or a run directory as TARGET)"
    )

    opaque_ids = True  # scoring passes it on unread (rewards.calls._ids)

    def _unknown(self, *args, **kwargs):
        raise UnknownTokenIds(self.WHY)

    __len__ = __iter__ = __getitem__ = __bool__ = _unknown

    def __repr__(self) -> str:
        return "<completion_ids unknown: no tokenizer>"


NO_TOKEN_IDS = NoTokenIds()


def use_tokenizer(task: Task, tok) -> None:
    """Reward functions scoring completions get their token ids from the sampler's tokenizer
    `tok` (None: nothing to use; a task scored by its own verifier needs none)."""
    if tok is not None and hasattr(task, "encode"):
        task.encode = lambda text: tok(text, add_special_tokens=False).input_ids


def evaluate_policy(
    engine, task: Task, problems: list[Problem], samples: int, batch_size: int | None = None
) -> dict[str, float]:
    """Sample `samples` responses per problem with `engine` and score them (reward functions get
    the completions' token ids from the engine's tokenizer)."""
    return summarize(policy_results(engine, task, problems, samples, batch_size), judged=getattr(task, "judged", True))


def policy_results(
    engine, task: Task, problems: list[Problem], samples: int, batch_size: int | None = None
) -> list[ProblemResult]:
    """`evaluate_policy`'s verdicts, problem by problem, before they are summarised."""
    use_tokenizer(task, getattr(engine, "tokenizer", None))
    return score_problems(task, problems, sample_completions(engine, problems, samples, batch_size))


def problem_records(results: list[ProblemResult]) -> dict[str, list]:
    """An evaluation's per-problem record, as eval.jsonl's `problems` key holds it: columns `id`
    (in the order evaluated), `correct` (how many of its samples were correct) and `reward` (the
    mean reward over its samples, 4 decimals): three lists, not one object per problem, so 500
    problems take about 13 kB whatever K is."""
    return {
        "id": [r.problem.id for r in results],
        "correct": [sum(r.correct) for r in results],
        "reward": [round(sum(s.reward for s in r.scores) / max(len(r.scores), 1), 4) for r in results],
    }
