"""Fused MoE experts against the loop over experts (`eager`) on the quickstart's model:
`model.experts_implementation: grouped_mm` (transformers' grouped-GEMM experts) and
`gspo_grouped_mm` (the same with index_select gathers, gspo_cli/models/experts.py), side by side
in one process: the same cold-started weights loaded once per implementation, timed in
alternating order on the same work.

- update: forward + backward of a rollout batch (16 prompts x 8 samples, 40 new tokens) as the
  trainer runs it: 4 mini-batches of 32 rows, each trimmed to its rows' width, routes recorded;
- generation: the engine's `generate` of the same 128 prompts (sampler log-probs and routes on).

Each round times every implementation on both kinds of work, the order reversed every other
round; reported: the medians and the medians of the per-round ratios (grouped_mm / loop,
gspo_grouped_mm / grouped_mm) with their ranges. Log-probs are compared with the loop's on the
batch (max abs difference).

    python studies/fused-experts/fused_experts.py                               # 2 threads, ~4 min
    OMP_NUM_THREADS=1 python studies/fused-experts/fused_experts.py            # 1 thread
    python studies/fused-experts/fused_experts.py --rounds 3                    # shorter

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


IMPLS = ("eager", "grouped_mm", "gspo_grouped_mm")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    import torch

    from gspo_cli.rollout import response_logprobs

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))))
    ctxs = {impl: _ctx(impl) for impl in IMPLS}
    for impl, ctx in ctxs.items():
        assert ctx.model.config._experts_implementation == impl
    loop = ctxs["eager"]
    task = loop.task
    prompts = [pr.prompt for pr in task.train_problems(loop.rng, 16) for _ in range(8)]
    torch.manual_seed(0)
    batch = loop.engine.generate(prompts)
    with torch.no_grad():
        logp = {impl: response_logprobs(ctx.model, batch).logp for impl, ctx in ctxs.items()}
    mask = batch.response_mask > 0
    gaps = ", ".join(f"{impl} {(logp[impl] - logp['eager'])[mask].abs().max().item():.1e}" for impl in IMPLS[1:])
    print(
        f"fused experts: quickstart model, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{len(prompts)} sequences, width {batch.input_ids.shape[1]}; load {os.getloadavg()[0]:.1f}; "
        f"max |log-prob| difference from the loop: {gaps}",
        flush=True,
    )
    for ctx in ctxs.values():  # warm-up
        _update(ctx, batch)
        _generate(ctx, prompts, 0)
    times = {(k, w): [] for k in IMPLS for w in ("update", "generate")}
    for r in range(a.rounds):
        order = IMPLS if r % 2 == 0 else IMPLS[::-1]
        for impl in order:
            times[(impl, "update")].append(_update(ctxs[impl], batch))
        for impl in order:
            times[(impl, "generate")].append(_generate(ctxs[impl], prompts, r + 1))
        last = {k: v[-1] for k, v in times.items()}
        print(
            f"  round {r + 1}: update "
            + " / ".join(f"{last[(i, 'update')]:.3f}" for i in IMPLS)
            + " s, generate "
            + " / ".join(f"{last[(i, 'generate')]:.3f}" for i in IMPLS)
            + f" s ({' / '.join(IMPLS)}), load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    print(
        f"\n| work | loop (eager) s | grouped_mm s | gspo_grouped_mm s | grouped_mm / loop | "
        f"gspo_grouped_mm / grouped_mm | (medians of {a.rounds} per-round ratios, range) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    labels = {"update": "forward + backward, 4 x 32 rows", "generate": "generate 128 x up to 40 tokens"}

    def ratio(num, den):
        r = [y / x for x, y in zip(times[(den, w)], times[(num, w)])]
        return f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"

    for w in ("update", "generate"):
        med = [statistics.median(times[(i, w)]) for i in IMPLS]
        print(
            f"| {labels[w]} | {med[0]:.3f} | {med[1]:.3f} | {med[2]:.3f} | "
            f"{ratio('grouped_mm', 'eager')} | {ratio('gspo_grouped_mm', 'grouped_mm')} | |"
        )


if __name__ == "__main__":
    if __package__ in (None, ""):
        sys.path[0] = str(ROOT)
    main()
