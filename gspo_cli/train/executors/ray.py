"""The Ray executor: one Ray task per run (not built yet: the spec section and the option exist
so that a spec can say it; `--executor ray` refuses until it is)."""

from __future__ import annotations

from gspo_cli.errors import SpecError


class RayExecutor:
    name = "ray"

    def __init__(self, config):
        raise SpecError("--executor ray: not available yet in this gspo; use local or slurm")
