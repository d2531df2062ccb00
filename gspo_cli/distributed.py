"""Data-parallel training across processes (`torchrun`): process group set-up, sharding
prompts by rank (whole groups stay on one rank), and reducing metrics.

With one process everything here is a no-op, so the single-process path pays nothing.
Gradients are averaged by DDP; since every rank holds the same number of equal-sized
groups, the average of the ranks' sequence-mean losses is the global sequence mean.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gspo_cli.errors import SpecError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str = "cpu") -> DistInfo:
    """Join the process group torchrun describes in the environment (gloo on CPU, nccl on
    CUDA); a plain `gspo train` is a world of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") and torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size())


RANK_SEED_STRIDE = 1_000_003  # a prime far above any seed or step count: ranks' seeds never meet


def rank_seed(base: int, rank: int) -> int:
    """The torch seed of `rank` for a given base (a run's seed, a resumed step): rank 0 keeps
    `base`, so one process samples exactly as rank 0 of several does."""
    return base + RANK_SEED_STRIDE * rank


def check_divisible(prompts_per_step: int, group_size: int, mini_batches: list[int], info: DistInfo) -> None:
    if not info.enabled:
        return
    if prompts_per_step % info.world_size:
        raise SpecError(f"rollout.prompts_per_step: {prompts_per_step} is not divisible by the "
                        f"{info.world_size} processes (whole groups stay on one rank)")
    local = prompts_per_step // info.world_size * group_size
    for mb in mini_batches:
        if local % mb:
            raise SpecError(f"mini_batches: {mb} does not divide the per-process batch of {local} "
                            f"({info.world_size} processes)")


def shard(items: list, info: DistInfo) -> list:
    """This rank's contiguous share of the global prompt list."""
    if not info.enabled:
        return items
    n = len(items) // info.world_size
    return items[info.rank * n:(info.rank + 1) * n]


_MAX_KEYS = ("response/length_max", "policy/ratio_max")
_MIN_KEYS = ("policy/ratio_min",)


def reduce_metrics(metrics: dict, info: DistInfo) -> dict:
    """Combine one step's metrics from every rank: extremes for min/max keys, the slowest
    rank for time/*, sums for counts, means for the rest (equal shards make them global)."""
    if not info.enabled:
        return metrics
    gathered: list[dict] = [None] * info.world_size  # type: ignore[list-item]
    dist.all_gather_object(gathered, metrics)
    out = {}
    for key in dict.fromkeys(k for m in gathered for k in m):
        vals = [m[key] for m in gathered if key in m]
        if key == "step":
            out[key] = vals[0]
        elif key in _MAX_KEYS or key.startswith("time/"):
            out[key] = max(vals)
        elif key in _MIN_KEYS:
            out[key] = min(vals)
        elif key in ("policy/skipped_minibatches", "perf/tokens_per_s"):
            out[key] = sum(vals)
        else:
            out[key] = sum(vals) / len(vals)
    return out


def broadcast_object(obj, info: DistInfo):
    """Rank 0's value of `obj` on every rank (decisions must agree: resume, stop)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def wrap(model: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """DDP around the policy for training forwards; generation uses the bare module."""
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)
