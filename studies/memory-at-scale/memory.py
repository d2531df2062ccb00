"""Peak host memory per process: of one RL step on a larger built-in MoE (the default run, the
older table), and of loading + one step per rank on a >= 250 M-parameter Qwen3-MoE (`--scale`,
the before/after table of docs/scaling/memory.md).

    .venv/bin/python studies/memory-at-scale/memory.py [--out results/bench/memory.md]
    .venv/bin/python studies/memory-at-scale/memory.py --scale 2,4 [--dtype float32] [--out FILE.json]

Default run: each configuration runs `gspo train` (2 steps, no cold start: memory does not
depend on what the weights have learnt) in a fresh process tree. Two peaks, each the largest
over processes: during the training steps (the run's own `perf/peak_rss_mb`, loading
included), and over the whole run (getrusage of the waited children), which adds the final
checkpoint.

`--scale`: the built-in MoE of SCALE_MODEL (random weights, saved in float32 by the built-in
cache, so the checkpoint's dtype is float32) is built once in this process, then for each
process count N a `torchrun --nproc-per-node N` of this file's rank worker runs
`train.step.setup` (load + FSDP sharding) and one `train_step`, and every rank reports its
own memory when idle (imports done, process group joined) and its peaks during setup (the
load) and during the step (`PhasePeaks`: resident high-water mark and sampled anonymous
memory, reset per phase). Figures are peaks above idle, in units of the float32 model size.
The worker only calls `setup` and `train_step`, so the same file measures any commit
(PYTHONPATH pointing at another worktree).
"""

from __future__ import annotations

import argparse
import json
import os
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
# ~0.27 B parameters, 1.0 GiB in float32; the character vocabulary keeps the head small, so
# the figures are about the decoder layers (experts), as in Qwen3-30B-A3B.
SCALE_MODEL = {
    **MODEL,
    "builtin": {
        "hidden_size": 768,
        "num_layers": 9,
        "num_heads": 12,
        "num_kv_heads": 4,
        "num_experts": 32,
        "experts_per_token": 4,
        "moe_intermediate_size": 384,
        "intermediate_size": 1536,
    },
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


def scale_spec(out: Path, dtype: str) -> dict:
    return {
        "name": "memory_scale",
        "output_dir": str(out),
        "model": {**SCALE_MODEL, "sharding": "fsdp", "dtype": dtype},
        "task": {"name": "arithmetic", "eval_size": 0},
        "rollout": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 8},
        "train": {"steps": 1, "checkpoint_every": 0},
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


class PhasePeaks:
    """Per-phase peaks of this process's memory, MiB: `rss` the kernel's high-water mark of
    resident memory (VmHWM, reset at each phase through /proc/self/clear_refs), which counts
    mapped file pages too (a safetensors checkpoint is read through mmap: its pages are page
    cache, shared and reclaimable); `anon` the largest anonymous resident memory (RssAnon,
    the tensors themselves), sampled every 2 ms by a thread."""

    def __init__(self):
        import threading

        self.anon_max = 0.0
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    @staticmethod
    def status() -> dict:
        fields = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) / 1024  # kB
        return fields

    def _sample(self) -> None:
        import time

        while True:
            self.anon_max = max(self.anon_max, self.status()["RssAnon"])
            time.sleep(0.002)

    def start(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.anon_max = self.status()["RssAnon"]

    def end(self) -> dict:
        st = self.status()
        return {"rss": st["VmHWM"], "anon": max(self.anon_max, st["RssAnon"]), "file_now": st["RssFile"]}


def rank_worker(spec_yaml: str, source: str, out_dir: str) -> None:
    """One rank of a `--scale` run (under torchrun): idle, load and step peaks -> rank<r>.json."""
    import torch

    from gspo_cli import distributed
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task
    from gspo_cli.train import step as step_mod

    spec = spec_from_dict(yaml.safe_load(Path(spec_yaml).read_text()))
    info = distributed.setup()
    task = make_task(spec.task.name, spec.task.params)
    peaks = PhasePeaks()
    distributed.barrier(info)
    idle = peaks.status()
    peaks.start()
    ctx = step_mod.setup(spec, spec.arms[0], 0, task, source, dist_info=info)
    distributed.barrier(info)
    load = peaks.end()
    peaks.start()
    metrics = step_mod.train_step(ctx, 1)
    distributed.barrier(info)
    step = peaks.end()
    result = {"rank": info.rank, "idle": idle, "load": load, "step": step, "loss": metrics.get("policy/loss")}
    Path(out_dir, f"rank{info.rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip teardown: see tests/dist/update_check.py


def measure_scale(world: int, dtype: str) -> dict:
    """Build (or reuse) SCALE_MODEL, run the rank workers under torchrun, collect their peaks."""
    from gspo_cli.models import resolve_model_source
    from gspo_cli.spec import ModelConfig
    from gspo_cli.tasks import make_task

    source = resolve_model_source(ModelConfig(**SCALE_MODEL), make_task("arithmetic", {}), log=lambda m: None)
    fp32_mib = sum(f.stat().st_size for f in Path(source).glob("*.safetensors")) / 2**20
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(scale_spec(Path(tmp) / "out", dtype)))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        res = subprocess.run(cmd + [__file__, "--rank-worker", str(path), source, tmp], capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"torchrun failed ({res.returncode}): {res.stderr[-3000:]}")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    return {"processes": world, "dtype": dtype, "fp32_model_mib": round(fp32_mib), "ranks": ranks}


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


def render_scale(rows: list[dict], label: str = "") -> str:
    """Markdown rows: per process count, rank 0 and the largest non-zero rank; each phase's
    peak above the idle process (resident, and anonymous only), MiB and x the float32 model."""

    def cell(ranks, phase, kind):
        base = "VmRSS" if kind == "rss" else "RssAnon"
        v = max(x[phase][kind] - x["idle"][base] for x in ranks)
        return f"{v:,.0f} ({v / m:.2f}x)"

    lines = []
    for r in rows:
        m = r["fp32_model_mib"]
        for who, ranks in (("0", r["ranks"][:1]), ("others (max)", r["ranks"][1:])):
            lines.append(
                f"| {label} | {r['processes']} | {r['dtype']} | {who} | "
                + " | ".join(cell(ranks, ph, kind) for ph in ("load", "step") for kind in ("rss", "anon"))
                + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--scale", help="comma-separated process counts for the load/step table (e.g. 2,4)")
    ap.add_argument("--dtype", default="float32", help="model.dtype of the --scale runs")
    ap.add_argument("--label", default="", help="first column of the --scale rows (e.g. before/after)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: world,sharding,checkpointing
    ap.add_argument("--rank-worker", nargs=3, help=argparse.SUPPRESS)  # internal: spec, source, out dir
    args = ap.parse_args()
    if args.rank_worker:
        rank_worker(*args.rank_worker)
        return
    if args.one:
        world, sharding, ckpt = args.one.split(",")
        print(json.dumps(measure_one(int(world), sharding, ckpt == "1")))
        return
    if args.scale:
        rows = [measure_scale(int(n), args.dtype) for n in args.scale.split(",")]
        out = Path(args.out or "results/bench/memory_scale.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=1))
        print(f"fp32 model: {rows[0]['fp32_model_mib']} MiB")
        print(render_scale(rows, args.label))
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
    out = Path(args.out or "results/bench/memory.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
