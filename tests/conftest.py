import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Built-in models are cached per test session, never in the user's home."""
    if "GSPO_CACHE_DIR" not in os.environ:
        os.environ["GSPO_CACHE_DIR"] = str(tmp_path_factory.mktemp("gspo-cache"))
    yield


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # Two threads on a 2-core box; fixed so timings and reductions don't vary between tests.
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
