"""Loading the policy: a built-in tiny model, a local HF directory, or a hub id."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.hub import hub_endpoint, hub_reachable
from gspo_cli.models import experts, lora
from gspo_cli.models.builtin import BUILTIN_KINDS, builtin_model_dir
from gspo_cli.spec import ModelConfig
from gspo_cli.tasks import Task
from gspo_cli.tasks.base import Conversation

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
experts.register()  # model.experts_implementation: gspo_grouped_mm


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: str  # the directory or hub id it came from
    is_moe: bool


def compute_context(dtype: str, device: str, sharded: bool = False):
    """The context forward passes run in: `torch.autocast` to `dtype` ("bfloat16") over float32
    master weights, or nothing for "float32". Backward passes run outside it. A sharded model
    (`sharded`, FSDP2) needs nothing: its MixedPrecisionPolicy gathers `dtype` copies of the
    float32 shards itself (see `load_model`), without autocast's per-layer cast cache."""
    if dtype == "float32" or sharded:
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
        pool = task.train_pool
        if pool is not None and any(isinstance(p.prompt, Conversation) for p in pool):
            raise SpecError(
                f"model.name: {cfg.name} has no chat template, and task.params.source holds conversational "
                "prompts (lists of messages): use a model whose tokenizer has one, or standard (string) prompts"
            )
        if cfg.cold_start.steps and pool is not None and all(p.solution is None for p in pool):
            # Said before anything is built: the cold start would find nothing to learn from.
            raise SpecError(
                f"model.name: {cfg.name} is cold-started on reference completions and the training data of task "
                f"{task.name} has none"
                + (": add a `solution` (or `completion`) column" if task.name == "prompts" else "")
                + "; or use a pretrained model"
            )
        quiet_transformers()
        return str(builtin_model_dir(kind, cfg.builtin, cfg.cold_start, task, log=log))
    return cfg.name


def load_model(
    source: str, cfg: ModelConfig, *, training: bool = True, dist_info: DistInfo = DistInfo()
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a directory or hub id (cache only if offline).

    For training (the default) the weights are float32 whatever `cfg.dtype` says: they are
    the master weights the optimizer updates, and forwards run in `cfg.dtype` under
    `compute_context`. An AdamW step of lr 1e-5 on a bf16 weight near 0.02 is below bf16's
    spacing there (~1.2e-4) and would be lost. With `training=False` (evaluation only) the
    weights load in `cfg.dtype`.

    With `cfg.lora` (training) the base loads in `cfg.dtype` and stays frozen; PEFT's adapters
    (float32) are injected in place (models/lora.py). A LoRA adapter directory (a LoRA run's
    checkpoint: adapter_config.json) loads its base, then its adapters: injected for training
    (the base's digest checked), merged into the weights otherwise (evaluation, export).

    With `cfg.sharding` fsdp under torchrun (`dist_info` of several processes, training), the
    model comes back already sharded (FSDP2, `distributed.shard_`): every rank builds it on the
    meta device, shards it and fills its own shards from the checkpoint that rank 0 alone reads
    (`_load_sharded`), so no other rank ever holds the whole model. A collective: every rank
    calls it.

    Bad input (a path that is not a model, an id not reachable) is a SpecError naming it.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    adapters = None  # an adapter directory (a LoRA run's checkpoint): its base loads, then the adapters
    if lora.is_adapter_dir(Path(source).expanduser()):
        lora.require_peft(f"{source} (a LoRA adapter directory)")
        adapters, source = Path(source).expanduser(), str(lora.adapter_base(Path(source).expanduser())["base"])
    local = Path(source).expanduser()
    looks_local = local.exists() or source.startswith((".", "/", "~"))
    if looks_local:
        if not local.exists():
            raise SpecError(f"model.name: {source}: no such directory")
        if not local.is_dir():
            raise SpecError(f"model.name: {source}: not a directory (a model is a directory with a config.json)")
        if not (local / "config.json").is_file():
            raise SpecError(f"model.name: {source} is not a model directory (no config.json)")
        source = str(local)
    # Without a network the hub client retries each file for ~25 s before giving up: ask once,
    # briefly, and read the local cache only when the hub cannot be reached.
    offline = not looks_local and not hub_reachable()
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=offline)
    except Exception as err:  # hub/network/parse failures all mean "cannot use this name"
        if offline:
            raise SpecError(
                f"model.name: cannot load {source!r}: the hub ({hub_endpoint()}) cannot be reached and "
                "the model is not in the local cache (with no network, HF_HUB_OFFLINE=1 reads the cache "
                "without trying)"
            ) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SpecError(
            f"model.name: cannot load {source!r} (offline and not cached, or not a model id): {first}"
        ) from None
    use_lora = training and cfg.lora is not None
    if use_lora:
        lora.require_peft()
        if dist_info.enabled and cfg.sharding == "fsdp":
            raise SpecError("model.lora: not supported with model.sharding fsdp yet; use ddp (adapters are small)")
    # LoRA: the frozen base in model.dtype, only the adapters are float32 masters (models/lora.py)
    kwargs = {"dtype": torch.float32 if training and not use_lora else DTYPES[cfg.dtype]}
    if hasattr(config, "num_experts") or hasattr(config, "num_local_experts"):
        kwargs["experts_implementation"] = cfg.experts_implementation
    if hasattr(config, "router_aux_loss_coef"):
        config.router_aux_loss_coef = cfg.router_aux_loss_coef
        config.output_router_logits = cfg.router_aux_loss_coef > 0
    if training and dist_info.enabled and cfg.sharding == "fsdp":
        model = _load_sharded(source, config, kwargs, cfg, dist_info)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        return _finish(model, tokenizer, source)
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(source, config=config, local_files_only=offline, **kwargs)
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
            model = AutoModelForCausalLM.from_pretrained(source, config=config, local_files_only=offline, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
    except (OSError, ValueError) as err:
        raise SpecError(f"model.name: cannot load {source!r}: {str(err).splitlines()[0]}") from None
    disable_dropout(model)
    if use_lora:
        model = lora.apply_lora(model, cfg.lora, cfg.name)
        if adapters is not None:  # resuming: the same base, then the checkpoint's adapters
            lora.check_base(adapters, source)
            lora.load_adapters(model, adapters)
    elif adapters is not None:  # evaluation, export: the adapters merged into the base
        model = lora.merge_adapters(model, adapters)
    model.to(cfg.device)
    # A LoRA policy's source is its base (what an engine such as vLLM loads before the merged weights arrive)
    return _finish(model, tokenizer, str(adapters) if adapters is not None and not use_lora else source)


def _finish(model, tokenizer, source: str) -> LoadedModel:
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


def _load_sharded(source: str, config, kwargs: dict, cfg: ModelConfig, info: DistInfo) -> torch.nn.Module:
    """The model of `source`, FSDP2-sharded over the `info.world_size` processes, holding the
    checkpoint's weights; no process but rank 0 ever holds more than its shards plus one
    tensor in flight.

    Every rank builds the architecture on the meta device (no memory), shards it (one unit per
    decoder layer plus the root; `cfg.dtype` bfloat16 gathers bf16 copies of the float32 master
    shards), then allocates its shards (`to_empty`). Rank 0 alone reads the checkpoint, in the
    checkpoint's own dtype (one copy; transformers converts the file layout, e.g. per-expert
    tensors into the fused 3-D experts), and broadcasts it tensor by tensor, each rank keeping
    its slice (`distributed.fill_from_rank0`): every rank holds rank 0's values, not values it
    merely hopes are equal. Buffers that are not in a checkpoint (rotary `inv_freq`) come out
    of `to_empty` as garbage and are rebuilt from the config."""
    from transformers import AutoModelForCausalLM

    # Read before from_config, which overwrites config.dtype with the dtype it builds in.
    ckpt_dtype = getattr(config, "dtype", None) or torch.float32
    ckpt_dtype = getattr(torch, ckpt_dtype) if isinstance(ckpt_dtype, str) else ckpt_dtype

    def build(**kw):
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kw)

    try:
        model = build(**kwargs)
    except (ValueError, NotImplementedError):
        if kwargs.get("experts_implementation", "eager") == "eager":
            raise
        kwargs = {**kwargs, "experts_implementation": "eager"}  # as in load_model: no grouped experts
        model = build(**kwargs)
    disable_dropout(model)
    distributed.shard_(model, param_dtype=None if cfg.dtype == "float32" else DTYPES[cfg.dtype])
    model.to_empty(device=cfg.device)
    full_sd: dict = {}
    if info.is_main:
        full = AutoModelForCausalLM.from_pretrained(source, config=config, **{**kwargs, "dtype": ckpt_dtype})
        full_sd = full.state_dict()
        del full  # the state dict's tensors are the only copy left
    distributed.fill_from_rank0(model, full_sd)
    del full_sd
    rebuild_buffers(model, cfg.device)
    return model


def rebuild_buffers(model: torch.nn.Module, device: str) -> list[str]:
    """Recompute every non-persistent buffer (not in checkpoints: rotary `inv_freq`, ...) of a
    model whose storage came from `to_empty`, by building a fresh instance of the owning module
    from its config. Returns the buffers' names. A module that cannot be rebuilt so raises (a
    bug to fix here, not something a spec can cause)."""
    names = []
    for name, module in model.named_modules():
        if not module._non_persistent_buffers_set:
            continue
        if not hasattr(module, "config"):
            raise RuntimeError(
                f"{name} ({type(module).__name__}): non-persistent buffers and no config to rebuild them"
            )
        fresh = type(module)(module.config)
        for key in module._non_persistent_buffers_set:
            module._buffers[key] = fresh._buffers[key].to(device)
            names.append(f"{name}.{key}")
    return names
