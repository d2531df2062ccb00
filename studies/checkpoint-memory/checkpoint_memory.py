"""Peak host memory of writing one checkpoint of an FSDP-sharded model, per rank: the way
gspo-cli wrote them before sharded checkpoints (gather the full model and the full AdamW
state on rank 0, write them there) against today's (`train.checkpoint`: every rank writes its
own slices with torch.distributed.checkpoint). Not part of the test suite.

Measures: a random Qwen3 (dense, --hidden x --layers, vocab 32k), fully_shard per layer,
one AdamW step on a fixed batch, then the peak RSS rise (VmHWM, reset just before) while one
checkpoint is written. Each way runs in fresh processes. Writes results/checkpoint_memory.json
(git ignores results/) and prints a Markdown table.

usage: python studies/checkpoint-memory/checkpoint_memory.py [--procs 2] [--hidden 1024] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def worker(way: str, hidden: int, layers: int, out_dir: str) -> None:
    """One rank: build, shard, step, then write one checkpoint `way` ("gather" or "sharded")."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from gspo_cli import distributed
    from gspo_cli.runs import RunDir
    from gspo_cli.train.checkpoint import save_checkpoint

    info = distributed.setup()
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=32000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=hidden // 8,
        intermediate_size=hidden * 3,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in model.parameters())
    distributed.shard_(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.arange(2 * 32).reshape(2, 32) % 1000 + 3
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    base = _rss_mb("VmRSS")
    rd = RunDir(Path(out_dir) / "run")
    if way == "gather":  # what train.loop did before: full states on rank 0, written there
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full_model = get_model_state_dict(model, options=opts)
        full_optim = get_optimizer_state_dict(model, opt, options=opts)
        if info.is_main:
            rd.path.mkdir(parents=True, exist_ok=True)
            torch.save({"model": full_model, "optimizer": full_optim}, rd.path / "full.pt")
        del full_model, full_optim
    else:

        class Tok:
            def save_pretrained(self, path):
                (Path(path) / "tokenizer_config.json").write_text("{}")

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
        save_checkpoint(
            rd, 1, model, opt, Tok(), sched, info=info, rng=random.Random(0), shuffle=torch.Generator(), keep=1
        )
    distributed.barrier(info)
    rise = _rss_mb("VmHWM") - base
    rows = distributed.gather_objects(round(rise, 1), info)
    if info.is_main:
        fp32_mb = n_params * 4 / 2**20
        print(json.dumps({"way": way, "params": n_params, "fp32_model_mb": round(fp32_mb, 1), "rise_mb": rows}))


def measure(procs: int, hidden: int, layers: int) -> list[dict]:
    results = []
    for way in ("gather", "sharded"):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
            cmd += [__file__, "--worker", way, "--hidden", str(hidden), "--layers", str(layers), "--out", tmp]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            results.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return results


def render(results: list[dict], procs: int) -> str:
    r0 = results[0]
    lines = [
        f"Checkpoint write, {procs} processes, {r0['params'] / 1e6:.0f} M parameters "
        f"({r0['fp32_model_mb']:.0f} MB in fp32), peak RSS rise per rank (MB):",
        "",
        "| way | " + " | ".join(f"rank {i}" for i in range(procs)) + " |",
        "| --- | " + " | ".join("---" for _ in range(procs)) + " |",
    ]
    for r in results:
        name = "gather on rank 0 (before)" if r["way"] == "gather" else "per-rank DCP (now)"
        lines.append(f"| {name} | " + " | ".join(f"{x:.0f}" for x in r["rise_mb"]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--worker")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.hidden, a.layers, a.out)
        return
    results = measure(a.procs, a.hidden, a.layers)
    out = ROOT / "results" / "checkpoint_memory.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(render(results, a.procs))


if __name__ == "__main__":
    main()
