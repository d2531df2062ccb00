"""Checkpoints: an HF model directory plus optimizer, scheduler and RNG state, written
under a temporary name and renamed, so a crash never leaves a half-written checkpoint."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

from gspo_cli.distributed import load_optimizer_state
from gspo_cli.errors import RunError
from gspo_cli.runs import RunDir

STATE_FILE = "trainer_state.pt"


def save_checkpoint(
    rd: RunDir,
    step: int,
    model,
    tokenizer,
    optimizer_state: dict,
    scheduler,
    *,
    rng: random.Random,
    shuffle: torch.Generator,
    keep: int,
    dtype: str | None = None,
    model_state: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Write step `step`'s checkpoint: `model` (float32 master weights, saved as they are so a
    resume continues exactly; `model_state` instead of the model's own when its weights are
    sharded, see distributed.full_states) with `dtype` recorded in its config.json, so that
    transformers loads it in the dtype the run computed in; the tokenizer; the optimizer
    state (keyed by parameter names), scheduler and RNG state."""
    rd.checkpoints.mkdir(parents=True, exist_ok=True)
    final = rd.checkpoints / f"step_{step:06d}"
    tmp = rd.checkpoints / f".tmp-step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, **({"state_dict": model_state} if model_state is not None else {}))
        if dtype is not None:
            _set_config_dtype(tmp / "config.json", dtype)
        tokenizer.save_pretrained(tmp)
        torch.save(
            {
                "step": step,
                "optimizer": optimizer_state,
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "python_rng": rng.getstate(),
                "shuffle_rng": shuffle.get_state(),
                **(extra or {}),
            },
            tmp / STATE_FILE,
        )
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(rd.checkpoints)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"{final}: could not write checkpoint ({err.strerror or err})") from None
    for old in valid_checkpoints(rd)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _set_config_dtype(config_json: Path, dtype: str) -> None:
    config = json.loads(config_json.read_text())
    config["dtype"] = dtype
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _fsync_dir(path: Path) -> None:
    for f in [*path.iterdir(), path] if path.is_dir() else [path]:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def valid_checkpoints(rd: RunDir) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories never count)."""
    return [p for p in rd.checkpoint_dirs() if (p / STATE_FILE).is_file() and (p / "config.json").is_file()]


def load_trainer_state(
    ckpt: Path, model, optimizer, scheduler, *, rng: random.Random, shuffle: torch.Generator
) -> dict:
    """Restore optimizer (into `model`'s parameters, sharded or not), scheduler and every RNG
    from `ckpt`; returns the raw state dict."""
    state = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=False)
    load_optimizer_state(model, optimizer, state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    rng.setstate(state["python_rng"])
    shuffle.set_state(state["shuffle_rng"])
    return state
