"""Rollouts with Hugging Face `generate`, sampling exactly from the policy."""

from __future__ import annotations

import contextlib

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from gspo_cli.algorithms.precision import upcast
from gspo_cli.models.prompts import raw_prompts, stop_token_ids
from gspo_cli.models.routing import routes_from_generate
from gspo_cli.rollout.base import RolloutBatch, concat_batches
from gspo_cli.rollout.decode import Sampled, sample


class HFRolloutEngine:
    """Samples with the trainer's own model: always the current policy, no weight sync."""

    streams_rows = True  # generate(on_rows=...) hands over rows as they finish (decode: compact)

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        sampler_logprobs: bool = False,
        routing=None,
        stop_ids: list[int] | None = None,
        prompt_format=None,
        synced: bool = False,
        decode: str = "compact",
        sample_rows: int | None = None,
    ):
        """`top_p` < 1 (nucleus sampling) is for evaluation only: the sampler then differs from
        the policy, and training's importance ratios would be biased.

        `sampler_logprobs`: also return, from generate's own forward passes, each response
        token's log-prob and entropy (temperature applied) and, given a RoutingController,
        the experts every position was routed to: pi_old without a second forward pass. Read
        step by step as generate samples (`SamplerLogprobs`): one (B, vocab) distribution held
        at a time, never the (B, max_new_tokens, vocab) logits, whatever the vocabulary.

        `stop_ids`: the ids that end a response (None: the checkpoint's, `stop_token_ids`);
        `prompt_format`: a PromptFormatter turning task prompts into text (None: raw text).
        `synced`: the weights are sharded across processes (FSDP): every process runs forward
        passes until all are done (generate's synced_gpus), or a process that stops early
        would leave the others waiting for its shards.
        `decode`: "compact" samples with our own loop (rollout/decode.py: the KV cache grows in
        place, finished rows leave the batch), "generate" with transformers' `generate`; the
        same distribution either way.
        `sample_rows` (rollout.sample_rows): at most this many rows per sampling call; more
        prompts are sampled in chunks of this many, joined into one batch (concat_batches)."""
        self.sample_rows = sample_rows
        self.model = model
        self.tokenizer = tokenizer
        self.sampler_logprobs = sampler_logprobs
        self.routing = routing
        self.temperature = temperature
        self.synced = synced
        if decode not in ("compact", "generate"):
            raise ValueError(f"decode: {decode!r} is not compact or generate")
        self.decode = decode
        self.top_p = top_p
        self.stop_ids = list(stop_ids) if stop_ids is not None else stop_token_ids(model, tokenizer)
        self.format = prompt_format or raw_prompts(tokenizer)
        self.gen_config = neutral_generation_config(
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            stop_ids=self.stop_ids,
            pad_token_id=tokenizer.pad_token_id,
        )

    def generate(self, prompts: list[str], on_rows=None) -> RolloutBatch:
        """One completion per prompt, at most `sample_rows` sampled at once. `on_rows(rows,
        completions, completion_ids)`: called with rows (indices into `prompts`) that stopped
        while others still sample (`decode: compact` only), their texts and token ids as the batch
        will hold them (the trainer scores them meanwhile)."""
        n = self.sample_rows or len(prompts)
        if len(prompts) <= n:
            return self._sample(prompts, on_rows)
        # Every process holds the same number of prompts (whole groups), so under FSDP every
        # process makes as many calls as the others (each call's forwards are collective).
        chunks = [
            self._sample(prompts[i : i + n], _offset(on_rows, i) if on_rows is not None else None)
            for i in range(0, len(prompts), n)
        ]
        return concat_batches(chunks, self.tokenizer.pad_token_id)

    @torch.no_grad()
    def _sample(self, prompts: list[str], on_rows=None) -> RolloutBatch:
        tok = self.tokenizer
        enc = tok(self.format(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        device = next(self.model.parameters()).device
        ids, attn = enc.input_ids.to(device), enc.attention_mask.to(device)
        was_training = self.model.training
        self.model.eval()
        P = ids.shape[1]
        want = self.sampler_logprobs
        record = self.routing.recording_steps() if want and self.routing is not None else contextlib.nullcontext()
        try:
            # steps: None unless routes are recorded
            with record as steps:
                if self.decode == "compact":
                    got = sample(
                        self.model,
                        ids,
                        attn,
                        max_new_tokens=self.gen_config.max_new_tokens,
                        temperature=self.temperature,
                        top_p=self.top_p,
                        stop_ids=_as_list(self.gen_config.eos_token_id),
                        pad_id=_pad_id(self.gen_config),
                        want_logprobs=want,
                        synced=self.synced,
                        on_done=None if on_rows is None else self._finished_rows(on_rows),
                    )
                else:
                    got = self._generate(ids, attn, want)
        finally:
            self.model.train(was_training)
        out = got.ids
        resp = out[:, P:]
        is_eos = torch.isin(resp, torch.tensor(self.stop_ids, device=resp.device))
        # Response = tokens up to and including the first stop id; everything after is padding.
        after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
        resp_mask = (~after_eos).float()
        truncated = ~is_eos.any(-1)
        full_attn = torch.cat([attn, resp_mask.long()], dim=1)
        texts = tok.batch_decode(resp.masked_fill(after_eos, tok.pad_token_id), skip_special_tokens=True)
        batch = RolloutBatch(
            input_ids=out,
            attention_mask=full_attn,
            response_mask=resp_mask,
            prompt_len=P,
            completions=texts,
            truncated=truncated,
        )
        if want:
            batch.engine_logp = got.logp * resp_mask
            batch.engine_entropy = got.entropy * resp_mask
            if steps is not None:
                batch.engine_routes = routes_from_generate(
                    steps, out.shape[0], P, out.shape[1], rows=got.rows, prefill_rows=got.prefill_rows
                )
        return batch

    def _finished_rows(self, on_rows):
        """decode.sample's on_done -> on_rows(rows, texts, ids), decoded as `generate` decodes the batch."""

        def done(rows: list[int], resp: torch.Tensor) -> None:
            texts = self.tokenizer.batch_decode(resp, skip_special_tokens=True)
            on_rows(rows, texts, resp.tolist())

        return done

    def _generate(self, ids: torch.Tensor, attn: torch.Tensor, want: bool) -> Sampled:
        """transformers' `generate` (rollout.decode: generate), its draws as our loop returns
        them (log-probs and entropies read step by step by SamplerLogprobs when `want`)."""
        reader = SamplerLogprobs(self.temperature) if want else None
        extra = {"logits_processor": LogitsProcessorList([reader])} if want else {}
        if getattr(self.model.config, "output_router_logits", False):
            # On for the update's load-balancing loss (model.router_aux_loss_coef); while decoding,
            # transformers would compute that loss over one step's router logits against the
            # whole attention mask and fail ("size of tensor a (16) must match ... b (144)").
            extra["output_router_logits"] = False
        with _only_generation_config(self.model, self.gen_config):
            out = self.model.generate(
                input_ids=ids, attention_mask=attn, generation_config=self.gen_config, synced_gpus=self.synced, **extra
            )
        logp, entropy = reader.finish(out[:, ids.shape[1] :]) if want else (None, None)
        return Sampled(ids=out, logp=logp, entropy=entropy)


def _as_list(ids) -> list[int]:
    return [ids] if isinstance(ids, int) else list(ids)


def _pad_id(cfg: GenerationConfig) -> int:
    """The id that fills a row after its stop token: the pad id, else (as generate) the first stop id."""
    return cfg.pad_token_id if cfg.pad_token_id is not None else _as_list(cfg.eos_token_id)[0]


class SamplerLogprobs(LogitsProcessor):
    """Reads, at each generate step, the raw logits that sample the next token (custom
    processors run before the temperature warper): that step's entropy at once, and its log-
    softmax until the next step shows which token was drawn. Holds one (B, V) float32
    distribution at a time. Returns the scores untouched: sampling is unchanged."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.logp: list[torch.Tensor] = []  # (B,) per step, the sampled token's log-prob
        self.entropy: list[torch.Tensor] = []  # (B,) per step
        self.pending: torch.Tensor | None = None  # (B, V) the last step's log-softmax

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:  # the previous step's token is input_ids' last column
            self._take(input_ids[:, -1])
        logprobs = torch.log_softmax(upcast(scores) / self.temperature, dim=-1)
        self.entropy.append(-(logprobs.exp() * logprobs).sum(-1))
        self.pending = logprobs
        return scores

    def _take(self, token_B: torch.Tensor) -> None:
        self.logp.append(self.pending.gather(-1, token_B.unsqueeze(-1)).squeeze(-1))
        self.pending = None

    def finish(self, resp_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-prob, entropy) (B, C) of the C response tokens generate returned (C = the
        number of steps it took; values past a row's end are the padding's, for callers to mask)."""
        if self.pending is not None and len(self.logp) < resp_BC.shape[1]:
            self._take(resp_BC[:, len(self.logp)])
        B, C = resp_BC.shape
        if not self.logp:
            zeros = torch.zeros(B, C, device=resp_BC.device)
            return zeros, zeros.clone()
        return torch.stack(self.logp, 1)[:, :C], torch.stack(self.entropy, 1)[:, :C]


def neutral_generation_config(
    *, temperature: float, top_p: float, max_new_tokens: int, stop_ids: list[int], pad_token_id: int | None
) -> GenerationConfig:
    """Plain sampling at `temperature` (and `top_p`), nothing else. Every knob whose neutral
    value is not None is spelled out; the None ones (min_p, suppress_tokens, bad_words_ids,
    stop_strings...) transformers would fill from the model's own generation config, which
    `_only_generation_config` keeps out of the way while generate runs."""
    return GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=top_p,
        min_p=None,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        encoder_repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0,
        length_penalty=1.0,
        min_length=0,
        max_new_tokens=max_new_tokens,
        num_beams=1,
        num_return_sequences=1,
        renormalize_logits=False,
        remove_invalid_values=False,
        output_scores=False,
        output_logits=False,
        return_dict_in_generate=False,
        use_cache=True,
        pad_token_id=pad_token_id,
        eos_token_id=list(stop_ids),
        bos_token_id=None,
    )


@contextlib.contextmanager
def _only_generation_config(model, gen_config: GenerationConfig):
    """generate() fills every option our config leaves None from `model.generation_config`
    (the checkpoint's generation_config.json, custom entries included). While generate
    runs, that is our own config, so nothing of the checkpoint's can reach the sampler; the
    checkpoint's is put back after (checkpoints still save it)."""
    saved = model.generation_config
    model.generation_config = gen_config
    try:
        yield
    finally:
        model.generation_config = saved


def _offset(on_rows, start: int):
    """on_rows for a chunk of the prompts starting at `start`: its rows as indices into all of them."""
    return lambda rows, texts, ids: on_rows([start + r for r in rows], texts, ids)
