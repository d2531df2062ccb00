"""The weight push of `rollout.engine: vllm-server`, next to the colocated engine's sync, on one
model: seconds per push, and resident memory above the steady state in the trainer and in the
server's model process while it runs.

    python studies/vllm-fsdp/vllm_server_push.py [--hidden 512] [--layers 4] [--experts 16] [--pushes 3]

(with `.venv-vllm`'s python). Builds a random Qwen3-MoE from a config (nothing downloaded),
starts a vLLM server on it as `gspo vllm-server` would (a subprocess), pushes the trainer's
weights `--pushes` times, each after perturbing them, and checks that the server then samples
with the trainer's log-probs; stops the server, starts a colocated engine (in this process) on
the same directory and syncs it as many times. A thread samples RSS every 2 ms (the trainer's
own; the server's process holding the model, by /proc). Prints one JSON object. This file only measures;
docs/scaling/vllm-fsdp.md holds the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `gspo_cli` from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[2])

MiB = 2**20


def rss_of(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Peak:
    """The largest RSS of process `pid` between enter and exit, sampled every 2 ms."""

    def __init__(self, pid: int | str = "self"):
        self.pid, self.peak, self._run = pid, 0, False

    def __enter__(self):
        self.before = self.peak = rss_of(self.pid)
        self._run = True
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def _loop(self):
        while self._run:
            self.peak = max(self.peak, rss_of(self.pid))
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._run = False
        self._t.join()
        self.peak = max(self.peak, rss_of(self.pid))

    @property
    def above_mib(self) -> float:
        return round((self.peak - self.before) / MiB, 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_worker_pid(server_pid: int) -> int:
    """The server's process that holds the model: vLLM's `VLLM::Worker` (under the engine
    process `VLLM::EngineCore`, under the API server), or the engine process without one."""
    import psutil

    found = {}
    for child in psutil.Process(server_pid).children(recursive=True):
        title = " ".join(child.cmdline()) + " " + child.name()
        for kind in ("Worker", "EngineCore"):
            if f"VLLM::{kind}" in title:
                found.setdefault(kind, child.pid)
    return found.get("Worker") or found.get("EngineCore") or server_pid


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbour, vllm_fsdp_stream.py
    from vllm_fsdp_stream import add_model_args, moe_config

    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--pushes", type=int, default=3)
    args = ap.parse_args()

    import torch
    from transformers import Qwen3MoeForCausalLM

    from gspo_cli.cli.serve import server_argv
    from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine
    from gspo_cli.rollout.vllm_server import VLLMServerRolloutEngine, stream_metadata

    cfg = moe_config(args.hidden, args.layers, args.experts, args.vocab)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).eval()
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    model_dir = Path(tempfile.mkdtemp(prefix="push-"))
    model.save_pretrained(model_dir)
    prompt = [[5, 6, 7, 8]]

    def perturb(i):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * (i + 1))

    port = free_port()
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    log = open(model_dir / "server.log", "w")
    argv = server_argv(str(model_dir), "float32", "127.0.0.1", port, on_cpu=True)
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    sys.exit(f"server did not start: {(model_dir / 'server.log').read_text()[-2000:]}")
                time.sleep(1)
        engine = VLLMServerRolloutEngine(
            model, None, url=f"http://127.0.0.1:{port}", max_new_tokens=8, temperature=1.0, stop_ids=[0]
        )
        core = model_worker_pid(server.pid)
        pushes = []
        for i in range(args.pushes):
            perturb(i)
            with Peak() as mine, Peak(core) as theirs:
                t = time.time()
                engine.sync_weights()
                secs = time.time() - t
            pushes.append(
                {"s": round(secs, 2), "trainer_above_mib": mine.above_mib, "server_above_mib": theirs.above_mib}
            )
        server_gap = sampled_gap(engine, model, prompt)
        engine.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    colocated = VLLMRolloutEngine(
        model, None, model_dir=str(model_dir), max_new_tokens=8, temperature=1.0, stop_ids=[0]
    )
    syncs = []
    for i in range(args.pushes):
        perturb(args.pushes + i)
        with Peak() as mine:
            t = time.time()
            colocated.sync_weights()
            secs = time.time() - t
        syncs.append({"s": round(secs, 2), "process_above_mib": mine.above_mib})
    colocated.close()
    print(
        json.dumps(
            {
                "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
                "tensors_pushed": len(stream_metadata(model, None)[0]),
                "largest_param_mib": round(largest / MiB, 1),
                "server_pushes": pushes,
                "server_gap_after_last_push": server_gap,
                "colocated_syncs": syncs,
            }
        ),
        flush=True,
    )


def sampled_gap(engine, model, prompt: list[list[int]]) -> float:
    """max |server - trainer| log-prob of 8 tokens the server samples after `prompt`."""
    import torch

    body = engine._request(prompt[0], 1.0, (0, 0))
    answer = engine.client.call("/inference/v1/generate", body)["choices"][0]
    ids = answer["token_ids"]
    lps = torch.tensor([c["logprob"] for c in answer["logprobs"]["content"]])
    with torch.no_grad():
        logits = model(torch.tensor([prompt[0] + ids])).logits[0, len(prompt[0]) - 1 : -1]
    ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    return float((ref - lps).abs().max())


if __name__ == "__main__":
    main()
