"""Models: loading HF causal LMs, the built-in tiny models, MoE routing capture/replay."""

from gspo_cli.models.loading import LoadedModel, compute_context, load_model, resolve_model_source

__all__ = ["LoadedModel", "compute_context", "load_model", "resolve_model_source"]
