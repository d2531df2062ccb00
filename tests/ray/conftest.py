"""The Ray executor on a local Ray cluster, which each `gspo` command here starts and stops
(`make test-ray` installs the ray extra and runs this folder). Without ray every test here is
skipped with the reason, never passed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_study_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def env(cache_dir):
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("ray is not installed (pip install 'gspo-cli[ray]'; make test-ray installs it)")
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "GSPO_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


@pytest.fixture
def tiny_spec():
    return tiny_study_spec


@pytest.fixture
def gspo():
    def run(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gspo_cli", *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    return run
