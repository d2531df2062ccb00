"""`model.lora`: LoRA adapters (PEFT) on a frozen base.

The base loads in `model.dtype` (bf16 where asked) and stays frozen; PEFT's layers are injected
into the transformers model in place (`peft.inject_adapter_in_model`), so the model keeps its own
class: generation, the routing controller's hooks, gradient checkpointing and the log-prob head see
the same modules as without LoRA. What trains (float32 masters, whatever the base's dtype):

- adapters on the linear layers `target_modules` names (`all-linear`: every nn.Linear but the head);
- `experts: true`: adapters on the fused 3-D expert weights (PEFT's `target_parameters`; our
  `gspo_grouped_mm` experts read `self.gate_up_proj` and `self.down_proj`, which PEFT's ParamWrapper
  parametrizes to base + delta during the forward);
- `routers: lora`: an adapter on each router's (E, H) weight, likewise; `routers: full`: each router
  a PEFT `modules_to_save` copy trained in full, the original kept. The routing controller hooks the
  wrapper (models/routing.py skips the modules inside an accepted router).

The reference policy is the same module with every adapter (and router copy) off
(`adapters_disabled`): the initial policy, since LoRA's B starts at zero and the copies start equal.
Checkpoints hold the adapters in PEFT's format (adapter_config.json, adapter_model.safetensors) plus
`lora_base.json` (the base's path and digest, checked on resume).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import torch

from gspo_cli.errors import SpecError
from gspo_cli.files import files_digest
from gspo_cli.hub import hub_revision

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "lora_base.json"  # {"base": the base model's directory or hub id, "digest": base_digest(...)}
EXTRA_LINE = "pip install 'gspo-cli[lora]' (or pip install 'peft>=0.17')"
_EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj")  # fused (E, ., .) expert weights transformers 5 uses


def require_peft(where: str = "model.lora") -> None:
    """SpecError (one line, naming the extra) when peft cannot be imported."""
    try:
        import peft  # noqa: F401
    except ImportError:
        raise SpecError(f"{where}: LoRA needs the peft package, which is not installed: {EXTRA_LINE}") from None


def is_adapter_dir(path) -> bool:
    """Whether `path` is a directory holding a PEFT adapter (adapter_config.json)."""
    try:
        return (Path(path) / ADAPTER_CONFIG).is_file()
    except (OSError, TypeError):
        return False


def adapter_base(path) -> dict:
    """{"base", "digest"} of an adapter directory: lora_base.json, else the base named in
    adapter_config.json (an adapter written by other tools; digest None)."""
    path = Path(path)
    try:
        if (path / BASE_FILE).is_file():
            return json.loads((path / BASE_FILE).read_text())
        return {"base": json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path"), "digest": None}
    except (OSError, ValueError) as err:
        raise SpecError(f"{path}: unreadable adapter directory ({err})") from None


def base_digest(source: str) -> str:
    """What a base model is, as a digest that changes with its weights: sha256 over a local
    directory's weight files (a built-in model's cache entry too), or a hub id with the revision in
    the local hub cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(
            f for f in path.iterdir() if f.is_file() and (f.suffix == ".safetensors" or f.name.endswith(".bin"))
        )
        return "sha256:" + files_digest(files)
    revision = hub_revision(source)  # the snapshot's commit in the local hub cache (no network)
    return f"hub:{source}" + (f"@{revision}" if revision else "")


def router_paths(model: torch.nn.Module) -> list[str]:
    """Qualified names of the model's MoE routers: the `.gate` / `.router` child, or a module whose
    class name ends in Router, that has an integer top_k (as models/routing.py finds them)."""
    out = []
    for qual, mod in model.named_modules():
        leaf = qual.rsplit(".", 1)[-1]
        top_k = getattr(mod, "top_k", None)
        if (leaf in ("gate", "router") or type(mod).__name__.endswith("Router")) and isinstance(top_k, int):
            if not any(qual.startswith(p + ".") for p in out):
                out.append(qual)
    return out


def expert_parameters(model: torch.nn.Module) -> list[str]:
    """PEFT `target_parameters` suffixes ("experts.gate_up_proj", ...) of the model's fused 3-D
    expert weights; empty when it has none."""
    found = set()
    for qual, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if pname in _EXPERT_PARAMS and p.dim() == 3:
                found.add(f"{qual.rsplit('.', 1)[-1]}.{pname}")
    return sorted(found)


def peft_config(spec, model: torch.nn.Module, model_name: str):
    """The peft LoraConfig of `spec` (a LoraSpec) for `model`; SpecError (one line) for a
    target that matches nothing, experts or routers the model does not have."""
    from peft import LoraConfig

    linear = [q for q, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    routers = router_paths(model)
    targets: list[str] | str = spec.target_modules
    if isinstance(targets, list):
        names = [q for q, _ in model.named_modules() if q]
        for t in targets:
            hits = [q for q in names if q == t or q.endswith("." + t)]
            if not hits:
                leaves = sorted({q.rsplit(".", 1)[-1] for q in linear if not _is_module(model, q, head)})
                raise SpecError(
                    f"model.lora.target_modules: {t!r} matches no module of {model_name}; its linear layers are "
                    + ", ".join(leaves)
                )
            bad = [q for q in hits if not isinstance(model.get_submodule(q), torch.nn.Linear)]
            if bad:
                kind = type(model.get_submodule(bad[0])).__name__
                hint = " (routers: set model.lora.routers)" if bad[0] in routers else ""
                raise SpecError(
                    f"model.lora.target_modules: {t!r} names {bad[0]}, a {kind}, not a linear layer{hint}; "
                    "LoRA here adapts nn.Linear layers"
                )
        targets = [q for t in targets for q in linear if (q == t or q.endswith("." + t)) and q not in routers]
    else:  # all-linear, minus the output head and any linear router (routers are their own choice)
        targets = [q for q in linear if not _is_module(model, q, head) and q not in routers]
    # Experts kept as nn.Linear modules (architectures transformers does not fuse) are `experts`' choice too
    expert_linear = [q for q in linear if ".experts." in q]
    targets = [q for q in targets if q not in expert_linear] + (expert_linear if spec.experts else [])
    parameters: list[str] = []
    if spec.experts:
        experts = expert_parameters(model)
        if not experts and not expert_linear:
            raise SpecError(
                f"model.lora.experts: true, but {model_name} has no fused 3-D expert weights (gate_up_proj, "
                "down_proj) that PEFT's parameter targeting can adapt; use experts: false"
            )
        parameters += experts
    if spec.routers != "frozen" and not routers:
        raise SpecError(f"model.lora.routers: {spec.routers}, but {model_name} has no MoE routers; use frozen")
    if spec.routers == "lora":
        parameters += [f"{q}.weight" for q in routers]
    if not targets and not parameters and spec.routers != "full":
        raise SpecError(f"model.lora: nothing to adapt in {model_name}")
    return LoraConfig(
        r=spec.r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=0.0,
        target_modules=sorted(set(targets)) or None,
        target_parameters=parameters or None,
        modules_to_save=routers if spec.routers == "full" else None,
    )


def _is_module(model, qual: str, module) -> bool:
    return module is not None and model.get_submodule(qual) is module


def apply_lora(model: torch.nn.Module, spec, model_name: str) -> torch.nn.Module:
    """Inject `spec`'s adapters into `model` in place (the base frozen in its dtype); every
    trainable tensor becomes float32. Returns the model."""
    require_peft()
    from peft import inject_adapter_in_model

    config = peft_config(spec, model, model_name)
    model.requires_grad_(False)
    with warnings.catch_warnings():  # PEFT warns about patterns for modules it did not need
        warnings.simplefilter("ignore")
        model = inject_adapter_in_model(config, model)
    for _, p in model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def is_lora(model: torch.nn.Module) -> bool:
    return "default" in (getattr(model, "peft_config", None) or {})


def trainable_count(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (a router's modules_to_save copy counted once)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for n, p in model.named_parameters() if ".modules_to_save." not in n)
    return trainable, total


def _adapter_layers(model: torch.nn.Module) -> list:
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return [m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """Inside: `model` computes its base (every adapter off, routers' originals in use); the
    trainable flags are as before on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    layers = _adapter_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


class AdaptersOff:
    """The KL reference of a LoRA run: calls `model` with its adapters off; everything else
    (config, output head) is the model's own. No second copy of the weights."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __call__(self, *args, **kwargs):
        with adapters_disabled(self.model):
            return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


PEFT_PREFIX = "base_model.model."  # a PeftModel's names: what PeftModel.from_pretrained reads


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors under PEFT's names (adapter_model.safetensors' keys, as a
    PeftModel saves them: prefixed, so that PEFT's own reader finds trained router copies too)."""
    from peft import get_peft_model_state_dict

    return {PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


def save_adapters(model: torch.nn.Module, directory: Path, base: str) -> None:
    """adapter_config.json, adapter_model.safetensors and lora_base.json into `directory`."""
    from safetensors.torch import save_file

    directory = Path(directory)
    config = model.peft_config["default"]
    config.base_model_name_or_path = base
    config.save_pretrained(str(directory))
    save_file(adapter_state(model), str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (directory / BASE_FILE).write_text(json.dumps({"base": base, "digest": base_digest(base)}, indent=2) + "\n")


def load_adapters(model: torch.nn.Module, directory: Path) -> None:
    """Put an adapter directory's tensors into `model` (adapters injected from the same spec);
    SpecError when the tensors do not fit (another r or other targets)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / ADAPTER_WEIGHTS))
    mine = adapter_state(model)
    if set(state) != set(mine) or any(state[k].shape != mine[k].shape for k in state):
        raise SpecError(f"{directory}: its adapters do not fit model.lora (another rank, targets or routers)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        set_peft_model_state_dict(model, {k.removeprefix(PEFT_PREFIX): v for k, v in state.items()})


def check_base(directory: Path, source: str) -> None:
    """SpecError (one line) when the adapter directory was trained on another base than `source`."""
    stored = adapter_base(directory).get("digest")
    if stored is not None and stored != (now := base_digest(source)):
        raise SpecError(
            f"{directory}: its adapters were trained on another base model (digest {stored}; {source} is now {now}); "
            "the base must be the one the run started from"
        )


def merge_adapters(model: torch.nn.Module, directory: Path) -> torch.nn.Module:
    """`model` (the base) with the adapter directory's adapters merged into its weights: a plain
    transformers model (PEFT's own reader, so the directory is checked as PEFT would read it)."""
    require_peft("adapter directory")
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(model, str(directory))
        return peft_model.merge_and_unload()


def param_info(model: torch.nn.Module, spec=None, dtype: str = "float32") -> dict:
    """run.json's `params` record (gspo_cli/params.py): trainable and total counts, and with
    LoRA (`spec`, a LoraSpec) what is adapted."""
    trainable, total = trainable_count(model)
    info: dict = {"trainable": trainable, "total": total}
    if spec is not None and is_lora(model):
        info["lora"] = {
            "r": spec.r,
            "alpha": spec.lora_alpha,
            "targets": spec.target_modules,
            "experts": spec.experts,
            "routers": spec.routers,
            "base_dtype": dtype,
        }
    return info


def check_spec(spec, world_size: int = 1) -> None:
    """Before any model loads: model.lora needs peft, and what LoRA runs cannot do yet (or what
    makes no sense with it) is refused in one line (SpecError)."""
    cfg = spec.model.lora
    if cfg is None:
        return
    require_peft()
    problem = None
    if world_size > 1 and spec.model.sharding == "fsdp":
        problem = "model.sharding: fsdp with model.lora is not supported yet; use ddp (the adapters are small)"
    elif spec.rollout.engine == "vllm-server":
        problem = (
            "rollout.engine: vllm-server with model.lora is not supported yet (the weight push sends the "
            "model's own parameters); use hf or vllm"
        )
    elif spec.train.compile:
        problem = "train.compile with model.lora is not supported yet (not verified with PEFT's layers); use false"
    elif spec.model.router_aux_loss_coef > 0 and cfg.routers == "frozen":
        problem = (
            f"model.router_aux_loss_coef: {spec.model.router_aux_loss_coef:g} with model.lora.routers frozen: the "
            "load-balancing loss could only move the layers under the routers, not the routers; set routers: lora "
            "or full, or the coefficient to 0"
        )
    elif spec.optimizer.router_lr_scale != 1.0 and cfg.routers == "frozen":
        problem = (
            f"optimizer.router_lr_scale: {spec.optimizer.router_lr_scale:g} with model.lora.routers frozen: no "
            "router trains; set routers: lora or full, or the scale to 1"
        )
    if problem:
        raise SpecError(problem)


def merged_parameters(model: torch.nn.Module):
    """(name, tensor) pairs of the policy's weights under the base model's own names, every
    adapter merged (W + scale B A) and a trained router copy in place of its original: what an
    engine holding a plain model (vLLM) needs after each update. A generator: one merged tensor at
    a time, never a second copy of the model."""
    from peft.tuners.lora.layer import LoraLayer, ParamWrapper
    from peft.utils.other import ModulesToSaveWrapper

    adapted, originals = {}, set()
    for mod in model.modules():
        if isinstance(mod, ParamWrapper):
            adapted[id(mod.get_param())] = mod
        elif isinstance(mod, LoraLayer):
            adapted[id(mod.get_base_layer().weight)] = mod
        elif isinstance(mod, ModulesToSaveWrapper):
            originals |= {id(p) for p in mod.original_module.parameters()}
    for name, p in model.named_parameters():
        if ".lora_" in name or id(p) in originals:
            continue
        with torch.no_grad():
            t = p.detach() if id(p) not in adapted else p.detach() + adapted[id(p)].get_delta_weight("default")
        yield name.replace(".base_layer", "").replace(".modules_to_save.default", ""), t
