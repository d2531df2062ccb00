"""The field's policy-loss variants (docs/algorithms/zoo.md) against hand-computed numbers, and
the invariants that tie them to the vanilla policy gradient and to GSPO.

Invariants checked here (each a test):
- on-policy (pi = pi_old), every variant's gradient equals the vanilla policy gradient
  -grad aggregate(A * log pi) under its aggregation (LUSPO: under seq_mean_token_sum, since it
  scales each response by its length; Clip-Cov: when no token is selected);
- SAPO's gate has slope 1 at r = 1 for either temperature;
- GMPO equals GSPO in value and gradient when no token (GMPO) or sequence (GSPO) is clipped,
  for either sign of A (not only A > 0);
- LUSPO is |y_i| x GSPO per response, value and gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

from gspo_cli.algorithms import (
    LOSS_LEVELS,
    POLICY_LOSSES,
    aggregate,
    entropy_top_mask,
    get_policy_loss,
    gspo_loss,
    loss_param_problems,
    loss_params,
    off_policy_sequence_mask,
    overlong_penalty,
    signal_groups,
)


def approx(x, rel=1e-6, abs=1e-9):
    return pytest.approx(x, rel=rel, abs=abs)


def run(name, logp, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation=None, **params):
    """(loss, stats, grad w.r.t. logp) for a fresh leaf copy of logp (float64)."""
    leaf = logp.detach().clone().double().requires_grad_(True)
    kw = {} if aggregation is None else {"aggregation": aggregation}
    loss, stats = get_policy_loss(name)(
        leaf, old.double(), adv.double(), mask.double(), clip_low=clip_low, clip_high=clip_high, **kw, **params
    )
    loss.backward()
    return loss.detach(), stats, leaf.grad


def random_batch(seed, B=6, C=5, spread=0.05):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, C, generator=g, dtype=torch.float64) * 3.0
    old = logp - (torch.rand(B, C, generator=g, dtype=torch.float64) * 2 - 1) * spread
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    mask = (torch.arange(C)[None, :] < lengths[:, None]).double()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, old, mask, adv


# ----------------------------------------------------------------------------- registry and params


def test_every_variant_is_registered_with_its_level_and_paper_defaults():
    assert {"cispo", "sapo", "gmpo", "luspo", "clip_cov", "kl_cov"} <= set(POLICY_LOSSES)
    assert {n: LOSS_LEVELS[n] for n in ("gspo", "luspo", "gmpo", "grpo", "gspo_token", "cispo", "sapo")} == {
        "gspo": "sequence",
        "luspo": "sequence",
        "gmpo": "sequence",
        "grpo": "token",
        "gspo_token": "token",
        "cispo": "token",
        "sapo": "token",
    }
    assert loss_params("sapo") == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert loss_params("clip_cov") == {"cov_ratio": 2e-4, "cov_lb": 1.0, "cov_ub": 5.0}
    assert loss_params("kl_cov") == {"cov_ratio": 2e-3, "kl_coef": 1.0}
    assert loss_params("grpo") == {}


def test_another_loss_parameter_is_named_as_such():
    assert loss_param_problems("grpo", {"tau_pos": 1.0}) == [
        "tau_pos: a parameter of sapo, not of grpo (grpo takes no parameters)"
    ]
    assert loss_param_problems("sapo", {"tau": 1.0}) == ["tau: unknown parameter of sapo (sapo takes tau_pos, tau_neg)"]
    assert loss_param_problems("sapo", {"tau_neg": 2.0}) == []


# ----------------------------------------------------------------------------- CISPO


def test_cispo_hand_computed():
    # one response, two tokens: r = 2 and r = 0.5; A = 1; clip 0.2 / 0.28 -> weights 1.28, 0.8
    logp = torch.tensor([[-1.0, -2.0]])
    old = logp - torch.tensor([[math.log(2.0), math.log(0.5)]])
    loss, stats, grad = run("cispo", logp, old, torch.tensor([1.0]), torch.ones(1, 2), aggregation="token_mean")
    # loss = -(1.28 * 1 * -1 + 0.8 * 1 * -2) / 2
    assert loss.item() == approx((1.28 + 1.6) / 2)
    assert grad.tolist() == [[approx(-0.64), approx(-0.4)]]  # -sg(w) * A / N: no token is zeroed
    # both weights capped (one each side, whatever A's sign)
    assert (stats["clip_frac_token_high"].item(), stats["clip_frac_token_low"].item()) == (0.5, 0.5)
    assert stats["ratio_max"].item() == approx(2.0) and stats["ratio_min"].item() == approx(0.5)


def test_cispo_preset_bounds_leave_no_lower_clip():
    # clip_low 1.0: weights in [0, 5]; r = 0.01 keeps its weight
    logp = torch.tensor([[-1.0]])
    old = logp - math.log(0.01)
    _, stats, grad = run("cispo", logp, old, torch.tensor([1.0]), torch.ones(1, 1), clip_low=1.0, clip_high=4.0)
    assert grad.item() == approx(-0.01) and stats["clip_frac_token"].item() == 0.0


# ----------------------------------------------------------------------------- SAPO


def test_sapo_hand_computed_off_policy():
    # two one-token responses: r = e^0.5 with A = +1 (tau 1), r = e^-0.5 with A = -1 (tau 1.05)
    logp = torch.tensor([[-1.0], [-1.0]])
    old = logp - torch.tensor([[0.5], [-0.5]])
    loss, stats, grad = run("sapo", logp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1))

    def sig(x):
        return 1 / (1 + math.exp(-x))

    r1, r2 = math.exp(0.5), math.exp(-0.5)
    f1, f2 = sig(r1 - 1) * 4, sig(1.05 * (r2 - 1)) * 4 / 1.05
    assert loss.item() == approx((-f1 + f2) / 2)
    s1, s2 = sig(r1 - 1), sig(1.05 * (r2 - 1))
    # d loss / d logp = -A * 4 s (1 - s) * r / G
    assert grad[:, 0].tolist() == [approx(-4 * s1 * (1 - s1) * r1 / 2), approx(4 * s2 * (1 - s2) * r2 / 2)]
    assert stats["clip_frac_token"].item() == 0.0


@pytest.mark.parametrize("tau_pos,tau_neg", [(1.0, 1.05), (0.3, 7.0)])
def test_sapo_gate_has_slope_one_at_ratio_one(tau_pos, tau_neg):
    logp = torch.tensor([[-0.7], [-2.0]])
    loss, _, grad = run(
        "sapo", logp, logp, torch.tensor([1.0, -1.0]), torch.ones(2, 1), tau_pos=tau_pos, tau_neg=tau_neg
    )
    assert grad[:, 0].tolist() == [approx(-0.5), approx(0.5)]  # exactly -A / G: slope 1
    assert loss.item() == approx((-2 / tau_pos + 2 / tau_neg) / 2)  # f(1) = 2 / tau


# ----------------------------------------------------------------------------- GMPO


def test_gmpo_hand_computed_both_signs():
    # one response, log-ratios [0.5, -0.1], clip 0.4 / 0.4 in log space
    logp = torch.tensor([[-1.0, -2.0]])
    old = logp - torch.tensor([[0.5, -0.1]])
    loss, stats, grad = run("gmpo", logp, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.4, clip_high=0.4)
    # A > 0: min(l, clamp(l)) = [0.4, -0.1], mean 0.15; token 0 clipped carries no gradient
    assert loss.item() == approx(-math.exp(0.15))
    assert grad.tolist() == [[0.0, approx(-math.exp(0.15) / 2)]]
    assert stats["clip_frac_token_high"].item() == 0.5 and stats["clip_frac_token_low"].item() == 0.0
    loss, stats, grad = run("gmpo", logp, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_low=0.4, clip_high=0.4)
    # A < 0: max(l, clamp(l)) = [0.5, -0.1], mean 0.2; nothing clipped on the low side
    assert loss.item() == approx(math.exp(0.2))
    assert grad.tolist() == [[approx(math.exp(0.2) / 2), approx(math.exp(0.2) / 2)]]
    assert stats["clip_frac_token"].item() == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gmpo_equals_gspo_when_nothing_is_clipped(seed):
    logp, old, mask, adv = random_batch(seed, spread=0.05)  # |log r| < 0.05 < 0.4
    g_loss, g_stats, g_grad = run("gmpo", logp, old, adv, mask, clip_low=0.4, clip_high=0.4)
    s_loss, s_stats, s_grad = run("gspo", logp, old, adv, mask, clip_low=0.5, clip_high=0.5)
    assert g_stats["clip_frac_token"].item() == 0.0 and s_stats["clip_frac_token"].item() == 0.0
    assert g_loss.item() == approx(s_loss.item())
    assert torch.allclose(g_grad, s_grad, rtol=0, atol=1e-12)
    assert (adv < 0).any() and (adv > 0).any()  # both signs covered


# ----------------------------------------------------------------------------- LUSPO


def test_luspo_is_length_times_gspo_per_response():
    logp, old, mask, adv = random_batch(4)
    l_loss, l_stats, l_grad = run("luspo", logp, old, adv, mask, clip_low=2e-3, clip_high=2.5e-3)
    lengths = mask.sum(-1)
    per_seq, grads = [], []
    for i in range(len(adv)):
        loss, _, grad = run("gspo", logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], 2e-3, 2.5e-3)
        per_seq.append(lengths[i] * loss)
        grads.append(lengths[i] * grad / len(adv))
    assert l_loss.item() == approx(float(sum(per_seq) / len(adv)))
    assert torch.allclose(l_grad, torch.cat(grads), rtol=0, atol=1e-12)
    assert l_stats["clip_frac_seq"].item() > 0  # the tight clip bites: the clipped branch is GSPO's


# ----------------------------------------------------------------------------- Clip-Cov / KL-Cov


def _cov_batch():
    # A = [2, -2] per response (mean 0), log-probs centred at -2: cov = A (logp + 2)
    logp = torch.tensor([[-0.5, -3.5], [-4.0, 0.0]])
    return logp, torch.tensor([2.0, -2.0]), torch.ones(2, 2)  # cov = [[3, -3], [4, -4]]


def test_clip_cov_detaches_the_selected_tokens():
    logp, adv, mask = _cov_batch()
    # cov_ratio 0.5 -> 2 tokens; candidates in (1, 5): (0, 0) cov 3 and (1, 0) cov 4
    loss, stats, grad = run("clip_cov", logp, logp, adv, mask, aggregation="token_mean", cov_ratio=0.5)
    assert loss.item() == approx((0 - 2 + 0 + 2) / 4)  # on-policy per-token loss -A, two zeroed
    assert grad.tolist() == [[0.0, approx(-0.5)], [0.0, approx(0.5)]]
    assert stats["cov_frac"].item() == 0.5
    # a token PPO already clipped is never a candidate: only (1, 0) is left
    old = logp.clone()
    old[0, 0] -= 0.5  # r = e^0.5 > 1.28 with A > 0
    loss, stats, grad = run("clip_cov", logp, old, adv, mask, aggregation="token_mean", cov_ratio=0.5)
    assert grad[1, 0].item() == 0.0 and grad[0, 0].item() == 0.0 and stats["cov_frac"].item() == 0.25
    assert stats["clip_frac_token_high"].item() == 0.25
    # bounds exclude everything: nothing detached, whatever the ratio
    _, stats, _ = run("clip_cov", logp, logp, adv, mask, cov_ratio=0.5, cov_lb=10.0, cov_ub=20.0)
    assert stats["cov_frac"].item() == 0.0


def test_kl_cov_penalises_the_top_covariance_token():
    logp, adv, mask = _cov_batch()
    old = logp.clone()
    old[1, 0] -= 0.1  # log r = 0.1 on the top-cov token (cov 4)
    loss, stats, grad = run("kl_cov", logp, old, adv, mask, cov_ratio=0.25, kl_coef=1.0)
    e = math.exp(0.1)
    assert loss.item() == approx((-2 - 2 + (2 * e + 0.1) + 2) / 4)
    # d/dlogp of -r A + kl |log r| at (1, 0): 2 e^0.1 + 1
    assert grad.tolist() == [[approx(-0.5), approx(-0.5)], [approx((2 * e + 1) / 4), approx(0.5)]]
    assert stats["cov_frac"].item() == 0.25 and stats["clip_frac_token"].item() == 0.0


# ----------------------------------------------------------------------------- on-policy invariant

VANILLA = {  # loss -> (aggregation it is called with, the vanilla PG aggregation its gradient equals)
    "grpo": ("seq_mean_token_mean", "seq_mean_token_mean"),
    "gspo": ("seq_mean_token_mean", "seq_mean_token_mean"),
    "gspo_token": ("token_mean", "token_mean"),
    "cispo": ("token_mean", "token_mean"),
    "sapo": ("seq_mean_token_mean", "seq_mean_token_mean"),
    "gmpo": ("seq_mean_token_mean", "seq_mean_token_mean"),
    "luspo": ("seq_mean_token_mean", "seq_mean_token_sum"),
    "kl_cov": ("token_mean", "token_mean"),
    "clip_cov": ("seq_mean_token_sum_norm", "seq_mean_token_sum_norm"),
}


@pytest.mark.parametrize("name", sorted(VANILLA))
def test_on_policy_gradient_is_the_vanilla_policy_gradient(name):
    logp, _, mask, adv = random_batch(7)
    agg, vanilla_agg = VANILLA[name]
    params = {"cov_lb": 1e9, "cov_ub": 2e9} if name == "clip_cov" else {}  # nothing selected
    _, _, grad = run(name, logp, logp, adv, mask, aggregation=agg, **params)
    leaf = logp.clone().requires_grad_(True)
    aggregate(-adv[:, None] * leaf, mask, vanilla_agg).backward()
    assert torch.allclose(grad, leaf.grad, rtol=0, atol=1e-12)
    assert set(POLICY_LOSSES) <= set(VANILLA)  # a new loss joins this invariant


# ----------------------------------------------------------------------------- filters


def test_entropy_top_keeps_the_highest_entropy_share():
    ent = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # padding's entropy never counts
    # quantile 0.8 of [0.1, 0.3, 0.5, 0.7, 0.9] = 0.74; quantile 0.6 = 0.58
    assert entropy_top_mask(ent, mask, 0.2).tolist() == [[False, False, True], [False, False, False]]
    assert entropy_top_mask(ent, mask, 0.4).tolist() == [[False, False, True], [False, True, False]]
    assert entropy_top_mask(ent, mask, 1.0).tolist() == (mask > 0).tolist()


def test_off_policy_sequence_mask_drops_only_stale_negative_responses():
    logp = torch.zeros(3, 2)
    old = torch.tensor([[0.3, 0.3], [0.3, 0.3], [0.1, 0.1]])  # mean log(pi_old / pi) = 0.3, 0.3, 0.1
    keep = off_policy_sequence_mask(logp, old, torch.tensor([-1.0, 1.0, -1.0]), torch.ones(3, 2), delta=0.2)
    assert keep.tolist() == [False, True, True]


def test_dapo_soft_overlong_punishment():
    # max 10 tokens, buffer 4: no penalty up to 6, a ramp to -1 at 10, -1 beyond
    out = overlong_penalty(torch.tensor([5, 6, 8, 10, 11]), max_len=10, buffer=4)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert overlong_penalty(torch.tensor([10]), 10, 0).tolist() == [0.0]


def test_signal_groups():
    assert signal_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]), 4).tolist() == [True, False]


def test_statistics_skip_dropped_tokens():
    """A token at weight 0 (rejected by a correction, filtered) is neither clipped nor part of a
    ratio statistic: today's code counted it (clip_frac 0.5, ratio_max 3)."""
    logp = torch.tensor([[-1.0, -1.0]])
    old = logp - torch.tensor([[math.log(3.0), 0.0]])  # token 0: r = 3 > 1.28, A > 0: clipped
    weights = torch.tensor([[0.0, 1.0]])
    _, stats = POLICY_LOSSES["grpo"](
        logp, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.28, weights_BC=weights
    )
    assert stats["clip_frac_token"].item() == 0.0
    assert stats["ratio_max"].item() == approx(1.0) and stats["approx_kl"].item() == 0.0
    _, stats = gspo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.28)
    assert stats["clip_frac_token"].item() == 1.0  # unweighted: both tokens of the clipped response
