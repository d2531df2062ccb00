"""Data-parallel training across processes (`torchrun`): process group set-up, sharding
prompts by rank (whole groups stay on one rank), and reducing metrics.

With one process everything here is a no-op, so the single-process path pays nothing.
Gradients are averaged by DDP, so each rank divides its share of the loss by the global
count (tokens or responses) / world size: the average is then the single-process loss
for every aggregation (`algorithms.aggregate`). Metrics are combined exactly by
`train.stats.StepStats`.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

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
        on_gpu = device.startswith("cuda") and torch.cuda.is_available()
        if on_gpu:  # "cuda" then means this process's own GPU, not GPU 0 for everyone
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if on_gpu else "gloo")
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
        raise SpecError(
            f"rollout.prompts_per_step: {prompts_per_step} is not divisible by the "
            f"{info.world_size} processes (whole groups stay on one rank)"
        )
    local = prompts_per_step // info.world_size * group_size
    for mb in mini_batches:
        if local % mb:
            raise SpecError(
                f"mini_batches: {mb} does not divide the per-process batch of {local} ({info.world_size} processes)"
            )


def shard(items: list, info: DistInfo) -> list:
    """This rank's contiguous share of the global prompt list."""
    if not info.enabled:
        return items
    n = len(items) // info.world_size
    return items[info.rank * n : (info.rank + 1) * n]


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's `obj`, in rank order (a list of one without torchrun)."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def comm_device() -> torch.device:
    """Where a collective's tensors must be: this process's GPU under NCCL (it moves no host
    memory), the host under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def total(value: float, info: DistInfo) -> float:
    """The sum of `value` over all ranks (e.g. a global token count)."""
    if not info.enabled:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def total_tensor(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """The elementwise sum of a (detached) tensor over all ranks, as a new tensor on `t`'s device."""
    if not info.enabled:
        return t.detach().clone()
    out = t.detach().to(comm_device(), copy=True)
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out.to(t.device)


def gather_values(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Every rank's 1-D tensor `t` (lengths may differ, 0 included) concatenated in rank order,
    the same on every rank, on `t`'s device; `t` itself without torchrun. Each rank holds all of
    them: world size x the local size (a global quantile needs them all)."""
    if not info.enabled:
        return t
    dev = comm_device()
    size = torch.tensor([t.numel()], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(size) for _ in range(info.world_size)]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    if max(counts) == 0:
        return t
    padded = torch.zeros(max(counts), dtype=t.dtype, device=dev)
    padded[: t.numel()] = t.detach().reshape(-1).to(dev)
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([p[:k] for p, k in zip(parts, counts)]).to(t.device)


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank when `flag` is true on any rank: a decision to stop, skip or
    diverge must be taken by all ranks together, or the others wait in the next collective."""
    if not info.enabled:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def leave_process_group(code: int = 0, *, exit_now: bool = False) -> None:
    """End a torchrun worker without tripping the process group's C++ destructors, which abort
    (SIGABRT, "terminate called without an active exception") when they run at interpreter exit
    after a peer has gone. On success (`code` 0) the ranks meet once more and the group is
    destroyed in order; then, unless `exit_now`, this returns and the interpreter exits normally
    (its exit handlers run: vLLM's CPU engine unlinks its shared-memory segments there). On an
    error the peers may have gone already, so the process leaves at once with its code, as it
    does with `exit_now` (scripts whose other threads' destructors have aborted at exit)."""
    import logging
    import sys

    if code == 0 and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer failed after its last collective: its own exit code reports it
            code = 1
    if code == 0 and not exit_now:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def broadcast_object(obj, info: DistInfo):
    """Rank 0's value of `obj` on every rank (decisions must agree: resume, stop)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shared_directory_problem(path: Path, info: DistInfo, wait_s: float = 5.0) -> str | None:
    """None when every rank's `path` (each rank's own: spec paths may be relative, or mounted
    elsewhere) is rank 0's directory, one filesystem shared by all nodes; else which rank on
    which host does not see it. Rank 0 writes a token file there and every rank looks for it
    in its own `path` (for up to `wait_s`: NFS may cache a name's absence for a moment).
    Collective; creates `path` on rank 0."""
    if not info.enabled:
        return None
    name = None
    if info.is_main:
        path.mkdir(parents=True, exist_ok=True)
        name = f".shared-check-{secrets.token_hex(8)}"
        (path / name).write_text(socket.gethostname())
    token = path / broadcast_object(name, info)
    deadline = time.monotonic() + wait_s
    while not token.is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    seen = gather_objects((token.is_file(), socket.gethostname(), str(path.absolute())), info)
    barrier(info)
    if info.is_main:
        token.unlink(missing_ok=True)
    blind = [(r, host, where) for r, (ok, host, where) in enumerate(seen) if not ok]
    if not blind:
        return None
    r, host, where = blind[0]
    return f"rank {r} on {host} does not see rank 0's files in its {where} ({len(blind)} of {info.world_size} ranks)"


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def wrap(model: torch.nn.Module, info: DistInfo, sharding: str = "ddp") -> torch.nn.Module:
    """The module training forwards go through. One process: `model` itself. `ddp`: a DDP
    wrapper (a whole copy per process, gradients all-reduced; generation uses the bare
    module). `fsdp`: FSDP2 applied in place (`fully_shard`, one unit per decoder layer plus
    the root), so `model` itself becomes the sharded module: each process keeps 1/world of
    the parameters, gradients and optimizer state, and gathers a layer's weights only while
    it runs. Create the optimizer after wrapping (it must see the sharded parameters)."""
    if not info.enabled:
        return model
    if sharding == "fsdp":
        if not is_sharded(model):  # models.load_model shards while it loads
            shard_(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def shard_(model: torch.nn.Module, param_dtype: torch.dtype | None = None) -> None:
    """FSDP2 in place: every decoder layer (the classes the model lists as never to be split,
    `_no_split_modules`) is one unit, the rest (embeddings, norm, head) the root's.

    `param_dtype` (e.g. bfloat16): forwards and backwards compute with copies of the float32
    shards gathered in that dtype (FSDP2's MixedPrecisionPolicy), gradients are reduced in
    float32 into float32 shards; None computes in the parameters' own dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layer_types = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_types]
    if not layers:
        raise SpecError(
            f"model.sharding: fsdp needs decoder layers to shard; {type(model).__name__} lists none (_no_split_modules)"
        )
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def fill_from_rank0(model: torch.nn.Module, full_state: dict) -> None:
    """Fill a sharded model's shards with rank 0's `full_state` (whole tensors keyed as in the
    model's state dict, any dtype: copied into the parameters' own; the other ranks pass {}).
    Tensor by tensor, each broadcast from rank 0 and sliced by every rank: a rank holds its
    shards plus one whole tensor at a time. A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state, options=opts)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> dict:
    """The optimizer state of a whole (unsharded) model, keyed by parameter names so that it
    loads into any number of processes and shardings; a sharded model writes
    `sharded_states` instead."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=info.enabled)
    return get_optimizer_state_dict(model, optimizer, options=opts)


def sharded_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"model": ..., "optim": ...} keyed by parameter names, holding only this rank's slices
    (DTensors) of a sharded model, whole tensors of an unsharded one: what
    `torch.distributed.checkpoint` saves per rank, and the templates it loads into (it
    reshards from whatever process count wrote the checkpoint). An optimizer that has not
    stepped yet gets its state created first (a zero-gradient step at lr 0, torch's own
    `_init_optim_state`), so that there is something to load into. Nothing is gathered."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def load_sharded_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, states: dict) -> None:
    """Put `states` (`sharded_states`' layout, filled by `dcp.load`) into the model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optim"])


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a whole-model checkpoint's optimizer state: keyed by parameter names (`full_optimizer_state`,
    whatever the number of processes that wrote it), or by parameter index (checkpoints written
    before gspo-cli 0.1's sharding support)."""
    if state.get("state") and isinstance(next(iter(state["state"])), int):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def scalar(x) -> torch.Tensor:
    """A plain tensor from a possibly sharded (DTensor) scalar such as FSDP's gradient norm."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x
