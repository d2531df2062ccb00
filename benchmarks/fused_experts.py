"""Fused MoE experts (`model.experts_implementation: grouped_mm`, transformers' grouped-GEMM
experts) against the loop over experts (`eager`) on the quickstart's model, side by side in one
process: the same cold-started weights loaded twice, one per implementation, timed in
alternating order on the same work.

- update: forward + backward of a rollout batch (16 prompts x 8 samples, 40 new tokens) as the
  trainer runs it: 4 mini-batches of 32 rows, each trimmed to its rows' width, routes recorded;
- generation: the engine's `generate` of the same 128 prompts (sampler log-probs and routes on).

Each round times both implementations on both kinds of work, the order alternating between
rounds; reported: the medians and the median of the per-round ratios (fused / loop) with
their range. Log-probs of the two are compared on the batch (max abs difference).

    OMP_NUM_THREADS=1 python benchmarks/fused_experts.py            # ~3 min on 2 busy cores
    python benchmarks/fused_experts.py --rounds 3                    # shorter

Prints markdown; writes nothing. The numbers in benchmarks/README.md came from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ctx(impl: str):
    import yaml

    from gspo_cli.models import resolve_model_source
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task
    from gspo_cli.train.step import setup

    raw = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    raw["model"]["experts_implementation"] = impl
    raw["train"].update(eval_every=0, checkpoint_every=0)
    raw["arms"] = [{"name": "gspo", "preset": "paper-gspo"}]
    spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    return setup(spec, spec.arms[0], 0, task, resolve_model_source(spec.model, task, log=print))


def _update(ctx, batch, mini_batches: int = 4) -> float:
    """Seconds for the forward and backward of `batch` in mini-batches, routes recorded."""
    import torch

    from gspo_cli.rollout import response_logprobs

    t = time.perf_counter()
    for rows in torch.arange(batch.input_ids.shape[0]).chunk(mini_batches):
        sub = batch.rows(rows, sampler=False).trimmed()[0]
        with ctx.routing.recording():
            lp = response_logprobs(ctx.model, sub).logp
            (-(lp * sub.response_mask).sum() / sub.response_mask.sum()).backward()
    ctx.model.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def _generate(ctx, prompts, seed: int) -> float:
    import torch

    torch.manual_seed(seed)
    t = time.perf_counter()
    ctx.engine.generate(prompts)
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    import torch

    from gspo_cli.rollout import response_logprobs

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    ctxs = {impl: _ctx(impl) for impl in ("eager", "grouped_mm")}
    loop, fused = ctxs["eager"], ctxs["grouped_mm"]
    assert loop.model.config._experts_implementation == "eager"
    assert fused.model.config._experts_implementation == "grouped_mm"
    task = loop.task
    prompts = [pr.prompt for pr in task.train_problems(loop.rng, 16) for _ in range(8)]
    torch.manual_seed(0)
    batch = loop.engine.generate(prompts)
    with torch.no_grad():
        gap = (response_logprobs(loop.model, batch).logp - response_logprobs(fused.model, batch).logp).abs()
    gap = gap[batch.response_mask > 0].max().item()
    print(
        f"fused experts: quickstart model, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{len(prompts)} sequences, width {batch.input_ids.shape[1]}; load {os.getloadavg()[0]:.1f}; "
        f"max |log-prob| difference fused vs loop {gap:.1e}",
        flush=True,
    )
    for ctx in (loop, fused):  # warm-up
        _update(ctx, batch)
        _generate(ctx, prompts, 0)
    times = {(k, w): [] for k in ("eager", "grouped_mm") for w in ("update", "generate")}
    for r in range(a.rounds):
        order = ("eager", "grouped_mm") if r % 2 == 0 else ("grouped_mm", "eager")
        for impl in order:
            times[(impl, "update")].append(_update(ctxs[impl], batch))
        for impl in order:
            times[(impl, "generate")].append(_generate(ctxs[impl], prompts, r + 1))
        last = {k: v[-1] for k, v in times.items()}
        print(
            f"  round {r + 1}: update {last[('eager', 'update')]:.3f} / {last[('grouped_mm', 'update')]:.3f} s, "
            f"generate {last[('eager', 'generate')]:.3f} / {last[('grouped_mm', 'generate')]:.3f} s "
            f"(loop / fused), load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    print(f"\n| work | loop (eager) s | fused (grouped_mm) s | fused / loop, median of {a.rounds} rounds (range) |")
    print("|---|---:|---:|---:|")
    labels = {"update": "forward + backward, 4 x 32 rows", "generate": "generate 128 x up to 40 tokens"}
    for w in ("update", "generate"):
        e, f = times[("eager", w)], times[("grouped_mm", w)]
        ratios = [y / x for x, y in zip(e, f)]
        print(
            f"| {labels[w]} | {statistics.median(e):.3f} | {statistics.median(f):.3f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path[0] = str(ROOT)
    main()
