"""Checkpoints and exports follow the umask: safetensors writes owner-only files (0600), which a
vLLM server or a colleague running as another user could not read."""

import os
import random
import stat

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.models.builtin import build_config, build_tokenizer
from gspo_cli.runs import RunDir
from gspo_cli.spec import BuiltinModelConfig
from gspo_cli.train.checkpoint import save_checkpoint


@pytest.fixture
def umask():
    def set_mask(mask):
        old.append(os.umask(mask))

    old = []
    yield set_mask
    if old:
        os.umask(old[0])


def _modes(directory):
    return {f.name: stat.S_IMODE(f.stat().st_mode) for f in directory.iterdir() if f.is_file()}


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_a_checkpoint_and_its_export_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    tok = build_tokenizer("0123456789+=")
    size = BuiltinModelConfig(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=32)
    model = AutoModelForCausalLM.from_config(build_config("tiny-dense", size, tok))
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    rd = RunDir(tmp_path / "run")
    rd.checkpoints.mkdir(parents=True)
    ckpt = save_checkpoint(
        rd, 1, model, opt, tok, sched, rng=random.Random(0), shuffle=torch.Generator(), keep=1, dtype="float32"
    )
    modes = _modes(ckpt)
    assert modes["model.safetensors"] == mode  # was 0o600
    assert set(modes.values()) == {mode}, modes
    out = tmp_path / "hf"
    res = CliRunner().invoke(app, ["export", str(ckpt), "-o", str(out)])
    assert res.exit_code == 0, res.output
    exported = _modes(out)
    assert exported["model.safetensors"] == mode and set(exported.values()) == {mode}, exported
