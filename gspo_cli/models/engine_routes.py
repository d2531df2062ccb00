"""Routes as an inference engine reports them (vLLM's routed experts), converted to the
trainer's (L, B, T, k) layout for routing replay R3.

vLLM (0.32, read from its source) returns, per request, `routed_experts`: an array
[positions, num_hidden_layers, top_k] with one row per position its model routed, prompt first,
indexed by DECODER layer (dense layers included, with meaningless ids), uint8 when the model
has at most 256 experts, else uint16. The final sampled token is never fed back, so it has no
row: prompt + response - 1 rows. Some releases return the prompt's rows separately, as the
request's `prompt_routed_experts` (prompt rows) beside the completion's response - 1 rows.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["route_rows", "routes_from_vllm"]


def route_rows(completion_routes, prompt_routes, prompt_len: int, response_len: int) -> np.ndarray:
    """One sequence's routed rows, prompt first: (prompt_len + response_len - 1, L_dec, k).

    `completion_routes` is the completion's `routed_experts`; `prompt_routes` the request's
    `prompt_routed_experts` where this vLLM fills it (None otherwise: then, or when the
    completion's rows already cover the prompt, those are used alone). `response_len` counts
    the response tokens vLLM generated (rows beyond a caller's own cut are the caller's to
    drop). ValueError, one line, when the row counts fit neither layout."""
    if completion_routes is None and prompt_routes is not None:  # a 1-token response routes nothing
        completion_routes = np.zeros((0, *np.asarray(prompt_routes).shape[1:]), dtype=np.int64)
    rows = np.asarray(completion_routes)
    full = prompt_len + response_len - 1
    if prompt_routes is None or rows.shape[0] == full:
        if rows.shape[0] != full:
            raise ValueError(
                f"{rows.shape[0]} routed positions for a {prompt_len}-token prompt and a {response_len}-token "
                f"response; expected prompt + response - 1 = {full}"
            )
        return rows
    prompt = np.asarray(prompt_routes)
    if prompt.shape[0] != prompt_len or rows.shape[0] != response_len - 1 or prompt.shape[1:] != rows.shape[1:]:
        raise ValueError(
            f"prompt routes {tuple(prompt.shape)} and response routes {tuple(rows.shape)} do not fit a "
            f"{prompt_len}-token prompt and a {response_len}-token response (expected {prompt_len} and "
            f"{response_len - 1} rows, same layers and top-k)"
        )
    return np.concatenate([prompt, rows], axis=0)


def routes_from_vllm(
    routed: list,
    prompt_lens: list[int],
    response_lens: list[int],
    P: int,
    C: int,
    *,
    moe_layers: list[int] | None = None,
    num_experts: int | None = None,
) -> torch.Tensor:
    """vLLM's routed experts for B sequences as the trainer's (L, B, P+C, k) routes.

    ``routed[b]``: row b's routed rows in sequence order, prompt first (`route_rows`), of
    shape (prompt_lens[b] + response_lens[b] - 1, L_dec, k), any integer dtype (vLLM's
    uint8/uint16 included). `moe_layers`: the decoder layers holding a router, in order
    (`RoutingController.decoder_layers`); the others (dense) are dropped, so L =
    len(moe_layers); None keeps every layer. The batch layout is the hf engine's: row b's
    prompt is left-padded to width P, its response starts at column P; sequence position j
    lands in column P - prompt_lens[b] + j. Columns nothing routed (left padding, each row's
    last token, right padding) get experts 0..k-1: any valid experts do, since no response
    log-prob depends on them. int16 (int32 past 32767 experts). ValueError, one line, on any
    other shape, a decoder layer count `moe_layers` does not fit, or an expert id outside
    [0, num_experts) when that is given (checked on the MoE layers only: a dense layer's ids
    mean nothing).
    """
    B = len(routed)
    if not (len(prompt_lens) == len(response_lens) == B) or B == 0:
        raise ValueError(
            f"routed experts for {B} rows, prompt lengths {len(prompt_lens)}, response lengths {len(response_lens)}"
        )
    # int64 first: torch has no arithmetic on uint16, and uint8 ids would wrap in int8.
    arrays = [torch.from_numpy(np.asarray(r).astype(np.int64)) for r in routed]
    if any(a.dim() != 3 for a in arrays) or len({tuple(a.shape[1:]) for a in arrays}) != 1:
        raise ValueError(
            f"routed experts must be (tokens, layers, top_k) alike in every row, got "
            f"{sorted({tuple(a.shape) for a in arrays})}"
        )
    L_dec, k = arrays[0].shape[1:]
    if moe_layers is not None:
        if not moe_layers or max(moe_layers) >= L_dec:
            raise ValueError(
                f"routed experts cover {L_dec} decoder layers, but the model's routers sit in layers "
                f"{list(moe_layers)}: the engine's model is not the trainer's"
            )
        keep = torch.tensor(list(moe_layers))
        arrays = [a.index_select(1, keep) for a in arrays]
    L = arrays[0].shape[1]
    dtype = torch.int16 if num_experts is None or num_experts <= 2**15 else torch.int32
    out = torch.arange(k, dtype=dtype).expand(L, B, P + C, k).clone()
    for b, (a, p, r) in enumerate(zip(arrays, prompt_lens, response_lens)):
        if not (1 <= p <= P and 0 <= r <= C) or a.shape[0] != p + r - 1:
            raise ValueError(
                f"row {b}: {a.shape[0]} routed positions for a {p}-token prompt (width {P}) and "
                f"a {r}-token response (width {C}); expected prompt + response - 1 = {p + r - 1}"
            )
        if num_experts is not None and a.numel() and (int(a.min()) < 0 or int(a.max()) >= num_experts):
            raise ValueError(
                f"row {b}: expert id {int(a.max()) if int(a.max()) >= num_experts else int(a.min())} outside "
                f"[0, {num_experts}) (the model's expert count): the engine's routes do not belong to this model"
            )
        out[:, b, P - p : P - p + a.shape[0]] = a.permute(1, 0, 2).to(dtype)
    return out
