"""Where the trainer combined correct losses wrongly or reported them
wrongly, each reproduced in a test of its own, and dual-clip PPO against verl's formula."""

from __future__ import annotations

import random
import warnings
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import rows_batch
from typer.testing import CliRunner

from gspo_cli.algorithms import (
    clip_cov_loss,
    entropy_top_mask,
    get_mismatch_correction,
    grpo_advantages,
    grpo_loss,
    gspo_token_loss,
    kl_cov_loss,
    kl_k3_BC,
    weighs_responses_equally,
)
from gspo_cli.analysis.rundata.arm_settings import SETTINGS
from gspo_cli.cli.app import app
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.rollout import response_logprobs
from gspo_cli.spec import AggregationWarning
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Score
from gspo_cli.train.sampling import dynamic_sampling, signal_values
from gspo_cli.train.stats import StepStats
from gspo_cli.train.step import learn, setup
from gspo_cli.train.token_weights import token_weights


def base(**arm):
    return {
        "name": "r",
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 10},
        "arms": [{"name": "a", **arm}],
    }


def arm_of(**arm):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spec_from_dict(base(**arm)).arms[0]


# ----------------------------------------------------------------------------- a tiny trainer


def tiny_ctx(tmp_path, **arm):
    """A step context on a small untrained dense built-in model (no cold start: a second)."""
    raw = {
        "name": "r",
        "output_dir": str(tmp_path),
        "model": {
            "name": "builtin:tiny-dense",
            "builtin": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64},
            "cold_start": {"steps": 0},
        },
        "task": {"name": "arithmetic", "params": {"num_operands": 2, "max_operand": 4, "operators": "+"}},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 12, "sampler_logprobs": False},
        "arms": [{"name": "a", "preset": "paper-grpo", "mini_batches": 1, **arm}],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    return setup(spec, spec.arms[0], 0, task, source)


def mixed_scores(n: int) -> list[Score]:
    """Rewards 1, 0, 1, 0, ...: every group of 4 has two positive and two negative advantages."""
    return [Score(reward=float(i % 2 == 0), correct=i % 2 == 0) for i in range(n)]


# ----------------------------------------------------------------------------- 1. logged KL


def test_kl_ref_metric_is_the_mean_of_what_the_penalty_averages(tmp_path):
    """Item 1: with the 80/20 filter most loss-mask tokens have weight 0. The penalty averages k3
    over every loss-mask token; the metric was that sum over the count of weight-non-0 tokens
    only (~5x too large with top 0.2). Now it is the penalty's own mean."""
    torch.manual_seed(0)
    ctx = tiny_ctx(tmp_path, kl_coef=0.1, token_filter={"entropy_top": 0.2})
    with torch.no_grad():  # the policy moves away from the reference (the initial weights)
        for p in ctx.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = ctx.engine.generate([p.prompt for p in ctx.task.train_problems(random.Random(0), 2) for _ in range(4)])
    with torch.no_grad():
        logp = response_logprobs(ctx.model, batch, 1.0).logp
        ref = response_logprobs(ctx.ref_model, batch, 1.0).logp
    on = batch.response_mask > 0
    expected = kl_k3_BC(logp, ref)[on].mean().item()  # one mini-batch: its forward is at these weights
    metrics = learn(ctx, batch, mixed_scores(8), step=1)
    assert metrics["policy/dropped_token_frac"] > 0.6  # the filter left ~80% at weight 0
    assert expected > 1e-3
    assert metrics["policy/kl_ref_k3"] == pytest.approx(expected, rel=1e-3)


# ----------------------------------------------------------------------------- 2. entropy threshold


@pytest.mark.parametrize("how", ["overlong", "rejected_zero"])
def test_entropy_threshold_is_taken_over_the_trained_tokens(how):
    """Item 2: rows the loss never trains (DAPO's overlong filter; mismatch rejections) with the
    highest entropies used to set the 80/20 threshold, leaving 0% of the trained tokens with
    gradient. Now the kept share of the trained tokens is `top`."""
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(4, 10, generator=g)
    entropy[2:] += 5.0  # rows 2, 3: the highest entropies, and never trained
    if how == "overlong":
        arm = arm_of(preset="dapo", mini_batches=2, token_filter={"entropy_top": 0.2})
        b = rows_batch([10] * 4, truncated=[False, False, True, True])
        weights, loss_mask = token_weights(arm, StepStats(), None, torch.zeros(4, 10), entropy, b)
        trained = loss_mask > 0
    else:
        arm = arm_of(
            preset="paper-grpo",
            mini_batches=2,
            token_filter={"entropy_top": 0.2},
            mismatch={"mode": "seq_mask", "rejected": "zero"},
        )
        engine = torch.zeros(4, 10)
        engine[2:] = -3.0  # ratio e^3 > 2: rows 2, 3 rejected at weight 0
        b = rows_batch([10] * 4, engine_logp=engine)
        weights, loss_mask = token_weights(
            arm, StepStats(), get_mismatch_correction("seq_mask"), torch.zeros(4, 10), entropy, b
        )
        trained = loss_mask > 0
    carries = (weights != 0) & trained
    assert trained[:2].all()
    assert int(carries.sum()) == 4  # 20% of the 20 trained tokens (was 0)
    top4 = entropy[:2].reshape(-1).topk(4).values.min()
    assert (entropy[:2][carries[:2]] >= top4).all()


# ----------------------------------------------------------------------------- 3. large batches


def test_entropy_top_mask_takes_more_than_2_24_tokens():
    """Item 3: torch.quantile refuses more than 2^24 values (1024 x 16400 = 16.8M response tokens
    in one process: DAPO-like scale). Selection keeps exactly the top share."""
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(1024, 16400, generator=g)
    mask = torch.ones(1024, 16400)
    with pytest.raises(RuntimeError, match="too large"):
        torch.quantile(entropy[mask > 0], 0.8)
    keep = entropy_top_mask(entropy, mask, 0.2)
    assert abs(int(keep.sum()) - 0.2 * entropy.numel()) <= 1
    assert entropy[keep].min() >= entropy[~keep].max()


@pytest.mark.parametrize("top", [0.2, 0.25, 0.5, 0.05, 1 / 3])
def test_entropy_top_mask_keeps_what_the_quantile_threshold_kept(top):
    """The same tokens as `entropy >= torch.quantile(entropy, 1 - top)` (linear interpolation),
    on continuous values and on ties."""
    g = torch.Generator().manual_seed(1)
    for n in (1, 2, 7, 50, 333, 1001):
        for ent in (torch.rand(n, generator=g), torch.randint(0, 4, (n,), generator=g).float()):
            mask = torch.ones(1, n)
            old = ent >= torch.quantile(ent, 1 - top)
            assert torch.equal(entropy_top_mask(ent[None], mask, top)[0], old), (n, top)


# ----------------------------------------------------------------------------- 4. off-policy mask


@pytest.mark.parametrize("engine", [True, False])
def test_off_policy_mask_sees_the_engine_trainer_mismatch(tmp_path, engine):
    """Item 4: the sampler's log-probs sit 1 nat above the trainer's pi_old (as a drifted vLLM
    might), so log(pi_sampler / pi_theta) = 1 > delta 0.5 on every token from mini-batch 0 on:
    the mask drops every negative-advantage response. Against the trainer's pi_old alone it
    could never fire before an update; without engine log-probs it still compares with pi_old."""
    torch.manual_seed(0)
    ctx = tiny_ctx(tmp_path, off_policy_mask=0.5)
    batch = ctx.engine.generate([p.prompt for p in ctx.task.train_problems(random.Random(0), 2) for _ in range(4)])
    assert batch.engine_logp is None  # sampler_logprobs off: pi_old is the trainer's forward
    if engine:
        with torch.no_grad():
            batch.engine_logp = (response_logprobs(ctx.model, batch, 1.0).logp + 1.0) * batch.response_mask
    metrics = learn(ctx, batch, mixed_scores(8), step=1)
    lengths = batch.response_mask.sum(-1)
    negative_share = float(lengths[1::2].sum() / lengths.sum())  # odd rows: reward 0, A < 0
    expected = negative_share if engine else 0.0
    assert metrics["policy/dropped_token_frac"] == pytest.approx(expected, abs=1e-6)
    assert metrics["policy/off_policy_mask_sampler"] == float(engine)


# ----------------------------------------------------------------------------- 5. dynamic sampling


def test_dynamic_sampling_decides_signal_by_the_verdict():
    """Item 5: an all-correct group whose one response is a token into the overlong buffer has
    shaped rewards differing by 1e-3, which std normalisation turns into advantages of +-1.5.
    DAPO (and verl's recipe, filter_groups.metric acc) drops it; by default so do we now, and
    sample another round."""
    spec = spec_from_dict(
        base(preset="dapo", mini_batches=2)
        | {"rollout": {"prompts_per_step": 1, "group_size": 4, "max_new_tokens": 1000}}
    )
    arm = spec.arms[0]
    # buffer = 0.2 x 1000 = 200 tokens: length 801 is one token into it (penalty -1/200)
    first = rows_batch([10, 20, 30, 801], C=801)
    all_correct = [Score(reward=1.0, correct=True)] * 4
    shaped_arm = arm.model_copy(
        update={"dynamic_sampling": arm.dynamic_sampling.model_copy(update={"metric": "shaped"})}
    )
    adv = grpo_advantages(signal_values(shaped_arm, 1000, first, all_correct), 4)
    assert adv.abs().max() > 1.4  # the old decision's reading: signal worth +-1.5 advantages
    second = rows_batch([5, 5, 5, 5])
    mixed = [Score(reward=float(i < 2), correct=i < 2) for i in range(4)]
    ctx = SimpleNamespace(
        arm=arm, spec=spec, dist=DistInfo(), engine=SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0))
    )
    calls = []

    def sample():
        calls.append(1)
        return None, second, mixed

    out, scores, counts = dynamic_sampling(ctx, [None], first, all_correct, sample)
    assert counts["rounds"] == 1 and counts["signal"] == 1
    assert [s.correct for s in scores] == [True, True, False, False]  # the second round's group
    assert arm.dynamic_sampling.metric == "correct"  # the default

    # shaped (the old behaviour, still offered) keeps the all-correct group: no extra round
    _, _, counts = dynamic_sampling(
        SimpleNamespace(**{**vars(ctx), "arm": shaped_arm}), [None], first, all_correct, sample
    )
    assert counts["rounds"] == 0


def test_dynamic_sampling_metric_reward_reads_the_task_reward():
    arm = arm_of(preset="dapo", mini_batches=2, dynamic_sampling={"metric": "reward"})
    scores = [Score(reward=0.5, correct=False), Score(reward=1.0, correct=False)]
    assert signal_values(arm, 10, rows_batch([2, 2]), scores).tolist() == [0.5, 1.0]
    correct = arm_of(preset="dapo", mini_batches=2)
    assert signal_values(correct, 10, rows_batch([2, 2]), scores).tolist() == [0.0, 0.0]


# ----------------------------------------------------------------------------- 6. Clip-Cov / KL-Cov


def _planted_cov():
    """Row 0 (A = 2, log pi far above the mean, weight 0) holds the tokens of largest cov(A, log pi)
    over the whole mask (2.6); rows 1-3 are trained, and among them (means A -1/3, log pi -2)
    row 1's first token has the largest cov, 4/3, the only one above 1 (row 2's first: 2/3)."""
    adv = torch.tensor([2.0, 1.0, -1.0, -1.0])
    logp = torch.full((4, 5), -2.0)
    logp[0] = 0.0  # far above the mean, with the largest advantage: the top covariances
    logp[1, 0] = -1.0
    logp[2, 0] = -3.0
    mask = torch.ones(4, 5)
    weights = torch.ones(4, 5)
    weights[0] = 0.0  # e.g. the entropy filter dropped them
    return logp, adv, mask, weights


def test_kl_cov_penalises_only_trained_tokens():
    """Item 6: the top-cov tokens have weight 0; they used to take the whole budget, so the
    penalty landed where the loss cannot move anything (cov_frac 0)."""
    logp, adv, mask, weights = _planted_cov()
    _, stats = kl_cov_loss(logp, logp, adv, mask, clip_low=0.2, clip_high=0.2, weights_BC=weights, cov_ratio=0.1)
    # budget floor(0.1 x 15 trained tokens) = 1, among the trained tokens
    assert stats["cov_frac"].item() == pytest.approx(1 / 15)


def test_clip_cov_detaches_only_trained_tokens():
    """Clip-Cov's candidates (cov in (1, 5)) and covariance are the trained tokens': row 1's first
    token is detached (its gradient 0); over the whole mask it was not even a candidate (0.375)."""
    logp, adv, mask, weights = _planted_cov()
    logp = logp.requires_grad_()
    torch.manual_seed(0)
    loss, stats = clip_cov_loss(
        logp, logp.detach(), adv, mask, clip_low=0.2, clip_high=0.2, weights_BC=weights, cov_ratio=0.1
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert stats["cov_frac"].item() == pytest.approx(1 / 15)
    assert grad[1, 0].item() == 0.0 and grad[1, 1].item() != 0.0


# ----------------------------------------------------------------------------- 7. aggregation warnings


def test_sequence_losses_with_token_weighted_aggregations_warn_once_per_arm():
    raw = base(preset="paper-gspo", mini_batches=2, aggregation="token_mean")
    raw["arms"] += [
        {"name": "b", "preset": "luspo", "mini_batches": 2, "aggregation": "seq_mean_token_sum_norm"},
        {"name": "c", "preset": "paper-gspo", "mini_batches": 2},  # the paper's: no warning
        {"name": "d", "preset": "dapo", "mini_batches": 2},  # token-level loss: no warning
    ]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        spec_from_dict(raw)
    lines = [str(w.message) for w in seen if issubclass(w.category, AggregationWarning)]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith("arms[0].aggregation: token_mean weighs each response of the sequence-level loss gspo")
    assert lines[1].startswith("arms[1].aggregation: seq_mean_token_sum_norm")
    assert [weighs_responses_equally(n) for n in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum")] == [
        True,
        False,
        False,
    ]


# ----------------------------------------------------------------------------- 8. clip_low per loss


def test_clip_low_bounds_depend_on_the_loss(tmp_path):
    """Item 8: GMPO's clip_low is a log-space bound (2.0: ratio >= e^-2), so it may exceed 1; a
    ratio-clipped loss refuses it in one line naming the field; CISPO's 1.0 is no lower bound."""
    assert arm_of(preset="gmpo", mini_batches=2, clip_low=2.0).clip_low == 2.0
    assert arm_of(preset="cispo", mini_batches=2).clip_low == 1.0
    with pytest.raises(SpecError) as info:
        spec_from_dict(base(preset="paper-grpo", mini_batches=2, clip_low=1.5))
    assert str(info.value) == (
        "arms[0].clip_low: 1.5 is above 1; grpo clips the ratio at 1 - clip_low, so 1.0 already means no lower bound"
    )
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base(preset="paper-gspo", mini_batches=2, clip_low=3.0)))
    result = CliRunner().invoke(app, ["train", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "arms[0].clip_low: 3.0 is above 1" in result.output and "Traceback" not in result.output


# ----------------------------------------------------------------------------- 11. dual clip


def verl_vanilla(old_logp, logp, adv, mask, clip_low, clip_high, clip_ratio_c):
    """verl's compute_policy_loss_vanilla (verl/trainer/ppo/core_algos.py), token-mean, written
    out step by step as verl does: the reference the dual clip is tested against."""
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -adv * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * mask).sum() / mask.sum()


def test_dual_clip_hand_computed():
    """clip 0.2 / 0.2, c = 3. Tokens (ratio, A): (4, -1): PPO's loss 4, dual-clipped to 3 with no
    gradient; (2, -1): 2, untouched (below c); (4, +1): PPO clips it to -1.2; (0.5, -1): PPO's
    low clip, -0.8 ... loss -(-0.8) = 0.8."""
    ratio = torch.tensor([[4.0, 2.0, 4.0, 0.5]])
    logp = ratio.log().requires_grad_()
    old = torch.zeros(1, 4)
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, stats = grpo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, aggregation="token_mean", clip_dual=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2 + 0.8) / 4)
    loss.backward()
    # d/dlogp of the per-token loss / 4: dual-clipped 0, (2, -1): -A r / 4 = 0.5, PPO-clipped 0, 0
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.5, 0.0, 0.0])
    assert stats["clip_frac_token_dual"].item() == pytest.approx(0.25)
    assert stats["clip_frac_token"].item() == pytest.approx(0.75)  # dual + high + low
    assert (stats["clip_frac_token_low"].item(), stats["clip_frac_token_high"].item()) == (0.25, 0.25)
    # off: the PPO loss, unbounded for the negative token
    plain, plain_stats = grpo_loss(logp.detach(), old, adv, mask, clip_low=0.2, clip_high=0.2, aggregation="token_mean")
    assert plain.item() == pytest.approx((4.0 + 2.0 - 1.2 + 0.8) / 4)
    assert "clip_frac_token_dual" not in plain_stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dual_clip_matches_verl_vanilla(seed):
    """grpo with clip_dual = verl's vanilla PPO loss with clip_ratio_c, value and gradient, on
    random ratios wide enough that every branch is taken."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(6, 9, generator=g)
    logp = (old + 1.5 * torch.randn(6, 9, generator=g)).requires_grad_()
    adv = torch.randn(6, generator=g)[:, None].expand(6, 9).contiguous()
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    ours, _ = grpo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token_mean", clip_dual=3.0)
    (g_ours,) = torch.autograd.grad(ours, logp)
    ref = verl_vanilla(old, logp, adv, mask, 0.2, 0.28, 3.0)
    (g_ref,) = torch.autograd.grad(ref, logp)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(g_ours, g_ref, atol=1e-7)
    ratio = (logp - old).exp()
    assert bool(((adv < 0) & (ratio > 3.0) & (mask > 0)).any())  # the dual branch was exercised


def test_dual_clip_in_gspo_token_and_clip_cov():
    """gspo_token bounds its sequence ratio s_i for A < 0; clip_cov applies it before selecting."""
    old = torch.zeros(2, 3)
    logp = torch.full((2, 3), 2.0).requires_grad_()  # s_i = e^2 ~ 7.4 > 3
    adv = torch.tensor([-1.0, 1.0])
    mask = torch.ones(2, 3)
    loss, stats = gspo_token_loss(logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4, clip_dual=3.0)
    assert loss.item() == pytest.approx((3.0 - 1.0004) / 2)
    assert stats["clip_frac_token_dual"].item() == pytest.approx(0.5)
    loss, stats = clip_cov_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_dual=3.0)
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2)


def test_clip_dual_is_refused_for_the_other_losses():
    for preset in ("paper-gspo", "cispo", "sapo", "gmpo", "luspo", "kl-cov"):
        with pytest.raises(SpecError) as info:
            spec_from_dict(base(preset=preset, mini_batches=2, clip_dual=3.0))
        lines = str(info.value).splitlines()
        assert len(lines) == 1 and lines[0].startswith("arms[0].clip_dual: "), lines
        assert "(the token-level PPO-clipped losses do: grpo, gspo_token, clip_cov)" in lines[0]
    assert arm_of(preset="paper-grpo", mini_batches=2, clip_dual=3.0).clip_dual == 3.0
    with pytest.raises(SpecError, match=r"arms\[0\]\.clip_dual"):
        spec_from_dict(base(preset="paper-grpo", mini_batches=2, clip_dual=1.0))


def test_compare_shows_dual_clip_and_the_signal_metric():
    """The algorithm column names clip_dual and what dynamic sampling decides by; a spec.yaml
    written before dynamic_sampling.metric existed decided by the shaped reward."""
    algorithm = SETTINGS["algorithm"][1]
    dapo = arm_of(preset="dapo", mini_batches=2, clip_dual=3.0).model_dump(mode="json")
    assert "clip 0.2/0.28 dual 3" in algorithm(dapo) and "dynamic sampling <= 3 by correct" in algorithm(dapo)
    old = {**dapo, "dynamic_sampling": {"max_rounds": 3}}
    old.pop("clip_dual")
    assert "dynamic sampling <= 3 by shaped" in algorithm(old) and "dual" not in algorithm(old)
