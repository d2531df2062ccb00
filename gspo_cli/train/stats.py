"""One step's statistics, kept as parts that add up exactly across processes.

Every metric the trainer logs per step is recorded here with the reduction its
definition needs: a weighted mean (a total and a weight: tokens, responses, groups or
mini-batches), a minimum, a maximum, a sum, a value every process holds alike, or the
moments of a standard deviation. Under torchrun each rank records its own share, the
parts are gathered once per step and combined, so the logged numbers are the numbers
one process would log for the same global batch. With one process the same code runs
without any communication.
"""

from __future__ import annotations

import math
import resource

import torch

from gspo_cli import distributed
from gspo_cli.algorithms import zero_variance_group_frac
from gspo_cli.algorithms.precision import upcast
from gspo_cli.distributed import DistInfo
from gspo_cli.metrics import LOSS_STAT_KEYS, reward_key, reward_std_key
from gspo_cli.rollout.base import logprob_gaps


class StepStats:
    """Accumulates one step's metrics on one rank; `reduce` combines all ranks."""

    def __init__(self) -> None:
        self.parts: dict[str, tuple] = {}

    def mean(self, key: str, total: float, weight: float) -> None:
        """Add `total` (a sum of values) over `weight` units (tokens, responses, ...)."""
        _, t, w = self.parts.get(key, ("mean", 0.0, 0.0))
        self.parts[key] = ("mean", t + float(total), w + float(weight))

    def max(self, key: str, value: float) -> None:
        old = self.parts.get(key, ("max", -math.inf))[1]
        self.parts[key] = ("max", max(old, float(value)))

    def min(self, key: str, value: float) -> None:
        old = self.parts.get(key, ("min", math.inf))[1]
        self.parts[key] = ("min", min(old, float(value)))

    def sum(self, key: str, value: float) -> None:
        self.parts[key] = ("sum", self.parts.get(key, ("sum", 0.0))[1] + float(value))

    def same(self, key: str, value) -> None:
        """A value every rank holds alike (the step, the learning rate, agreed counts)."""
        self.parts[key] = ("same", value)

    def std(self, key: str, values: list[float]) -> None:
        """Sample standard deviation (n - 1) of all ranks' `values` together."""
        _, n, s1, s2 = self.parts.get(key, ("std", 0, 0.0, 0.0))
        self.parts[key] = ("std", n + len(values), s1 + sum(values), s2 + sum(v * v for v in values))

    def var(self, key: str, values) -> None:
        """Population variance of all ranks' `values` (a 1-D tensor or list) together."""
        vals = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
        _, n, s1, s2 = self.parts.get(key, ("var", 0, 0.0, 0.0))
        self.parts[key] = ("var", n + vals.numel(), s1 + vals.sum().item(), s2 + (vals * vals).sum().item())

    def absorb(self, other: "StepStats") -> None:
        """Add `other`'s parts to these, as if recorded here (a `same` value: `other`'s)."""
        for key, part in other.parts.items():
            kind, mine = part[0], self.parts.get(key)
            if mine is None or kind == "same":
                self.parts[key] = part
            elif kind in ("max", "min"):
                self.parts[key] = (kind, (max if kind == "max" else min)(mine[1], part[1]))
            else:  # mean, sum, std, var: every field after the kind adds up
                self.parts[key] = (kind, *(a + b for a, b in zip(mine[1:], part[1:])))

    def reduce(self, info: DistInfo) -> dict:
        """The step's metrics over every rank, as plain numbers."""
        ranks = distributed.gather_objects(self.parts, info)
        out = {}
        for key in dict.fromkeys(k for parts in ranks for k in parts):
            vals = [parts[key] for parts in ranks if key in parts]
            out[key] = _combine(vals)
        return {k: v for k, v in out.items() if v is not None}


def _combine(vals: list[tuple]):
    kind = vals[0][0]
    if kind == "mean":
        total, weight = sum(v[1] for v in vals), sum(v[2] for v in vals)
        return total / weight if weight > 0 else None
    if kind == "max":
        return max(v[1] for v in vals)
    if kind == "min":
        return min(v[1] for v in vals)
    if kind == "sum":
        return sum(v[1] for v in vals)
    if kind == "same":
        return vals[0][1]
    if kind == "std":
        n, s1, s2 = (sum(v[i] for v in vals) for i in (1, 2, 3))
        if n < 2:
            return 0.0
        return math.sqrt(max(s2 - s1 * s1 / n, 0.0) / (n - 1))
    if kind == "var":
        n, s1, s2 = (sum(v[i] for v in vals) for i in (1, 2, 3))
        return max(s2 / n - (s1 / n) ** 2, 0.0) if n else None
    raise ValueError(f"unknown reduction {kind!r}")


# ---------------------------------------------------------------------------------------
# What one step records, metric by metric (definitions in gspo_cli.metrics)


def record_gap(stats: StepStats, engine_logp_BC, trainer_logp_BC, mask_BC) -> None:
    """|sampler - trainer| log-prob over response tokens (rollout.base.logprob_gaps):
    token-weighted mean and max, as parts that add up across ranks."""
    diff = logprob_gaps(engine_logp_BC, trainer_logp_BC, mask_BC)
    stats.mean("rollout/logprob_diff_mean", diff.sum().item(), diff.numel())
    stats.max("rollout/logprob_diff_max", diff.max().item() if diff.numel() else 0.0)


# Response-length buckets of the log-ratio diagnostic: (lo, hi] in tokens, the last open-ended.
LOGVAR_LENGTH_EDGES = (16, 32, 64, 128, 256)


def logvar_length_key(length: int) -> str:
    """`ratio/logvar_len_<lo>_<hi>` for a response of `length` tokens (the last bucket: `_<lo>_inf`)."""
    lo = 0
    for hi in LOGVAR_LENGTH_EDGES:
        if length <= hi:
            return f"ratio/logvar_len_{lo + 1}_{hi}"
        lo = hi
    return f"ratio/logvar_len_{lo + 1}_inf"


def record_logratio_var(stats: StepStats, new_logp_BC, old_logp_BC, mask_BC, minibatch: int) -> None:
    """The paper's diagnostic: the variance of token log-ratios log(pi_theta / pi_old) over the
    response tokens of a mini-batch, by the mini-batch's index in the step (0: on-policy; later
    ones drift further) and by each response's length bucket. (B, C) tensors; `mask_BC` 1 on
    response tokens."""
    logr_BC = (upcast(new_logp_BC.detach()) - upcast(old_logp_BC)) * mask_BC
    on = mask_BC > 0
    stats.var(f"ratio/logvar_mb{minibatch}", logr_BC[on])
    keys = [logvar_length_key(int(n)) if n else None for n in mask_BC.sum(-1).tolist()]
    for key in dict.fromkeys(k for k in keys if k is not None):
        rows = torch.tensor([k == key for k in keys], device=logr_BC.device)
        stats.var(key, logr_BC[rows][on[rows]])


def record_batch(stats: StepStats, batch, scores, rewards_B, entropy_BC, group_size: int, lr: float) -> None:
    """The rollout batch's own metrics (rewards, lengths, entropy), as exact parts. `batch` is
    a RolloutBatch, `scores` its task Scores, `rewards_B` (B,), `entropy_BC` (B, C)."""
    G = group_size
    mask_BC = getattr(batch, "model_mask", batch.response_mask)  # the model's tokens: tool output counts in neither
    n = len(scores)
    lengths_B = mask_BC.sum(-1)
    stats.mean("reward/mean", rewards_B.sum().item(), n)
    stats.std("reward/std", rewards_B.tolist())
    stats.mean("reward/accuracy", sum(s.correct for s in scores), n)
    for k in dict.fromkeys(k for s in scores for k in s.components):  # a reward's mean over the rows it applies to
        applied = [s.components[k] for s in scores if k in s.components]
        stats.mean(reward_key(k), sum(applied), len(applied))
        stats.std(reward_std_key(k), applied)
    flags = [s.rewarded for s in scores if s.rewarded is not None]
    if flags:  # reward functions: rows none of them applied to (reward 0)
        stats.mean("reward/no_reward_frac", sum(not f for f in flags), len(flags))
    stats.mean("reward/zero_var_group_frac", zero_variance_group_frac(rewards_B, G) * (n // G), n // G)
    stats.mean("response/length_mean", lengths_B.sum().item(), n)
    stats.max("response/length_max", lengths_B.max().item())
    stats.mean("response/truncated_frac", batch.truncated.float().sum().item(), n)
    stats.mean("policy/entropy", (entropy_BC * mask_BC).sum().item(), mask_BC.sum().item())
    stats.same("policy/lr", lr)
    stats.sum("perf/tokens", batch.response_mask.sum().item())  # every response token the step ran
    if getattr(batch, "tool_counts", None) is not None:
        record_tools(stats, batch)
    # Linux reports kB. The process's peak so far (loading included), the largest over ranks.
    stats.max("perf/peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        stats.max("perf/peak_gpu_mb", torch.cuda.max_memory_allocated() / 2**20)


def record_update(stats: StepStats, loss, loss_stats: dict, extra: dict, grad_norm, mask_BC) -> None:
    """One mini-batch's statistics, weighted by what each is a mean over (metrics.LOSS_STAT_KEYS)."""
    weights = {"tokens": float(mask_BC.sum()), "responses": float((mask_BC.sum(-1) > 0).sum())}
    # This rank's loss is its share of the mini-batch loss times world size (step._denominator),
    # so the mean over ranks and mini-batches is the mean of the mini-batches' global losses.
    stats.mean("policy/loss", float(loss.detach()), 1.0)
    stats.mean("policy/grad_norm", float(grad_norm), 1.0)  # equal on every rank after the all-reduce
    for k, (key, unit) in LOSS_STAT_KEYS.items():
        if k in loss_stats:
            stats.mean(key, float(loss_stats[k]) * weights[unit], weights[unit])
    if "kl_ref" in extra:  # over the tokens the penalty averages (step._update), not `mask_BC`'s
        stats.mean("policy/kl_ref_k3", float(extra["kl_ref"]), extra["kl_ref_tokens"])
    if "aux_loss" in extra:
        stats.mean("moe/aux_loss", float(extra["aux_loss"]), 1.0)
    if weights["tokens"] > 0:
        stats.min("policy/ratio_min", float(loss_stats["ratio_min"]))
        stats.max("policy/ratio_max", float(loss_stats["ratio_max"]))


def record_tools(stats: StepStats, batch) -> None:
    """A multi-turn batch's tool metrics: turns, tool calls, tool errors and time-outs per
    response (`tools/*_mean`) and the environment's share of the response tokens."""
    n = len(batch.tool_counts)
    for key in ("turns", "tool_calls", "tool_errors", "tool_timeouts"):
        stats.mean(f"tools/{key}_mean", float(sum(c[key] for c in batch.tool_counts)), n)
    env = float((batch.response_mask - batch.model_mask).sum())
    stats.mean("tools/env_token_frac", env, float(batch.response_mask.sum()))
