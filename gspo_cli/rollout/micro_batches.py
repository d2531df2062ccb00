"""Micro-batches (`train.micro_batch_tokens`, `train.micro_batch_rows`): how the rows of a
mini-batch (or of the step's batch, for a no-grad forward) are split so that no forward holds
more than a budget of real tokens or rows, per process.

A row's tokens are its real prompt and response tokens, not the padding a forward adds. Rows
are never split. The packing is balanced: the fewest micro-batches the budget allows (more
only when the rows do not fit), filled longest row first into the micro-batch holding the
fewest tokens (LPT), so every forward is about as large as the others. A row longer than the
token budget runs alone: it is counted (`oversize`), never refused.

Under torchrun every process must run as many forwards as the others (FSDP gathers each
layer's weights collectively, its backwards reduce-scatter, DDP's last one all-reduces), so a
process with fewer micro-batches pads with forwards of weight 0 (`padded_count`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo


@dataclass
class Split:
    """A split of some rows: `parts` (row-index tensors, in the caller's indexing) and how many
    of those rows were longer than the token budget (each alone in its part)."""

    parts: list[torch.Tensor]
    oversize: int = 0


def row_tokens(batch) -> torch.Tensor:
    """(B,) each row's real tokens, a RolloutBatch's: prompt (attention mask) and response
    (response mask), no padding."""
    P = batch.prompt_len
    return batch.attention_mask[:, :P].sum(-1).cpu() + (batch.response_mask > 0).sum(-1).cpu()


def split_rows(rows: torch.Tensor, tokens_B: torch.Tensor, max_tokens: int | None, max_rows: int | None) -> Split:
    """`rows` (indices into `tokens_B`) packed into micro-batches of at most `max_tokens` tokens
    and `max_rows` rows (None: no bound), each part's rows in the order `rows` gives them."""
    rows = torch.as_tensor(rows)
    if (max_tokens is None and max_rows is None) or rows.numel() == 0:
        return Split([rows])
    length = tokens_B[rows].tolist()
    order = list(range(len(length)))
    big = [i for i in order if max_tokens is not None and length[i] > max_tokens]
    rest = [i for i in order if i not in set(big)]
    bins = _pack(rest, length, max_tokens, max_rows) + [[i] for i in big]
    return Split([rows[sorted(b)] for b in bins if b], oversize=len(big))


def _pack(items: list[int], length: list[int], max_tokens: int | None, max_rows: int | None) -> list[list[int]]:
    """Longest first into the least-loaded bin with room; one more bin whenever one does not fit."""
    if not items:
        return []
    total = sum(length[i] for i in items)
    k = max(1, math.ceil(total / max_tokens) if max_tokens else 1, math.ceil(len(items) / max_rows) if max_rows else 1)
    longest_first = sorted(items, key=lambda i: -length[i])
    while True:
        bins: list[list[int]] = [[] for _ in range(k)]
        load = [0] * k
        for i in longest_first:
            room = [
                b
                for b in range(k)
                if (max_tokens is None or load[b] + length[i] <= max_tokens)
                and (max_rows is None or len(bins[b]) < max_rows)
            ]
            if not room:
                break
            b = min(room, key=lambda b: (load[b], len(bins[b]), b))
            bins[b].append(i)
            load[b] += length[i]
        else:
            return bins
        k += 1


def padded_count(n: int, info: DistInfo) -> int:
    """The number of micro-batches every process runs: the largest `n` over processes."""
    if not info.enabled:
        return n
    return max(distributed.gather_objects(n, info))


def forward_logprobs(
    model,
    batch,
    temperature: float,
    max_tokens: int | None,
    max_rows: int | None,
    *,
    routing=None,
    info: DistInfo = DistInfo(),
    with_entropy: bool = False,
    replay_BT=None,
    record: bool = False,
    packed: bool = False,
):
    """(LogProbs, routes (L, B, T, k) or None) of a no-grad forward of `model` over `batch` in
    micro-batches of at most `max_tokens` tokens and `max_rows` rows (one forward without a
    bound). `replay_BT` (L, B, T, k): routes every router of `routing` (a RoutingController) is
    forced to take (R3); `record`: the routes the routers chose, returned. Callers hold
    torch.no_grad() and the compute context. Each micro-batch is trimmed to its own rows'
    columns, so a row's outputs are those of one forward of the whole batch; recorded routes at
    columns a micro-batch trimmed (that row's padding, which no loss reads and no real token
    attends to) are experts 0..k-1. `packed`: each micro-batch runs as one padding-free row
    (rollout/packing.py), the same outputs (padding columns' routes: experts 0..k-1 too)."""
    from gspo_cli.models.routing import routes_from_BT, routes_to_BT
    from gspo_cli.rollout.base import LogProbs, response_logprobs
    from gspo_cli.rollout.packing import Packing

    B, T = batch.input_ids.shape
    if max_tokens is None and max_rows is None:
        parts, n_real = [torch.arange(B)], 1
    else:
        parts = split_rows(torch.arange(B), row_tokens(batch), max_tokens, max_rows).parts
        n_real = len(parts)
        parts = parts + [parts[0][:1]] * (padded_count(n_real, info) - n_real)  # FSDP: as many on every rank
    logp_BC = entropy_BC = routes_BT = None
    for j, rows in enumerate(parts):
        single = len(parts) == 1  # the whole batch in one forward, untrimmed, as without a budget
        sub, lo, c = (batch, 0, batch.response_mask.shape[1]) if single else batch.rows(rows, False).trimmed()
        hi = batch.prompt_len + c
        packing = Packing.of(sub) if packed else None
        if replay_BT is not None:
            mb_BT = replay_BT if single else replay_BT[:, rows, lo:hi]
            around = routing.replaying(packing.routes_in(mb_BT) if packed else routes_from_BT(mb_BT))
        else:
            around = routing.recording() if record else contextlib.nullcontext()
        with around as rec:
            out = response_logprobs(model, sub, temperature, with_entropy=with_entropy, packed=packed)
        recorded = (packing.routes_out(rec.routes) if packed else rec.routes) if record else None
        if single:
            return out, routes_to_BT(recorded, B, T) if record else None
        if j >= n_real:
            continue
        if logp_BC is None:
            logp_BC = torch.zeros(batch.response_mask.shape, dtype=out.logp.dtype, device=out.logp.device)
            entropy_BC = torch.zeros_like(logp_BC) if with_entropy else None
        logp_BC[rows.to(logp_BC.device), :c] = out.logp[:, :c]
        if with_entropy:
            entropy_BC[rows.to(logp_BC.device), :c] = out.entropy[:, :c]
        if record:
            mb = routes_to_BT(recorded, len(rows), hi - lo)
            if routes_BT is None:
                L, k = mb.shape[0], mb.shape[-1]
                routes_BT = torch.arange(k, dtype=mb.dtype, device=mb.device).expand(L, B, T, k).clone()
            routes_BT[:, rows.to(mb.device), lo:hi] = mb
    return LogProbs(logp=logp_BC, entropy=entropy_BC), routes_BT
