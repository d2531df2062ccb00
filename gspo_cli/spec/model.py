"""`model:` the policy (built-in tiny model, hub id or local path), its dtype, device and
sharding, and the built-in model's size and cold start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gspo_cli.spec.base import _Problems, _Strict


class BuiltinModelConfig(_Strict):
    """Size of a built-in tiny model (Qwen3 / Qwen3-MoE architecture)."""

    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=8)
    num_experts: int = Field(8, ge=2)
    experts_per_token: int = Field(2, ge=1)
    moe_intermediate_size: int = Field(128, ge=8)
    max_positions: int = Field(256, ge=16)

    @model_validator(mode="after")
    def _check(self):
        problems = []
        if self.experts_per_token > self.num_experts:
            problems.append(f"experts_per_token: {self.experts_per_token} exceeds num_experts ({self.num_experts})")
        if self.hidden_size % self.num_heads:
            problems.append(f"hidden_size: {self.hidden_size} is not divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads: {self.num_heads} is not divisible by num_kv_heads ({self.num_kv_heads})")
        if problems:
            raise _Problems("\n".join(problems))
        return self


class ColdStartConfig(_Strict):
    """Supervised warm start of a built-in model on the task's reference solutions."""

    steps: int = Field(300, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0)
    seed: int = 0


class ModelConfig(_Strict):
    name: str = Field("builtin:tiny-moe", description="builtin:tiny-moe, builtin:tiny-dense, a hub id or a local path")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    builtin: BuiltinModelConfig = BuiltinModelConfig()
    cold_start: ColdStartConfig = ColdStartConfig()
    # The router load-balancing loss moves weights even when every advantage is 0, so it is
    # an explicit choice, off for the paper's presets.
    router_aux_loss_coef: float = Field(0.0, ge=0)
    # How MoE expert layers run in the trainer. grouped_mm: one grouped matmul per layer
    # (same forward as eager, ~16% faster updates on the tiny MoE); eager: a Python loop over
    # experts; batched_mm is not offered (it ran a 24 GB box out of memory on the tiny MoE).
    experts_implementation: Literal["grouped_mm", "eager"] = "grouped_mm"
    # Under torchrun: ddp keeps a whole copy of the model per process; fsdp (PyTorch FSDP2)
    # shards parameters, gradients and optimizer state across processes, and loads each
    # process's shards from rank 0's read of the checkpoint (docs/scaling/memory.md).
    sharding: Literal["ddp", "fsdp"] = "ddp"
