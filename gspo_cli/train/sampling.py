"""Rollout-side behaviours of an arm (DAPO, arXiv:2503.14476): the rewards the advantages
see (with the soft overlong punishment), the advantages (several rewards summed, or each
normalised in its group first: `multi_reward`), and dynamic sampling, which drops groups whose
responses are all alike (by default all correct or all wrong) and samples more prompts until
the batch is full of groups with signal (or a cap on extra rounds is hit)."""

from __future__ import annotations

import torch

from gspo_cli import distributed
from gspo_cli.algorithms import advantages_of_scored, overlong_penalty, signal_groups
from gspo_cli.algorithms.multi_reward import normalize_then_sum, signal_groups_where_applies
from gspo_cli.rollout import RolloutBatch
from gspo_cli.rollout.base import concat_batches


def shaped_rewards(arm, max_new_tokens: int, batch: RolloutBatch, scores: list) -> torch.Tensor:
    """(B,) float32 rewards: the task's, plus DAPO's soft overlong punishment when the arm's
    ``overlong.buffer_frac`` > 0 (buffer = round(buffer_frac x max_new_tokens) tokens)."""
    rewards_B = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    penalty_B = _overlong(arm, max_new_tokens, batch)
    return rewards_B if penalty_B is None else rewards_B + penalty_B


def _overlong(arm, max_new_tokens: int, batch: RolloutBatch) -> torch.Tensor | None:
    """(B,) DAPO's soft overlong punishment (<= 0), or None when the arm has none."""
    frac = arm.overlong.buffer_frac
    if frac <= 0:
        return None
    lengths_B = batch.model_mask.sum(-1).cpu()  # rewards stay on the host, beside the scores
    buffer = max(1, round(frac * max_new_tokens))
    return overlong_penalty(lengths_B, max_new_tokens, buffer, arm.overlong.penalty)


def reward_values(scores: list, name: str) -> torch.Tensor:
    """(B,) float32: the named reward of each row (Score.components), NaN where it does not apply."""
    return torch.tensor([s.components.get(name, float("nan")) for s in scores], dtype=torch.float32)


def advantages(ctx, batch: RolloutBatch, rewards_B: torch.Tensor, scores: list) -> torch.Tensor:
    """(B,) the arm's advantages, on the host. multi_reward sum_then_normalize: the estimator on
    `rewards_B` (shaped_rewards), rows no reward function applied to left out of their group and
    given 0 (`advantages_of_scored`, as TRL); normalize_then_sum: each of task.rewards normalised in its
    group, weighted, summed with the group-centred overlong penalty, over the batch's std
    (multi_reward.normalize_then_sum; under torchrun the std is the global batch's)."""
    arm, G = ctx.arm, ctx.spec.rollout.group_size
    if arm.multi_reward == "sum_then_normalize":
        scored_B = torch.tensor([s.rewarded is not False for s in scores])  # None: the task's own verifier
        return advantages_of_scored(ctx.adv_fn, rewards_B, scored_B, G, eps=arm.adv_eps)
    rewards = ctx.spec.task.rewards
    values_KB = torch.stack([reward_values(scores, r.label) for r in rewards])
    return normalize_then_sum(
        values_KB,
        [r.weight for r in rewards],
        G,
        eps=arm.adv_eps,
        penalty_B=_overlong(arm, ctx.spec.rollout.max_new_tokens, batch),
        reduce=lambda t: distributed.total_tensor(t, ctx.dist),
    )


def signal_values(arm, max_new_tokens: int, batch: RolloutBatch, scores: list) -> torch.Tensor:
    """(B,) float32: what dynamic sampling asks a group to differ in (arm.dynamic_sampling.metric):
    correct: the task's verdict (DAPO; verl's filter_groups.metric acc), reward: the task's
    reward (verl: score), shaped: the reward with the overlong penalty (verl: seq_reward),
    reward:<name>: that one of task.rewards, NaN where it does not apply. By the verdict, an
    all-correct group whose one long response is a token into the overlong buffer carries no
    signal, though its shaped rewards differ by 1e-3 (std normalisation would blow that up
    into advantages of +-1.5)."""
    metric = arm.dynamic_sampling.metric
    if metric == "shaped":
        return shaped_rewards(arm, max_new_tokens, batch, scores)
    if metric.startswith("reward:"):
        return reward_values(scores, metric.removeprefix("reward:"))
    return torch.tensor([float(s.correct) if metric == "correct" else s.reward for s in scores], dtype=torch.float32)


def signal(arm, max_new_tokens: int, batch: RolloutBatch, scores: list, group_size: int) -> torch.Tensor:
    """(Q,) bool: the groups with signal, whose `signal_values` differ (reward:<name>: among the
    rows that reward applies to, at least 2 of them)."""
    values_B = signal_values(arm, max_new_tokens, batch, scores)
    if arm.dynamic_sampling.metric.startswith("reward:"):
        return signal_groups_where_applies(values_B, group_size)
    return signal_groups(values_B, group_size)


def dynamic_sampling(ctx, problems: list, batch: RolloutBatch, scores: list, sample) -> tuple:
    """DAPO's dynamic sampling (signal: ``signal``). ``sample()`` draws one more round (this rank's share of
    rollout.prompts_per_step prompts) and returns (problems, batch, scores). Rounds continue
    while any rank lacks groups with signal, at most ``arm.dynamic_sampling.max_rounds``
    extra rounds (decided together: every rank generates the same number of times, as sharded
    generation needs). The batch keeps this rank's group count: groups with signal first, in
    sampling order, then (when the cap is hit) groups without signal from the first round.

    Returns (batch, scores, counts) with counts for ``record_dynamic``."""
    arm, spec = ctx.arm, ctx.spec
    G = spec.rollout.group_size
    n_groups = len(problems)
    pool_b, pool_s = [batch], [scores]
    signal_Q = [signal(arm, spec.rollout.max_new_tokens, batch, scores, G)]
    rounds = 0
    while rounds < arm.dynamic_sampling.max_rounds:
        short = int(torch.cat(signal_Q).sum()) < n_groups
        if not distributed.any_rank(short, ctx.dist):
            break
        _, b, s = sample()
        rounds += 1
        pool_b.append(b)
        pool_s.append(s)
        signal_Q.append(signal(arm, spec.rollout.max_new_tokens, b, s, G))
    all_signal_Q = torch.cat(signal_Q)
    with_signal = all_signal_Q.nonzero().squeeze(-1).tolist()[:n_groups]
    without = (~signal_Q[0]).nonzero().squeeze(-1).tolist()[: n_groups - len(with_signal)]
    groups = sorted(with_signal + without)
    rows = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
    merged = concat_batches(pool_b, ctx.engine.tokenizer.pad_token_id)
    merged_scores = [x for s in pool_s for x in s]
    out = merged.rows(rows)
    counts = {"rounds": rounds, "signal": len(with_signal), "groups": n_groups, "sampled": all_signal_Q.numel()}
    return out, [merged_scores[i] for i in rows.tolist()], counts


def record_dynamic(stats, counts: dict) -> None:
    """``rollout/dynamic_rounds`` (extra rounds, equal on every rank), ``rollout/signal_group_frac``
    (share of the trained groups with signal) and ``rollout/sampled_groups`` (groups generated
    this step over all rounds and ranks) into a StepStats."""
    stats.same("rollout/dynamic_rounds", counts["rounds"])
    stats.mean("rollout/signal_group_frac", counts["signal"], counts["groups"])
    stats.sum("rollout/sampled_groups", counts["sampled"])
