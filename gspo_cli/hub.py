"""The Hugging Face hub, asked once: without a network its client retries each file for ~25-30 s
before giving up, so the policy's loading and a reward model given by hub id ask the endpoint
once, briefly, and read only the local cache when it does not answer."""

from __future__ import annotations

import functools


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable() -> bool:
    """Whether the Hugging Face hub (HF_ENDPOINT) answers at all, asked once per process and
    endpoint with one short request and no retries. True in offline mode (HF_HUB_OFFLINE=1):
    the hub client then reads its cache itself, without trying the network."""
    from huggingface_hub import constants

    return True if constants.HF_HUB_OFFLINE else _answers(constants.ENDPOINT)


@functools.lru_cache(maxsize=None)
def _answers(endpoint: str, timeout_s: float = 3.0) -> bool:
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=timeout_s)  # any HTTP answer will do
    except Exception:  # refused, timed out, no route, DNS: all mean "no hub from here"
        return False
    return True


def hub_revision(repo_id: str) -> str | None:
    """The commit of `repo_id`'s snapshot in the local hub cache (no network), else None."""
    try:
        from pathlib import Path

        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True)).name
    except Exception:  # not cached, not a repo id, no huggingface_hub: unknown
        return None
