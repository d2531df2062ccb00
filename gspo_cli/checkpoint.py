"""Checkpoints: an HF model directory plus optimizer, scheduler and RNG state, written
under a temporary name and renamed, so a crash never leaves a half-written checkpoint."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch

from gspo_cli.errors import RunError
from gspo_cli.runs import RunDir

STATE_FILE = "trainer_state.pt"


def save_checkpoint(rd: RunDir, step: int, model, tokenizer, optimizer, scheduler, *,
                    rng: random.Random, shuffle: torch.Generator, keep: int) -> Path:
    rd.checkpoints.mkdir(parents=True, exist_ok=True)
    final = rd.checkpoints / f"step_{step:06d}"
    tmp = rd.checkpoints / f".tmp-step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save({
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": rng.getstate(),
            "shuffle_rng": shuffle.get_state(),
        }, tmp / STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"{final}: could not write checkpoint ({err.strerror or err})") from None
    for old in rd.checkpoint_dirs()[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final
