"""Resume checkpoints, written under a temporary name and renamed, so that a crash never
leaves a half-written one (a checkpoint is complete when `trainer_state.pt` and
`config.json` are in a `step_*` directory; a `.tmp-*` directory never counts).

Two layouts, chosen by how the model is held:

- whole model (one process, DDP): an HF model directory (float32 safetensors, config,
  tokenizer) plus `trainer_state.pt` with the optimizer state keyed by parameter names,
  scheduler and RNG state. Written by rank 0 alone, loadable by transformers as it is.
- LoRA (model.lora): the adapters in PEFT's format (adapter_config.json,
  adapter_model.safetensors), `lora_base.json` (the frozen base's path and digest, checked on
  resume), config and tokenizer, and `trainer_state.pt` as above; the base is not copied.
- sharded model (FSDP): `state/`, a `torch.distributed.checkpoint` directory in which every
  rank writes its own slices of the weights and AdamW state (one `__R_0.distcp` per rank and
  a `.metadata`), plus config, tokenizer and `trainer_state.pt` (scheduler, RNG) from rank 0.
  Nothing is gathered; loading reshards to any process count, sharded or not. transformers
  cannot read it: `gspo export` (train.export) writes an HF directory from it.

Either layout resumes with any process count and either sharding.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import RunError
from gspo_cli.models import lora
from gspo_cli.runs import RunDir

STATE_FILE = "trainer_state.pt"
SHARDED_DIR = "state"  # the torch.distributed.checkpoint directory of a sharded checkpoint


def save_checkpoint(
    rd: RunDir,
    step: int,
    model,
    optimizer,
    tokenizer,
    scheduler,
    *,
    info: DistInfo = DistInfo(),
    rng: random.Random,
    shuffle: torch.Generator,
    keep: int,
    dtype: str | None = None,
    extra: dict | None = None,
) -> Path:
    """Write step `step`'s checkpoint, on every rank together (a sharded model's slices are
    written by their own ranks). `model` holds float32 master weights, saved as they are so a
    resume continues exactly; `dtype` is recorded in config.json so that transformers loads
    it in the dtype the run computed in. A failure on any rank (disk full...) is a RunError on
    every rank, and the previous checkpoints stay as they were."""
    final = rd.checkpoints / f"step_{step:06d}"
    tmp = rd.checkpoints / f".tmp-step_{step:06d}"
    sharded = distributed.is_sharded(model)
    failure = None
    if info.is_main:
        failure = _guard(final, lambda: _fresh_dir(tmp))
    failure = distributed.broadcast_object(failure, info)
    optimizer_state = None
    if failure is None and sharded:
        failure = _save_shards(model, optimizer, tmp / SHARDED_DIR, final, info)
    elif failure is None:
        optimizer_state = distributed.full_optimizer_state(model, optimizer, info)
    if info.is_main and failure is None:
        state = {
            "step": step,
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": rng.getstate(),
            "shuffle_rng": shuffle.get_state(),
            **(extra or {}),
        }
        if optimizer_state is not None:
            state["optimizer"] = optimizer_state
        failure = _guard(final, lambda: _finish(tmp, final, model, tokenizer, dtype, state, whole=not sharded))
    failure = distributed.broadcast_object(failure, info)
    if failure is not None:
        if info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(failure)
    if info.is_main:
        for old in valid_checkpoints(rd)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _guard(final: Path, write) -> str | None:
    """None, or the one-line failure of `write` (an OSError: disk full, permissions)."""
    try:
        write()
    except OSError as err:
        return f"{final}: could not write checkpoint ({err.strerror or err})"
    return None


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _save_shards(model, optimizer, where: Path, final: Path, info: DistInfo) -> str | None:
    """Every rank writes its slices into `where` (torch.distributed.checkpoint; its files are
    fsynced); None, or the first failure of any rank, the same on every rank."""
    import torch.distributed.checkpoint as dcp

    failure = None
    try:
        dcp.save(distributed.sharded_states(model, optimizer), checkpoint_id=str(where))
    except Exception as err:  # DCP wraps a rank's OSError in CheckpointException
        failure = f"{final}: could not write checkpoint ({_first_line(err)})"
    return next((f for f in distributed.gather_objects(failure, info) if f), None)


def dcp_reason(err: BaseException) -> str:
    """One line for a torch.distributed.checkpoint failure: the first rank's own error (a
    CheckpointException wraps each rank's as (exception, traceback)), else the error's line."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        inner = inner[0] if isinstance(inner, tuple) else inner
        if isinstance(inner, BaseException):
            return _first_line(inner)
    return _first_line(err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    for marker in ("No space left on device", "Permission denied", "Read-only file system"):
        if marker in text:
            return marker
    return text.splitlines()[0] if text else type(err).__name__


def _finish(tmp: Path, final: Path, model, tokenizer, dtype: str | None, state: dict, *, whole: bool) -> None:
    """Rank 0: the HF weights (whole models) or only the config (sharded ones), tokenizer and
    trainer state into `tmp`, fsync, then the rename that makes the checkpoint exist."""
    if whole and lora.is_lora(model):  # the adapters in PEFT's format, the base named and digested
        model.config.save_pretrained(tmp)
        lora.save_adapters(model, tmp, model.name_or_path)
    elif whole:
        model.save_pretrained(tmp)
    else:
        model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
    if dtype is not None:
        _set_config_dtype(tmp / "config.json", dtype)
    tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    follow_umask(tmp)
    if (tmp / SHARDED_DIR).is_dir():
        fsync_dir(tmp / SHARDED_DIR)
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)


def _set_config_dtype(config_json: Path, dtype: str) -> None:
    config = json.loads(config_json.read_text())
    config["dtype"] = dtype
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def follow_umask(directory: Path) -> None:
    """Give every file under `directory` the mode a new file gets under this process's umask
    (0644 under umask 022). safetensors writes its files owner-only (0600), which a vLLM server
    or a colleague running as another user cannot read, while the other files follow the umask."""
    mode = 0o666 & ~_umask()
    for f in Path(directory).rglob("*"):
        if f.is_file() and not f.is_symlink():
            os.chmod(f, mode)


def _umask() -> int:
    """The process's umask, from /proc where it says (reading it there changes nothing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back at once
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """fsync every file directly in `path`, then `path` itself (so a rename into it lasts)."""
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


def replace_dir(tmp: Path, out: Path) -> None:
    """Make the finished directory `tmp` (fsynced here) the directory `out`: the old `out`, if
    any, moved aside first and removed only once `tmp` has taken its name. Its files follow the
    umask (`follow_umask`)."""
    follow_umask(tmp)
    fsync_dir(tmp)
    old = out.parent / f".old-{out.name}"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)


def valid_checkpoints(rd: RunDir) -> list[Path]:
    """Complete checkpoints, oldest first (temporary directories never count)."""
    return [p for p in rd.checkpoint_dirs() if (p / STATE_FILE).is_file() and (p / "config.json").is_file()]


def is_sharded_checkpoint(ckpt: Path) -> bool:
    """Whether `ckpt` holds its weights as torch.distributed.checkpoint shards (no HF weights)."""
    return (Path(ckpt) / SHARDED_DIR / ".metadata").is_file()


def load_trainer_state(
    ckpt: Path,
    model,
    optimizer,
    scheduler,
    *,
    rng: random.Random,
    shuffle: torch.Generator,
    info: DistInfo = DistInfo(),
) -> dict:
    """Restore optimizer, scheduler and every RNG from `ckpt`, on every rank together; from a
    sharded checkpoint also the weights (a whole-model checkpoint's weights were loaded with
    the model: `weights_to_load`). Any process count and sharding loads any checkpoint.
    Returns the raw trainer state. A checkpoint this version cannot read (a layout from
    another version) is a RunError naming it."""
    try:
        state = torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)
    except Exception as err:
        raise RunError(f"{ckpt}: unreadable checkpoint ({_first_line(err)}); move it aside to start over") from None
    if is_sharded_checkpoint(ckpt):
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        states = distributed.sharded_states(model, optimizer)
        try:
            dcp.load(states, checkpoint_id=str(Path(ckpt) / SHARDED_DIR), no_dist=not dist.is_initialized())
        except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
            raise RunError(f"{ckpt}: cannot load its sharded state ({dcp_reason(err)})") from None
        distributed.load_sharded_states(model, optimizer, states)
    elif "optimizer" in state:
        distributed.load_optimizer_state(model, optimizer, state["optimizer"])
    else:
        raise RunError(f"{ckpt}: neither sharded state ({SHARDED_DIR}/) nor an optimizer state; cannot resume from it")
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    rng.setstate(state["python_rng"])
    shuffle.set_state(state["shuffle_rng"])
    return state


def weights_to_load(ckpt: Path | None) -> str | None:
    """The directory the model's weights come from when resuming from `ckpt`: the checkpoint
    itself when it is an HF directory, None (the run's initial model, overwritten by
    `load_trainer_state`) when it is sharded."""
    if ckpt is None or is_sharded_checkpoint(ckpt):
        return None
    return str(ckpt)
