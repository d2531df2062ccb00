"""What `train.compile` costs on a run's start and buys per step, on the quickstart's model and
task (paper-gspo arm, 16 prompts x 8 samples, 40 new tokens, 4 mini-batches), eager and
compiled side by side:

1. start-up: fresh processes, alternately eager and compiled (eager, compiled, eager,
   compiled, ...), each running --steps training steps from a new run. The compiled runs share
   one compile cache that starts empty (a fresh TORCHINDUCTOR_CACHE_DIR): the first compiled run
   compiles every width it meets, later ones load them from disk. Reported: set-up seconds,
   the first step's update seconds (compiling included), the later steps' update and whole-step
   seconds (medians), each process's total.
2. steady state: one process holding an eager and a compiled trainer with the same initial
   weights (the compile cache now warm); each step one batch is sampled and both trainers
   update on it, in alternating order. Reported: the median update seconds of each and the
   median of the per-step ratios, over the steps where the compiled trainer met no new width.

    OMP_NUM_THREADS=1 python studies/compiled-updates/compile_cache.py                 # ~10 min on 2 busy cores
    python studies/compiled-updates/compile_cache.py --rounds 1 --steps 3 --paired 4  # shorter

Prints markdown; writes nothing but its temporary compile cache (removed at the end unless
--cache is given). The numbers in README.md beside it came from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TAG = "COMPILE_RESULT "


def _raw(compile_: bool, steps: int, bucket: int) -> dict:
    import yaml

    raw = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    raw["train"].update(steps=steps, eval_every=0, checkpoint_every=0, compile=compile_, compile_bucket=bucket)
    raw["arms"] = [{"name": "gspo", "preset": "paper-gspo"}]
    return raw


def _ctx(compile_: bool, steps: int, bucket: int):
    from gspo_cli.models import resolve_model_source
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task
    from gspo_cli.train.step import setup

    spec = spec_from_dict(_raw(compile_, steps, bucket))
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: print(m, file=sys.stderr))
    return setup(spec, spec.arms[0], 0, task, source)


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {k: v for g in ("inductor", "aot_autograd") for k, v in counters[g].items() if "cache" in k}


def child_run(compile_: bool, steps: int, bucket: int) -> dict:
    """A new run's first `steps` steps: set-up and per-step update / step seconds."""
    from gspo_cli.train.step import train_step

    t = time.perf_counter()
    ctx = _ctx(compile_, steps, bucket)
    setup_s = time.perf_counter() - t
    rows = []
    for s in range(1, steps + 1):
        before = len(ctx.compiled.widths) if ctx.compiled else 0
        m = train_step(ctx, s)
        new = (len(ctx.compiled.widths) if ctx.compiled else 0) - before
        rows.append({"update_s": m["time/update_s"], "step_s": m["time/step_s"], "new_widths": new})
    widths = sorted(ctx.compiled.widths) if ctx.compiled else []
    return {"setup_s": setup_s, "steps": rows, "widths": widths, "counters": _counters()}


def child_paired(steps: int, bucket: int) -> dict:
    """Eager and compiled trainers in one process, updating on the same batches, alternately first."""
    from gspo_cli.train.step import learn

    eager, comp = _ctx(False, steps, bucket), _ctx(True, steps, bucket)
    comp.model.load_state_dict(eager.model.state_dict())
    rows = []
    for s in range(1, steps + 1):
        spec, G = eager.spec, eager.spec.rollout.group_size
        problems = eager.task.train_problems(eager.rng, spec.rollout.prompts_per_step)
        batch = eager.engine.generate([p.prompt for p in problems for _ in range(G)])
        scores = eager.task.score_batch([problems[i // G] for i in range(len(batch.completions))], batch.completions)
        before = len(comp.compiled.widths)
        times = {}
        for name, ctx in (("eager", eager), ("compiled", comp)) if s % 2 else (("compiled", comp), ("eager", eager)):
            t = time.perf_counter()
            learn(ctx, batch, scores, s)
            times[name] = time.perf_counter() - t
        rows.append({**times, "new_widths": len(comp.compiled.widths) - before})
    return {"steps": rows, "widths": sorted(comp.compiled.widths), "counters": _counters()}


def _spawn(args: list[str], env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if out.returncode:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    line = next(x for x in out.stdout.splitlines() if x.startswith(TAG))
    return json.loads(line[len(TAG) :])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="start-up rounds (an eager then a compiled run each)")
    p.add_argument("--steps", type=int, default=4, help="training steps per start-up run")
    p.add_argument("--paired", type=int, default=10, help="steps of the steady-state comparison (0: skip)")
    p.add_argument("--bucket", type=int, default=16, help="train.compile_bucket")
    p.add_argument("--cache", help="compile cache directory to use and keep (default: a fresh temporary one)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        res = (
            child_paired(a.paired, a.bucket)
            if a.child == "paired"
            else child_run(a.child == "compiled", a.steps, a.bucket)
        )
        print(TAG + json.dumps(res), flush=True)
        return

    tmp = None if a.cache else tempfile.TemporaryDirectory(prefix="gspo-compile-bench-")
    cache = a.cache or tmp.name
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    env.setdefault("OMP_NUM_THREADS", "1")
    common = ["--steps", str(a.steps), "--bucket", str(a.bucket), "--paired", str(a.paired)]
    print(
        f"compile benchmark: quickstart model, paper-gspo, {env['OMP_NUM_THREADS']} thread(s), bucket {a.bucket}, "
        f"load {os.getloadavg()[0]:.1f}; compile cache {cache}",
        flush=True,
    )
    runs = []
    for r in range(a.rounds):
        for kind in ("eager", "compiled"):
            t = time.perf_counter()
            res = _spawn(["--child", kind, *common], env)
            res.update(kind=kind, round=r + 1, wall_s=time.perf_counter() - t, load=os.getloadavg()[0])
            runs.append(res)
            first = res["steps"][0]
            print(
                f"  round {r + 1} {kind}: set-up {res['setup_s']:.1f} s, step 1 update {first['update_s']:.1f} s, "
                f"process {res['wall_s']:.1f} s, widths {res['widths']}, {res['counters']}",
                flush=True,
            )
    print("\n## start-up (fresh processes; the compiled runs share one cache, empty before round 1)\n")
    print("| run | set-up s | step 1 update s (compile incl.) | steps 2+ update s | steps 2+ step s | process s |")
    print("|---|---:|---:|---:|---:|---:|")
    for res in runs:
        later = [s["update_s"] for s in res["steps"][1:]] or [float("nan")]
        later_step = [s["step_s"] for s in res["steps"][1:]] or [float("nan")]
        label = f"{res['kind']} #{res['round']}" + (
            " (cold cache)" if res["kind"] == "compiled" and res["round"] == 1 else ""
        )
        print(
            f"| {label} | {res['setup_s']:.1f} | {res['steps'][0]['update_s']:.2f} | "
            f"{statistics.median(later):.3f} | {statistics.median(later_step):.3f} | {res['wall_s']:.1f} |"
        )
    if a.paired:
        t = time.perf_counter()
        res = _spawn(["--child", "paired", *common], env)
        steady = [s for s in res["steps"] if not s["new_widths"]]
        n, took = len(res["steps"]), time.perf_counter() - t
        print(f"\n## steady state ({len(steady)} of {n} steps without a new width, {took:.0f} s)\n")
        if steady:
            e = statistics.median(s["eager"] for s in steady)
            c = statistics.median(s["compiled"] for s in steady)
            ratio = statistics.median(s["compiled"] / s["eager"] for s in steady)
            lo, hi = min(s["compiled"] / s["eager"] for s in steady), max(s["compiled"] / s["eager"] for s in steady)
            print("| update (4 mini-batches) | eager s | compiled s | compiled / eager (median of steps; range) |")
            print("|---|---:|---:|---:|")
            print(f"| one RL step's updates | {e:.3f} | {c:.3f} | {ratio:.2f} ({lo:.2f}-{hi:.2f}) |")
        print(f"\nwidths {res['widths']}; per step: {json.dumps(res['steps'])}; {res['counters']}")
    print(f"\nload at the end {os.getloadavg()[0]:.1f}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path[0] = str(ROOT)
    main()
