"""Padding-free packing (`train.packing`): the rows of a forward concatenated into one row of
their real tokens, each row's positions restarting at 0, with no attention mask. transformers'
mask builders (`masking_utils.find_packed_sequence_indices`) read a position that does not
follow its predecessor as the start of another sequence and attend within each sequence only
(sdpa, eager, flex: a block-diagonal causal mask; flash attention: its varlen kernel from the
same positions), so each row's outputs are those of the padded forward; the padded layout's
padding is never computed.

A row's real tokens are the positions its attention mask marks (left-padded prompt, response
up to its stop token, tool output included): `Packing` maps them in and out. Outputs at
padding positions, which no loss or metric reads, come back as zeros (log-probs, router
logits) or experts 0..k-1 (routes).

Packing trades B x T padded positions for N real ones, but sdpa's and eager's packed mask is
N x N: their attention grows with the square of the whole micro-batch's tokens, not each row's
(flash attention's varlen kernel does not: sum of each row's squares). Where it pays is
measured (benchmarks/README.md); `auto` packs only there (`AUTO_PACKS`), `on` wherever the
attention can.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

# transformers attention implementations whose masks (or varlen kernels) separate packed rows
PACKED_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
# (device type, attention) pairs where packing was measured faster than padding; `auto` packs
# only there (benchmarks/README.md, "Padding-free packing"). None yet: on CPU, sdpa packed ran
# 0.19-0.73x the padded time on a hidden-256 MoE but 2.57x on the built-in tiny one at 128 rows
# (its N x N mask outweighs its small linear layers), eager 1.5-3.7x at 128 rows; no GPU measured.
AUTO_PACKS: tuple[tuple[str, str], ...] = ()


@dataclass
class Packing:
    """The packed layout of a (B, T) batch: `keep_BT` (bool) marks the real tokens, which the
    packed row holds in row-major order (N of them)."""

    keep_BT: torch.Tensor

    @classmethod
    def of(cls, batch) -> Packing:
        return cls(batch.attention_mask > 0)

    def inputs(self, batch) -> dict:
        """The model's keyword inputs: (1, N) ids and per-row positions, no attention mask."""
        return {
            "input_ids": batch.input_ids[self.keep_BT][None],
            "position_ids": batch.position_ids[self.keep_BT][None],
            "attention_mask": None,
        }

    def index_BT(self) -> torch.Tensor:
        """(B, T) each position's index in the packed row (-1 on padding)."""
        flat = self.keep_BT.reshape(-1)
        idx = flat.long().cumsum(0) - 1
        return torch.where(flat, idx, torch.full_like(idx, -1)).reshape(self.keep_BT.shape)

    def routes_in(self, routes_LBTk: torch.Tensor) -> torch.Tensor:
        """(L, B, T, k) routes in the padded layout -> (L, N, k) in the packed row's order."""
        return routes_LBTk[:, self.keep_BT.to(routes_LBTk.device)]

    def routes_out(self, routes_LNk: torch.Tensor | None) -> torch.Tensor | None:
        """(L, N, k) routes of a packed forward -> (L, B x T, k) in the padded layout, experts
        0..k-1 at padding (as forward_logprobs fills trimmed columns)."""
        if routes_LNk is None:
            return None
        L, _, k = routes_LNk.shape
        B, T = self.keep_BT.shape
        out = torch.arange(k, dtype=routes_LNk.dtype, device=routes_LNk.device).expand(L, B, T, k).clone()
        out[:, self.keep_BT.to(out.device)] = routes_LNk
        return out.reshape(L, B * T, k)

    def rows_out(self, x_NE: torch.Tensor) -> torch.Tensor:
        """(N, E) per-token rows (a router's logits) -> (B x T, E), zeros at padding; gradients
        flow to the real rows."""
        keep = self.keep_BT.reshape(-1).to(x_NE.device)
        out = x_NE.new_zeros(keep.shape[0], *x_NE.shape[1:])
        return out.index_put((keep.nonzero().squeeze(-1),), x_NE)


def _hf_model(model):
    """The transformers model inside wrappers (DDP, PEFT): the first module defined in a
    transformers.models package."""
    for module in model.modules():
        if type(module).__module__.startswith("transformers.models."):
            return module
    return None


def cannot_pack(model) -> str | None:
    """Why `model`'s attention cannot run packed rows, or None when it can: a transformers model
    whose modeling code builds its mask with `masking_utils.create_causal_mask` (which detects
    packed positions) under an attention implementation that honours it."""
    hf = _hf_model(model)
    if hf is None:
        return f"{type(model).__name__} is not a transformers model"
    attn = getattr(hf.config, "_attn_implementation", None)
    if attn not in PACKED_ATTENTION:
        return f"attention implementation {attn!r} has no packed-sequence path"
    if not hasattr(sys.modules.get(type(hf).__module__), "create_causal_mask"):
        return f"{type(hf).__name__} does not build its mask with transformers' create_causal_mask"
    return None


def resolve_packing(setting: str, model, device: str, compiled: bool) -> tuple[bool, str]:
    """(pack?, the setup line's text) for `train.packing` `setting` ('auto' | 'on' | 'off') on
    `model` running on `device` ('cpu', 'cuda', ...). Packing requested where the attention
    cannot do it, or with train.compile (buckets of padded widths), falls back to padding, said
    in the line."""
    if setting == "off":
        return False, "forwards: padded rows (train.packing: off)"
    if compiled:
        return False, f"forwards: padded rows (train.packing: {setting} falls back: train.compile pads to buckets)"
    why = cannot_pack(model)
    if why is not None:
        return False, f"forwards: padded rows (train.packing: {setting} falls back: {why})"
    kind = torch.device(device).type
    attn = _hf_model(model).config._attn_implementation
    if setting == "on":
        return True, f"forwards: packed rows, padding-free ({attn} attention on {kind}, train.packing: on)"
    if (kind, attn) not in AUTO_PACKS:
        return False, (
            f"forwards: padded rows (train.packing: auto; {attn} attention on {kind} packs, but was not "
            "measured faster there: benchmarks/README.md)"
        )
    return True, f"forwards: packed rows, padding-free ({attn} attention on {kind}, train.packing: auto)"
