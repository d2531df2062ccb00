"""`model.experts_implementation: gspo_grouped_mm` (the default for MoE models): transformers'
grouped-matmul MoE experts (`grouped_mm`) with the gathers changed, registered in transformers'
own ExpertsInterface, so any model whose experts transformers can group can run it.

transformers' `grouped_mm` sorts the (token, expert) pairs by expert, gathers the tokens, runs
one grouped matmul for the gate/up and one for the down projection (transformers' own
dispatch: torch's grouped GEMM, or its CPU fallback under `torch.compile`), weights the rows
and puts them back in token order. Same here, except how rows are gathered:

- `x[perm // k]` and `y[inverse]` (advanced indexing) become `index_select`. The backward of
  advanced indexing is an accumulating `index_put_`: on CPU ~0.4 ms per call at the
  quickstart's mini-batch (1,920 rows x 128), slower on 2 threads than on 1, and 3-4 per MoE
  layer per mini-batch. `index_select`'s backward is `index_add_` (0.19 vs 0.98 ms on 2
  threads). On CPU the tokens are gathered with repeats (`perm // k`: index_add_ is serial over
  rows there); elsewhere each token's k copies are permuted, so no index repeats and the
  backward has no atomic-add races (deterministic, as transformers keeps its combine).
- The row counts per expert are a `searchsorted` over the sorted expert ids instead of a
  `histc` (the same offsets, integer arithmetic).

The matmuls, the gate and the final sum over each token's k experts are transformers' own, in
the same order: forward and backward equal `grouped_mm`'s bit for bit on CPU in float32
(tests/test_experts.py). Experts with biases, a post-expert norm or expert parallelism (and a
transformers without the helper this uses) run transformers' `grouped_mm` unchanged.
"""

from __future__ import annotations

import torch
from transformers.integrations.moe import grouped_mm_experts_forward

try:  # a private helper of transformers' grouped_mm (5.x); without it, grouped_mm runs as it is
    from transformers.integrations.moe import _grouped_linear
except ImportError:  # pragma: no cover
    _grouped_linear = None

NAME = "gspo_grouped_mm"


def _gather_with_repeats(hidden_states: torch.Tensor) -> bool:
    """Gather rows with repeated indices (CPU), or permute each token's k copies (elsewhere)."""
    return hidden_states.device.type == "cpu"


def gspo_grouped_mm_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """The experts' forward (an ExpertsInterface function): (N, H) hidden states, (N, k)
    chosen experts and their weights -> (N, H). See the module docstring."""
    special = (getattr(self, a, False) for a in ("has_bias", "has_post_expert_norm", "_is_expert_parallel"))
    if _grouped_linear is None or any(special):
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    n_tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    expert_ids = top_k_index.reshape(-1)
    expert_ids_g, perm = torch.sort(expert_ids)  # as grouped_mm sorts: the same row order
    if _gather_with_repeats(hidden_states):
        x_g = hidden_states.index_select(0, perm // k)  # backward: index_add_, serial over rows on CPU
    else:  # a permutation of each token's k copies: no index repeats, so no atomic-add races backward
        x_g = hidden_states.unsqueeze(1).expand(n_tokens, k, hidden).reshape(-1, hidden).index_select(0, perm)
    weights_g = top_k_weights.reshape(-1).index_select(0, perm)
    bounds = torch.arange(1, self.num_experts + 1, device=expert_ids_g.device, dtype=expert_ids_g.dtype)
    offs = torch.searchsorted(expert_ids_g, bounds, right=False).to(torch.int32)  # rows of experts < e+1
    gated, transposed = getattr(self, "has_gate", True), getattr(self, "is_transposed", False)
    h = _grouped_linear(x_g, self.gate_up_proj if gated else self.up_proj, offs, is_transposed=transposed)
    h = self._apply_gate(h) if gated else self.act_fn(h)
    y = _grouped_linear(h, self.down_proj, offs, is_transposed=transposed)
    y = y * weights_g.unsqueeze(-1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    out = y.index_select(0, inverse).view(n_tokens, k, hidden).sum(dim=1)
    return out.to(hidden_states.dtype)


def register() -> None:
    """Make `gspo_grouped_mm` an experts implementation transformers' models accept."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, gspo_grouped_mm_forward)
