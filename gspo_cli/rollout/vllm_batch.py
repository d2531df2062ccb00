"""vLLM's completions as the hf engine's batch (`to_batch`): left-padded prompts, right-padded
responses cut at the first stop id, the sampler's log-probs and, with routing replay, the routed
experts. Both vLLM engines (in-process and server) lay their answers out here."""

from __future__ import annotations

import torch

from gspo_cli.errors import RunError, SpecError
from gspo_cli.models.engine_routes import route_rows, routes_from_vllm
from gspo_cli.rollout.base import RolloutBatch


def to_batch(
    prompt_ids: list[list[int]],
    completions,
    tok,
    device,
    stop_ids: list[int],
    with_routes: bool = False,
    prompt_routes: list | None = None,
    moe_layers: list[int] | None = None,
    num_experts: int | None = None,
) -> RolloutBatch:
    """The hf engine's layout: left-padded prompts (width P), right-padded responses (C).
    vLLM ends each completion at its first stop id (kept as its last token) or at
    max_tokens; the hf engine's mask rule (up to and including the first stop) is enforced
    here too, so a stop id vLLM let through (none should) cannot extend a response.
    `with_routes`: also each completion's `routed_experts` (with the request's
    `prompt_routed_experts` where given, per row), as (L, B, P+C, k) routes of the decoder
    layers `moe_layers` (gspo_cli.models.engine_routes); RunError, one line, when they do not
    fit the batch or the model (`num_experts`)."""
    B, P = len(prompt_ids), max(len(p) for p in prompt_ids)
    C = max(1, max(len(c.token_ids) for c in completions))
    pad = tok.pad_token_id
    rows_ids, rows_attn, rows_logp, truncated = [], [], [], []
    stops, texts, kept = set(stop_ids), [], []
    for ids, c in zip(prompt_ids, completions):  # Python lists, one tensor each at the end
        resp = list(c.token_ids)  # ends with a stop id unless max_tokens stopped it
        first = next((j for j, t in enumerate(resp) if t in stops), None)
        resp = resp if first is None else resp[: first + 1]
        left, right = P - len(ids), C - len(resp)
        rows_ids.append([pad] * left + list(ids) + resp + [pad] * right)
        rows_attn.append([0] * left + [1] * (len(ids) + len(resp)) + [0] * right)
        rows_logp.append([c.logprobs[j][t].logprob for j, t in enumerate(resp)] + [0.0] * right)
        truncated.append(first is None)
        texts.append(tok.decode(resp, skip_special_tokens=True))
        kept.append(len(resp))
    input_ids = torch.tensor(rows_ids, dtype=torch.long)
    attn = torch.tensor(rows_attn, dtype=torch.long)
    logp = torch.tensor(rows_logp, dtype=torch.float32)
    truncated = torch.tensor(truncated, dtype=torch.bool)
    routes = None
    if with_routes:
        prompt_routes = prompt_routes or [None] * B
        if any(c.routed_experts is None and pr is None for c, pr in zip(completions, prompt_routes)):
            raise SpecError(
                "routing_replay: r3: vLLM returned no routed experts for this batch "
                "(enable_return_routed_experts is set; is the model an MoE vLLM routes?)"
            )
        try:
            # one routed position per prompt token and kept response token, but the last
            routed = [
                route_rows(c.routed_experts, pr, len(ids), len(c.token_ids))[: len(ids) + n - 1]
                for ids, c, n, pr in zip(prompt_ids, completions, kept, prompt_routes)
            ]
            routes = routes_from_vllm(
                routed, [len(p) for p in prompt_ids], kept, P, C, moe_layers=moe_layers, num_experts=num_experts
            ).to(device)
        except ValueError as err:
            raise RunError(f"routing_replay: r3: vLLM's routed experts: {err}") from None
    return RolloutBatch(
        input_ids=input_ids.to(device),
        attention_mask=attn.to(device),
        response_mask=attn[:, P:].float().to(device),
        prompt_len=P,
        completions=texts,
        truncated=truncated.to(device),
        engine_logp=logp.to(device),
        engine_routes=routes,
    )


def ids_and_logprobs(completion) -> tuple[list[int], list[float]]:
    ids = list(completion.token_ids)
    return ids, [completion.logprobs[j][t].logprob for j, t in enumerate(ids)]
