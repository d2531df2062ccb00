"""Peak memory per process of one RL step on a larger built-in MoE: 1 process, 2 x DDP and
2 x FSDP (gloo, CPU), each with and without activation checkpointing.

    .venv/bin/python benchmarks/memory.py [--out results/bench/memory.md]

Each configuration runs `gspo train` (2 steps, no cold start: memory does not depend on what
the weights have learnt) in a fresh process tree. Two peaks, each the largest over processes:
during the training steps (the run's own `perf/peak_rss_mb`, loading included), and over the
whole run (getrusage of the waited children), which adds the final checkpoint: rank 0
gathers the whole weights and optimizer state to write it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

MODEL = {
    "name": "builtin:tiny-moe",
    "builtin": {
        "hidden_size": 512,
        "num_layers": 8,
        "num_heads": 8,
        "num_kv_heads": 4,
        "num_experts": 32,
        "experts_per_token": 4,
        "moe_intermediate_size": 256,
        "intermediate_size": 1024,
    },
    "cold_start": {"steps": 0},
}
CONFIGS = [
    (1, "ddp", False),
    (1, "ddp", True),
    (2, "ddp", False),
    (2, "ddp", True),
    (2, "fsdp", False),
    (2, "fsdp", True),
]


def spec(out: Path, sharding: str, checkpointing: bool) -> dict:
    return {
        "name": "memory",
        "output_dir": str(out),
        "model": {**MODEL, "sharding": sharding},
        "task": {"name": "arithmetic", "eval_size": 0},
        "rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 32},
        "train": {"steps": 2, "checkpoint_every": 0, "gradient_checkpointing": checkpointing},
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
    }


def measure_one(world: int, sharding: str, checkpointing: bool) -> dict:
    """Run one configuration (in this process's children) and return its peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(spec(Path(tmp) / "out", sharding, checkpointing)))
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
            if world > 1
            else [sys.executable]
        )
        res = subprocess.run(
            launcher + ["-m", "gspo_cli", "train", str(path), "--quiet", "--json"], capture_output=True, text=True
        )
        status = json.loads(res.stdout)[0]["status"] if res.returncode == 0 else f"exit {res.returncode}"
        metrics = [json.loads(line) for line in (Path(tmp) / "out/memory/gspo/seed0/metrics.jsonl").open()]
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: kB
    return {
        "processes": world,
        "sharding": sharding if world > 1 else "-",
        "checkpointing": checkpointing,
        "train_peak_rss_mb": round(metrics[-1]["perf/peak_rss_mb"]),
        "peak_rss_mb": round(peak_mb),
        "status": status,
    }


def render(rows: list[dict]) -> str:
    lines = [
        "| processes | sharding | activation checkpointing | peak RSS per process, training steps (MB) "
        "| peak RSS per process, whole run (MB) | run |",
        "|---:|---|---|---:|---:|---|",
    ]
    lines += [
        f"| {r['processes']} | {r['sharding']} | {'yes' if r['checkpointing'] else 'no'} | "
        f"{r['train_peak_rss_mb']:,} | {r['peak_rss_mb']:,} | {r['status']} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/memory.md")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: world,sharding,checkpointing
    args = ap.parse_args()
    if args.one:
        world, sharding, ckpt = args.one.split(",")
        print(json.dumps(measure_one(int(world), sharding, ckpt == "1")))
        return
    rows = []
    for world, sharding, ckpt in CONFIGS:  # a fresh process per configuration: its own peak
        res = subprocess.run(
            [sys.executable, __file__, "--one", f"{world},{sharding},{int(ckpt)}"],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    text = render(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
