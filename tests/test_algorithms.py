"""Hand-computed numbers and invariants for gspo_cli.algorithms."""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate,
    aggregation_count,
    get_advantage_estimator,
    get_policy_loss,
    grpo_loss,
    zero_variance_group_frac,
)

CLIP_FRAC_KEYS = ("clip_frac_token", "clip_frac_token_low", "clip_frac_token_high", "clip_frac_seq")
STAT_KEYS = CLIP_FRAC_KEYS + ("ratio_mean", "ratio_min", "ratio_max", "seq_ratio_mean", "approx_kl")
LOSS_NAMES = ("grpo", "gspo", "gspo_token")


def approx(x, rel=1e-5, abs=1e-6):
    return pytest.approx(x, rel=rel, abs=abs)


def run_loss(name, logp, old_logp, adv, mask, clip_low=0.2, clip_high=0.2, aggregation="seq_mean_token_mean"):
    """Return (loss, stats, grad w.r.t. logp) for a fresh leaf copy of logp."""
    logp = logp.detach().clone().requires_grad_(True)
    loss, stats = get_policy_loss(name)(
        logp, old_logp, adv, mask, clip_low=clip_low, clip_high=clip_high, aggregation=aggregation
    )
    loss.backward()
    return loss.detach(), stats, logp.grad


def random_batch(seed, B=8, C=7, dtype=torch.float64):
    """Random logp, old_logp (per-sequence offset ±0.1 plus noise), ragged mask, adv (B,)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, C, generator=g, dtype=dtype) * 3.0
    offset = (torch.rand(B, 1, generator=g, dtype=dtype) * 2 - 1) * 0.1
    noise = (torch.rand(B, C, generator=g, dtype=dtype) * 2 - 1) * 0.02
    old = logp - offset - noise
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C)[None, :] < lengths[:, None]).to(dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    return logp, old, mask, adv


# ----------------------------------------------------------------------------- 1. grpo by hand


def test_grpo_hand_computed_2x3():
    # logp - old_logp: row0 = [0.5, 0.0, -0.5] (all response), row1 = [-0.5, 0.1, pad]
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.5, -0.9, -7.0]])
    old = torch.tensor([[-1.5, -2.0, -2.5], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -0.5])
    loss, stats, grad = run_loss("grpo", logp, old, adv, mask, clip_low=0.2, clip_high=0.27)

    e5, em5, e1 = math.exp(0.5), math.exp(-0.5), math.exp(0.1)  # 1.6487, 0.6065, 1.1052
    # row0, A=+1: t0 ratio 1.6487 > 1.27 -> clipped high, objective 1.27
    #             t1 ratio 1 -> objective 1
    #             t2 ratio 0.6065 < 0.8 but A>0: min(0.6065, 0.8) = 0.6065, unclipped
    row0 = -(1.27 + 1.0 + em5) / 3  # = -0.958843
    # row1, A=-0.5: t0 ratio 0.6065 < 0.8 -> clipped low, min(-0.30327, -0.4) = -0.4
    #               t1 ratio 1.1052 in range -> -0.5 * 1.1052 = -0.55259
    row1 = -(-0.5 * 0.8 + -0.5 * e1) / 2  # = 0.476293
    assert loss.item() == approx((row0 + row1) / 2)
    assert loss.item() == approx(-0.241275, rel=1e-4)

    # 5 response tokens, clipped: (0,0) high, (1,0) low
    assert stats["clip_frac_token"].item() == approx(2 / 5)
    assert stats["clip_frac_token_high"].item() == approx(1 / 5)
    assert stats["clip_frac_token_low"].item() == approx(1 / 5)
    assert stats["clip_frac_seq"].item() == approx((1 / 3 + 1 / 2) / 2)  # 5/12
    assert stats["ratio_mean"].item() == approx((e5 + 1 + em5 + em5 + e1) / 5)  # 0.99339
    assert stats["ratio_min"].item() == approx(em5)
    assert stats["ratio_max"].item() == approx(e5)
    # sequence ratios: row0 exp(0) = 1, row1 exp((-0.5 + 0.1) / 2) = exp(-0.2) = 0.81873
    assert stats["seq_ratio_mean"].item() == approx((1 + math.exp(-0.2)) / 2)
    # k3 = e^x - 1 - x over x in {0.5, 0, -0.5, -0.5, 0.1}
    k3 = [math.exp(x) - 1 - x for x in (0.5, 0.0, -0.5, -0.5, 0.1)]
    assert stats["approx_kl"].item() == approx(sum(k3) / 5)  # 0.073391

    # d loss / d logp = -(1/G)(1/|y_i|) A w on unclipped tokens, 0 on clipped / pad
    expected = torch.tensor([[0.0, -1 / 6, -em5 / 6], [0.0, -(1 / 2) * (1 / 2) * (-0.5) * e1, 0.0]])
    torch.testing.assert_close(grad, expected)


# ----------------------------------------------------------------------------- 2. gspo by hand


def test_gspo_hand_computed_two_lengths():
    # seq A: length 2, log-ratios [0.3, 0.5] -> mean 0.4, s = e^0.4 = 1.4918 > 1.2, A=+1 -> clipped
    # seq B: length 4, log-ratios [0.1, -0.1, 0.2, 0.0] -> mean 0.05, s = e^0.05 = 1.0513, A=+0.5
    old = torch.full((2, 4), -2.0)
    logp = old + torch.tensor([[0.3, 0.5, 0.0, 0.0], [0.1, -0.1, 0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, 0.5])
    sB = math.exp(0.05)
    loss_A = -1.2  # -min(1.4918 * 1, 1.2 * 1)
    loss_B = -0.5 * sB  # -0.525636, inside [0.8, 1.2]

    loss, stats, grad = run_loss("gspo", logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == approx((loss_A + loss_B) / 2)  # -0.862818
    assert stats["clip_frac_token"].item() == approx(2 / 6)  # A's 2 tokens of 6
    assert stats["clip_frac_token_high"].item() == approx(2 / 6)
    assert stats["clip_frac_token_low"].item() == 0.0
    assert stats["clip_frac_seq"].item() == approx(1 / 2)  # 1 of 2 responses
    assert stats["seq_ratio_mean"].item() == approx((math.exp(0.4) + sB) / 2)
    assert stats["ratio_max"].item() == approx(math.exp(0.4))
    assert stats["ratio_mean"].item() == approx((2 * math.exp(0.4) + 4 * sB) / 6)
    # grad: A clipped -> 0; B: -(1/G) A s (1/|y|) per token = -(1/2)(0.5)(1.0513)/4
    expected = torch.tensor([[0.0] * 4, [-(0.5 * 0.5 * sB) / 4] * 4])
    torch.testing.assert_close(grad, expected)

    # token_mean weights each sequence by its length: (2 * -1.2 + 4 * -0.525636) / 6
    loss_tm, _, _ = run_loss("gspo", logp, old, adv, mask, aggregation="token_mean")
    assert loss_tm.item() == approx((2 * loss_A + 4 * loss_B) / 6)  # -0.750424


# ----------------------------------------------------------------------------- 3. gspo_token == gspo


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize("seed", [0, 1, 5])
def test_gspo_token_equals_gspo(seed, aggregation):
    logp, old, mask, adv = random_batch(seed)
    kw = dict(clip_low=0.05, clip_high=0.05, aggregation=aggregation)
    l_seq, s_seq, g_seq = run_loss("gspo", logp, old, adv, mask, **kw)
    l_tok, s_tok, g_tok = run_loss("gspo_token", logp, old, adv, mask, **kw)
    # the example must exercise unclipped sequences and clipping on both sides
    assert 0.0 < s_seq["clip_frac_seq"].item() < 1.0
    assert s_seq["clip_frac_token_low"].item() > 0 and s_seq["clip_frac_token_high"].item() > 0
    torch.testing.assert_close(l_tok, l_seq)
    for key in STAT_KEYS:
        torch.testing.assert_close(s_tok[key], s_seq[key], msg=key)
    torch.testing.assert_close(g_tok, g_seq)


# ----------------------------------------------------------------------------- 4. on-policy


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_on_policy_ratios_are_one(name):
    logp, _, mask, adv = random_batch(3)
    _, stats, _ = run_loss(name, logp, logp.detach().clone(), adv, mask)
    for key in CLIP_FRAC_KEYS + ("approx_kl",):
        assert stats[key].item() == 0.0, key
    for key in ("ratio_mean", "ratio_min", "ratio_max", "seq_ratio_mean"):
        assert stats[key].item() == 1.0, key


def test_on_policy_grpo_and_gspo_same_gradient():
    logp, _, mask, adv = random_batch(4)
    old = logp.detach().clone()
    _, _, g_grpo = run_loss("grpo", logp, old, adv, mask)
    _, _, g_gspo = run_loss("gspo", logp, old, adv, mask)
    _, _, g_tok = run_loss("gspo_token", logp, old, adv, mask)
    torch.testing.assert_close(g_grpo, g_gspo)
    torch.testing.assert_close(g_grpo, g_tok)
    # and the gradient is -(1/G) A_i / |y_i| on response tokens
    n_seq = (mask.sum(-1) > 0).sum()
    expected = -(adv[:, None] / mask.sum(-1, keepdim=True)) * mask / n_seq
    torch.testing.assert_close(g_grpo, expected)


# ----------------------------------------------------------------------------- 5. masked garbage


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize("name", LOSS_NAMES)
def test_masked_positions_never_leak(name, aggregation):
    logp, old, mask, adv = random_batch(5)
    pad = mask == 0
    assert pad.any()
    dirty_logp = logp.clone()
    dirty_old = old.clone()
    garbage = torch.tensor([float("nan"), 1e30, -float("inf"), float("inf")], dtype=logp.dtype)
    dirty_logp[pad] = garbage.repeat(pad.sum().item() // 4 + 1)[: pad.sum()]
    dirty_old[pad] = garbage.flip(0).repeat(pad.sum().item() // 4 + 1)[: pad.sum()]

    kw = dict(clip_low=0.05, clip_high=0.05, aggregation=aggregation)
    l_clean, s_clean, g_clean = run_loss(name, logp, old, adv, mask, **kw)
    l_dirty, s_dirty, g_dirty = run_loss(name, dirty_logp, dirty_old, adv, mask, **kw)
    assert torch.isfinite(l_dirty)
    assert l_dirty.item() == l_clean.item()
    assert torch.isfinite(g_dirty).all()
    assert (g_dirty[pad] == 0).all()
    torch.testing.assert_close(g_dirty, g_clean)
    for key in STAT_KEYS:
        assert torch.isfinite(s_dirty[key]), key
        torch.testing.assert_close(s_dirty[key], s_clean[key], msg=key)


@pytest.mark.parametrize("name", ["grpo", "gspo_token"])
def test_masked_token_advantages_never_leak(name):
    logp, old, mask, adv = random_batch(6)
    adv_BC = adv[:, None].expand_as(mask).clone()
    dirty = adv_BC.clone()
    dirty[mask == 0] = float("nan")
    l_clean, _, g_clean = run_loss(name, logp, old, adv_BC, mask)
    l_dirty, _, g_dirty = run_loss(name, logp, old, dirty, mask)
    assert l_dirty.item() == l_clean.item()
    torch.testing.assert_close(g_dirty, g_clean)


# ----------------------------------------------------------------------------- 6. one-token responses


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_one_token_responses_grpo_equals_gspo(aggregation):
    # Each response has exactly one token, so token ratio == sequence ratio.
    g = torch.Generator().manual_seed(7)
    B, C = 8, 3
    logp = -torch.rand(B, C, generator=g, dtype=torch.float64)
    old = logp + (torch.rand(B, C, generator=g, dtype=torch.float64) * 2 - 1) * 0.5
    mask = torch.zeros(B, C, dtype=torch.float64)
    mask[torch.arange(B), torch.arange(B) % C] = 1.0
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    kw = dict(clip_low=0.1, clip_high=0.1, aggregation=aggregation)
    l_grpo, s_grpo, g_grpo = run_loss("grpo", logp, old, adv, mask, **kw)
    l_gspo, s_gspo, g_gspo = run_loss("gspo", logp, old, adv, mask, **kw)
    assert s_grpo["clip_frac_token"].item() > 0  # old != new and clipping happens
    torch.testing.assert_close(l_grpo, l_gspo)
    for key in STAT_KEYS:
        torch.testing.assert_close(s_grpo[key], s_gspo[key], msg=key)
    torch.testing.assert_close(g_grpo, g_gspo)


# ----------------------------------------------------------------------------- 7. advantages


def test_grpo_advantages_hand_numbers():
    # mean 0.5, deviations ±0.5, sample var = 4 * 0.25 / 3 = 1/3, std = 0.57735
    # adv = ±0.5 / (0.57735 + 1e-6) = ±0.866024
    adv = get_advantage_estimator("grpo")(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4)
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([s, -s, -s, s]))
    assert s == approx(0.866024, rel=1e-5)


def test_grpo_advantages_zero_variance_groups_are_exact_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 4.0, 0.1 + 0.2, 0.3, 0.3])
    adv = get_advantage_estimator("grpo")(rewards, 3)
    assert torch.isfinite(adv).all()
    assert (adv[:3] == 0).all()  # identical rewards
    assert (adv[6:] == 0).all()  # identical up to float noise (0.1 + 0.2 != 0.3 in float)
    # middle group: mean 2, sample std 2 -> [-1, 0, 1] / (2 + eps)
    torch.testing.assert_close(adv[3:6], torch.tensor([-2.0, 0.0, 2.0]) / (2.0 + 1e-6))
    # group size 1: no spread -> zeros, not NaN
    assert (get_advantage_estimator("grpo")(torch.tensor([3.0, -1.0]), 1) == 0).all()


def test_mean_only_advantages():
    adv = get_advantage_estimator("mean_only")(torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0, 3.0]), 4)
    # group 0: mean 0.5; group 1: mean 3
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, -1.0, -1.0, 2.0, 0.0]))


@pytest.mark.parametrize("name", ["grpo", "mean_only"])
def test_advantages_reject_bad_group(name):
    with pytest.raises(ValueError, match="divisible"):
        get_advantage_estimator(name)(torch.zeros(5), 2)


def test_unknown_advantage_estimator():
    assert {"grpo", "mean_only"} <= set(ADVANTAGE_ESTIMATORS)
    with pytest.raises(ValueError, match="grpo"):
        get_advantage_estimator("nope")


def test_zero_variance_group_frac():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.3, 0.1 + 0.2])
    assert zero_variance_group_frac(rewards, 2) == approx(3 / 4)
    assert zero_variance_group_frac(rewards, 4) == approx(0.0)
    with pytest.raises(ValueError):
        zero_variance_group_frac(rewards, 3)


# ----------------------------------------------------------------------------- 8. aggregation


def test_aggregation_modes_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 empty
    assert aggregate(values, mask, "seq_mean_token_mean").item() == approx((1.5 + 4.0) / 2)
    assert aggregate(values, mask, "token_mean").item() == approx((1 + 2 + 4) / 3)
    assert aggregate(values, mask, "seq_mean_token_sum").item() == approx((3 + 4) / 2)
    # Dr. GRPO: every token summed over a constant, rows x max length (here the width 3)
    assert aggregate(values, mask, "seq_mean_token_sum_norm").item() == approx((1 + 2 + 4) / (3 * 3))
    assert aggregate(values, mask, "seq_mean_token_sum_norm", denominator=3 * 8).item() == approx(7 / 24)
    assert aggregation_count(mask, "seq_mean_token_sum_norm", max_len=8).item() == 24.0


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregation_masked_nan_and_empty(mode):
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = aggregate(values, mask, mode)
    # one token per response, so all modes give (1 + 2) / 2; Dr. GRPO divides by rows x width
    assert out.item() == approx(0.75 if mode == "seq_mean_token_sum_norm" else 1.5)
    out.backward()
    assert torch.isfinite(values.grad).all()
    assert values.grad[0, 1] == 0 and values.grad[1, 0] == 0

    empty = torch.zeros(2, 2)
    vals = torch.randn(2, 2, requires_grad=True)
    out = aggregate(vals, empty, mode)
    assert out.item() == 0.0
    out.backward()  # still attached to the graph
    assert (vals.grad == 0).all()


def test_unknown_aggregation_and_registries():
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "bogus")
    assert {"grpo", "gspo", "gspo_token"} <= set(POLICY_LOSSES)
    assert {"seq_mean_token_mean", "token_mean", "seq_mean_token_sum"} <= set(AGGREGATIONS)
    with pytest.raises(ValueError, match="gspo"):
        get_policy_loss("ppo2")


# ----------------------------------------------------------------------------- 9. sign / misc


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_descent_step_raises_logp_with_positive_advantage(name):
    torch.manual_seed(0)
    B, C, V = 3, 5, 7
    logits = torch.randn(B, C, V, requires_grad=True)
    tokens = torch.randint(0, V, (B, C))
    mask = torch.ones(B, C)
    mask[0, 3:] = 0

    def logp_of(lg):
        return torch.log_softmax(lg, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)

    before = logp_of(logits).detach()
    loss, _ = get_policy_loss(name)(logp_of(logits), before, torch.ones(B), mask, clip_low=0.2, clip_high=0.2)
    loss.backward()
    with torch.no_grad():
        after = logp_of(logits - 0.1 * logits.grad)
    assert (after[mask > 0] > before[mask > 0]).all()


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_empty_batch(name):
    logp = torch.randn(2, 3, requires_grad=True)
    loss, stats = get_policy_loss(name)(
        logp, torch.randn(2, 3), torch.ones(2), torch.zeros(2, 3), clip_low=0.2, clip_high=0.2
    )
    assert loss.item() == 0.0
    loss.backward()
    assert (logp.grad == 0).all()
    assert set(stats) == set(STAT_KEYS) | {"clipped_tokens_B"}
    assert stats.pop("clipped_tokens_B").tolist() == [0.0, 0.0]
    for key, val in stats.items():
        assert val.dim() == 0 and not val.requires_grad, key
        assert val.item() == 0.0, key


def test_stats_are_detached_scalars():
    logp, old, mask, adv = random_batch(8)
    for name in LOSS_NAMES:
        _, stats = get_policy_loss(name)(logp.clone().requires_grad_(True), old, adv, mask, clip_low=0.2, clip_high=0.2)
        assert set(stats) == set(STAT_KEYS) | {"clipped_tokens_B"}
        per_row_B = stats.pop("clipped_tokens_B")
        assert per_row_B.shape == (8,) and not per_row_B.requires_grad
        assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_clipped_tokens_per_response_add_up_to_the_clip_fraction(name):
    """The per-response counts samples.jsonl shows are the token clip fraction's numerator;
    a sequence-ratio loss clips a response's tokens all together or not at all."""
    logp, old, mask, adv = random_batch(8)
    _, stats = get_policy_loss(name)(logp, old, adv, mask, clip_low=0.01, clip_high=0.01)
    per_row_B = stats["clipped_tokens_B"]
    assert per_row_B.sum() / mask.sum() == approx(stats["clip_frac_token"].item())
    assert per_row_B.sum() > 0  # tight clip: something is clipped
    if name != "grpo":
        lengths_B = mask.sum(-1)
        assert all(c in (0.0, n) for c, n in zip(per_row_B.tolist(), lengths_B.tolist()))


def test_gspo_rejects_token_advantages_and_gspo_token_accepts_them():
    logp, old, mask, adv = random_batch(9)
    adv_BC = adv[:, None].expand_as(mask)
    with pytest.raises(ValueError, match="per-sequence"):
        get_policy_loss("gspo")(logp, old, adv_BC, mask, clip_low=0.2, clip_high=0.2)
    l_tok, _ = get_policy_loss("gspo_token")(logp, old, adv_BC, mask, clip_low=0.2, clip_high=0.2)
    l_seq, _ = get_policy_loss("gspo")(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(l_tok, l_seq)


# ----------------------------------------------------------------------------- 10. split batches


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_split_batch_with_global_denominator_averages_to_the_whole(mode):
    """Two halves of a batch (as on two processes), each divided by the global count / 2:
    their mean is the whole batch's value, in value and gradient, for every mode. The halves'
    own means are not (uneven lengths, and an empty response in one half)."""
    logp, old, mask, adv = random_batch(3, B=8, C=7)
    mask[1] = 0.0  # an empty response in the first half
    mask[5, 2:] = 0.0
    whole = logp.clone().requires_grad_(True)
    loss_whole, _ = grpo_loss(whole, old, adv, mask, clip_low=0.2, clip_high=0.27, aggregation=mode)
    loss_whole.backward()
    count = aggregation_count(mask, mode)
    halves = logp.clone().requires_grad_(True)
    parts, own = [], []
    for rows in (slice(0, 4), slice(4, 8)):
        part, _ = grpo_loss(
            halves[rows],
            old[rows],
            adv[rows],
            mask[rows],
            clip_low=0.2,
            clip_high=0.27,
            aggregation=mode,
            denominator=count / 2,
        )
        parts.append(part)
        own.append(
            grpo_loss(logp[rows], old[rows], adv[rows], mask[rows], clip_low=0.2, clip_high=0.27, aggregation=mode)[0]
        )
    split = (parts[0] + parts[1]) / 2
    split.backward()
    assert torch.allclose(split, loss_whole, rtol=0, atol=1e-12)
    assert torch.allclose(halves.grad, whole.grad, rtol=0, atol=1e-12)
    gap = abs(float((own[0] + own[1]).detach() / 2 - loss_whole.detach()))  # what a per-process mean would give
    if mode == "seq_mean_token_sum_norm":
        assert gap < 1e-12  # Dr. GRPO's constant normaliser: halves already add up
    else:
        assert gap > 1e-4


def test_aggregation_count_by_hand():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregation_count(mask, "token_mean")) == 3.0
    assert float(aggregation_count(mask, "seq_mean_token_mean")) == 2.0  # the empty response does not count
    assert float(aggregation_count(mask, "seq_mean_token_sum")) == 2.0
