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


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for a module of tiny-model tests (use with `pytest.mark.usefixtures`): a
    second intra-op thread only adds overhead there (the eager experts' index_add_ can take ~40 ms
    per call with 2 threads on a loaded CPU); restored for the other modules."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
