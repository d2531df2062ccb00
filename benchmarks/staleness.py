"""What rollout.staleness buys: steps per second and the trainer's idle time at staleness 0, 1,
2 and 4, with a reward that takes time (50 ms per row, scored in the trainer).

The test suite's tiny model and task (`--model quickstart`: the quickstart's), 16 prompts x 8
samples = 128 rows per step, up to 16 new tokens, GSPO's preset (4 mini-batches), scored by a
reward file's function that sleeps 50 ms per row (6.4 s a step); `--reward instant` returns at
once. One whole run per staleness (`train_run`, evaluation off), one after another, repeated in ABBA
order (`--repeats`, default 2: 0 1 2 4 4 2 1 0), so that a load that drifts weighs on every
staleness alike; the table takes the median over a staleness's runs.

Per step, from the run's metrics.jsonl, over the steps after the first k + 1 (warm-up):
- step s: `time/step_s`, from the step's start (its wait for the batch included) to the end of
  its updates; steps/s is 1 / its median;
- busy s: the trainer's own work, `time/old_logp_s` + `time/update_s`;
- idle s: step s minus busy s: waiting for generation and scoring (staleness 0: both run inside
  the step; k >= 1: `perf/rollout_wait_s`, what the worker and the scoring thread did not hide).

With a reward slower than the trainer's work, staleness 1 hides the update behind scoring and
generation behind both; the batches are scored one at a time, so a reward slower than a whole
step still bounds the pace and larger k buys little more.

    python benchmarks/staleness.py                  # ~10 min on 2 idle cores
    python benchmarks/staleness.py --steps 10 --staleness 0 2
    python benchmarks/staleness.py --smoke          # the test suite's: staleness 0 and 1, 3 steps, tiny sizes

Prints markdown; writes nothing else (its runs go to a temporary directory). The numbers in
studies/staleness-throughput/README.md came from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from reward_pool import REWARDS, ROW_S  # noqa: E402  the same reward file (50 ms per row, or instant)

# (prompts, group, max new tokens, mini-batches): the study's, and --smoke's
SIZES = {False: (16, 8, 16, 4), True: (2, 2, 8, 2)}


def _raw(k: int, steps: int, model: str, function: str, out: str, smoke: bool = False) -> dict:
    from benchmarks.common import base_raw

    prompts, group, max_new, mini_batches = SIZES[smoke]
    raw = base_raw(
        prompts=prompts,
        group=group,
        max_new=max_new,
        mini_batches=mini_batches,
        steps=steps,
        preset="paper-gspo",
        staleness=k,
        smoke=smoke,
    )
    if model == "tiny":  # the test suite's model (tests/helpers.py TINY), cached once the tests ran
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers import TINY

        raw["model"], raw["task"] = TINY["model"], {**TINY["task"], "eval_size": 4}
        if smoke:  # random weights, as base_raw's smoke model
            raw["model"] = {**raw["model"], "cold_start": {**raw["model"]["cold_start"], "steps": 0}}
    raw["task"]["rewards"] = [{"function": function}]
    raw["task"]["reward_workers"] = 0  # scored in the trainer (staleness >= 1: its scoring thread)
    raw["rollout"]["logprob_check_every"] = 0
    raw["train"].update(eval_every=0, log_samples_every=0)
    raw.update(name=f"staleness{k}", output_dir=out)
    return raw


def run_one(k: int, steps: int, model: str, function: str, out: str, smoke: bool = False) -> dict:
    """One run at staleness `k`: medians over its steps after warm-up, and its wall time."""
    from benchmarks.common import load_spec_and_task, model_source
    from gspo_cli.rewards import with_rewards
    from gspo_cli.runs import RunDir, run_path
    from gspo_cli.tasks import make_task
    from gspo_cli.train.loop import train_run
    from gspo_cli.train.reporting import quiet_reporter

    spec, plain = load_spec_and_task(_raw(k, steps, model, function, out, smoke))
    source = model_source(spec, plain)
    task = with_rewards(make_task(spec.task.name, spec.task.params), spec.task.rewards)  # the slow reward scores
    t = time.perf_counter()
    train_run(spec, spec.arms[0], 0, task, source, reporter=quiet_reporter())
    wall = time.perf_counter() - t
    metrics = RunDir(run_path(spec.output_dir, spec.name, spec.arms[0].name, 0)).metrics()[k + 1 :]
    step = [m["time/step_s"] for m in metrics]
    busy = [m["time/old_logp_s"] + m["time/update_s"] for m in metrics]
    return {
        "k": k,
        "step": statistics.median(step),
        "busy": statistics.median(busy),
        "idle": statistics.median(s - b for s, b in zip(step, busy)),
        "score": statistics.median(m["time/score_s"] for m in metrics),
        "rollout": statistics.median(m["time/rollout_s"] for m in metrics),
        "lag": statistics.median(m.get("rollout/staleness_mean", 0.0) for m in metrics),
        "steps": len(metrics),
        "wall": wall,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="steps per run (the first k + 1 are not counted)")
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--reward", choices=("sleepy", "instant"), default="sleepy")
    p.add_argument("--model", choices=("tiny", "quickstart"), default="tiny")
    p.add_argument("--repeats", type=int, default=2, help="runs per staleness, in ABBA order (load drifts)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the process (default: torch's); staleness >= 1 splits them between the trainer "
        "and the worker, so --threads 2 compares 2 trainer threads at staleness 0 with 1 + 1 at staleness 1",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's check that it runs: staleness 0 and 1, 3 steps, one run each, the instant reward, "
        "2 prompts x 2 samples of up to 8 tokens, random weights",
    )
    a = p.parse_args(argv)
    if a.smoke:
        a.staleness, a.steps, a.repeats, a.reward = [0, 1], 3, 1, "instant"
    if a.steps <= max(a.staleness) + 1:
        p.error(f"--steps {a.steps}: needs more than the largest staleness + 1 ({max(a.staleness) + 1}) to count any")
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="gspo-bench-staleness-"))
    (tmp / "rewards.py").write_text(REWARDS)
    function = f"{tmp}/rewards.py:{a.reward}"
    rows = SIZES[a.smoke][0] * SIZES[a.smoke][1]
    print(
        f"staleness: {a.model} model, torch {torch.__version__}, {torch.get_num_threads()} torch thread(s), "
        f"{os.cpu_count()} cores, {rows} rows x {ROW_S * 1000 if a.reward == 'sleepy' else 0:.0f} ms reward, "
        f"{a.steps} steps per run, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    got = {k: [] for k in a.staleness}
    for rep in range(a.repeats):
        for k in a.staleness if rep % 2 == 0 else a.staleness[::-1]:
            r = run_one(k, a.steps, a.model, function, str(tmp / f"runs{rep}"), a.smoke)
            got[k].append(r)
            print(f"  staleness {k}: {r['step']:.2f} s/step, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = [{key: statistics.median(r[key] for r in got[k]) for key in got[k][0]} for k in a.staleness]
    base = rows[0]["step"]
    print(f"\nmedians over each run's steps after its first k + 1, then over the {a.repeats} runs of each:\n")
    print(
        "| staleness | lag | steps/s | speed-up | step s | trainer busy s | trainer idle s | idle share "
        "| generation s | scoring s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['k']:.0f} | {r['lag']:.0f} | {1 / r['step']:.3f} | {base / r['step']:.2f}x | {r['step']:.2f} "
            f"| {r['busy']:.2f} | {r['idle']:.2f} | {r['idle'] / r['step']:.0%} | {r['rollout']:.2f} "
            f"| {r['score']:.2f} |"
        )


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path[0] = str(ROOT)
    from benchmarks.common import spec_errors_in_one_line

    with spec_errors_in_one_line("staleness"):
        main()
