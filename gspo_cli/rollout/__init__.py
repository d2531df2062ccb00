"""Rollout engines behind one interface: `engine.generate(prompts) -> RolloutBatch`."""

from __future__ import annotations

from gspo_cli.distributed import rank_seed
from gspo_cli.models.prompts import PromptFormat, stop_token_ids
from gspo_cli.rollout.base import RolloutBatch, RolloutEngine, logprob_mismatch, response_logprobs
from gspo_cli.rollout.hf import HFRolloutEngine
from gspo_cli.rollout.turns import with_environment

__all__ = [
    "HFRolloutEngine",
    "RolloutBatch",
    "RolloutEngine",
    "logprob_mismatch",
    "make_engine",
    "response_logprobs",
    "with_environment",
]


def make_engine(
    cfg,
    model,
    tokenizer,
    *,
    model_dir: str,
    dtype: str = "float32",
    seed: int = 0,
    routing=None,
    synced: bool = False,
    return_routes: bool = False,
) -> RolloutEngine:
    """The sampler `cfg` (a RolloutConfig) asks for, sampling from `model`'s current weights.
    `model_dir` is the HF directory `model` was loaded from (vLLM starts from it); `routing`
    (a RoutingController) lets the hf engine record the routes it samples with;
    `return_routes` (r3) asks vLLM for its routes (the hf engine records them anyway). Every
    engine stops at the checkpoint's stop ids and formats prompts as `cfg`'s prompt fields say
    (SpecError for a system prompt or template kwargs without a template). `synced`: the
    weights are sharded across processes (see HFRolloutEngine; vllm then gathers them into
    every process's engine one parameter at a time, a collective). Under torchrun vllm runs
    one engine per process (see gspo_cli.rollout.vllm_engine); vllm-server samples from a
    server that rank 0 pushes the weights to (gspo_cli.rollout.vllm_server)."""
    if cfg.engine == "vllm":
        from gspo_cli.rollout.vllm_settings import import_vllm

        import_vllm()  # imports vllm itself, only now: a missing vLLM is the first thing to say
    common = {
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "stop_ids": stop_token_ids(model, tokenizer),
        "prompt_format": PromptFormat.from_rollout(cfg).formatter(tokenizer),
    }
    if cfg.engine == "hf":
        return HFRolloutEngine(
            model,
            tokenizer,
            sampler_logprobs=cfg.sampler_logprobs,
            routing=routing,
            synced=synced,
            decode=cfg.decode,
            sample_rows=cfg.sample_rows,
            **common,
        )
    if cfg.engine == "vllm-server":
        from gspo_cli.rollout.vllm_server import VLLMServerRolloutEngine

        server = cfg.server
        return VLLMServerRolloutEngine(
            model,
            tokenizer,
            url=server.url,
            seed=rank_seed(seed, _rank()),
            weight_port=server.weight_port,
            timeout_s=server.timeout_s,
            sharded=synced,
            max_parallel=server.max_parallel,
            return_routes=return_routes,
            moe_layers=getattr(routing, "decoder_layers", None),
            num_experts=getattr(routing, "num_experts", None),
            **common,
        )
    from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine

    # Under torchrun each engine (group) samples its own share with its own seed; rank 0 keeps
    # the run's, as one process would (the same rule as the trainer's torch seed). A
    # tensor-parallel group runs in lock step: every member takes its first rank's seed.
    tp = (cfg.vllm or {}).get("tensor_parallel_size", 1)
    return VLLMRolloutEngine(
        model,
        tokenizer,
        model_dir=model_dir,
        dtype=dtype,
        seed=rank_seed(seed, _rank() // tp * tp),
        engine_kwargs=cfg.vllm,
        return_routes=return_routes,
        sharded=synced,
        moe_layers=getattr(routing, "decoder_layers", None),
        num_experts=getattr(routing, "num_experts", None),
        **common,
    )


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
