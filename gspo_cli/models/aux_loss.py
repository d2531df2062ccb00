"""The MoE router load-balancing loss (Switch Transformer, arXiv:2101.03961, eqs. 4-6; the form
transformers' Qwen3-MoE computes) over the whole batch when it is split across processes.

    loss = E * sum_e f_e * P_e,   f_e = (top-k picks of expert e) / R,   P_e = (sum of p_e) / R

over every (layer, counted position) row, R rows in all (transformers counts the attended
positions; the trainer passes the prompt and response tokens, the same rows in a real rollout).
It is a product of two means, so the mean of per-process losses is not the loss of the whole
batch (review: 2.218 vs 2.152 on two halves). Here each process sums its parts, the parts are
added over processes (counts and R without gradient), and each process backpropagates its own
share of P, scaled by the world size because DDP and FSDP average gradients: the averaged
gradient and the logged value are the whole batch's, as one process would compute them.
"""

from __future__ import annotations

import torch

from gspo_cli import distributed
from gspo_cli.algorithms.precision import upcast
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import RunError


def load_balance_parts(router_logits, attention_mask: torch.Tensor, num_experts: int, top_k: int):
    """(picks_E, prob_sum_E, rows): this process's sums over every layer's rows. `router_logits`:
    a tuple of (B*T, E) per MoE layer (the model's `router_logits` output); `attention_mask`
    (B, T), 1 on the positions that count (0 on padding). picks_E (no gradient) counts top-k
    choices per expert, prob_sum_E (differentiable) sums the router's softmax probabilities,
    rows is a 0-d count."""
    flat = attention_mask.reshape(-1).float()
    picks_E = torch.zeros(num_experts, dtype=torch.float32, device=flat.device)
    prob_E = torch.zeros(num_experts, dtype=torch.float32, device=flat.device)
    rows = torch.zeros((), dtype=torch.float32, device=flat.device)
    for logits in router_logits:
        probs = torch.softmax(upcast(logits), dim=-1)
        chosen = probs.detach().topk(top_k, dim=-1).indices
        picks_E = picks_E + torch.zeros_like(picks_E).scatter_add_(0, chosen.reshape(-1), flat.repeat_interleave(top_k))
        prob_E = prob_E + (probs * flat.unsqueeze(-1)).sum(0)
        rows = rows + flat.sum()
    return picks_E, prob_E, rows


def global_load_balancing_loss(
    router_logits, attention_mask: torch.Tensor, num_experts: int, top_k: int, info: DistInfo
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to backpropagate on this process, the whole batch's loss value, detached).

    One process: both are the batch's loss (equal to transformers' `aux_loss` given the same
    mask). Under torchrun: the first is world_size x E x sum_e f_e x (this process's prob
    sum_e) / R, whose gradient averaged over processes is the whole batch's; the second is the
    whole batch's value."""
    picks_E, prob_E, rows = load_balance_parts(router_logits, attention_mask, num_experts, top_k)
    picks_E = distributed.total_tensor(picks_E, info)
    rows_all = distributed.total_tensor(rows, info).clamp(min=1)
    f_E = picks_E / rows_all
    if not info.enabled:
        loss = num_experts * (f_E * prob_E / rows_all).sum()
        return loss, loss.detach()
    value = num_experts * (f_E * distributed.total_tensor(prob_E, info) / rows_all).sum()
    return info.world_size * num_experts * (f_E * prob_E / rows_all).sum(), value


def router_aux_loss(model_aux_loss, router_logits, tokens_BT: torch.Tensor, config, info: DistInfo):
    """(term to add to this process's loss, logged value) of the load-balancing loss:
    `global_load_balancing_loss` over the positions `tokens_BT` (B, T) marks, on one process as
    under torchrun, so both count the same rows however a mini-batch is split or trimmed. Pass
    the prompt and response tokens (not the attention mask: a position the model attends but
    no row of a mini-batch needs is trimmed away, which would change the rows with the split).
    Models that do not return `router_logits`: their own `aux_loss` on one process; under
    torchrun that would be rank-local, so it is a RunError (one line). `config`: the model's (num_experts,
    num_experts_per_tok)."""
    if router_logits is None:
        if info.enabled:
            raise RunError(
                "model.router_aux_loss_coef: the model returns no router_logits, so under torchrun its "
                "load-balancing loss would be each process's own; set router_aux_loss_coef: 0"
            )
        return model_aux_loss, model_aux_loss.detach()
    return global_load_balancing_loss(router_logits, tokens_BT, config.num_experts, config.num_experts_per_tok, info)


def load_balance_counts(router_logits, tokens_BT: torch.Tensor, config) -> tuple[torch.Tensor, torch.Tensor]:
    """(picks_E, rows) of `load_balance_parts`, without gradient: what a no-grad forward over a
    whole mini-batch contributes to f_e before its micro-batches run (train/update.py)."""
    with torch.no_grad():
        picks_E, _, rows = load_balance_parts(router_logits, tokens_BT, config.num_experts, config.num_experts_per_tok)
    return picks_E, rows


def router_aux_share(router_logits, tokens_BT: torch.Tensor, config, f_E: torch.Tensor, rows_all, info: DistInfo):
    """(term to add to this micro-batch's loss, its prob sums (E,) detached) of the load-balancing
    loss of a mini-batch run in micro-batches: f_E (the whole mini-batch's pick fractions over
    every process, from a no-grad pre-pass) is fixed, and the loss is linear in P, so the terms
    of the micro-batches add up to `global_load_balancing_loss`'s term for the whole mini-batch
    (value and gradient). The logged value is E x sum_e f_e x (all prob sums) / rows_all."""
    if router_logits is None:
        raise RunError(
            "model.router_aux_loss_coef: the model returns no router_logits, so its load-balancing loss "
            "cannot be split over micro-batches; set router_aux_loss_coef: 0 or drop train.micro_batch_*"
        )
    _, prob_E, _ = load_balance_parts(router_logits, tokens_BT, config.num_experts, config.num_experts_per_tok)
    scale = info.world_size if info.enabled else 1
    return scale * config.num_experts * (f_E * prob_E / rows_all).sum(), prob_E.detach()
