"""What every rollout engine returns, and the log-prob pass shared by old and new policies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.utils.checkpoint

from gspo_cli.algorithms.precision import upcast


@dataclass
class RolloutBatch:
    """B sampled sequences: left-padded prompts (width P) then right-padded responses (width C)."""

    input_ids: torch.Tensor  # (B, P+C) long
    attention_mask: torch.Tensor  # (B, P+C) long, 0 on padding on either side
    response_mask: torch.Tensor  # (B, C) float, 1 on generated tokens up to and including EOS
    prompt_len: int  # P
    completions: list[str]  # decoded responses, special tokens removed
    truncated: torch.Tensor  # (B,) bool, True where no EOS was produced
    # (B, C) float32: the sampler's own log-prob of each response token (temperature applied),
    # 0 on padding; None for engines that sample with the trainer's model (hf).
    engine_logp: torch.Tensor | None = None
    # hf with sampler_logprobs only: (B, C) per-token entropy and (L, B, P+C, k) MoE routes
    # of the sampling forward passes (column P+C-1 has none: see routes_from_generate).
    engine_entropy: torch.Tensor | None = None
    engine_routes: torch.Tensor | None = None
    # (B, C) float32: one full forward of the weights that sampled, when the sampler ran it
    # (the async worker of rollout.staleness, on logprob-check steps); None otherwise.
    check_logp: torch.Tensor | None = None
    # Multi-turn rollouts (rollout/turns.py): (B, C) float, 1 on the environment's tokens (tool
    # output inserted between the model's turns); None: every response token is the model's.
    tool_mask: torch.Tensor | None = None
    # Multi-turn rollouts: each row's turns [{"role": "model" | "tool", "content": text}] and
    # its counts {"turns", "tool_calls", "tool_errors", "tool_timeouts"}; None otherwise.
    turns: list[list[dict]] | None = None
    tool_counts: list[dict] | None = None

    @property
    def model_mask(self) -> torch.Tensor:
        """(B, C) 1 on the tokens the model sampled: what every loss, its denominator (GSPO's
        |y|), ratio, clip statistic, KL, filter and correction counts. `response_mask` covers
        the environment's tokens too (attention, trimming, routes). The very same tensor as
        `response_mask` for a single-turn batch."""
        if self.tool_mask is None:
            return self.response_mask
        return self.response_mask * (1 - self.tool_mask)

    @property
    def position_ids(self) -> torch.Tensor:
        # Left padding: positions must count real tokens only, as generate() does.
        return (self.attention_mask.cumsum(-1) - 1).clamp(min=0)

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]

    @property
    def completion_ids(self) -> list[list[int]]:
        """Each response's token ids, padding removed (EOS kept), as TRL hands them to rewards."""
        return [row[m > 0].tolist() for row, m in zip(self.response_ids, self.response_mask)]

    def trimmed(self) -> tuple["RolloutBatch", int, int]:
        """This batch without the columns that are padding in every row: leading prompt columns
        (left padding) and response columns past the longest response. Returns (batch, lo, c):
        the new batch holds input columns lo .. P+c-1 and response columns 0 .. c-1 of this one.
        Every row's log-probs, routes and losses are those of the untrimmed batch (positions come
        from the attention mask; padding is masked either way); the forward and backward of a
        mini-batch just skip what its own rows do not need."""
        P = self.prompt_len
        first = self.attention_mask[:, :P].bool().any(0).nonzero()
        lo = min(int(first[0, 0]), P - 1) if first.numel() else P - 1  # column P-1 predicts the first response token
        resp_C = (self.response_mask > 0).any(0).nonzero()
        c = int(resp_C[-1, 0]) + 1 if resp_C.numel() else 1
        if lo == 0 and c == self.response_mask.shape[1]:
            return self, 0, c
        hi = P + c

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:, :c]

        return (
            RolloutBatch(
                input_ids=self.input_ids[:, lo:hi],
                attention_mask=self.attention_mask[:, lo:hi],
                response_mask=self.response_mask[:, :c],
                prompt_len=P - lo,
                completions=self.completions,
                truncated=self.truncated,
                engine_logp=cut(self.engine_logp),
                engine_entropy=cut(self.engine_entropy),
                engine_routes=None if self.engine_routes is None else self.engine_routes[:, :, lo:hi],
                check_logp=cut(self.check_logp),
                tool_mask=cut(self.tool_mask),
                turns=self.turns,
                tool_counts=self.tool_counts,
            ),
            lo,
            c,
        )

    def rows(self, idx: torch.Tensor, sampler: bool = True) -> "RolloutBatch":
        """The rows `idx`. `sampler=False` leaves out what the sampler recorded (its log-probs,
        entropy, routes), which a trainer's forward does not read: on a large MoE with R3 the
        routes alone are layers x rows x tokens x k integers, not worth copying per mini-batch."""

        def pick(t: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
            return None if t is None or not sampler else t.index_select(dim, idx)

        return RolloutBatch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            response_mask=self.response_mask[idx],
            prompt_len=self.prompt_len,
            completions=[self.completions[i] for i in idx.tolist()],
            truncated=self.truncated[idx],
            engine_logp=pick(self.engine_logp),
            engine_entropy=pick(self.engine_entropy),
            engine_routes=pick(self.engine_routes, 1),
            check_logp=pick(self.check_logp),
            tool_mask=None if self.tool_mask is None else self.tool_mask[idx],
            turns=None if self.turns is None else [self.turns[i] for i in idx.tolist()],
            tool_counts=None if self.tool_counts is None else [self.tool_counts[i] for i in idx.tolist()],
        )


class RolloutEngine(Protocol):
    """What the trainer and evaluation need from a sampler."""

    tokenizer: object

    def generate(self, prompts: list[str]) -> RolloutBatch: ...


@dataclass
class LogProbs:
    logp: torch.Tensor  # (B, C) float32; values on padding are meaningless: callers mask
    entropy: torch.Tensor | None = None  # (B, C) per-token entropy, when asked for
    aux_loss: torch.Tensor | None = None  # MoE router load-balancing loss, when the model computes it
    router_logits: tuple | None = None  # MoE: per layer (B*T, E), when the model returns them (aux loss on)


# Largest float32 logits (rows x vocab x 4 bytes) one chunk of `response_logprobs` builds:
# 64 MiB is ~110 positions of Qwen3's 151,936-token vocabulary.
LOGITS_CHUNK_BYTES = 1 << 26


def response_logprobs(
    model,
    batch: RolloutBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_bytes: int | None = None,
    packed: bool = False,
) -> LogProbs:
    """Log-probabilities (and entropy) of the response tokens under `model`.

    Logits are divided by `temperature`: the distribution the sampler actually used. The
    full-vocabulary logits are never built for the whole batch: the output head runs on the
    final hidden states of the response positions in chunks of at most `chunk_bytes`
    (default LOGITS_CHUNK_BYTES) of float32 logits, each reduced at once to the sampled
    token's log-prob (and the entropy) and, when gradients are on, recomputed in the backward
    pass (activation checkpointing per chunk), so neither forward nor backward holds more
    than one chunk's logits. Values equal a whole-batch log-softmax (float rounding).

    `packed` (train.packing, rollout/packing.py): the rows run as one padding-free row; the
    results come back in the (B, C) layout (0 at padding), router logits as (B*T, E) per layer.
    """
    head = _output_head(model)
    P = batch.prompt_len
    if packed:
        return _logprobs_packed(model, head, batch, temperature, with_entropy, chunk_bytes)
    if head is None:  # a head we cannot wrap (or logits post-processed after it): the whole batch
        return _logprobs_whole(model, batch, temperature, with_entropy)
    ids_BC = batch.response_ids
    rows = max(1, (chunk_bytes or LOGITS_CHUNK_BYTES) // (4 * head.out_features))
    plain_forward = head.forward

    def reduced_head(hidden_BTH: torch.Tensor) -> torch.Tensor:
        # Runs inside the model's own forward (FSDP: while the head's weights are gathered);
        # returns (B, C, 1 or 2) in place of the (B, T, V) logits.
        h_BCH = hidden_BTH[:, P - 1 : -1]  # position t predicts token t+1
        out = _chunked_token_logprobs(plain_forward, h_BCH, ids_BC, temperature, with_entropy, rows)
        return torch.stack(out, -1)

    head.forward = reduced_head  # an instance attribute: the class's forward is back after
    try:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
    finally:
        del head.forward
    res_BCk = out.logits
    return LogProbs(
        logp=res_BCk[..., 0],
        entropy=res_BCk[..., 1] if with_entropy else None,
        aux_loss=getattr(out, "aux_loss", None),
        router_logits=getattr(out, "router_logits", None),
    )


def _output_head(model) -> torch.nn.Linear | None:
    """The LM head the model's forward calls on its final hidden states, when its output is
    the logits as they are (no soft-capping or scaling after it)."""
    bare = getattr(model, "module", model)  # DDP wraps; FSDP2 shards in place
    get = getattr(bare, "get_output_embeddings", None)
    head = get() if get is not None else None
    config = getattr(bare, "config", None)
    post = getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None)
    if not isinstance(head, torch.nn.Linear) or post or "forward" in vars(head):
        return None
    return head


def _chunked_token_logprobs(head_fn, h_BCH, ids_BC, temperature, with_entropy, rows):
    """[(B, C) log-prob of ids_BC] (+ [(B, C) entropy]) from hidden states (B, C, H), `rows`
    positions per chunk."""
    B, C, H = h_BCH.shape
    h_NH, ids_N = h_BCH.reshape(B * C, H), ids_BC.reshape(B * C)
    recompute = torch.is_grad_enabled() and h_NH.requires_grad
    parts = []
    for h, ids in zip(h_NH.split(rows), ids_N.split(rows)):
        if recompute:
            part = torch.utils.checkpoint.checkpoint(
                _token_logprobs, head_fn, h, ids, temperature, with_entropy, use_reentrant=False
            )
        else:
            part = _token_logprobs(head_fn, h, ids, temperature, with_entropy)
        parts.append(part)
    return [torch.cat(cols).reshape(B, C) for cols in zip(*parts)]


def _token_logprobs(head_fn, h_NH, ids_N, temperature, with_entropy):
    logprobs_NV = torch.log_softmax(upcast(head_fn(h_NH)) / temperature, dim=-1)
    logp_N = logprobs_NV.gather(-1, ids_N.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return (logp_N,)
    return logp_N, -(logprobs_NV.exp() * logprobs_NV).sum(-1)


def _logprobs_packed(model, head, batch: RolloutBatch, temperature, with_entropy, chunk_bytes) -> LogProbs:
    """`response_logprobs` of the rows packed into one (rollout/packing.py): the head runs on
    the hidden states that predict a real response token (M of them), in chunks as above."""
    from gspo_cli.rollout.packing import Packing

    packing = Packing.of(batch)
    P = batch.prompt_len
    keep = packing.keep_BT
    predicts_BC = keep[:, P - 1 : -1] & keep[:, P:]  # a real response token and a real predictor
    src_M = packing.index_BT()[:, P - 1 : -1][predicts_BC]
    ids_M = batch.response_ids[predicts_BC]
    k = 2 if with_entropy else 1
    if head is None:
        out = model(**packing.inputs(batch), use_cache=False)
        res_Mk = torch.stack(_token_logprobs(lambda h: h, out.logits[0, src_M], ids_M, temperature, with_entropy), -1)
    else:
        rows = max(1, (chunk_bytes or LOGITS_CHUNK_BYTES) // (4 * head.out_features))
        plain_forward = head.forward

        def reduced_head(hidden_1NH: torch.Tensor) -> torch.Tensor:  # (1, M, k) for the logits
            h_1MH = hidden_1NH[:, src_M.to(hidden_1NH.device)]
            ids = ids_M.to(hidden_1NH.device)[None]
            return torch.stack(_chunked_token_logprobs(plain_forward, h_1MH, ids, temperature, with_entropy, rows), -1)

        head.forward = reduced_head
        try:
            out = model(**packing.inputs(batch), use_cache=False)
        finally:
            del head.forward
        res_Mk = out.logits[0]
    res_BCk = res_Mk.new_zeros(*predicts_BC.shape, k).index_put((predicts_BC.to(res_Mk.device),), res_Mk)
    router = getattr(out, "router_logits", None)
    return LogProbs(
        logp=res_BCk[..., 0],
        entropy=res_BCk[..., 1] if with_entropy else None,
        aux_loss=getattr(out, "aux_loss", None),
        router_logits=None if router is None else tuple(packing.rows_out(r) for r in router),
    )


def _logprobs_whole(model, batch: RolloutBatch, temperature: float, with_entropy: bool) -> LogProbs:
    """`response_logprobs` from the model's whole (B, T, V) logits (heads we cannot chunk)."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids, use_cache=False
    )
    P = batch.prompt_len
    logits = upcast(out.logits[:, P - 1 : -1]) / temperature  # (B, C, V)
    logprobs = torch.log_softmax(logits, dim=-1)
    logp_BC = logprobs.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    ent_BC = -(logprobs.exp() * logprobs).sum(-1) if with_entropy else None
    return LogProbs(
        logp=logp_BC,
        entropy=ent_BC,
        aux_loss=getattr(out, "aux_loss", None),
        router_logits=getattr(out, "router_logits", None),
    )


def logprob_gaps(engine_logp_BC: torch.Tensor, trainer_logp_BC: torch.Tensor, mask_BC: torch.Tensor) -> torch.Tensor:
    """|engine - trainer| log-prob (nats, float32) of every response token, flat (N,): the
    sampler/trainer gap that biases every importance ratio before any update. Both (B, C)."""
    return (upcast(engine_logp_BC) - upcast(trainer_logp_BC)).abs()[mask_BC > 0]


def logprob_mismatch(
    engine_logp_BC: torch.Tensor, trainer_logp_BC: torch.Tensor, mask_BC: torch.Tensor
) -> dict[str, float]:
    """Mean and max of `logprob_gaps` over response tokens (nats); an empty mask gives zeros."""
    diff = logprob_gaps(engine_logp_BC, trainer_logp_BC, mask_BC)
    if diff.numel() == 0:
        return {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0}
    return {"rollout/logprob_diff_mean": diff.mean().item(), "rollout/logprob_diff_max": diff.max().item()}


def check_due(every: int, step: int) -> bool:
    """Whether step `step` compares the sampler's log-probs with a full forward
    (rollout.logprob_check_every = `every`): at step 1 and every `every` steps; never for 0."""
    return every > 0 and (step == 1 or step % every == 0)


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Rows of several rollout batches as one: prompts left-padded to the widest, responses
    right-padded. The sampler's log-probs, entropy, full-forward check log-probs and engine
    routes travel when every batch has them (0 on padding, as engines write them; a route's
    padded columns name experts 0..k-1, which no real token reads)."""
    if len(batches) == 1:
        return batches[0]
    P = max(b.prompt_len for b in batches)
    C = max(b.response_mask.shape[1] for b in batches)

    def pad(b: RolloutBatch, t: torch.Tensor, value) -> torch.Tensor:
        """(B, P_b + C_b) -> (B, P + C): left pad the prompt part, right pad the response."""
        left = t.new_full((t.shape[0], P - b.prompt_len), value)
        right = t.new_full((t.shape[0], C - b.response_mask.shape[1]), value)
        return torch.cat([left, t, right], dim=1)

    def resp(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros((t.shape[0], C - t.shape[1]))], dim=1)

    def opt(name: str) -> torch.Tensor | None:
        parts = [getattr(b, name) for b in batches]
        return None if any(p is None for p in parts) else torch.cat([resp(p) for p in parts])

    def routes() -> torch.Tensor | None:
        parts = [b.engine_routes for b in batches]
        if any(p is None for p in parts):
            return None
        L, _, _, k = parts[0].shape
        fill = torch.arange(k, dtype=parts[0].dtype, device=parts[0].device)

        def widen(b: RolloutBatch, r: torch.Tensor) -> torch.Tensor:
            left = fill.expand(L, r.shape[1], P - b.prompt_len, k)
            right = fill.expand(L, r.shape[1], C - b.response_mask.shape[1], k)
            return torch.cat([left, r, right], dim=2)

        return torch.cat([widen(b, r) for b, r in zip(batches, parts)], dim=1)

    return RolloutBatch(
        input_ids=torch.cat([pad(b, b.input_ids, pad_id) for b in batches]),
        attention_mask=torch.cat([pad(b, b.attention_mask, 0) for b in batches]),
        response_mask=torch.cat([resp(b.response_mask) for b in batches]),
        prompt_len=P,
        completions=[c for b in batches for c in b.completions],
        truncated=torch.cat([b.truncated for b in batches]),
        engine_logp=opt("engine_logp"),
        engine_entropy=opt("engine_entropy"),
        check_logp=opt("check_logp"),
        engine_routes=routes(),
        tool_mask=None
        if all(b.tool_mask is None for b in batches)
        else torch.cat([resp(b.response_mask * 0 if b.tool_mask is None else b.tool_mask) for b in batches]),
        turns=None if any(b.turns is None for b in batches) else [t for b in batches for t in b.turns],
        tool_counts=None
        if any(b.tool_counts is None for b in batches)
        else [t for b in batches for t in b.tool_counts],
    )
