"""`rollout:` how responses are sampled: engine (hf or vLLM), batch shape, sampling settings,
staleness and the engine's own arguments."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from gspo_cli.spec.base import _Problems, _Strict

# rollout.staleness at most: the worker holds this many copies of the weights in shared memory.
MAX_STALENESS = 8

# vllm.LLM arguments the vLLM engine sets itself: changing them breaks what the trainer assumes.
VLLM_RESERVED_KWARGS = (
    "model",
    "tokenizer",
    "skip_tokenizer_init",
    "logprobs_mode",
    "dtype",
    "seed",
    "generation_config",
)


def _vllm_value_problems(vllm: dict) -> list[str]:
    """The rollout.vllm values gspo-cli reads itself, checked before anything loads."""
    problems = []
    sleep = vllm.get("sleep", 0)
    if sleep not in (0, 1, 2) or isinstance(sleep, bool):
        problems.append(f"vllm.sleep: {sleep!r} is not 0, 1 or 2 (vLLM sleep mode level during the update)")
    util = vllm.get("gpu_memory_utilization", 0.5)
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        problems.append(f"vllm.gpu_memory_utilization: {util!r} is not a fraction in (0, 1]")
    tp = vllm.get("tensor_parallel_size", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        problems.append(f"vllm.tensor_parallel_size: {tp!r} is not a positive whole number")
    return problems


class VLLMServerConfig(_Strict):
    """Where the vLLM server of `engine: vllm-server` is (`gspo vllm-server SPEC` starts one)."""

    url: str = Field(..., description="the server's base URL, e.g. http://127.0.0.1:8000")
    weight_port: int = Field(
        51216,
        ge=1,
        le=65535,
        description="port the trainer's rank 0 opens for the server's workers to join the weight "
        "broadcast (must be reachable from the server)",
    )
    timeout_s: float = Field(600.0, gt=0, description="longest wait for one request or weight push, in seconds")
    max_parallel: int = Field(64, ge=1, description="sampling requests in flight per trainer process")


class RolloutConfig(_Strict):
    """How responses are sampled: engine, batch shape (prompts_per_step x group_size), prompts."""

    engine: Literal["hf", "vllm", "vllm-server"] = Field(
        "hf",
        description="hf: the trainer's own model.generate; vllm: an in-process vLLM engine, weights synced every "
        "step; vllm-server: a vLLM server on its own devices (rollout.server), weights pushed every step",
    )
    prompts_per_step: int = Field(16, ge=1, description="prompts sampled per step")
    group_size: int = Field(8, ge=2, description="responses per prompt (G); advantages are relative to the group")
    max_new_tokens: int = Field(
        48, ge=1, description="longest response, in tokens (task.environment: the model's tokens over all turns)"
    )
    max_turns: int = Field(4, ge=1, description="task.environment: model turns per rollout, at most")
    max_tool_calls: int = Field(2, ge=0, description="task.environment: tool calls (observations) per rollout, at most")
    max_total_tokens: int | None = Field(
        None,
        ge=1,
        description="task.environment: longest response, model and tool tokens together (default: max_new_tokens "
        "+ max_tool_calls x (tool_output_tokens + 16))",
    )
    tool_output_tokens: int = Field(
        32, ge=1, description="task.environment: a tool output longer than this many tokens is cut (and says so)"
    )
    temperature: float = Field(1.0, gt=0, description="sampling temperature (vllm: at most 2)")
    decode: Literal["compact", "generate"] = Field(
        "compact",
        description="hf only: compact samples with gspo-cli's own loop (KV cache grown in place, one "
        "prefill per distinct prompt, finished rows dropped from the batch); generate with "
        "transformers' model.generate. Same distribution; a seed gives other samples",
    )
    use_engine_logprobs: bool = Field(
        False,
        description="vllm only: take pi_old's log-probs from the engine "
        "instead of a trainer forward (paper section 5.4)",
    )
    sampler_logprobs: bool = Field(
        True,
        description="hf only: take pi_old's log-probs, entropy and MoE routes "
        "from generate's own forward passes instead of a second "
        "no-grad pass (~13% less per step; they differ from a full "
        "forward by ~1e-5 nats at most)",
    )
    sample_rows: int | None = Field(
        None,
        ge=1,
        description="hf engine: at most this many rows sampled at once per process (the KV cache's rows), in "
        "training and in-training evaluation; a step's prompts x group_size rows are sampled in chunks of "
        "this many and joined (sampler log-probs and MoE routes kept). None: all at once. vLLM schedules "
        "its own batches (rollout.vllm max_num_seqs) and does not read it",
    )
    vllm: dict[str, Any] = Field(
        default_factory=dict,
        description="extra vllm.LLM(...) arguments, e.g. gpu_memory_utilization (default on GPU: 0.3, "
        "leaving 70% to the colocated trainer), plus gspo-cli's own sleep: 0|1|2 (vLLM sleep mode "
        "during the update: 1 offloads the engine's weights to CPU, 2 drops them; GPU only); "
        "tensor_parallel_size: k shares one engine among k consecutive torchrun processes",
    )
    server: VLLMServerConfig | None = Field(
        None, description="engine vllm-server only: the server's address and the weight push's settings"
    )
    logprob_check_every: int = Field(
        10,
        ge=0,
        description="hf engine with sampler_logprobs: every N steps (and at "
        "step 1) compare the sampler's log-probs with one full "
        "trainer forward (rollout/logprob_diff_*); 0: never",
    )
    staleness: int = Field(
        0,
        ge=0,
        json_schema_extra={"maximum": MAX_STALENESS},
        description="0: each step samples from the current policy; k >= 1: a separate worker process "
        "samples ahead, step s+k's batch from the weights after step s-1 while step s trains, so "
        "each batch is k policy versions old (the first k steps' less); the arm's anchor says which "
        "policy its ratios are taken against; hf or vllm-server engine, one process; the worker "
        "holds k copies of the weights in shared memory, so k is at most 8",
    )
    # Prompts as the checkpoint defines them (gspo_cli.models.prompts), in training and evaluation.
    chat_template: Literal["auto", "none"] = Field(
        "auto",
        description="auto: task prompts go through the "
        "tokenizer's chat template as the user "
        "message when it has one; none: raw text",
    )
    system_prompt: str | None = Field(
        None, description="a system message before each prompt (needs a chat template); none: no system turn"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for the chat template, e.g. enable_thinking: false"
    )

    @model_validator(mode="after")
    def _check(self):
        problems = []
        if self.engine == "hf" and self.use_engine_logprobs:
            problems.append("use_engine_logprobs: needs engine: vllm (the hf engine returns no log-probs)")
        if self.engine != "vllm" and self.vllm:
            problems.append(
                "vllm: engine arguments given but engine is not vllm"
                + (" (a server's own go after `gspo vllm-server SPEC --`)" if self.engine == "vllm-server" else "")
            )
        if self.engine != "hf" and self.decode != "compact":  # the default, which a saved spec spells out, is accepted
            problems.append("decode: generate chooses the hf engine's sampling loop; vLLM samples with its own")
        if self.engine != "hf" and self.temperature > 2:
            problems.append(f"temperature: {self.temperature} is above 2, the most vLLM samples at")
        if self.max_total_tokens is not None and self.max_total_tokens < self.max_new_tokens:
            problems.append(
                f"max_total_tokens: {self.max_total_tokens} is below max_new_tokens ({self.max_new_tokens})"
            )
        if self.staleness > MAX_STALENESS:
            problems.append(
                f"staleness: {self.staleness} is above {MAX_STALENESS}: the worker holds one copy of the weights in "
                f"shared memory per batch in flight, and {MAX_STALENESS} bounds that memory"
            )
        if self.engine == "vllm" and self.staleness:
            problems.append(
                f"staleness: {self.staleness} runs its sampler in a worker process; not supported with engine: vllm "
                "(use vllm-server)"
            )
        if self.engine == "vllm-server" and self.server is None:
            problems.append("server: engine vllm-server needs server.url, the vLLM server's address")
        if self.engine != "vllm-server" and self.server is not None:
            problems.append("server: given but engine is not vllm-server")
        if self.chat_template == "none":
            if self.system_prompt is not None:
                problems.append("system_prompt: needs a chat template, but chat_template is none")
            if self.chat_template_kwargs:
                problems.append("chat_template_kwargs: given but chat_template is none")
        for key in self.vllm:
            if key in VLLM_RESERVED_KWARGS:
                problems.append(f"vllm.{key}: set by gspo-cli itself (from the model and rollout settings)")
        problems += _vllm_value_problems(self.vllm)
        if problems:
            raise _Problems("\n".join(problems))
        return self

    @property
    def total_tokens(self) -> int:
        """task.environment: the longest response, model and tool tokens (max_total_tokens or its default)."""
        return self.max_total_tokens or self.max_new_tokens + self.max_tool_calls * (self.tool_output_tokens + 16)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size
