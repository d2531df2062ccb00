"""The learning-rate schedule: warm-up then constant, linear or cosine decay, counted in RL
steps (each makes mini_batches x epochs optimizer steps), recorded as `policy/lr`."""

import math

import pytest
import torch
from helpers import TINY

from gspo_cli.errors import SpecError
from gspo_cli.spec import OptimizerConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.train.optim import lr_factor, make_scheduler


def test_factors_by_hand():
    # warm-up 2 of 10: 0.5, 1.0, then the decay from step 2 (1.0) to step 10 (the floor)
    assert [lr_factor(i, 2, 10) for i in (0, 1, 5, 9, 20)] == [0.5, 1.0, 1.0, 1.0, 1.0]
    lin = [lr_factor(i, 2, 10, "linear", 0.2) for i in (0, 1, 2, 6, 10, 14)]
    assert lin == pytest.approx([0.5, 1.0, 1.0, 1.0 - 0.8 * 4 / 8, 0.2, 0.2])
    cos = [lr_factor(i, 0, 8, "cosine") for i in (0, 2, 4, 6, 8)]
    want = [0.5 * (1 + math.cos(math.pi * i / 8)) for i in (0, 2, 4, 6, 8)]  # 1, 0.854, 0.5, 0.146, 0
    assert cos == pytest.approx(want) and cos[2] == pytest.approx(0.5)
    assert lr_factor(3, 4, 4, "linear") == 1.0  # warm-up as long as the run: no decay left


def test_the_scheduler_counts_rl_steps():
    """3 RL steps x 4 mini-batches, linear to 0.1: the rate before each optimizer step."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    cfg = OptimizerConfig(lr=1e-3, warmup_steps=1, decay="linear", min_lr_ratio=0.1)
    sched = make_scheduler(opt, cfg, steps=3, updates_per_step=4)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    warm = [1e-3 * k / 4 for k in (1, 2, 3, 4)]
    decay = [1e-3 * (1 - 0.9 * k / 8) for k in range(8)]
    assert seen == pytest.approx(warm + decay)
    again = make_scheduler(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3), cfg, 3, 4)
    again.load_state_dict(sched.state_dict())  # a resumed run continues where it was
    assert again.get_last_lr() == sched.get_last_lr() == pytest.approx([1e-3 * (1 - 0.9)])


def test_bad_schedule_is_refused():
    with pytest.raises(SpecError, match="decay"):
        spec_from_dict({**TINY, "optimizer": {"decay": "step"}})
    with pytest.raises(SpecError, match="min_lr_ratio"):
        spec_from_dict({**TINY, "optimizer": {"min_lr_ratio": 2}})
