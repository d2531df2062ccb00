"""What makes our update cheaper must not change what it computes: mini-batches trimmed to
their own rows' width, and AdamW's fused kernel."""

import pytest
import torch
from helpers import TINY, max_gap, models_in_float64

from gspo_cli.models import resolve_model_source
from gspo_cli.rollout import RolloutBatch
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.optim import fused_adamw_ok
from gspo_cli.train.step import setup, train_step


def _uneven(generate, pad_id: int):
    """The engine's batches with an extra column of left padding in every row and responses
    cut to different lengths (a barely trained model always runs to max_new_tokens): every
    mini-batch then has columns to drop on both sides."""

    def wrapped(prompts):
        b = generate(prompts)
        B = b.input_ids.shape[0]
        lens = torch.tensor([2 + (7 * i) % 13 for i in range(B)])
        keep_BC = torch.arange(b.response_mask.shape[1]) < lens[:, None]
        resp = b.response_ids.masked_fill(~keep_BC, pad_id)
        pad = torch.full((B, 1), pad_id)
        b.input_ids = torch.cat([pad, b.input_ids[:, : b.prompt_len], resp], 1)
        b.attention_mask = torch.cat([torch.zeros_like(pad), b.attention_mask[:, : b.prompt_len], keep_BC.long()], 1)
        b.response_mask = b.response_mask * keep_BC
        b.prompt_len += 1
        if b.engine_logp is not None:
            b.engine_logp, b.engine_entropy = b.engine_logp * keep_BC, b.engine_entropy * keep_BC
        if b.engine_routes is not None:
            r = b.engine_routes
            b.engine_routes = torch.cat([torch.zeros_like(r[:, :, :1]), r], 2)
        return b

    return wrapped


def _ctx(tmp_path, arm_name: str):
    raw = {
        **TINY,
        "output_dir": str(tmp_path),
        "rollout": {**TINY["rollout"], "prompts_per_step": 8},
        "arms": [{**a, "mini_batches": 4} for a in TINY["arms"] if a["name"] == arm_name],
    }
    spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    ctx = setup(spec, spec.arms[0], 0, task, source)
    models_in_float64(ctx.model)  # two paths that differ in the order of sums: float64 (helpers.in_float64)
    ctx.engine.generate = _uneven(ctx.engine.generate, ctx.engine.tokenizer.pad_token_id)
    return ctx


@pytest.mark.parametrize("arm", ["grpo_rr", "gspo_token"])
def test_trimmed_minibatches_train_as_the_full_width_does(tmp_path, monkeypatch, arm):
    """Two steps with trimming and two with every mini-batch at the batch's full width: the
    same losses, clip fractions, ratio variances and expert changes (routing replay included:
    pi_old's routes are cut with the columns) and the same weights, in float64 (1e-10)."""
    cuts = []
    real = RolloutBatch.trimmed

    def spy(self):
        out = real(self)
        cuts.append((out[1], out[2], self.response_mask.shape[1]))
        return out

    monkeypatch.setattr(RolloutBatch, "trimmed", spy)
    ctx = _ctx(tmp_path / "a", arm)
    trimmed = [train_step(ctx, s) for s in (1, 2)]
    w_trimmed = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    assert all(lo == 1 for lo, _, _ in cuts) and any(c < C for _, c, C in cuts)  # narrower on both sides

    monkeypatch.setattr(RolloutBatch, "trimmed", lambda self: (self, 0, self.response_mask.shape[1]))
    ctx = _ctx(tmp_path / "b", arm)
    full = [train_step(ctx, s) for s in (1, 2)]
    for a, b in zip(trimmed, full):
        keys = [k for k in b if k.startswith(("policy/", "ratio/", "moe/", "reward/")) and "time" not in k]
        assert "moe/expert_change_frac" in keys and any(k.startswith("ratio/logvar_mb") for k in keys)
        for k in keys:
            assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12), k
    assert ctx.model.dtype == torch.float64
    assert max_gap(w_trimmed, ctx.model.state_dict()) < 1e-10


def test_fused_adamw_trains_as_the_default_path(tmp_path, monkeypatch):
    """The fused kernel where parameters allow it, and a step with it (4 mini-batches, so 4
    AdamW steps) gives the weights the default (for-each-parameter) AdamW gives, in float64
    (1e-10). (One step only: a rounding-level change in the weights may flip a sampled token
    in the next step's batch, which then differs outright.)"""
    import gspo_cli.train.optim as optim_mod

    ctx = _ctx(tmp_path / "a", "gspo")
    start = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    versions = {n: p._version for n, p in ctx.model.named_parameters()}
    assert ctx.optimizer.param_groups[0]["fused"] is True
    train_step(ctx, 1)
    # The vLLM engine re-syncs weights when a version counter moves; the fused kernel alone
    # leaves them as they were (CI's vLLM tests caught engines sampling from step-1 weights).
    assert all(p._version > versions[n] for n, p in ctx.model.named_parameters())
    fused = ctx.model.state_dict()
    monkeypatch.setattr(optim_mod, "fused_adamw_ok", lambda model, sharded: False)
    ref = _ctx(tmp_path / "b", "gspo")
    assert not ref.optimizer.param_groups[0]["fused"]
    train_step(ref, 1)
    assert all(v.dtype == torch.float64 for v in fused.values() if v.is_floating_point())
    assert max_gap(fused, ref.model.state_dict()) < 1e-10
    assert sum(not torch.equal(start[k], v) for k, v in fused.items()) > len(fused) // 2  # it trained
    assert not fused_adamw_ok(ctx.model, sharded=True)  # FSDP's sharded parameters: the default path
    assert not fused_adamw_ok(torch.nn.Linear(2, 2).requires_grad_(False), sharded=False)  # nothing to train
