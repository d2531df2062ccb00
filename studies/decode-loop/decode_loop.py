"""Our sampling loop (`rollout.decode: compact`) against transformers' `generate` (`decode:
generate`) on the quickstart's model at `make bench`'s sizes, side by side in one process: the
same cold-started weights loaded twice, one engine per loop, sampler log-probs and routes on.

- generate: the engine's sampling of the same 128 prompts (16 x 8 samples, up to 48 tokens) at
  temperature 1.0 and at 1.5 (longer, more varied responses: more rows finish early), the
  same seed for both loops in a round;
- step: one whole RL step (`train_step`: sampling, scoring, the 4 mini-batch updates) of two
  trainers that differ only in the loop (their samples differ after step 1).

Rounds alternate the order of the two; reported: medians and the median of the per-round
ratios (compact / generate) with their range, at each thread count asked for.

    python studies/decode-loop/decode_loop.py                    # ~4 min on 2 idle cores
    python studies/decode-loop/decode_loop.py --rounds 5 --threads 1

Prints markdown; writes nothing. The numbers in README.md beside it came from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOPS = ("generate", "compact")


def _ctx(decode: str, steps: int):
    from benchmarks.common import base_raw, load_spec_and_task, model_source
    from gspo_cli.train.step import setup

    raw = base_raw(prompts=16, group=8, max_new=48, mini_batches=4, steps=steps, preset="paper-gspo")
    raw["rollout"]["decode"] = decode
    spec, task = load_spec_and_task(raw)
    return setup(spec, spec.arms[0], 0, task, model_source(spec, task))


def _sample(ctx, prompts, seed: int, temperature: float) -> tuple[float, int]:
    """(seconds, decode steps) of one sampling call."""
    import torch

    ctx.engine.temperature = ctx.engine.gen_config.temperature = temperature  # generate reads the config
    torch.manual_seed(seed)
    t = time.perf_counter()
    b = ctx.engine.generate(prompts)
    return time.perf_counter() - t, b.response_mask.shape[1]


def _row(label: str, ref: list[float], new: list[float]) -> str:
    ratios = [y / x for x, y in zip(ref, new)]
    return (
        f"| {label} | {statistics.median(ref):.3f} | {statistics.median(new):.3f} | "
        f"**{statistics.median(ratios):.2f}** ({min(ratios):.2f}-{max(ratios):.2f}) |"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    a = p.parse_args(argv)
    import torch

    threads = [int(t) for t in a.threads.split(",")]
    steps = 1 + a.rounds * len(threads)
    ctxs = {d: _ctx(d, steps) for d in LOOPS}
    assert ctxs["compact"].engine.decode == "compact" and ctxs["generate"].engine.decode == "generate"
    prompts = [pr.prompt for pr in ctxs["compact"].task.train_problems(ctxs["compact"].rng, 16) for _ in range(8)]
    step = 0
    for d in LOOPS:  # warm-up
        _sample(ctxs[d], prompts, 0, 1.0)
    print(f"decode loops: quickstart model, torch {torch.__version__}, 128 rows, load {os.getloadavg()[0]:.1f}")
    for n in threads:
        torch.set_num_threads(n)
        times = {(d, w): [] for d in LOOPS for w in ("t1", "t15", "step")}
        widths = {d: [] for d in LOOPS}
        for r in range(a.rounds):
            order = LOOPS if r % 2 == 0 else LOOPS[::-1]
            for w, temp in (("t1", 1.0), ("t15", 1.5)):
                for d in order:
                    s, c = _sample(ctxs[d], prompts, 100 * n + r, temp)
                    times[(d, w)].append(s)
                    if w == "t15":
                        widths[d].append(c)
            step += 1
            for d in order:
                ctxs[d].engine.temperature = ctxs[d].engine.gen_config.temperature = 1.0
                times[(d, "step")].append(_train_step(ctxs[d], step))
            print(
                f"  {n} thread(s), round {r + 1}: "
                + ", ".join(
                    f"{w} {times[('generate', w)][-1]:.3f}/{times[('compact', w)][-1]:.3f}"
                    for w in ("t1", "t15", "step")
                )
                + f" s (generate/compact), load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        print(f"\n{n} torch thread(s), {a.rounds} rounds:\n")
        print("| work | generate s | compact s | compact / generate, median (range) |")
        print("|---|---:|---:|---:|")
        print(_row("sampling, temperature 1.0", times[("generate", "t1")], times[("compact", "t1")]))
        print(
            _row(
                f"sampling, temperature 1.5 (longest: median {statistics.median(widths['compact']):.0f} tokens)",
                times[("generate", "t15")],
                times[("compact", "t15")],
            )
        )
        print(_row("whole RL step (`train_step`)", times[("generate", "step")], times[("compact", "step")]))
        print()


def _train_step(ctx, step: int) -> float:
    from gspo_cli.train.step import train_step

    return train_step(ctx, step)["time/step_s"]


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path[0] = str(ROOT)
    main()
