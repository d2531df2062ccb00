"""bf16 training: float32 master weights and optimizer state, forwards in bf16, checkpoints
that transformers loads in bf16 and that resume exactly."""

import glob

import pytest
import torch
from helpers import TINY
from safetensors.torch import load_file

from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter
from gspo_cli.train.step import setup

pytestmark = pytest.mark.slow


def _weights(directory) -> dict:
    return {k: v for f in sorted(glob.glob(f"{directory}/*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def source():
    task = make_task("arithmetic", TINY["task"]["params"])
    return resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)


def _run(out, dtype):
    raw = {
        **TINY,
        "output_dir": str(out),
        "name": f"mp_{dtype}",
        "model": {**TINY["model"], "dtype": dtype},
        "optimizer": {"lr": 1e-5},
        "train": {"steps": 2, "checkpoint_every": 0},
        "task": {**TINY["task"], "eval_size": 0},
        "arms": [{"name": "grpo", "preset": "paper-grpo", "mini_batches": 4}],
    }
    (res,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    assert res.status == "completed"
    return sorted(glob.glob(f"{res.path}/checkpoints/step_*"))[-1]


def test_small_updates_survive_in_bf16(tmp_path, source):
    """8 AdamW steps of lr 1e-5: seen in bf16, about as many weights change as in an fp32
    run (bf16 weights updated in place kept about a sixth of them: 3.6% vs 22%)."""
    init = _weights(source)
    changed = {}
    for dtype in ("float32", "bfloat16"):
        final = _weights(_run(tmp_path, dtype))
        assert all(v.dtype == torch.float32 for v in final.values())  # the master weights, as they are
        diff = sum(int((init[k].bfloat16() != final[k].bfloat16()).sum()) for k in init)
        changed[dtype] = diff / sum(v.numel() for v in init.values())
    assert changed["float32"] > 0.05
    assert changed["bfloat16"] == pytest.approx(changed["float32"], rel=0.3), changed


def test_bf16_checkpoint_loads_in_bf16_and_resumes_in_fp32(tmp_path, source):
    from transformers import AutoModelForCausalLM

    ckpt = _run(tmp_path, "bfloat16")
    model = AutoModelForCausalLM.from_pretrained(ckpt)  # the user's default load
    assert next(model.parameters()).dtype == torch.bfloat16
    spec = spec_from_dict(
        {
            **TINY,
            "model": {**TINY["model"], "dtype": "bfloat16"},
            "arms": [{"name": "grpo", "preset": "paper-grpo", "mini_batches": 4}],
        }
    )
    task = make_task("arithmetic", TINY["task"]["params"])
    ctx = setup(spec, spec.arms[0], 0, task, source, weights=ckpt)
    assert {p.dtype for p in ctx.model.parameters()} == {torch.float32}
    # no precision lost on resume: the weights are not bf16 values widened to fp32
    rounded = sum(int((p == p.bfloat16().float()).sum()) for p in ctx.model.parameters())
    assert rounded < 0.5 * sum(p.numel() for p in ctx.model.parameters())
    ids = torch.tensor([[1, 2, 3, 4]])
    with ctx.compute():
        assert ctx.model(input_ids=ids).logits.dtype == torch.bfloat16
    assert ctx.model(input_ids=ids).logits.dtype == torch.float32


def test_float16_training_is_refused_in_one_line():
    with pytest.raises(SpecError) as err:
        spec_from_dict({**TINY, "model": {**TINY["model"], "dtype": "float16"}})
    assert str(err.value) == (
        "model.dtype: float16 training needs loss scaling, which gspo-cli does not do "
        "(small gradients underflow); use bfloat16"
    )
