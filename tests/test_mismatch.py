"""Rollout/trainer mismatch corrections: hand-computed weights for every mode, the loss they
weight, and their spec fields."""

import math

import pytest
import torch

from gspo_cli.algorithms import MISMATCH_CORRECTIONS, correction_stats, get_mismatch_correction, get_policy_loss
from gspo_cli.errors import SpecError
from gspo_cli.metrics import METRICS, MISMATCH_STAT_KEYS
from gspo_cli.spec.loading import spec_from_dict

# Two responses; rho = pi_old(trainer) / pi(engine) per token. Row 0 has 2 tokens (one pad),
# row 1 has 3. Row 0's product is 2.5 * 0.4 = 1, row 1's 3 * 1.2 * 1 = 3.6.
RHO = [[2.5, 0.4, 7.0], [3.0, 1.2, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ENGINE = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, -2.5]])
TRAINER = ENGINE + torch.tensor(RHO).log()


def _run(mode, low=0.5, high=2.0):
    return get_mismatch_correction(mode)(TRAINER, ENGINE, MASK, low=low, high=high)


def _close(t, expected):
    assert torch.allclose(t, torch.tensor(expected), atol=1e-5), t.tolist()


def test_registry_holds_the_five_modes():
    assert list(MISMATCH_CORRECTIONS) == ["token_tis", "token_mask", "seq_tis", "seq_mask", "geo_mask"]
    assert {v[0] for v in MISMATCH_STAT_KEYS.values()} <= set(METRICS)
    with pytest.raises(ValueError, match="unknown mismatch correction 'tis'"):
        get_mismatch_correction("tis")


def test_token_tis_truncates_at_high():
    c = _run("token_tis")
    _close(c.weight_BC, [[2.0, 0.4, 0.0], [2.0, 1.2, 1.0]])  # padding weighs 0
    assert c.truncated_BC.tolist() == [[True, False, False], [True, False, False]]
    assert not c.masked_BC.any()


def test_token_mask_drops_tokens_outside_low_high():
    c = _run("token_mask")
    _close(c.weight_BC, [[0.0, 0.0, 0.0], [0.0, 1.2, 1.0]])  # kept tokens keep their ratio (IcePop)
    assert c.masked_BC.tolist() == [[True, True, False], [True, False, False]]
    assert not c.truncated_BC.any()
    _close(_run("token_mask", low=0.0, high=10.0).weight_BC, [[2.5, 0.4, 0.0], [3.0, 1.2, 1.0]])


def test_sequence_modes_use_the_product_of_token_ratios():
    c = _run("seq_tis")
    _close(c.weight_BC, [[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])  # row 1: min(3.6, 2)
    assert c.truncated_BC.tolist() == [[False, False, False], [True, True, True]]
    c = _run("seq_mask")
    _close(c.weight_BC, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # 3.6 > 2: the whole response goes
    assert c.masked_BC.tolist() == [[False, False, False], [True, True, True]]
    _close(_run("seq_mask", high=4.0).weight_BC, [[1.0, 1.0, 0.0], [3.6, 3.6, 3.6]])


def test_geometric_mask_keeps_whole_responses_at_weight_one():
    # geometric means: row 0 sqrt(2.5 * 0.4) = 1, row 1 3.6 ** (1/3) = 1.5326
    c = _run("geo_mask", low=0.99, high=1.01)  # SkyRL's bounds
    _close(c.weight_BC, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    _close(_run("geo_mask", low=0.99, high=1.54).weight_BC, [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    _close(_run("geo_mask", low=0.99, high=1.53).weight_BC, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_statistics_are_token_and_response_weighted():
    st = correction_stats(_run("token_tis"), MASK)
    assert st["weight_mean"] == pytest.approx((2.0 + 0.4 + 2.0 + 1.2 + 1.0, 5.0))
    assert st["truncated_token_frac"] == (2.0, 5.0) and st["truncated_seq_frac"] == (2.0, 2.0)
    assert st["masked_token_frac"] == (0.0, 5.0) and st["masked_seq_frac"] == (0.0, 2.0)
    st = correction_stats(_run("token_mask"), MASK)
    assert st["weight_mean"] == pytest.approx((2.2, 5.0))
    assert st["masked_token_frac"] == (3.0, 5.0) and st["masked_seq_frac"] == (2.0, 2.0)
    empty = torch.zeros_like(MASK)
    st = correction_stats(get_mismatch_correction("seq_mask")(TRAINER, ENGINE, empty, low=0.5, high=2.0), empty)
    assert st["masked_seq_frac"] == (0.0, 0.0) and st["weight_mean"] == (0.0, 0.0)


def test_equal_log_probs_give_weight_one_and_extremes_stay_finite():
    for mode in MISMATCH_CORRECTIONS:
        c = get_mismatch_correction(mode)(ENGINE, ENGINE, MASK, low=0.5, high=2.0)
        assert torch.equal(c.weight_BC, MASK), mode
    far = ENGINE + torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, 1e4]])
    for mode in MISMATCH_CORRECTIONS:
        w = get_mismatch_correction(mode)(far, ENGINE, MASK, low=0.5, high=2.0).weight_BC
        assert torch.isfinite(w).all() and float(w.max()) <= 2.0, mode


def _loss_inputs():
    torch.manual_seed(0)
    B, C = 4, 5
    old = -torch.rand(B, C) - 0.5
    logp = (old + 0.3 * torch.randn(B, C)).requires_grad_()
    mask = torch.ones(B, C)
    mask[1, 3:] = 0
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])
    return logp, old, adv, mask


@pytest.mark.parametrize("name", ["grpo", "gspo", "gspo_token"])
def test_weights_multiply_the_per_token_loss(name):
    logp, old, adv, mask = _loss_inputs()
    fn = get_policy_loss(name)
    kw = {"clip_low": 0.2, "clip_high": 0.27}
    plain, _ = fn(logp, old, adv, mask, **kw)
    ones, _ = fn(logp, old, adv, mask, weights_BC=torch.ones_like(mask), **kw)
    twice, _ = fn(logp, old, adv, mask, weights_BC=2 * torch.ones_like(mask), **kw)
    assert torch.equal(plain, ones)  # weight 1 is no correction, bit for bit
    assert twice.item() == pytest.approx(2 * plain.item(), rel=1e-6)
    # a token of weight 0 gets no gradient, the others keep theirs
    w = torch.ones_like(mask)
    w[0, 2] = 0.0
    g_plain = torch.autograd.grad(fn(logp, old, adv, mask, **kw)[0], logp)[0]
    g_w = torch.autograd.grad(fn(logp, old, adv, mask, weights_BC=w, **kw)[0], logp)[0]
    if name == "gspo":  # the sequence loss is spread over its tokens: row 0 loses 1/5 of its weight
        assert torch.allclose(g_w[0], 0.8 * g_plain[0], atol=1e-7)
    else:
        assert g_w[0, 2] == 0 and g_plain[0, 2] != 0
    assert torch.allclose(g_w[1:], g_plain[1:], atol=1e-7)


def test_gspo_token_equals_gspo_under_sequence_weights():
    logp, old, adv, mask = _loss_inputs()
    w = torch.tensor([0.5, 2.0, 1.0, 0.0]).unsqueeze(1).expand_as(mask).contiguous()  # seq_tis / seq_mask shape
    kw = {"clip_low": 3e-4, "clip_high": 4e-4, "weights_BC": w}
    a, _ = get_policy_loss("gspo")(logp, old, adv, mask, **kw)
    b, _ = get_policy_loss("gspo_token")(logp, old, adv, mask, **kw)
    ga, gb = (torch.autograd.grad(x, logp)[0] for x in (a, b))
    assert a.item() == pytest.approx(b.item(), abs=1e-7)
    assert torch.allclose(ga, gb, atol=1e-7)
    assert float(ga[3].abs().sum()) == 0.0  # the dropped response


def _spec(arm_extra, rollout=None):
    from helpers import TINY

    raw = {
        **TINY,
        "rollout": {**TINY["rollout"], **(rollout or {})},
        "arms": [{"name": "a", "preset": "paper-grpo", **arm_extra}],
    }
    return spec_from_dict(raw)


def test_spec_fields_defaults_and_refusals():
    arm = _spec({}).arms[0]
    assert (arm.mismatch.mode, arm.mismatch.low, arm.mismatch.high) == ("off", 0.5, 2.0)
    assert _spec({"mismatch": {"mode": "geo_mask", "low": 0.99, "high": 1.01}}).arms[0].mismatch.high == 1.01
    cases = [
        (
            {"mismatch": {"mode": "tokn_tis"}},
            None,
            (
                "arms[0].mismatch.mode: unknown mismatch correction 'tokn_tis' (did you mean 'token_tis'?); "
                "known: off, token_tis, token_mask, seq_tis, seq_mask, geo_mask"
            ),
        ),
        ({"mismatch": {"mode": "token_tis", "high": 0.9}}, None, "arms[0].mismatch.high: Input should be greater"),
        (
            {"mismatch": {"mode": "token_tis", "low": 1.0, "high": 1.0}},
            None,
            "arms[0].mismatch: low (1.0) must be below high (1.0)",
        ),
        (
            {"mismatch": {"mode": "seq_tis"}},
            {"sampler_logprobs": False},
            "arms[0].mismatch.mode: seq_tis needs the engine's log-probs",
        ),
        (
            {"mismatch": {"mode": "seq_tis"}},
            {"engine": "vllm", "use_engine_logprobs": True},
            "arms[0].mismatch.mode: seq_tis weights by pi_old(trainer) / pi(engine), but rollout.use_engine_logprobs",
        ),
        ({"routing_replay": "r3"}, {"sampler_logprobs": False}, "arms[0].routing_replay: r3 replays the routes"),
    ]
    for arm_extra, rollout, message in cases:
        with pytest.raises(SpecError) as err:
            _spec(arm_extra, rollout)
        assert str(err.value).startswith(message), str(err.value)
        assert len(str(err.value).splitlines()) == 1
    assert _spec({"routing_replay": "r3"}).arms[0].routing_replay == "r3"
    assert math.isclose(_spec({"mismatch": {"mode": "token_mask", "low": 0}}).arms[0].mismatch.low, 0.0)
