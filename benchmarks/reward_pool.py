"""A slow reward's cost to an RL step: scored serially in the trainer against the reward pool
(`task.reward_workers`, `task.reward_calls: chunks`) with scoring overlapped with sampling.

The test suite's tiny model and task (`--model quickstart`: the quickstart's), 16 prompts x
8 samples = 128 rows per step (up to 48 new tokens), scored by a reward file's function that
sleeps 50 ms per row (serially: 6.4 s a step). Four trainers in one process, one whole step
each per round (`train_step`: sampling, scoring, the updates), in turns whose order alternates:

- instant: a reward that returns at once, in the trainer (`reward_workers: 0`): the step
  without the reward's cost;
- serial: the sleeping reward in the trainer (`reward_workers: 0`);
- pool-batch: the sleeping reward in 8 worker processes, every row sent when generation
  returns (no overlap: what the colocated vLLM engine and `decode: generate` get);
- pool: the same pool, rows sent as the hf engine's compact loop finishes them (overlap).

Each step's sampling is seeded by the step and every reward gives the same values, so the four
trainers sample and train alike (their mean response lengths are checked equal every round)
and differ only in scoring.

Reported: medians over rounds of the step time and `time/score_s` (what scoring adds after
generation returns), and the step's added time against `instant` (median of per-round
differences). The bound: the pool adds at most 20% of the serial 6.4 s (1.28 s).

    python benchmarks/reward_pool.py              # ~3 min on 2 idle cores
    python benchmarks/reward_pool.py --rounds 3 --workers 8
    python benchmarks/reward_pool.py --smoke      # the test suite's: 1 round, 2 workers, tiny sizes

Prints markdown; writes nothing else. The numbers in studies/reward-pool/README.md
came from it.
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
ROW_S = 0.05  # the reward's sleep per row
REWARDS = f"""
import time

def sleepy(completions, **kwargs):
    time.sleep({ROW_S} * len(completions))
    return [float(len(c) % 3) for c in completions]

def instant(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]
"""
SIDES = ("instant", "serial", "pool-batch", "pool")
# (prompts, group, mini-batches): the study's 128 rows, and --smoke's 4
SIZES = {False: (16, 8, 4), True: (2, 2, 2)}


def _ctx(function: str, steps: int, max_new: int, model: str, smoke: bool = False):
    from benchmarks.common import base_raw, model_source
    from gspo_cli.rewards import with_rewards
    from gspo_cli.spec import RewardConfig
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task
    from gspo_cli.train.step import setup

    prompts, group, mini_batches = SIZES[smoke]
    raw = base_raw(
        prompts=prompts,
        group=group,
        max_new=max_new,
        mini_batches=mini_batches,
        steps=steps,
        preset="paper-gspo",
        smoke=smoke,
    )
    if model == "tiny":  # the test suite's model (tests/helpers.py TINY), cached once the tests ran
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers import TINY

        raw["model"], raw["task"] = TINY["model"], {**TINY["task"], "eval_size": 4}
        if smoke:  # random weights, as base_raw's smoke model
            raw["model"] = {**raw["model"], "cold_start": {**raw["model"]["cold_start"], "steps": 0}}
    spec = spec_from_dict(raw)
    plain = make_task(spec.task.name, spec.task.params)
    task = with_rewards(make_task(spec.task.name, spec.task.params), [RewardConfig(function=function)])
    return setup(spec, spec.arms[0], 0, task, model_source(spec, plain))


def _step(ctx, step: int, pool) -> dict:
    """One train_step with `pool` as the active reward pool (None: rewards in the trainer),
    sampling seeded by the step: the trainers start from the same weights and every reward
    gives the same values, so they sample and train alike and differ only in scoring."""
    import torch

    from gspo_cli.rewards import pool as reward_pool
    from gspo_cli.train.step import train_step

    reward_pool._active = pool
    try:
        torch.manual_seed(step)
        t = time.perf_counter()
        m = train_step(ctx, step)
        return {
            "step": time.perf_counter() - t,
            "score": m["time/score_s"],
            "rollout": m["time/rollout_s"],
            "length": m["response/length_mean"],
        }
    finally:
        reward_pool._active = None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument(
        "--model",
        choices=("tiny", "quickstart"),
        default="tiny",
        help="tiny: the test suite's model (hidden 32; cached by the tests); quickstart: the quickstart's "
        "(cold-started on first use: minutes)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's check that it runs: 1 round, 2 workers, 2 prompts x 2 samples of up to 8 tokens, "
        "random weights",
    )
    a = p.parse_args(argv)
    if a.smoke:
        a.rounds, a.workers, a.max_new = 1, 2, 8
    rows = SIZES[a.smoke][0] * SIZES[a.smoke][1]
    import torch

    from gspo_cli.rewards.pool import RewardPool

    tmp = Path(tempfile.mkdtemp(prefix="gspo-bench-rewards-"))
    (tmp / "rewards.py").write_text(REWARDS)
    steps = a.rounds + 1
    ctxs = {
        s: _ctx(f"{tmp}/rewards.py:{'instant' if s == 'instant' else 'sleepy'}", steps, a.max_new, a.model, a.smoke)
        for s in SIDES
    }
    ctxs["pool-batch"].engine.streams_rows = False  # this engine's rows go to the pool at the end only
    pool = RewardPool(a.workers, 300, chunks=True)  # task.reward_calls: chunks
    try:
        pools = {"instant": None, "serial": None, "pool-batch": pool, "pool": pool}
        for s in SIDES:  # warm-up: step 1 (the pool's workers import the reward file)
            _step(ctxs[s], 1, pools[s])
        print(
            f"reward pool: {a.model} model, torch {torch.__version__}, {torch.get_num_threads()} torch thread(s), "
            f"{os.cpu_count()} cores, {rows} rows x {ROW_S * 1000:.0f} ms, {a.workers} workers, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        got = {s: [] for s in SIDES}
        for r in range(a.rounds):
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            for s in order:
                got[s].append(_step(ctxs[s], r + 2, pools[s]))
            lengths = {round(got[s][-1]["length"], 6) for s in SIDES}
            assert len(lengths) == 1, f"the trainers sampled differently: {lengths}"
            print(
                f"  round {r + 1}: "
                + ", ".join(f"{s} {got[s][-1]['step']:.2f} s (score {got[s][-1]['score']:.2f})" for s in SIDES)
                + f", {got['pool'][-1]['length']:.1f} tokens/response, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    finally:
        pool.close()
    serial_s = rows * ROW_S
    print(f"\n{a.rounds} rounds, medians:\n")
    print("| reward | step s | rollout s | score s (after generation) | step minus instant's, same round, s |")
    print("|---|---:|---:|---:|---:|")
    added = {}
    for s in SIDES:
        added[s] = statistics.median(x["step"] - y["step"] for x, y in zip(got[s], got["instant"]))
        med = {k: statistics.median(x[k] for x in got[s]) for k in ("step", "rollout", "score")}
        label = {
            "instant": "instant, in the trainer",
            "serial": "50 ms/row, in the trainer (serial)",
            "pool-batch": f"50 ms/row, pool of {a.workers}, rows sent after generation",
            "pool": f"50 ms/row, pool of {a.workers}, rows sent as they stop (overlap)",
        }[s]
        print(f"| {label} | {med['step']:.2f} | {med['rollout']:.2f} | {med['score']:.2f} | {added[s]:+.2f} |")
    bound = 0.2 * serial_s
    for s in ("pool", "pool-batch"):
        score = statistics.median(x["score"] for x in got[s])
        verdict = "met" if max(score, added[s]) <= bound else "NOT met"
        print(
            f"\n{s}: the pool adds at most 20% of the serial {serial_s:.1f} s ({bound:.2f} s): {verdict} "
            f"(score after generation {score:.2f} s, step difference {added[s]:+.2f} s)"
        )


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path[0] = str(ROOT)
    from benchmarks.common import spec_errors_in_one_line

    with spec_errors_in_one_line("reward_pool"):
        main()
