"""Loading the policy: a built-in tiny model, a local HF directory, or a hub id."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gspo_cli.errors import SpecError
from gspo_cli.models.builtin import BUILTIN_KINDS, builtin_model_dir
from gspo_cli.spec import ModelConfig
from gspo_cli.tasks import Task

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: str  # the directory or hub id it came from
    is_moe: bool


def compute_context(dtype: str, device: str):
    """The context forward passes run in: `torch.autocast` to `dtype` ("bfloat16") over float32
    master weights, or nothing for "float32". Backward passes run outside it."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=DTYPES[dtype])


def quiet_transformers() -> None:
    """Our own progress display owns the terminal: no per-load bars or advisory warnings."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def resolve_model_source(cfg: ModelConfig, task: Task, log=print) -> str:
    """Directory or hub id to load `cfg.name` from; builds (and caches) a built-in model."""
    if cfg.name.startswith("builtin:"):
        kind = cfg.name.split(":", 1)[1]
        if kind not in BUILTIN_KINDS:
            raise SpecError(
                f"model.name: unknown built-in model {cfg.name!r}; known: "
                + ", ".join(f"builtin:{k}" for k in BUILTIN_KINDS)
            )
        quiet_transformers()
        return str(builtin_model_dir(kind, cfg.builtin, cfg.cold_start, task, log=log))
    return cfg.name


def load_model(source: str, cfg: ModelConfig, *, training: bool = True) -> LoadedModel:
    """Load a causal LM and its tokenizer from a directory or hub id (cache only if offline).

    For training (the default) the weights are float32 whatever `cfg.dtype` says: they are
    the master weights the optimizer updates, and forwards run in `cfg.dtype` under
    `compute_context`. An AdamW step of lr 1e-5 on a bf16 weight near 0.02 is below bf16's
    spacing there (~1.2e-4) and would be lost. With `training=False` (evaluation only) the
    weights load in `cfg.dtype`.

    Bad input (a path that is not a model, an id not reachable) is a SpecError naming it.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    local = Path(source)
    looks_local = local.exists() or source.startswith((".", "/", "~"))
    if looks_local and not (local / "config.json").is_file():
        raise SpecError(f"model.name: {source} is not a model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as err:  # hub/network/parse failures all mean "cannot use this name"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SpecError(
            f"model.name: cannot load {source!r} (offline and not cached, or not a model id): {first}"
        ) from None
    kwargs = {"dtype": torch.float32 if training else DTYPES[cfg.dtype]}
    if hasattr(config, "num_experts") or hasattr(config, "num_local_experts"):
        kwargs["experts_implementation"] = cfg.experts_implementation
    if hasattr(config, "router_aux_loss_coef"):
        config.router_aux_loss_coef = cfg.router_aux_loss_coef
        config.output_router_logits = cfg.router_aux_loss_coef > 0
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(source, config=config, **kwargs)
        except (ValueError, NotImplementedError) as err:
            if kwargs.get("experts_implementation", "eager") == "eager":
                raise
            # An architecture without grouped experts: its own loop is the only choice.
            print(
                f"warning: model: {source} does not support experts_implementation="
                f"{kwargs['experts_implementation']} ({str(err).splitlines()[0]}); using eager",
                file=sys.stderr,
            )
            kwargs["experts_implementation"] = "eager"
            model = AutoModelForCausalLM.from_pretrained(source, config=config, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise SpecError(f"model.name: cannot load {source!r}: {str(err).splitlines()[0]}") from None
    disable_dropout(model)
    model.to(cfg.device)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    is_moe = any(type(m).__name__.endswith("Router") for m in model.modules())
    return LoadedModel(model=model, tokenizer=tokenizer, source=source, is_moe=is_moe)


def disable_dropout(model: torch.nn.Module) -> list[str]:
    """Zero every dropout probability of `model`, whatever its config says, so that train
    mode (pi_theta's forwards) computes the same function as eval mode (rollout, pi_old,
    reference): with dropout on, even the first on-policy importance ratio is noise.

    Covers config fields named *dropout* (sub-configs too; modules that read them at forward
    time, and checkpoints saved later), float module attributes named *dropout* (e.g.
    Qwen3's `attention_dropout`, copied from the config at construction) and nn.Dropout
    layers. Returns the names it changed from a non-zero value (for tests and messages)."""
    changed: list[str] = []

    def zero_config(config, prefix: str) -> None:
        for key, value in list(vars(config).items()):
            if "dropout" in key and isinstance(value, float) and not isinstance(value, bool) and value != 0.0:
                setattr(config, key, 0.0)
                changed.append(f"{prefix}{key}")
            elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config
                zero_config(value, f"{prefix}{key}.")

    zero_config(model.config, "config.")
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p != 0.0:
            module.p = 0.0
            changed.append(f"{name}.p")
        for key, value in list(vars(module).items()):
            if "dropout" in key and isinstance(value, float) and value != 0.0:
                setattr(module, key, 0.0)
                changed.append(f"{name}.{key}")
    return changed
