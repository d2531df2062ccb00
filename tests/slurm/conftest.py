"""The SLURM executor against a real single-node SLURM (`make test-slurm` starts one with
tests/slurm/start.sh, runs this folder and stops it). Without a cluster every test here is
skipped with the reason, never passed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_study_spec

HERE = Path(__file__).parent


def _cluster_problem() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        return "no SLURM cluster: SLURM_CONF is not set (make test-slurm starts one and sets it)"
    if not shutil.which("sinfo"):
        return "no SLURM client tools (slurm-wlm) on PATH"
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 20 s"
    if r.returncode or not r.stdout.strip():
        return f"SLURM does not answer: {r.stderr.strip() or 'no node'}"
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit is not installed (pip install 'gspo-cli[slurm]')"
    return None


@pytest.fixture(scope="session")
def slurm():
    problem = _cluster_problem()
    if problem:
        pytest.skip(problem)
    return os.environ["SLURM_CONF"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One model cache for the whole suite (a shared filesystem for the jobs, as on a cluster)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def env(slurm, cache_dir):
    """The environment of a `gspo` command: this checkout first on PYTHONPATH (the jobs inherit it)."""
    root = str(HERE.parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "GSPO_CACHE_DIR": str(cache_dir), "PYTHONPATH": root + (os.pathsep + path if path else "")}


@pytest.fixture
def tiny_spec():
    return tiny_study_spec


@pytest.fixture
def gspo():
    return _gspo


def _gspo(args: list[str], env: dict, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gspo_cli", *args], env=env, capture_output=True, text=True, timeout=timeout, **kw
    )
