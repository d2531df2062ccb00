"""Rollout engines behind one interface: `engine.generate(prompts) -> RolloutBatch`."""

from __future__ import annotations

from gspo_cli.errors import SpecError
from gspo_cli.rollout.base import (
    RolloutBatch,
    RolloutEngine,
    logprob_mismatch,
    response_logprobs,
)
from gspo_cli.rollout.hf import HFRolloutEngine

__all__ = ["HFRolloutEngine", "RolloutBatch", "RolloutEngine", "logprob_mismatch", "make_engine",
           "response_logprobs"]


def make_engine(cfg, model, tokenizer, *, model_dir: str, dtype: str = "float32", seed: int = 0,
                routing=None, return_routes: bool = False) -> RolloutEngine:
    """The sampler `cfg` (a RolloutConfig) asks for, sampling from `model`'s current weights.
    `model_dir` is the HF directory `model` was loaded from (vLLM starts from it); `routing`
    (a RoutingController) lets the hf engine record the routes it samples with;
    `return_routes` (r3) asks vLLM for its routes (the hf engine records them anyway)."""
    if cfg.engine == "hf":
        return HFRolloutEngine(model, tokenizer, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                               sampler_logprobs=cfg.sampler_logprobs, routing=routing)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise SpecError("rollout.engine: vllm runs in-process with one trainer; under torchrun use engine: hf")
    from gspo_cli.rollout.vllm_engine import (
        VLLMRolloutEngine,  # imports vllm itself, only now
    )

    return VLLMRolloutEngine(model, tokenizer, model_dir=model_dir, max_new_tokens=cfg.max_new_tokens,
                             temperature=cfg.temperature, dtype=dtype, seed=seed, engine_kwargs=cfg.vllm,
                             return_routes=return_routes)
