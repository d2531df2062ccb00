"""Multi-turn rollouts with tools through vLLM (`task.environment` with `rollout.engine: vllm`
or `vllm-server`): the same turns, limits, tool messages and batch as the hf engine's
(rollout/turns.py, whose bookkeeping this shares), sampled a round at a time.

Each round sends every unfinished row's token ids (its prompt, then every id of its response
so far: the model's as the engine returned them, the tool messages' as tokenised on their
own) to the engine as a token prompt, never text: nothing is re-tokenised
(token-in-token-out). The engine samples up to the row's budget, min(max_new_tokens - the
model's tokens so far, max_total_tokens - the response so far), and stops at the
checkpoint's stop ids and, for raw prompts (the built-in format), at every token whose text
holds a backtick. The turn ends by the hf engine's rule, read token by token: a stop id, or
a backtick token that closes a ```python block; a backtick that closes none (the opening
fence, code) ends only the round, and the next round continues the same turn from there. A
sample cut where a rule ends it is distributed exactly as one sampled under that rule, so
both engines sample the same process. The environments of rows whose turn ended then answer
(several at once, each call bounded by task.environment_timeout_s), their tool messages are
appended, and the next round starts.

The batch holds the engine's log-probs of the model's tokens (0 on tool tokens, like every
padding; `rollout/logprob_diff_*` compares them with the trainer's on the model's tokens). No
entropies (vLLM returns none) and no routes (R3 is refused with task.environment; R2 records
the trainer's own). Refused: tensor parallelism under torchrun (its members sample in lock step,
and rows take different numbers of rounds).
"""

from __future__ import annotations

import torch

from gspo_cli.errors import RunError, SpecError
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.rollout.turn_taking import TurnTaking, _Row


class VLLMTurnEngine(TurnTaking):
    """Samples with a vLLM engine (colocated or server; its `sample_ids`), in turns."""

    def __init__(self, base, make_env, **limits):
        if getattr(base, "tp", 1) > 1 and getattr(base, "shares_world", False):
            raise SpecError(
                "task.environment: multi-turn rollouts with rollout.vllm.tensor_parallel_size > 1 under "
                "torchrun are not supported (the group samples in lock step); use tensor_parallel_size 1"
            )
        super().__init__(base, make_env, **limits)
        self.round_stops = list(base.stop_ids) + (fence_ids(self.tokenizer) if self.raw else [])

    def generate(self, prompts: list, problems: list | None = None) -> RolloutBatch:
        base = self.base
        base.sync_if_stale()
        rows, prompt_ids = self._start(prompts, problems)
        stops = set(base.stop_ids)
        rounds = 0
        while live := [i for i, r in enumerate(rows) if not r.done]:
            budgets = [
                min(self.max_new_tokens - rows[i].model_tokens, self.max_total_tokens - len(rows[i].ids)) for i in live
            ]
            outs = base.sample_ids([prompt_ids[i] + rows[i].ids for i in live], budgets, self.round_stops, rounds)
            rounds += 1
            ended = [i for i, (ids, logps) in zip(live, outs) if self._take(rows[i], ids, logps, stops)]
            self._answer(rows, ended)
            for i in ended:
                self._feed(rows[i])
        model = getattr(base, "model", None)
        device = next(model.parameters()).device if model is not None else torch.device("cpu")
        pad = self._pad_id()
        ids, attn = self._left_padded(prompt_ids, pad, device)
        self._finish(rows)
        return self._batch(rows, ids, attn, pad, logprobs=True, entropy=False)

    def _take(self, r: _Row, ids: list[int], logps: list[float], stops: set) -> bool:
        """Append the round's sampled tokens to row `r` up to where the turn or a limit ends it
        (the engine stops there; anything past is dropped, never kept); True when the row's
        environment must answer now."""
        if not ids:  # the budget is at least 1 token: a bug, never a silent loop
            raise RunError(f"task.environment: the vLLM engine returned no token for a budget of {self.max_new_tokens}")
        for t, lp in zip(ids, logps):
            r.ids.append(t), r.tool.append(0), r.logp.append(float(lp)), r.entropy.append(0.0)
            r.model_tokens += 1
            ev = self._turn_end(r, t, stops)
            if self._after_token(r, ev):
                return True
            if r.done:
                return False
        return False  # a round that ended inside the turn (a backtick, no call closed): the next continues it

    def _feed(self, r: _Row) -> None:
        """The tool message `_after_turn` queued, appended as the environment's tokens."""
        while r.forced and not r.done:
            r.ids.append(r.forced.popleft()), r.tool.append(1), r.logp.append(0.0), r.entropy.append(0.0)
            self._after_token(r, [])  # max_total_tokens may end the row here
        r.turn_start = len(r.ids)


def fence_ids(tokenizer) -> list[int]:
    """Every token whose text holds a backtick: where a ```python block can close (the hf
    engine's turns.py checks its rule at exactly these tokens)."""
    vocab = range(len(tokenizer))
    return [i for i, text in zip(vocab, tokenizer.batch_decode([[i] for i in vocab])) if "`" in text]
