"""samples.jsonl: a few rollouts of a logged step, as the model saw and wrote them.

Every `train.log_samples_every` steps (and at step 1) the trainer keeps, from the first
MAX_GROUPS groups of the step's batch, the best and the worst response of each group (by
reward; one response for a group of one), so at most MAX_GROUPS x PER_GROUP = 8 lines per
logged step. Prompts and completions longer than MAX_CHARS characters are cut there (the
record keeps the full length in `*_chars`). Each line (runs.py lists the fields):

    step, arm, seed, group, index        where the response sits in the step's batch
    prompt                               the prompt tokens decoded, special tokens and chat
                                         template included: exactly what the model continued
    completion                           the decoded response (special tokens removed)
    reward, correct, components          the task's verdict
    advantage                            the group advantage the loss used
    length, truncated                    response tokens; True when no stop token came
    clip_frac, clipped                   share of the response's tokens whose gradient the
                                         arm's clip zeroed, averaged over the updates (epochs)
                                         that saw it (a sequence-ratio loss clips all of a
                                         response's tokens or none); clipped: clip_frac > 0
    masked_frac                          share of its tokens the mismatch correction dropped
                                         (weight 0); null when the arm has no correction
    detail                               only for tasks that give one (code: each test's
                                         verdict and the end of its stderr)

Under torchrun each rank holds its own share of the batch; rank 0 writes its own.
"""

from __future__ import annotations

import torch

MAX_GROUPS = 4  # groups per logged step
PER_GROUP = 2  # the best and the worst response of each group
MAX_CHARS = 2000  # per prompt and per completion


def samples_due(every: int, step: int) -> bool:
    """Whether step `step` writes samples (`train.log_samples_every` = `every`): step 1 and
    every `every` steps; never for 0."""
    return every > 0 and (step == 1 or step % every == 0)


def chosen_rows(rewards_B: torch.Tensor, group_size: int) -> list[int]:
    """Rows of the batch to log: for each of the first MAX_GROUPS groups, its highest-reward
    then its lowest-reward response (the first of equals; one row when they coincide)."""
    rows: list[int] = []
    for g in range(min(MAX_GROUPS, len(rewards_B) // group_size)):
        r = rewards_B[g * group_size : (g + 1) * group_size]
        best, worst = int(torch.argmax(r)), int(torch.argmin(r))
        rows += [g * group_size + i for i in dict.fromkeys((best, worst))][:PER_GROUP]
    return rows


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"


def sample_records(
    batch,
    scores: list,
    rewards_B: torch.Tensor,
    adv_B: torch.Tensor,
    clipped_tokens_B: torch.Tensor,
    weights_BC: torch.Tensor | None,
    tokenizer,
    group_size: int,
) -> list[dict]:
    """The lines samples.jsonl gets for one step, without `step`, `arm` and `seed` (the writer
    adds them; see the module docstring). `batch` a RolloutBatch, `scores` its task Scores,
    `rewards_B` / `adv_B` (B,), `clipped_tokens_B` (B,) each row's clipped-token count per
    update (summed over the epochs, divided by their number), `weights_BC` (B, C) the mismatch
    correction's loss weights or None, `tokenizer` the engine's."""
    P = batch.prompt_len
    lengths_B = batch.model_mask.sum(-1)  # the model's own tokens (multi-turn: tool output apart)
    masked_B = None
    if weights_BC is not None:
        masked_B = ((weights_BC == 0) & (batch.model_mask > 0)).sum(-1).float() / lengths_B.clamp(min=1)
    out = []
    for i in chosen_rows(rewards_B, group_size):
        keep = batch.attention_mask[i, :P] > 0  # left padding is not part of the prompt
        prompt = tokenizer.decode(batch.input_ids[i, :P][keep].tolist(), skip_special_tokens=False)
        completion = batch.completions[i]
        n = int(lengths_B[i])
        clip_frac = float(clipped_tokens_B[i]) / n if n else 0.0
        s = scores[i]
        out.append(
            {
                "group": i // group_size,
                "index": i,
                "prompt": _cut(prompt),
                "prompt_chars": len(prompt),
                "completion": _cut(completion),
                "completion_chars": len(completion),
                "reward": round(float(s.reward), 6),
                "correct": bool(s.correct),
                "components": {k: round(float(v), 6) for k, v in s.components.items()},
                "advantage": round(float(adv_B[i]), 6),
                "length": n,
                "truncated": bool(batch.truncated[i]),
                "clip_frac": round(clip_frac, 6),
                "clipped": clip_frac > 0,
                "masked_frac": None if masked_B is None else round(float(masked_B[i]), 6),
                **({"detail": s.detail} if s.detail else {}),
                **(
                    {}
                    if batch.turns is None
                    else {"turns": [{**t, "content": _cut(t["content"])} for t in batch.turns[i]]}
                ),
                **({} if batch.tool_counts is None else {"tools": batch.tool_counts[i]}),
            }
        )
    return out
