"""`gspo plan`: the memory a run will need per phase, per device and per host, from the spec
and the model's config.json alone (no weights, no torch)."""

from gspo_cli.plan.memory import LAYOUTS, gb, plan_memory
from gspo_cli.plan.phases import Hardware, Phase, Plan
from gspo_cli.plan.shapes import ModelShape, model_shape, read_config, shape_from_config

__all__ = [
    "LAYOUTS",
    "Hardware",
    "ModelShape",
    "Phase",
    "Plan",
    "gb",
    "model_shape",
    "plan_memory",
    "read_config",
    "shape_from_config",
]
