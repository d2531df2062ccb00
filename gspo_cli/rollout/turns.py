"""Multi-turn rollouts with tools (`task.environment`) on the hf engine (MultiTurnEngine: one
KV cache, rows advancing one position per forward, tool tokens forced), and `with_environment`,
which wraps an engine in the multi-turn sampler of its kind (the vLLM engines':
rollout/vllm_turns.py). The bookkeeping both share, and how turns, tool messages and limits
work: rollout/turn_taking.py."""

from __future__ import annotations

import contextlib

import torch

from gspo_cli.algorithms.precision import upcast
from gspo_cli.environments import resolve_environment
from gspo_cli.errors import SpecError
from gspo_cli.models.routing import routes_from_generate
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.rollout.decode import _accepts, in_place_cache
from gspo_cli.rollout.turn_taking import TurnTaking, _Row


def with_environment(engine, spec, stop=None):
    """`engine`, or, when `spec.task.environment` names one, a multi-turn engine around it: the
    hf engine's MultiTurnEngine, or the vLLM engines' VLLMTurnEngine (rollout/vllm_turns.py).
    `stop`: the training loop's StopFlag, which environment calls still running after a stop
    signal give way to (rollout/env_calls.py); None outside training."""
    name = spec.task.environment
    if not name:
        return engine
    kind = type(engine).__name__
    if kind == "HFRolloutEngine":
        cls = MultiTurnEngine
    elif kind in ("VLLMRolloutEngine", "VLLMServerRolloutEngine"):
        from gspo_cli.rollout.vllm_turns import VLLMTurnEngine

        cls = VLLMTurnEngine
    else:
        raise SpecError(f"task.environment: multi-turn rollouts run on the hf and vLLM engines, not {kind}")
    r = spec.rollout
    return cls(
        engine,
        resolve_environment(name, spec.task.environment_params),
        max_new_tokens=r.max_new_tokens,
        max_total_tokens=r.total_tokens,
        max_turns=r.max_turns,
        max_tool_calls=r.max_tool_calls,
        tool_output_tokens=r.tool_output_tokens,
        timeout_s=spec.task.environment_timeout_s,
        stop=stop,
    )


class MultiTurnEngine(TurnTaking):
    """Samples with an HFRolloutEngine's model, tokenizer, prompt format and stop ids, in turns."""

    def __init__(self, base, make_env, **limits):
        super().__init__(base, make_env, **limits)
        self.model = base.model

    @torch.no_grad()
    def generate(self, prompts: list[str], problems: list | None = None) -> RolloutBatch:
        model = self.model
        rows, prompt_ids = self._start(prompts, problems)
        pad = self._pad_id()
        ids, attn = self._left_padded(prompt_ids, pad, next(model.parameters()).device)
        was_training = model.training
        model.eval()
        routing = getattr(self.base, "routing", None) if self.sampler_logprobs else None
        try:  # R3: the routes of every forward, tool tokens' included (each forward feeds every row one position)
            with routing.recording_steps() if routing is not None else contextlib.nullcontext() as steps:
                self._decode(rows, ids, attn, pad)
        finally:
            model.train(was_training)
        self._finish(rows)
        batch = self._batch(rows, ids, attn, pad, logprobs=self.sampler_logprobs, entropy=self.sampler_logprobs)
        if steps is not None:
            B, T = batch.input_ids.shape
            batch.engine_routes = routes_from_generate(steps, B, ids.shape[1], T)
        return batch

    def _decode(self, rows: list[_Row], ids, attn, pad: int) -> None:
        model, temp, stops = self.model, self.base.temperature, set(self.base.stop_ids)
        B, P = ids.shape
        cache = in_place_cache(model.config, P + self.max_total_tokens + 1)
        extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
        cache_arg = "cache" if _accepts(model, "cache") else "past_key_values"
        if getattr(model.config, "output_router_logits", False):
            extra["output_router_logits"] = False
        mask = attn.clone()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        inputs, next_pos = ids, mask.sum(-1)
        while True:
            out = model(
                input_ids=inputs, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: cache}, **extra
            )
            logprobs = torch.log_softmax(upcast(out.logits[:, -1]) / temp, dim=-1)
            draw = torch.multinomial(logprobs.exp(), 1).squeeze(-1).tolist()
            col, real, ended = [], [], []
            for i, r in enumerate(rows):
                if r.done:
                    col.append(pad), real.append(0)
                    continue
                ev = []
                if r.forced:
                    t = r.forced.popleft()
                    r.ids.append(t), r.tool.append(1), r.logp.append(0.0), r.entropy.append(0.0)
                    if not r.forced:
                        r.turn_start = len(r.ids)
                else:
                    t = draw[i]
                    lp = logprobs[i]
                    r.ids.append(t), r.tool.append(0), r.logp.append(float(lp[t]))
                    r.entropy.append(float(-(lp.exp() * lp).sum()))
                    r.model_tokens += 1
                    ev = self._turn_end(r, t, stops)
                col.append(t), real.append(1)
                if self._after_token(r, ev):
                    ended.append(i)
            self._answer(rows, ended)
            if all(r.done for r in rows):
                return
            dev = ids.device
            real_t = torch.tensor(real, device=dev)
            inputs = torch.tensor(col, device=dev).unsqueeze(1)
            mask = torch.cat([mask, real_t.unsqueeze(1).to(mask.dtype)], 1)
            pos = next_pos.unsqueeze(1).clone()
            next_pos = next_pos + real_t
