"""Our own sampling loop for the hf engine (`rollout.decode: compact`): the same draws from the
same distribution as transformers' `generate` with plain sampling, with less work per token.

- The KV cache grows in place: each layer's keys and values live in one buffer sized for the
  prompt and the longest response, and attention reads a view of the filled part, where
  transformers' DynamicCache concatenates the whole cache again at every token (a fifth of a
  decode step's time on the built-in model).
- Rows with the same prompt (the G samples of a group) share one prefill: the distinct prompts
  run once and their cache rows are copied to every sample.
- Finished rows leave the batch: once a quarter of the rows still decoding have stopped, the
  rest (their cache rows, masks, positions) are gathered into a smaller batch, so the tail of
  a step's longest responses runs at the width of the rows still going instead of all B.
- Sampling is softmax(logits / temperature) (then top-p where asked) and one multinomial draw
  per row, as `generate` samples; the sampler's log-prob and entropy of each token are read
  from the same distribution (temperature applied), and the rows each forward ran are kept so
  that recorded MoE routes can be put back in place (`routes_from_generate(rows=...)`).

Rows drop out of the multinomial draw as they finish, so a seed gives other samples than
`generate` does; the distribution sampled is the same. With `synced` (FSDP: every process must
run every forward, whose weights are gathered from all of them) a process keeps running
one-row forwards after its own rows are done until every process is, as `generate`'s
`synced_gpus` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from gspo_cli.algorithms.precision import upcast

COMPACT_BELOW = 0.75  # gather the live rows when fewer than this share of the batch's rows are live


class InPlaceLayer(DynamicLayer):
    """A DynamicLayer that writes each step's keys and values into a buffer sized up front
    (`capacity` positions) and returns views of the filled part: no concatenation per token.
    Falls back to growing by concatenation if more than `capacity` positions arrive."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        B, H, _, D = key_states.shape
        self._k = key_states.new_empty(B, H, self.capacity, D)
        self._v = value_states.new_empty(B, value_states.shape[1], self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:  # never on our loop's path: grow, keeping what is there
            self.capacity = max(end, 2 * self.capacity)
            self._k, self._v = self._grown(self._k), self._grown(self._v)
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def _grown(self, buf: torch.Tensor) -> torch.Tensor:
        out = buf.new_empty(*buf.shape[:2], self.capacity, buf.shape[-1])
        out[:, :, : self.length] = buf[:, :, : self.length]
        return out

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` (in that order): the filled part is copied into new buffers."""
        if not self.is_initialized:
            return
        n = self.length
        self._k, self._v = self._picked(self._k, indices), self._picked(self._v, indices)
        self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    def _picked(self, buf: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        out = buf.new_empty(len(indices), *buf.shape[1:])
        out[:, :, : self.length] = buf[indices, :, : self.length]
        return out

    def reset(self) -> None:
        self.length = 0
        self._k = self._v = None
        super().reset()


MOVABLE_LAYERS = (InPlaceLayer, DynamicLayer, DynamicSlidingWindowLayer)


def in_place_cache(config, capacity: int) -> DynamicCache:
    """A DynamicCache for `config` whose plain full-attention layers grow in place (InPlaceLayer);
    other layer kinds (sliding windows, linear attention) keep transformers' own layers."""
    cache = DynamicCache(config=config)
    cache.layers = [InPlaceLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@dataclass
class Sampled:
    """One call's draws: `ids` (B, P+C) prompt then response (pad after a row's stop token),
    C = the decode steps taken; `logp`/`entropy` (B, C) the sampler's (0 past a row's end), or
    None when not asked for; `rows[j]` the original rows the forward feeding response token j
    ran on (j = 0 .. C-2; None = all rows; `rows` None: every forward ran on all rows) and
    `prefill_rows` (B,) which prefill row each row's prompt was (None: row i was row i), for
    routes recorded during the call."""

    ids: torch.Tensor
    logp: torch.Tensor | None
    entropy: torch.Tensor | None
    rows: list[torch.Tensor | None] | None = None
    prefill_rows: torch.Tensor | None = None

    def copied(self) -> "Sampled":
        """A copy whose tensors are new (made outside inference mode: ordinary tensors)."""

        def new(t):
            return None if t is None else t.clone()

        rows = None if self.rows is None else [new(r) for r in self.rows]
        return Sampled(new(self.ids), new(self.logp), new(self.entropy), rows, new(self.prefill_rows))


def _accepts(model, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scores` with every token outside the smallest set whose probability reaches `top_p` set
    to -inf (the most likely token always kept), as transformers' TopPLogitsWarper does."""
    sorted_scores, order = torch.sort(scores, descending=False)
    cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cum <= (1 - top_p)
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def _inference_unless_synced(loop):
    """Run `loop` (sample) in `torch.inference_mode` (no version counters or view tracking: a
    decode forward of the quickstart's model 2.25 vs 2.56 ms for one row, 5.8 vs 6.2 ms for 128,
    against `no_grad`) and copy what it returns out of it: inference tensors cannot be saved for
    backward, and the trainer differentiates forwards over the sampled tokens. Synced processes
    (FSDP, whose forwards gather parameters into buffers made outside the loop) keep `no_grad`."""

    @functools.wraps(loop)
    def run(*args, **kwargs) -> Sampled:
        if kwargs.get("synced"):
            with torch.no_grad():
                return loop(*args, **kwargs)
        with torch.inference_mode():
            got = loop(*args, **kwargs)
        with torch.no_grad():
            return got.copied()

    return run


@_inference_unless_synced
def sample(
    model,
    ids: torch.Tensor,
    attn: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    stop_ids: list[int],
    pad_id: int,
    top_p: float = 1.0,
    want_logprobs: bool = False,
    synced: bool = False,
    on_done: Callable[[list[int], torch.Tensor], None] | None = None,
) -> Sampled:
    """Sample up to `max_new_tokens` tokens after each left-padded prompt row of `ids`/`attn`
    (B, P), stopping a row at its first token in `stop_ids`. See the module docstring; runs in
    inference mode unless `synced` (`_inference_unless_synced`). `on_done(rows, resp)`: called
    when rows stop while others still sample, with their indices and their response tokens
    (len(rows), steps so far; each ends with its stop token), e.g. to score them meanwhile."""
    B, P = ids.shape
    dev = ids.device
    out = ids.new_full((B, P + max_new_tokens), pad_id)
    out[:, :P] = ids
    lp_dtype = torch.promote_types(model.dtype, torch.float32)  # float64 stays float64 (see upcast)
    logp = torch.zeros(B, max_new_tokens, device=dev, dtype=lp_dtype) if want_logprobs else None
    ent = torch.zeros(B, max_new_tokens, device=dev, dtype=lp_dtype) if want_logprobs else None
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=dev)
    cache = in_place_cache(model.config, P + max_new_tokens)
    extra = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    cache_arg = "cache" if _accepts(model, "cache") else "past_key_values"  # renamed in transformers 5
    if getattr(model.config, "output_router_logits", False):
        extra["output_router_logits"] = False  # on for the update's aux loss, not wanted here
    # Rows with the same prompt (a group's G samples) share one prefill: the distinct prompts
    # run once, then their cache rows and first logits are copied out to every row.
    # Rows move between batches only where every cache layer is one we know moves whole
    # (a linear-attention layer's recurrent state would not: such models keep all rows).
    movable = all(type(layer) in MOVABLE_LAYERS for layer in cache.layers)
    unique, inverse = torch.unique(torch.cat([ids, attn.to(ids.dtype)], 1), dim=0, return_inverse=True)
    prefill_rows = inverse if movable and len(unique) < B else None
    shared = prefill_rows is not None  # until the prefill has run
    if shared:
        inputs, mask = unique[:, :P], unique[:, P:].to(attn.dtype)
    else:
        inputs, mask = ids, attn
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    # The rows held in the forward batch: their original index, whether still sampling (rows
    # that stopped ride along until the next compaction), masks and positions.
    idx = torch.arange(B, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    rows: list[torch.Tensor | None] = []
    steps, idle = 0, False  # idle: synced, this process's rows all done, one dummy row kept
    while True:
        res = model(
            input_ids=inputs, attention_mask=mask, position_ids=positions, use_cache=True, **{cache_arg: cache}, **extra
        )
        logits = res.logits[:, -1, :]
        if shared:  # the prefill ran on the distinct prompts: every row gets its prompt's
            cache.batch_select_indices(inverse)
            logits, mask, positions, shared = logits[inverse], mask[inverse], positions[inverse], False
        if idle:  # the forward only kept the other processes going
            if not _any_running(False, dev):
                break
            positions = positions + 1
            mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
            continue
        scores = upcast(logits)
        if temperature != 1.0:
            scores = scores / temperature
        lp = torch.log_softmax(scores, dim=-1)
        # softmax of the (filtered) scores, as generate computes it: the same draws for a seed
        probs = (top_p_filter(scores, top_p) if top_p < 1.0 else scores).softmax(dim=-1)
        tok = torch.multinomial(probs, num_samples=1).squeeze(1)
        out[idx, P + steps] = torch.where(alive, tok, pad_id)
        if want_logprobs:
            logp[idx, steps] = torch.where(alive, lp.gather(-1, tok[:, None]).squeeze(-1), 0.0)
            ent[idx, steps] = torch.where(alive, -(lp.exp() * lp).sum(-1), 0.0)
        steps += 1
        stopped = alive & torch.isin(tok, stops)
        alive &= ~stopped
        if steps == max_new_tokens:
            alive[:] = False
        n_alive = int(alive.sum())
        if on_done is not None and n_alive and bool(stopped.any()):
            done = idx[stopped]
            on_done(done.tolist(), out[done, P : P + steps])
        if (not _any_running(n_alive > 0, dev)) if synced else n_alive == 0:
            break
        inputs, positions = tok[:, None], positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(len(idx), 1)], dim=1)
        if n_alive == 0:  # synced: others still sample; keep running forwards (on one row if it can)
            keep, idle = (idx.new_zeros(1) if movable else None), True
        elif movable and n_alive < COMPACT_BELOW * len(idx):
            keep = alive.nonzero().squeeze(1)
        else:
            keep = None
        if keep is not None:
            cache.batch_select_indices(keep)
            idx, alive, inputs, positions, mask = idx[keep], alive[keep], inputs[keep], positions[keep], mask[keep]
        if not idle:
            rows.append(idx if len(idx) < B else None)
    return Sampled(
        ids=out[:, : P + steps],
        logp=None if logp is None else logp[:, :steps],
        entropy=None if ent is None else ent[:, :steps],
        rows=rows,
        prefill_rows=prefill_rows,
    )


def _any_running(mine: bool, device) -> bool:
    """Whether any process still has rows to sample (`mine`: this one has); a collective, called
    once after every forward by every process."""
    import torch.distributed as dist

    flag = torch.tensor(1.0 if mine else 0.0, device=device)
    dist.all_reduce(flag)
    return flag.item() > 0
