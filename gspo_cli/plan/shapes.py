"""A model's shape from its `config.json` alone, and its exact parameter counts (Qwen3 and
Qwen3-MoE, as transformers builds them), without torch and without weights."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from gspo_cli.errors import SpecError
from gspo_cli.spec import ExperimentSpec

# Architectures whose parameter count below is exact (checked against a meta-device build in
# tests/test_plan.py). Others with the same fields are sized as the nearest of these, with a warning.
EXACT_TYPES = ("qwen3", "qwen3_moe")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Other names for the same field: transformers 5 saves Qwen3-MoE's num_experts as
# num_local_experts; the published configs use num_experts.
CONFIG_ALIASES = {"num_local_experts": "num_experts"}
# transformers' defaults (Qwen3Config / Qwen3MoeConfig) for fields a config.json may leave out;
# Qwen3's head_dim defaults to 128, not hidden_size / heads.
_QWEN = {"vocab_size": 151936, "tie_word_embeddings": False, "attention_bias": False, "num_attention_heads": 32}
CONFIG_DEFAULTS = {
    "qwen3": _QWEN
    | {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "intermediate_size": 22016,
    },
    "qwen3_moe": _QWEN
    | {
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_key_value_heads": 4,
        "intermediate_size": 6144,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}


@dataclass(frozen=True)
class ModelShape:
    """The sizes the memory plan needs. Lengths in elements, never bytes."""

    model_type: str
    vocab: int  # V
    hidden: int  # h
    layers: int  # L
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width
    experts: int  # 0: dense
    top_k: int  # experts per token
    moe_intermediate: int
    moe_layers: tuple[int, ...]  # indices of the layers with an MoE block
    tied: bool  # lm_head shares the embedding
    attention_bias: bool = False
    checkpoint_dtype: str = "float32"  # what the weights on disk are stored in

    def attention_params(self) -> int:
        """q, k, v, o projections (+ biases) and Qwen3's per-head q/k norms of one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 2 * self.head_dim
        return n + ((q + 2 * kv + self.hidden) if self.attention_bias else 0)

    def mlp_params(self, layer: int) -> int:
        """One layer's MLP: the router plus every expert's gate/up/down, or a dense SwiGLU."""
        if layer in self.moe_layers:
            return self.experts * self.hidden + self.experts * 3 * self.hidden * self.moe_intermediate
        return 3 * self.hidden * self.intermediate

    def layer_params(self, layer: int) -> int:
        return self.attention_params() + self.mlp_params(layer) + 2 * self.hidden  # + the two RMSNorms

    def embedding_params(self) -> int:
        """Input embedding, final norm and (untied) lm_head: FSDP's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def total_params(self) -> int:
        return self.embedding_params() + sum(self.layer_params(i) for i in range(self.layers))

    def largest_layer_params(self) -> int:
        return max(self.layer_params(i) for i in range(self.layers))

    def expert_params(self) -> int:
        per = 3 * self.hidden * self.moe_intermediate
        return self.experts * per * len(self.moe_layers)

    def active_params(self) -> int:
        """Parameters one token's forward touches (top_k experts per MoE layer)."""
        idle = (self.experts - self.top_k) * 3 * self.hidden * self.moe_intermediate * len(self.moe_layers)
        return self.total_params() - idle


def shape_from_config(cfg: dict, where: str = "config.json") -> ModelShape:
    """A ModelShape from a parsed HF `config.json` (Qwen3 / Qwen3-MoE fields; llama-like
    configs without experts work too). A missing required field is a SpecError naming it."""

    cfg = {k: v for k, v in cfg.items() if v is not None}
    for alias, name in CONFIG_ALIASES.items():
        if alias in cfg and name not in cfg:
            cfg[name] = cfg[alias]
    cfg = {**CONFIG_DEFAULTS.get(cfg.get("model_type", ""), {}), **cfg}

    def need(key: str):
        if key not in cfg:
            raise SpecError(f"{where}: no {key!r} field (needed to size the model)")
        return cfg[key]

    hidden, layers, heads = int(need("hidden_size")), int(need("num_hidden_layers")), int(need("num_attention_heads"))
    experts = int(cfg.get("num_experts") or 0)
    step = int(cfg.get("decoder_sparse_step") or 1)
    only_dense = set(cfg.get("mlp_only_layers") or [])
    moe_layers = tuple(i for i in range(layers) if i not in only_dense and (i + 1) % step == 0) if experts > 0 else ()
    return ModelShape(
        model_type=str(cfg.get("model_type", "unknown")),
        vocab=int(need("vocab_size")),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(cfg.get("intermediate_size") or 0),
        experts=experts,
        top_k=int(cfg.get("num_experts_per_tok") or 0),
        moe_intermediate=int(cfg.get("moe_intermediate_size") or 0),
        moe_layers=moe_layers,
        tied=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        checkpoint_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
    )


def read_config(path: str | Path) -> dict:
    """A model's config.json: `path` is the file itself or a directory holding it. A missing
    or unparsable file is a SpecError naming the path (nothing here reaches a hub)."""
    p = Path(path).expanduser()
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise SpecError(
            f"model.name: {path} has no config.json (gspo plan reads a local model directory or "
            "config file; download the config first, or pass --config PATH)"
        )
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise SpecError(f"{file}: not a readable JSON config ({err})") from None


def _local_or_cached(name: str) -> str:
    """`name` itself when it is a local path; for a hub id ("org/model"), the config.json of
    its snapshot in the Hugging Face cache when there is one (nothing is downloaded)."""
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        return name
    hub = os.environ.get("HF_HUB_CACHE") or str(Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = Path(hub).expanduser() / f"models--{name.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SpecError(
            f"model.name: {name} is a hub id with no config.json in the Hugging Face cache ({snapshots}); "
            "gspo plan reads no network: pass --config with a local config.json or its directory"
        )
    return str(found[-1])


def builtin_prompt_tokens(spec: ExperimentSpec, n: int = 256) -> int:
    """The longest prompt, in tokens, among `n` of a built-in model's training problems (its
    tokenizer has one token per character and no chat template)."""
    from gspo_cli.tasks import make_task

    task = make_task(spec.task.name, spec.task.params)
    return max(len(p.prompt) for p in task.train_problems(random.Random(0), n))


def builtin_config(spec: ExperimentSpec) -> dict:
    """The config.json a built-in model of this spec will have (gspo_cli.models.builtin's
    build_config), derived without building it: the vocabulary is the character tokenizer's
    over the task's corpus, the same draw the builder makes."""
    from gspo_cli.tasks import make_task
    from gspo_cli.tasks.base import character_vocabulary

    kind = spec.model.name.split(":", 1)[1]
    size = spec.model.builtin
    task = make_task(spec.task.name, spec.task.params)
    vocab = len(character_vocabulary(task.corpus_text(random.Random(spec.model.cold_start.seed + 1))))
    cfg = {
        "model_type": "qwen3" if kind == "tiny-dense" else "qwen3_moe",
        "vocab_size": vocab,
        "hidden_size": size.hidden_size,
        "num_hidden_layers": size.num_layers,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads,
        "head_dim": size.hidden_size // size.num_heads,
        "intermediate_size": size.intermediate_size,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    if kind != "tiny-dense":
        cfg |= {
            "num_experts": size.num_experts,
            "num_experts_per_tok": size.experts_per_token,
            "moe_intermediate_size": size.moe_intermediate_size,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    return cfg


def model_shape(spec: ExperimentSpec, config: str | Path | None = None) -> tuple[ModelShape, list[str]]:
    """The spec's model shape and any warnings. `config` (a config.json or its directory)
    overrides where it is read from; otherwise a built-in model's is derived and any other
    `model.name` must be a local directory with a config.json."""
    warnings = []
    if config is not None:
        raw = read_config(config)
    elif spec.model.name.startswith("builtin:"):
        raw = builtin_config(spec)
    else:
        raw = read_config(_local_or_cached(spec.model.name))
    shape = shape_from_config(raw, str(config or spec.model.name))
    if shape.model_type not in EXACT_TYPES:
        warnings.append(
            f"model_type {shape.model_type!r}: parameter counts are exact for {', '.join(EXACT_TYPES)} only; "
            "sized here as a Qwen3-shaped transformer"
        )
    return shape, warnings


def activation_elems_per_token(shape: ModelShape, layer: int) -> int:
    """Elements one token keeps for backward in one decoder layer (no recompute), counted from
    the ops of transformers' Qwen3 / Qwen3-MoE layers: each RMSNorm's input and normalised
    output (2h), q/k/v and their per-head norms and rotary outputs, the attention output (GQA's
    k/v expanded to every head for SDPA), the residual sums; a dense SwiGLU's gate, up, act and
    product (4 x intermediate); an MoE block's router logits and probabilities (2E) and, per
    routed copy (top_k per token), the gathered input, gate/up, act, product, down output and
    weighted output (3h + 4 x moe_intermediate)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attn = 2 * h + 3 * q + 3 * kv + 2 * q + q + 2 * h  # norm, q/k/v(+norms, rope), sdpa (GQA expanded), o, residual
    if layer in shape.moe_layers:
        mlp = 2 * h + 2 * shape.experts + shape.top_k * (3 * h + 4 * shape.moe_intermediate) + h
    else:
        mlp = 2 * h + 4 * shape.intermediate + h
    return attn + mlp


def forward_elems_per_token(shape: ModelShape, layer: int) -> int:
    """Elements one token holds at the peak of a no-grad forward through one layer (nothing
    kept for backward): the residual stream and its normalised copy, then the widest point,
    q/k/v (GQA expanded) in attention or, in an MoE block, each routed copy's input, gate/up and
    activation (top_k x (h + 3 x moe_intermediate)); a dense SwiGLU's gate, up and activation."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attn = 2 * h + 3 * q + 2 * kv
    if layer in shape.moe_layers:
        mlp = 2 * h + 2 * shape.experts + shape.top_k * (h + 3 * shape.moe_intermediate)
    else:
        mlp = 2 * h + 3 * shape.intermediate
    return max(attn, mlp)
