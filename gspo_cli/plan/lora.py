"""`gspo plan` with model.lora (models/lora.py): the base frozen in model.dtype (no fp32 master,
gradients or AdamW moments for it), float32 adapters with their gradients and two AdamW moments,
no KL reference copy (the reference is the base with the adapters off), and `routers: full`'s
trained router copies in float32."""

from __future__ import annotations

from gspo_cli.plan.shapes import DTYPE_BYTES, ModelShape

FP32 = 4
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def adapter_params(shape: ModelShape, lora) -> int:
    """Parameters the adapters of `lora` (a LoraSpec) add to `shape`: r x (in + out) per adapted
    linear layer (attention projections; the dense layers' MLP), per expert weight with
    `experts` (r x E x (in + out) for gate_up and down), per router with `routers: lora`. Names
    outside the Qwen-style projections are not counted."""
    names = set(_ATTENTION + _MLP) if lora.target_modules == "all-linear" else set(lora.target_modules)
    q, kv, h, r = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, lora.r
    per_attention = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h}
    n = 0
    for layer in range(shape.layers):
        n += sum(r * per_attention[m] for m in _ATTENTION if m in names)
        if layer not in shape.moe_layers:
            n += sum(r * (h + shape.intermediate) for m in _MLP if m in names)
        elif lora.experts:
            n += r * shape.experts * ((h + 2 * shape.moe_intermediate) + (shape.moe_intermediate + h))
        if layer in shape.moe_layers and lora.routers == "lora":
            n += r * (h + shape.experts)
    return n


def trained_router_params(shape: ModelShape, lora) -> int:
    """`routers: full`: each MoE layer's (E, H) router trains as a float32 copy."""
    return shape.experts * shape.hidden * len(shape.moe_layers) if lora.routers == "full" else 0


def resident_terms(shape: ModelShape, spec, share: int, W: int) -> list[tuple[str, int]]:
    """What every rank keeps between phases with LoRA (`share`: the FSDP shard count, 1 without)."""
    lora, c = spec.model.lora, DTYPE_BYTES[spec.model.dtype]
    A = adapter_params(shape, lora) + trained_router_params(shape, lora)
    terms = [
        (f"frozen base weights ({spec.model.dtype})", c * shape.total_params() // share),
        ("fp32 adapters" + (" + trained routers" if lora.routers == "full" else ""), FP32 * A),
        ("fp32 adapter gradients", FP32 * A),
        ("AdamW moments of the adapters, fp32", 2 * FP32 * A),
    ]
    if W > 1 and share == 1:
        terms.append(("DDP gradient buckets (adapters)", FP32 * A))
    return terms
