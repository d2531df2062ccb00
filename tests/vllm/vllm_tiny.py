"""The tiny model and prompts the vLLM tests share, and a `gspo vllm-server` for a test's block."""

import contextlib
import copy
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from gspo_cli.spec.loading import spec_from_dict

# Head dimension 32 (hidden 64 / 2 heads): vLLM's CPU attention has no kernel for 16.
TINY = {
    "name": "vllm",
    "seeds": [0],
    "model": {
        "name": "builtin:tiny-moe",
        "builtin": {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "experts_per_token": 2,
        },
        "cold_start": {"steps": 60, "batch_size": 32, "lr": 1e-2},
    },
    "task": {
        "name": "arithmetic",
        "params": {"num_operands": 2, "max_operand": 4, "operators": "+", "format_weight": 0.5},
        "eval_size": 4,
    },
    "rollout": {"engine": "vllm", "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
    "optimizer": {"lr": 1e-3},
    "train": {"steps": 2},
    "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
}

PROMPTS = [f"{a}+{b}=?\n" for a in range(5) for b in range(5)]  # the task's prompt format


def tiny_spec(**overrides):
    return spec_from_dict({**copy.deepcopy(TINY), **overrides})


@contextlib.contextmanager
def running_server(tmp, spec: str, port: int, vllm_args=(), env=None):
    """`gspo vllm-server SPEC --port PORT -- VLLM_ARGS` until the block ends (its URL); its log
    (tmp/server.log) is shown if it does not come up within 300 s."""
    url = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "w")
    cmd = [sys.executable, "-m", "gspo_cli", "vllm-server", spec, "--port", str(port)]
    proc = subprocess.Popen(
        cmd + (["--", *vllm_args] if vllm_args else []),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    pytest.fail(f"gspo vllm-server did not come up:\n{(tmp / 'server.log').read_text()[-3000:]}")
                time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
