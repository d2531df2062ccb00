"""The anchor of the trust region (arms[].anchor, algorithms/anchors.py): at staleness 0 both
anchors take today's gradient exactly; on a stale batch `behaviour` takes the ratio against the
sampler's log-probs and `proximal` against the trainer's forward before the step's updates,
each token weighed by pi_prox / pi_behav (per response, the geometric mean, for GSPO). Planted
log-probs with hand-computed values, then the step itself in float64."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from helpers import TINY, in_float64, learn_capturing_grads

from gspo_cli import algorithms
from gspo_cli.algorithms import get_policy_loss
from gspo_cli.algorithms.anchors import anchor_correction, decoupled_sequence, decoupled_token, uses_proximal
from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Score
from gspo_cli.train.micro import batch_logprobs
from gspo_cli.train.minibatch import minibatch_rows
from gspo_cli.train.step import setup

D = torch.float64
BEHAV = torch.tensor([[-1.0, -2.0]], dtype=D)  # the sampler's log-probs of two tokens
PROX = torch.tensor([[-0.8, -2.1]], dtype=D)  # the trainer's, before this step's updates
NEW = torch.tensor([[-0.7, -2.3]], dtype=D)  # pi_theta now
MASK = torch.ones(1, 2, dtype=D)
ADV = torch.tensor([1.0], dtype=D)


def _loss(name, anchor, new, clip=0.2):
    """(loss, d loss / d new) of loss `name` with its ratios against `anchor` (behaviour: no
    weight; proximal: the decoupled weight at the loss's level), on the planted tokens."""
    new = new.clone().requires_grad_(True)
    level = algorithms.LOSS_LEVELS[name]
    correct = anchor_correction(anchor, 2, "off", level)
    old = BEHAV if anchor == "behaviour" else PROX
    weights = None if correct is None else correct(PROX, BEHAV, MASK, low=0.0, high=0.0).weight_BC
    loss, _ = get_policy_loss(name)(new, old, ADV, MASK, clip_low=clip, clip_high=clip, weights_BC=weights)
    loss.backward()
    return loss.item(), new.grad[0].tolist()


def test_grpo_token_ratio_and_clip_against_each_anchor():
    # behaviour: ratios e^0.3 = 1.350 (clipped at 1.2, no gradient) and e^-0.3 = 0.741 (inside)
    loss, grad = _loss("grpo", "behaviour", NEW)
    assert loss == pytest.approx(-(1.2 + math.exp(-0.3)) / 2, abs=1e-12)
    assert grad == pytest.approx([0.0, -math.exp(-0.3) / 2], abs=1e-12)
    # proximal: ratios e^0.1 and e^-0.2, both inside the clip range, weighed by e^0.2 and e^-0.1
    loss, grad = _loss("grpo", "proximal", NEW)
    w, r = [math.exp(0.2), math.exp(-0.1)], [math.exp(0.1), math.exp(-0.2)]
    assert loss == pytest.approx(-(w[0] * r[0] + w[1] * r[1]) / 2, abs=1e-12)
    assert grad == pytest.approx([-w[0] * r[0] / 2, -w[1] * r[1] / 2], abs=1e-12)


def test_gspo_sequence_ratio_and_clip_against_each_anchor():
    new = torch.tensor([[-0.7, -1.8]], dtype=D)  # new - behav = (0.3, 0.2); new - prox = (0.1, 0.3)
    # behaviour: s = exp(mean(0.3, 0.2)) = e^0.25 = 1.284 > 1.2: clipped, the response carries no gradient
    loss, grad = _loss("gspo", "behaviour", new)
    assert loss == pytest.approx(-1.2, abs=1e-12) and grad == pytest.approx([0.0, 0.0], abs=1e-12)
    # proximal: s = e^0.2 = 1.2214 > 1.2: clipped too, at clip 0.25 inside
    loss, grad = _loss("gspo", "proximal", new)
    w = math.exp((0.2 - 0.1) / 2)  # the geometric mean of pi_prox / pi_behav over the response
    assert loss == pytest.approx(-w * 1.2, abs=1e-12) and grad == pytest.approx([0.0, 0.0], abs=1e-12)
    loss, grad = _loss("gspo", "proximal", new, clip=0.25)
    s = math.exp(0.2)
    assert loss == pytest.approx(-w * s, abs=1e-12)
    assert grad == pytest.approx([-w * s / 2, -w * s / 2], abs=1e-12)  # d s / d new_t = s / |y|


def test_decoupled_weights_on_planted_log_probs():
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    prox, behav = torch.tensor([[-0.8, -2.1, 0.0]], dtype=D), torch.tensor([[-1.0, -2.0, -5.0]], dtype=D)
    token = decoupled_token(prox, behav, mask).weight_BC
    assert token[0].tolist() == pytest.approx([math.exp(0.2), math.exp(-0.1), 0.0], abs=1e-12)
    seq = decoupled_sequence(prox, behav, mask).weight_BC
    assert seq[0].tolist() == pytest.approx([math.exp(0.05), math.exp(0.05), 0.0], abs=1e-12)
    same = decoupled_token(behav, behav, mask)
    assert torch.equal(same.weight_BC, mask) and not same.masked_BC.any()


def test_which_weight_each_setting_takes():
    assert not uses_proximal("proximal", 0) and uses_proximal("proximal", 1) and not uses_proximal("behaviour", 4)
    for anchor in ("behaviour", "proximal"):
        assert anchor_correction(anchor, 0, "off", "token") is None  # staleness 0: one policy, no weight
    assert anchor_correction("behaviour", 2, "off", "token") is None
    assert anchor_correction("proximal", 2, "off", "token") is decoupled_token
    assert anchor_correction("proximal", 2, "off", "sequence") is decoupled_sequence
    assert anchor_correction("proximal", 2, "seq_tis", "sequence") is algorithms.MISMATCH_CORRECTIONS["seq_tis"]


def test_spec_default_and_refusals():
    raw = {**TINY, "arms": [TINY["arms"][0]], "rollout": {**TINY["rollout"], "staleness": 2}}
    assert spec_from_dict(raw).arms[0].anchor == "behaviour"
    arm = {**TINY["arms"][0], "mismatch": {"mode": "token_tis"}}
    with pytest.raises(SpecError, match=r"arms\[0\].mismatch.mode: .*staleness: 2 .*anchor: proximal"):
        spec_from_dict({**raw, "arms": [arm]})
    assert spec_from_dict({**raw, "arms": [{**arm, "anchor": "proximal"}]}).arms[0].anchor == "proximal"
    with pytest.raises(SpecError, match="anchor"):
        spec_from_dict({**raw, "arms": [{**TINY["arms"][0], "anchor": "sampler"}]})


# ----------------------------------------------------------------------------- the step, in float64

ROLLOUT = {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 12, "sampler_logprobs": True}


def _spec(arm: dict, staleness: int):
    raw = {**TINY, "rollout": {**ROLLOUT, "staleness": staleness}, "arms": [{"name": "a", "mini_batches": 2, **arm}]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spec_from_dict(raw)


@pytest.fixture(scope="module")
def bench():
    """A tiny MoE context and one sampled batch whose sampler log-probs are moved off the
    current policy by row-varying noise (a stale sampler), in float64."""
    task = make_task("arithmetic", TINY["task"]["params"])
    source = resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)
    spec = _spec({"preset": "paper-grpo"}, 0)
    ctx = setup(spec, spec.arms[0], 0, task, source)
    problems = task.train_problems(ctx.rng, 4)
    with ctx.compute():
        batch = ctx.engine.generate([p.prompt for p in problems for _ in range(2)])
    g = torch.Generator().manual_seed(3)
    noise = torch.randn(batch.engine_logp.shape, generator=g) * torch.tensor([0.2, 0.02] * 4)[:, None]
    batch.engine_logp = (batch.engine_logp + noise) * batch.response_mask
    scores = [Score(reward=float(r), correct=r > 0.5) for r in torch.rand(8, generator=g).tolist()]
    in_float64(ctx, batch)
    state = (copy.deepcopy(ctx.model.state_dict()), copy.deepcopy(ctx.optimizer.state_dict()))
    return ctx, batch, scores, state


def _learn(bench, spec, monkeypatch):
    """(gradients, the (pi_old, weights) each loss call received)."""
    ctx, batch, scores, state = bench
    seen = []

    def spying(name):
        fn = get_policy_loss(name)

        def loss(new, old, *a, weights_BC=None, **k):
            seen.append((old.detach().clone(), None if weights_BC is None else weights_BC.clone()))
            return fn(new, old, *a, weights_BC=weights_BC, **k)

        return loss

    monkeypatch.setattr(algorithms, "get_policy_loss", spying)
    grads, _ = learn_capturing_grads(ctx, spec, batch, scores, state)
    return grads, seen


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["paper-grpo", "paper-gspo"])
def test_at_staleness_zero_both_anchors_take_todays_gradient(bench, monkeypatch, preset):
    today, _ = _learn(bench, _spec({"preset": preset}, 0), monkeypatch)
    for anchor in ("behaviour", "proximal"):
        grads, seen = _learn(bench, _spec({"preset": preset, "anchor": anchor}, 0), monkeypatch)
        assert len(grads) == 2 and all(torch.equal(a, b) for a, b in zip(grads, today))
        assert all(w is None for _, w in seen)  # the sampler's log-probs are pi_old; nothing weighs the loss


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["paper-grpo", "paper-gspo"])
def test_stale_batch_ratios_against_each_anchor(bench, monkeypatch, preset):
    ctx, batch, _, state = bench
    mask = batch.response_mask > 0
    # behaviour: pi_old is the sampler's log-probs, no weight: the staleness-0 gradient of this batch
    rows = minibatch_rows(8, 2, torch.Generator().manual_seed(0))  # each loss call's rows (learn's draw)
    behav_grads, seen = _learn(bench, _spec({"preset": preset, "anchor": "behaviour"}, 2), monkeypatch)
    assert len(seen) == 2
    for (old, w), r in zip(seen, rows):
        c = old.shape[1]
        assert w is None and torch.equal(old[mask[r, :c]], batch.engine_logp[r, :c][mask[r, :c]])
    # proximal: pi_old is the trainer's forward of its weights before the update
    grads, seen = _learn(bench, _spec({"preset": preset, "anchor": "proximal"}, 2), monkeypatch)
    ctx.model.load_state_dict(state[0])
    with torch.no_grad(), ctx.compute():
        prox = batch_logprobs(ctx, ctx.model, batch)[0].logp
    lr = torch.where(mask, prox - batch.engine_logp, torch.zeros_like(prox))
    if preset == "paper-gspo":  # one weight per response: the geometric mean of pi_prox / pi_behav
        want = (lr.sum(1) / mask.sum(1)).exp()[:, None] * mask
    else:
        want = lr.exp() * mask
    assert lr.abs().max() > 0.05  # the planted staleness is far from float noise
    for (old, w), r in zip(seen, rows):
        c = old.shape[1]
        assert (old - prox[r, :c]).abs()[mask[r, :c]].max() < 1e-12
        assert (w - want[r, :c]).abs().max() < 1e-12
    assert not all(torch.equal(a, b) for a, b in zip(grads, behav_grads))
