"""Prompts and stops as the checkpoint defines them.

A chat model is trained and evaluated on its chat template (a user turn, optionally a
system turn, then the assistant header); fed raw text it is off its own distribution. Its
turn ends at any of its stop ids, which are not always the tokenizer's EOS: Llama 3 lists
<|end_of_text|>, <|eom_id|> and <|eot_id|> in generation_config.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.tasks.base import Conversation


@dataclass(frozen=True)
class PromptFormat:
    """How task prompts become the text the sampler continues.

    `chat_template` "auto": through the tokenizer's chat template when it has one, raw text
    otherwise; "none": raw text always (the built-in models have no template).
    `system_prompt` (None: no system turn) and `template_kwargs` (e.g. Qwen3's
    `enable_thinking`) need a template: `formatter` refuses them without one."""

    chat_template: str = "auto"
    system_prompt: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_rollout(cls, cfg) -> PromptFormat:
        """From a RolloutConfig (or anything with its three prompt fields)."""
        return cls(
            chat_template=cfg.chat_template,
            system_prompt=cfg.system_prompt,
            template_kwargs=dict(cfg.chat_template_kwargs),
        )

    def formatter(self, tokenizer) -> PromptFormatter:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        use = self.chat_template == "auto" and has_template
        if not use and (self.system_prompt is not None or self.template_kwargs):
            what = "rollout.system_prompt" if self.system_prompt is not None else "rollout.chat_template_kwargs"
            why = (
                "rollout.chat_template is none"
                if self.chat_template == "none"
                else "the tokenizer has no chat template"
            )
            raise SpecError(f"{what}: needs a chat template, but {why}")
        return PromptFormatter(tokenizer, use, self.system_prompt, self.template_kwargs)


class PromptFormatter:
    """Callable: list of task prompts (user messages) -> list of texts to tokenize, with
    `add_special_tokens=False` (a template writes its own BOS)."""

    def __init__(
        self,
        tokenizer,
        use_template: bool,
        system_prompt: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ):
        self.tokenizer = tokenizer
        self.use_template = use_template
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})

    def __call__(self, prompts: list[str]) -> list[str]:
        if not self.use_template:
            if any(isinstance(p, Conversation) for p in prompts):
                raise SpecError(
                    "task.params.source: conversational prompts (lists of messages) need a chat template, and "
                    "this model's tokenizer has none (or rollout.chat_template is none)"
                )
            return list(prompts)
        try:
            return [
                self.tokenizer.apply_chat_template(
                    self.messages(p), tokenize=False, add_generation_prompt=True, **self.template_kwargs
                )
                for p in prompts
            ]
        except Exception as err:  # a Jinja error in the checkpoint's template, or a kwarg it rejects
            raise SpecError(
                f"rollout.chat_template: the tokenizer's chat template failed: "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            ) from None

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat of one task prompt: a conversation's own messages, else one user turn; with
        `system_prompt` a system turn first, unless the conversation has its own."""
        turns = list(prompt.messages) if isinstance(prompt, Conversation) else [{"role": "user", "content": prompt}]
        if self.system_prompt is None or any(m["role"] == "system" for m in turns):
            return turns
        return [{"role": "system", "content": self.system_prompt}, *turns]


def raw_prompts(tokenizer) -> PromptFormatter:
    """Raw text, as before chat templates: the default of engines built without a format."""
    return PromptFormatter(tokenizer, use_template=False)


def stop_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS, then the generation config's
    `eos_token_id` (an int or a list; transformers reads generation_config.json into
    `model.generation_config`, or derives it from config.json when there is none).
    Order kept, duplicates and None dropped; at least one id (SpecError otherwise)."""
    found: list[int] = []
    gen = getattr(model, "generation_config", None)
    for value in (tokenizer.eos_token_id, getattr(gen, "eos_token_id", None)):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in found:
                found.append(int(i))
    if not found:
        raise SpecError(
            "model: neither the tokenizer nor the generation config names an EOS token; responses would never end"
        )
    return found
