"""`model:` the policy (built-in tiny model, hub id or local path), its dtype, device and
sharding, and the built-in model's size and cold start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gspo_cli.spec.base import _Problems, _Strict


class BuiltinModelConfig(_Strict):
    """Size of a built-in tiny model (Qwen3 / Qwen3-MoE architecture)."""

    hidden_size: int = Field(128, ge=8, description="width of the residual stream")
    num_layers: int = Field(4, ge=1, description="decoder layers")
    num_heads: int = Field(4, ge=1, description="attention heads; must divide hidden_size")
    num_kv_heads: int = Field(2, ge=1, description="key/value heads (grouped-query attention)")
    intermediate_size: int = Field(256, ge=8, description="MLP width of the dense model")
    num_experts: int = Field(8, ge=2, description="experts per MoE layer")
    experts_per_token: int = Field(2, ge=1, description="experts each token is routed to (top-k)")
    moe_intermediate_size: int = Field(128, ge=8, description="MLP width of each expert")
    max_positions: int = Field(256, ge=16, description="longest sequence, prompt and response, in tokens")

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

    steps: int = Field(300, ge=0, description="supervised steps on reference solutions; 0: none")
    batch_size: int = Field(64, ge=1, description="sequences per cold-start step")
    lr: float = Field(3e-3, gt=0, description="cold-start learning rate")
    seed: int = Field(0, description="seed of the cold start (part of the cached model's key)")


class LoraSpec(_Strict):
    """LoRA adapters (PEFT) on a frozen base: what trains and how (docs/guides/lora.md)."""

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: float | None = Field(None, gt=0, description="LoRA alpha (the update is scaled by alpha / r); default 2 r")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="adapter dropout; only 0: dropout makes pi_theta (train mode) differ from pi_old (eval mode) "
        "even on-policy, so importance ratios would not be honest",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="the linear layers that get adapters: all-linear (every nn.Linear but the output head) or "
        "module names (suffixes such as q_proj, v_proj)",
    )
    experts: bool = Field(
        False,
        description="adapt the fused 3-D MoE expert weights too (PEFT parameter targeting); false: experts frozen",
    )
    routers: Literal["frozen", "lora", "full"] = Field(
        "frozen",
        description="MoE routers: frozen (base weights), lora (an adapter on the router weight) or full (the "
        "router weights train in full, float32)",
    )

    @model_validator(mode="after")
    def _check(self):
        if self.dropout > 0:
            raise _Problems(
                f"dropout: {self.dropout}: adapter dropout is refused; it makes pi_theta (the update's train-mode "
                "forward) differ from pi_old (eval mode) even on-policy, so importance ratios would not be honest; "
                "use 0"
            )
        if isinstance(self.target_modules, list) and not self.target_modules:
            raise _Problems("target_modules: empty; give module names or all-linear")
        return self

    @property
    def lora_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * self.r


class ModelConfig(_Strict):
    """The policy: a built-in tiny model, a hub id or a local HF directory, and how it runs."""

    name: str = Field("builtin:tiny-moe", description="builtin:tiny-moe, builtin:tiny-dense, a hub id or a local path")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="compute dtype; bfloat16 computes in bf16 over float32 master weights (autocast "
        "with one process or DDP, FSDP2 mixed precision with sharding: fsdp); float16 is refused",
    )
    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    builtin: BuiltinModelConfig = BuiltinModelConfig()
    cold_start: ColdStartConfig = ColdStartConfig()
    # The router load-balancing loss moves weights even when every advantage is 0, so it is
    # an explicit choice, off for the paper's presets.
    router_aux_loss_coef: float = Field(0.0, ge=0, description="weight of the MoE load-balancing loss")
    # How MoE expert layers run in the trainer. gspo_grouped_mm: transformers' grouped matmuls
    # with index_select gathers (models/experts.py; bit-identical to grouped_mm on CPU, ~6% off
    # the quickstart's RL step); grouped_mm: transformers' own (~16% faster updates than eager on
    # the tiny MoE); eager: a Python loop over experts. batched_mm is not offered (it ran a 24 GB
    # box out of memory on the tiny MoE).
    experts_implementation: Literal["gspo_grouped_mm", "grouped_mm", "eager"] = Field(
        "gspo_grouped_mm",
        description="MoE expert layers: grouped matmuls with index_select gathers (gspo_grouped_mm, fastest "
        "on CPU), transformers' grouped matmuls (grouped_mm) or a loop over experts (eager)",
    )
    # Under torchrun: ddp keeps a whole copy of the model per process; fsdp (PyTorch FSDP2)
    # shards parameters, gradients and optimizer state across processes, and loads each
    # process's shards from rank 0's read of the checkpoint (docs/scaling/memory.md).
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp", description="under torchrun: a whole copy per process (ddp) or FSDP2 shards (fsdp)"
    )
    # LoRA: the base loads in `dtype` and stays frozen; only adapters (float32) train.
    lora: LoraSpec | None = Field(
        None, description="LoRA adapters (needs the lora extra: pip install 'gspo-cli[lora]'); absent: full fine-tuning"
    )
