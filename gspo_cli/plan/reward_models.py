"""Reward models (`task.rewards[].model`) in `gspo plan`: their weights in every phase of the
processes that hold them, and one batch's forward in the rollout phase (scoring follows
sampling). Sized from the safetensors headers and config.json alone: no weights read, no torch.

Where they sit: on their own `device` (default model.device) in their own `dtype` (default
model.dtype). `placement: every_rank` puts a copy in every process, `rank0` one in rank 0 (the
busiest rank the plan shows either way; on the host it counts once)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from gspo_cli.errors import SpecError
from gspo_cli.plan.shapes import DTYPE_BYTES, _local_or_cached, forward_elems_per_token, shape_from_config
from gspo_cli.runs import plural


@dataclass(frozen=True)
class RewardModelSize:
    name: str  # the reward's label
    params: int | None  # None: unknown (no safetensors found)
    weight_bytes: int | None
    forward_bytes: int  # one batch's no-grad forward through its widest layer (0: unknown)
    device: str
    placement: str


def safetensors_params(directory: Path) -> int | None:
    """Elements in every *.safetensors file of `directory`, from their headers; None when there are none."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, t in header.items():
            if key != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                total += count
    return total


def reward_model_sizes(spec) -> tuple[list[RewardModelSize], list[str]]:
    """The spec's reward models, sized, and a note for each that cannot be."""
    out, notes = [], []
    for r in spec.task.rewards:
        if r.model is None:
            continue
        cfg = r.model
        dtype_bytes = DTYPE_BYTES[cfg.dtype or spec.model.dtype]
        try:
            directory = Path(_local_or_cached(cfg.path)).expanduser()
        except SpecError:
            directory = None
        if directory is not None and directory.is_file():
            directory = directory.parent  # the config.json of a cached snapshot
        params = safetensors_params(directory) if directory is not None and directory.is_dir() else None
        forward = 0
        if params is not None and (directory / "config.json").is_file():
            try:
                shape = shape_from_config(json.loads((directory / "config.json").read_text()), cfg.path)
                widest = max(forward_elems_per_token(shape, i) for i in range(shape.layers))
                forward = cfg.batch_size * cfg.max_length * widest * dtype_bytes
            except (SpecError, ValueError, KeyError):
                forward = 0
        if params is None:
            notes.append(
                f"reward model {r.label} ({cfg.path}): no safetensors found locally or in the Hugging Face cache; "
                "its weights are not in this plan"
            )
        out.append(
            RewardModelSize(
                name=r.label,
                params=params,
                weight_bytes=None if params is None else params * dtype_bytes,
                forward_bytes=forward,
                device=cfg.device or spec.model.device,
                placement=cfg.placement,
            )
        )
    return out, notes


def add_reward_models(phases, spec, kind: str, procs_on_node: int) -> list[str]:
    """Add the spec's reward models to `phases` (phases.Phase, in place): the weights in every
    phase, a batch's forward in rollout; on the device when it is the policy's kind (cpu or
    cuda), else on the host (a cuda reward model beside a cpu policy is a note). Returns notes."""
    sizes, notes = reward_model_sizes(spec)
    for rm in sizes:
        if rm.weight_bytes is None:
            continue
        rm_kind = "cpu" if rm.device == "cpu" else "cuda"
        holders = procs_on_node if rm.placement == "every_rank" else 1
        label = f"reward model {rm.name} ({rm.placement})"
        if rm_kind == "cuda" and kind == "cpu":
            notes.append(f"{label} runs on {rm.device}: its GPU memory is not in this plan")
            continue
        for phase in phases:
            forward = rm.forward_bytes if phase.name == "rollout" else 0
            terms = [(label, rm.weight_bytes)] + ([(f"{label}: forward of one batch", forward)] if forward else [])
            if rm_kind == kind:
                phase.device.extend(terms)
                phase.resident = phase.resident | {label}
            if rm_kind == "cpu":  # the host holds every copy (model.device cpu: its processes' memory)
                phase.host.extend(
                    (f"{name} ({plural(holders, 'process', 'processes')})", holders * b) for name, b in terms
                )
    return notes
