"""The trainer's optimizer: AdamW over the policy's parameters, the routers optionally in a
faster group (optimizer.router_lr_scale), with torch's fused kernel where it applies."""

from __future__ import annotations

import math

import torch

from gspo_cli.errors import SpecError, router_scale_problem
from gspo_cli.spec import OptimizerConfig


def make_optimizer(model, routing, cfg: OptimizerConfig, model_name: str, sharded: bool) -> torch.optim.AdamW:
    """AdamW for `model` (after any DDP/FSDP wrapping: it must see the parameters it steps).
    `routing`: the model's RoutingController, or None for a dense model."""
    fused = fused_adamw_ok(model, sharded)
    opt = torch.optim.AdamW(
        param_groups(model, routing, cfg.lr, cfg.router_lr_scale, model_name),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )
    if fused:
        opt.register_step_post_hook(_bump_versions)
    return opt


def lr_factor(i: int, warmup: int, total: int, decay: str = "constant", floor: float = 0.0) -> float:
    """The learning rate's multiplier before optimizer step `i` (0-based): a linear warm-up over
    `warmup` steps, then `decay` from 1 at step `warmup` to `floor` at step `total` (constant: 1
    throughout; linear: a straight line; cosine: floor + (1 - floor)(1 + cos(pi t)) / 2 with t the
    fraction of the decay done). Steps past `total` (a resumed run given more steps) stay at `floor`."""
    if warmup and i < warmup:
        return (i + 1) / warmup
    if decay == "constant" or total <= warmup:
        return 1.0
    t = min(1.0, (i - warmup) / (total - warmup))
    if decay == "linear":
        return 1.0 - (1.0 - floor) * t
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def make_scheduler(optimizer, cfg: OptimizerConfig, steps: int, updates_per_step: int):
    """LambdaLR over optimizer steps: warm-up and decay are given in RL steps, each of which
    makes `updates_per_step` optimizer steps (mini-batches x epochs)."""
    warm, total = cfg.warmup_steps * updates_per_step, steps * updates_per_step
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: lr_factor(i, warm, total, cfg.decay, cfg.min_lr_ratio)
    )


def _bump_versions(opt: torch.optim.Optimizer, args, kwargs) -> None:
    """The fused kernel writes parameters without bumping their version counters, which is how
    the vLLM engine tells that the trainer's weights changed and must be synced again
    (`_weights_version`): bump them, as the default path's in-place ops do."""
    for group in opt.param_groups:
        for p in group["params"]:
            torch.autograd.graph.increment_version(p)


def fused_adamw_ok(model: torch.nn.Module, sharded: bool) -> bool:
    """Whether AdamW can take torch's fused kernel (one pass over each parameter, not a dozen
    element-wise ops): plain (unsharded) floating-point parameters on CPU or CUDA. On the
    built-in tiny MoE the optimizer step goes from 5-7 ms to 2-3 ms per mini-batch on one
    thread; parameters agree with the default path to float32 rounding (1e-7)."""
    if sharded:
        return False
    params = [p for p in model.parameters() if p.requires_grad]
    return bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


def param_groups(model, routing, lr: float, router_scale: float, model_name: str) -> list[dict]:
    """AdamW parameter groups: one, or (optimizer.router_lr_scale != 1) the routers' weights
    in a second group at lr x router_scale. A router scale on a dense model is a spec error."""
    params = [p for p in model.parameters() if p.requires_grad]
    if router_scale == 1.0:
        return [{"params": params}]
    if routing is None:
        raise SpecError(router_scale_problem(router_scale, model_name))
    router_ids = {id(p) for p in router_parameters(model, routing)}
    return [
        {"params": [p for p in params if id(p) not in router_ids]},
        {"params": [p for p in params if id(p) in router_ids], "lr": lr * router_scale},
    ]


def router_parameters(model, routing) -> list:
    """The routers' parameters, with (model.lora) the adapters PEFT wraps around a router's weight
    (`gate.lora_A`, beside the router now at `gate.base_layer`) and a trained copy of a router."""
    routers = {id(r) for r in routing.routers}
    prefixes = tuple(q.removesuffix(".base_layer") + "." for q, m in model.named_modules() if id(m) in routers)
    return [p for n, p in model.named_parameters() if n.startswith(prefixes)]
