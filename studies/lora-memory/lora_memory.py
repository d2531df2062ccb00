"""Peak resident memory per phase and step times, one process on CPU, full
fine-tuning vs LoRA r=16 (model.lora) on a random local Qwen3-MoE of ~300 M parameters built from
a config (plan_check.py's `moe-300M`), with `gspo plan`'s per-process figure beside each phase.

    PYTHONPATH=. .venv/bin/python studies/lora-memory/lora_memory.py [--out results/bench/lora_memory.md] [--prompts 4]
        [--only LoRA] [--replan SAVED.json ...]   # --replan: saved measurements against the current plan

Each configuration runs in a fresh process: setup (phase "load"), two RL steps of the quickstart's
shape at a small batch (4 prompts x 4 samples, 48 new tokens, 2 mini-batches, so activations stay
small), one checkpoint; peaks are the kernel's high-water mark after a reset at each phase's start
(plan_check.PhaseMeter), minus the process's RSS before the model exists.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the plan check: benchmarks/plan_check.py

from benchmarks import plan_check as pc  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TAG = "LORA_MEMORY "
MODEL = pc.local("qwen3_moe", 640, 8, 32000, experts=32, moe_intermediate=512)
CONFIGS = [  # name, model.dtype, model.lora
    ("full fine-tuning", "float32", None),
    ("LoRA r=16, base fp32", "float32", {"r": 16}),
    ("LoRA r=16, base bf16", "bfloat16", {"r": 16}),
]


def worker(spec_file: str) -> None:
    import gc
    import warnings

    from gspo_cli.runs import RunDir
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.tasks import make_task
    from gspo_cli.train import loop, step

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = load_spec(spec_file)
    task = make_task(spec.task.name, spec.task.params)
    gc.collect()
    baseline = pc._rss_mb()
    meter = pc.PhaseMeter()
    with meter("load"):
        ctx = step.setup(spec, spec.arms[0], 0, task, spec.model.name)
    generate = meter.wrap("rollout", ctx.engine.generate)
    prompt_len = 0

    def generate_and_note(prompts):
        nonlocal prompt_len
        batch = generate(prompts)
        prompt_len = max(prompt_len, batch.prompt_len)
        return batch

    ctx.engine.generate = generate_and_note
    step.old_policy = meter.wrap("pi_old", step.old_policy)
    step.update = meter.wrap("update", step.update)  # as step.py imported it (train/update.py)
    times = []
    for i in (1, 2):
        m = step.train_step(ctx, i)
        times.append({k: m[k] for k in ("time/step_s", "time/rollout_s", "time/update_s")})
    with tempfile.TemporaryDirectory() as tmp, meter("checkpoint"):
        t = time.time()
        loop._checkpoint(ctx, RunDir(Path(tmp) / "run"), 2)
        ckpt_s = time.time() - t
    trainable = sum(p.numel() for p in ctx.model.parameters() if p.requires_grad)
    row = {
        "baseline_mb": baseline,
        "prompt_len": prompt_len,
        "peaks_mb": meter.peaks,
        "times": times,
        "ckpt_s": ckpt_s,
        "trainable": trainable,
    }
    print(TAG + json.dumps(row), flush=True)


def main() -> None:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "lora_memory.md"))
    ap.add_argument("--prompts", type=int, default=4, help="rollout.prompts_per_step (x 4 samples)")
    ap.add_argument("--only", help="run only configurations whose name contains this (e.g. LoRA)")
    ap.add_argument("--replan", nargs="+", metavar="JSON", help="re-render saved measurements with the current plan")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.replan:
        results = [r for path in args.replan for r in json.loads(Path(path).read_text())]
        for r in results:
            r["plan_mb"] = replan(r)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text := render(results))
        print(text)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        pc.write_local_model(MODEL, model_dir)
        for name, _, _ in CONFIGS:
            if args.only and args.only not in name:
                continue
            raw = spec_for(name, 4 * args.prompts, str(model_dir), Path(tmp) / "out")
            spec_file = Path(tmp) / "spec.yaml"
            spec_file.write_text(yaml.safe_dump(raw))
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, __file__, "--worker", str(spec_file)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            rows = [json.loads(line[len(TAG) :]) for line in res.stdout.splitlines() if line.startswith(TAG)]
            if res.returncode != 0 or len(rows) != 1:
                raise RuntimeError(f"{name}: exit {res.returncode}\n{res.stderr[-3000:]}")
            row = rows[0]
            plan = pc.plan_for(raw, 1, row["prompt_len"])["sharded"]
            measured = {ph: row["peaks_mb"][ph] - row["baseline_mb"] for ph in pc.PHASES}
            results.append(
                {
                    "name": name,
                    "rows": args.prompts * 4,
                    **row,
                    "measured_mb": measured,
                    "plan_mb": {k: v / 2**20 for k, v in plan.items()},
                }
            )
            print(json.dumps(results[-1]), flush=True)
    text = render(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)


def spec_for(name: str, rows: int, model_dir: str, out: Path) -> dict:
    """The measured spec of configuration `name` at `rows` rollout rows (4 samples per prompt)."""
    _, dtype, lora = next(c for c in CONFIGS if c[0] == name)
    raw = pc.raw_spec({"local": MODEL}, "ddp", False, out, model_dir)
    raw["rollout"]["prompts_per_step"] = rows // 4
    raw["model"] |= {"dtype": dtype, **({"lora": lora} if lora else {})}
    return raw


def replan(r: dict) -> dict:
    """The current plan (MB per phase) for a saved row; the model's config.json in a scratch directory."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps(MODEL))
        raw = spec_for(r["name"], r.get("rows", 16), tmp, Path(tmp) / "out")
        plan = pc.plan_for(raw, 1, r.get("prompt_len", 16))["sharded"]
    return {k: v / 2**20 for k, v in plan.items()}


def render(results: list[dict]) -> str:
    lines = [
        "| configuration | rows | trains | phase | measured peak - baseline (MB) | gspo plan (MB) | plan / measured |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        for ph in pc.PHASES:
            meas, plan = r["measured_mb"][ph], r["plan_mb"][ph]
            lines.append(
                f"| {r['name']} | {r.get('rows', 16)} | {r['trainable'] / 1e6:,.2f} M | {ph} | {meas:,.0f} | "
                f"{plan:,.0f} | "
                f"{plan / max(meas, 1):.2f} |"
            )
    full = max(results[0]["measured_mb"].values())
    lines += ["", "| configuration | peak over phases (MB) | vs full | step 1 / step 2 (s) | update s (step 2) |"]
    lines += ["|---|---:|---:|---|---:|"]
    for r in results:
        peak = max(r["measured_mb"].values())
        steps = " / ".join(f"{t['time/step_s']:.1f}" for t in r["times"])
        lines.append(
            f"| {r['name']} | {peak:,.0f} | {peak / full:.0%} | {steps} | {r['times'][-1]['time/update_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
