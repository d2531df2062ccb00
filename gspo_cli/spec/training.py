"""`optimizer:` and `train:` the update's optimizer, the run's length, schedules, divergence
guards and memory options."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.spec.base import _Strict

# Optional metric sinks (gspo_cli.train.sinks): name -> (module to import, pip extra). The one
# list of names: the spec accepts these, the sinks module builds them, the docs list them.
SINK_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"),
}
SinkName = Literal[tuple(SINK_PACKAGES)]  # type: ignore[valid-type]


class OptimizerConfig(_Strict):
    """AdamW over the policy's parameters, one optimizer step per mini-batch."""

    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay")
    beta2: float = Field(0.999, ge=0, lt=1, description="AdamW second-moment decay")
    grad_clip: float = Field(1.0, gt=0, description="largest global gradient norm; larger ones are scaled down")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up, in RL steps")
    decay: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="learning-rate decay after the warm-up, reaching lr x min_lr_ratio at train.steps: "
        "constant (none), linear or cosine",
    )
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="with decay: the final learning rate as a fraction of lr")
    router_lr_scale: float = Field(
        1.0,
        gt=0,
        description="MoE only: the routers' learning rate is lr x this (1: one rate for all weights); "
        "a router that moves faster than the rest of the network flips more expert choices per update",
    )


class DivergenceConfig(_Strict):
    """When a run is declared diverged. NaN/Inf in the loss, gradients or log-probs always
    counts; the collapse detectors are off unless given a threshold."""

    skip_bad_batches: bool = Field(
        False,
        description="skip a mini-batch with a non-finite loss or gradient instead of stopping (isolated bad batches)",
    )
    max_skipped: int = Field(3, ge=0, description="with skip_bad_batches: diverge after this many skips in a run")
    reward_below: float | None = Field(None, description="collapse: mean reward below this for `patience` steps")
    entropy_below: float | None = Field(None, ge=0, description="collapse: entropy below this for `patience` steps")
    patience: int = Field(10, ge=1, description="steps a collapse condition must hold")


class TrainConfig(_Strict):
    """A run's length, evaluation, checkpoints, metric sinks and memory options."""

    steps: int = Field(20, ge=1, description="RL steps per run (one rollout batch each)")
    checkpoint_every: int = Field(
        50, ge=0, description="steps between checkpoints (resume points); 0: only the final one"
    )
    keep_checkpoints: int = Field(2, ge=1, description="most recent checkpoints kept on disk")
    eval_every: int = Field(0, ge=0, description="0: evaluate only at the end")
    eval_samples: int = Field(1, ge=1, description="samples per eval problem (avg@k)")
    sinks: list[SinkName] = Field(
        default_factory=list,
        description="extra metric sinks besides metrics.jsonl (gspo_cli.train.sinks): "
        "tensorboard, wandb, mlflow, trackio; all offline by default",
    )
    log_samples_every: int = Field(
        10,
        ge=0,
        description="steps between writes of samples.jsonl (a few prompts, completions, rewards and "
        "advantages of the step's batch, bounded in size); 0: never",
    )
    divergence: DivergenceConfig = DivergenceConfig()
    gradient_checkpointing: bool = Field(
        False,
        description="recompute each decoder layer's activations in "
        "backward instead of keeping them (less memory, "
        "~1 extra forward per update)",
    )
    # Compiling costs tens of seconds per width on a CPU; the artefacts are cached on disk
    # (GSPO_CACHE_DIR/torch-compile), so only the first run with a given model size and width pays.
    compile: bool = Field(
        False,
        description="compile the update's forward and backward with torch.compile, each mini-batch padded "
        "to a width that is a multiple of compile_bucket; compiled code is cached on disk across runs",
    )
    compile_bucket: int = Field(
        16, ge=1, description="with compile: pad each mini-batch's width (tokens) up to a multiple of this"
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="per process: run each mini-batch's update, and every no-grad forward over the step's "
        "batch, in micro-batches of at most this many real tokens (prompt + response, no padding), whole "
        "rows packed evenly; gradients accumulate into one optimizer step equal to the unsplit one. A row "
        "longer than this runs alone (perf/oversize_rows). None: no limit",
    )
    micro_batch_rows: int | None = Field(
        None, ge=1, description="per process: at most this many rows per micro-batch (see micro_batch_tokens)"
    )
    packing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="padding-free forwards: each micro-batch's rows concatenated into one row with per-row "
        "positions (transformers' packed-sequence path), log-probs and routes unpacked per row. auto: only "
        "where measured faster than padding (nowhere yet: mixed on CPU, no GPU measured; benchmarks/README.md); "
        "on: wherever the attention can; where it cannot, or with compile, padding, said in the run's setup line",
    )

    @field_validator("packing", mode="before")
    @classmethod
    def _yaml_on_off(cls, value):
        """YAML 1.1 reads a bare `on` / `off` as true / false: take them as meant."""
        return ("on" if value else "off") if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _compile_whole_batches(self):
        if self.compile and (self.micro_batch_tokens or self.micro_batch_rows):
            raise ValueError(
                "compile: not with micro_batch_tokens / micro_batch_rows (every micro-batch's row count would "
                "be a new compiled graph); drop one of them"
            )
        return self
