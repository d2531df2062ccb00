"""Rollouts with Hugging Face `generate`, sampling exactly from the policy."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from gspo_cli.rollout.base import RolloutBatch


class HFRolloutEngine:
    """Samples with the trainer's own model: always the current policy, no weight sync."""

    def __init__(self, model, tokenizer, *, max_new_tokens: int, temperature: float, top_p: float = 1.0):
        """`top_p` < 1 (nucleus sampling) is for evaluation only: the sampler then differs from
        the policy, and training's importance ratios would be biased."""
        self.model = model
        self.tokenizer = tokenizer
        # Spelled out in full: generate() otherwise applies the model's generation-config
        # defaults (top_k=50, top_p, repetition penalties...) and the sampler silently
        # differs from the policy whose ratios we compute.
        self.gen_config = GenerationConfig(
            do_sample=True, temperature=temperature, top_k=0, top_p=top_p, min_p=None,
            repetition_penalty=1.0, max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )

    @torch.no_grad()
    def generate(self, prompts: list[str]) -> RolloutBatch:
        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        device = next(self.model.parameters()).device
        ids, attn = enc.input_ids.to(device), enc.attention_mask.to(device)
        was_training = self.model.training
        self.model.eval()
        out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=self.gen_config)
        self.model.train(was_training)
        P = ids.shape[1]
        resp = out[:, P:]
        eos = tok.eos_token_id
        is_eos = resp == eos
        # Response = tokens up to and including the first EOS; everything after is padding.
        after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
        resp_mask = (~after_eos).float()
        truncated = ~is_eos.any(-1)
        full_attn = torch.cat([attn, resp_mask.long()], dim=1)
        texts = tok.batch_decode(resp.masked_fill(after_eos, tok.pad_token_id), skip_special_tokens=True)
        return RolloutBatch(input_ids=out, attention_mask=full_attn, response_mask=resp_mask,
                            prompt_len=P, completions=texts, truncated=truncated)
