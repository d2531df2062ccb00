"""Does torch.compile pay for the quickstart's tiny MoE on CPU? Eager and compiled, side by
side in one process, on the same batches:

1. training: the mini-batch log-prob forward (`response_logprobs`) and its backward, the
   rows' width padded up to a multiple of --bucket so that shapes repeat across steps
   (two rollouts give the widths); `torch.compile(model)` with static shapes.
2. generation: our engine's `generate` as shipped (dynamic KV cache, eager), the same with a
   static KV cache, and the static cache with transformers' compiled decode step
   (`compile_config`, forced on CPU), on the same prompts each time.

For each variant: s/iteration (median after warm-up), the first call's time (compilation
included), and the max |log-prob| difference (nats) from eager: for training, of the
compiled forward against the eager one on the same rows; for generation, of the sampler's
log-probs against one eager full forward of the sequences it sampled.

    OMP_NUM_THREADS=1 python studies/compile-trial/compile_trial.py            # ~5-10 min on 2 cores
    python studies/compile-trial/compile_trial.py --iters 2 --skip-generation  # shorter

Prints a markdown table; writes nothing. The numbers quoted in README.md beside it came
from this script.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from benchmarks.common import base_raw, load_spec_and_task, model_source


def pad_to_bucket(batch, bucket: int):
    """`batch` (a RolloutBatch) with its response width C padded on the right up to the next
    multiple of `bucket` (padding: token id 0, attention 0, response mask 0). Causal
    attention keeps the real positions' log-probs unchanged (checked in `train_trial`)."""
    import torch.nn.functional as F

    C = batch.response_mask.shape[1]
    extra = -C % bucket
    if not extra:
        return batch
    return dataclasses.replace(
        batch,
        input_ids=F.pad(batch.input_ids, (0, extra)),
        attention_mask=F.pad(batch.attention_mask, (0, extra)),
        response_mask=F.pad(batch.response_mask, (0, extra)),
    )


def _timed(fn, iters: int) -> tuple[float, float]:
    """(first call's seconds, median seconds of `iters` further calls)."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, statistics.median(times)


def train_trial(ctx, batches: list, rows: int, bucket: int, iters: int) -> list[dict]:
    """Eager vs compiled forward+backward of `rows`-row mini-batches of each padded batch."""
    import torch

    from gspo_cli.rollout import response_logprobs

    model = ctx.model
    model.train()
    padded = [pad_to_bucket(b, bucket).rows(torch.arange(rows)) for b in batches]
    # right padding leaves the real positions' log-probs as they were
    with torch.no_grad():
        b0 = batches[0].rows(torch.arange(rows))
        C0 = b0.response_mask.shape[1]
        pad_gap = (response_logprobs(model, b0).logp - response_logprobs(model, padded[0]).logp[:, :C0]).abs()
        pad_gap = pad_gap[b0.response_mask > 0].max().item()
    compiled = torch.compile(model, dynamic=False)

    def step(m):
        def run():
            for b in padded:  # every bucket width, each iteration
                lp = response_logprobs(m, b).logp
                (-(lp * b.response_mask).sum() / b.response_mask.sum()).backward()
            model.zero_grad(set_to_none=True)

        return run

    out = []
    for name, m in (("eager", model), ("torch.compile", compiled)):
        first, per = _timed(step(m), iters)
        out.append({"variant": name, "first_s": first, "s_per_iter": per})
    with torch.no_grad():
        gap = max(
            ((response_logprobs(model, b).logp - response_logprobs(compiled, b).logp).abs()[b.response_mask > 0])
            .max()
            .item()
            for b in padded
        )
    out[0]["logp_gap"], out[1]["logp_gap"] = 0.0, gap
    widths = sorted({b.input_ids.shape[1] for b in padded})
    return out, {"pad_gap": pad_gap, "widths": widths}


def generation_trial(ctx, prompts: list[str], iters: int) -> list[dict]:
    """Our engine's generate: dynamic cache (eager), static cache, static cache + compiled decode."""
    import torch
    from transformers import CompileConfig

    from gspo_cli.rollout import response_logprobs

    engine, model = ctx.engine, ctx.model
    cfg, routing = engine.gen_config, engine.routing
    out = []
    variants = [("dynamic cache, eager (shipped)", None, True, True), ("static cache, eager", "static", True, True)]
    variants.append(("static cache, compiled decode", "static", False, True))
    # our route-recording hook appends to a list per step: dynamo guards on its length and
    # recompiles every step until its limit; without recording, the best case for compile
    variants.append(("static cache, compiled decode, routes not recorded", "static", False, False))
    last = {}

    def run():
        torch.manual_seed(0)
        last["batch"] = engine.generate(prompts)

    for name, cache, no_compile, record in variants:
        engine.routing = routing if record else None
        # dynamo caches compiled code per code object: entries of an earlier variant (or of the
        # training trial) for the same forward would count against its recompile limit
        torch._dynamo.reset()
        cfg.cache_implementation, cfg.disable_compile = cache, no_compile
        cc = CompileConfig(fullgraph=False, dynamic=False)
        cc._compile_all_devices = True  # transformers compiles only on accelerators unless told
        cfg.compile_config = cc
        first, per = _timed(run, iters)
        b = last["batch"]
        with torch.no_grad():
            full = response_logprobs(model, b, temperature=engine.temperature).logp
        gap = (b.engine_logp - full).abs()[b.response_mask > 0].max().item() if b.engine_logp is not None else None
        out.append({"variant": name, "first_s": first, "s_per_iter": per, "logp_gap": gap})
    cfg.cache_implementation, cfg.disable_compile, engine.routing = None, True, routing
    return out


def _table(rows: list[dict]) -> list[str]:
    lines = [
        "| variant | s/iteration | first call (compile incl.) | max abs log-prob diff (nats) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        gap = "—" if r["logp_gap"] is None else f"{r['logp_gap']:.1e}"
        lines.append(f"| {r['variant']} | {r['s_per_iter']:.3f} s | {r['first_s']:.1f} s | {gap} |")
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--rows", type=int, default=32, help="rows per training mini-batch (bench: 128 / 4)")
    p.add_argument("--bucket", type=int, default=16, help="pad response widths to a multiple of this")
    p.add_argument("--iters", type=int, default=4, help="timed iterations per variant, after the first call")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    a = p.parse_args(argv)

    import torch

    from gspo_cli.train.step import setup

    if a.threads:
        torch.set_num_threads(a.threads)
    raw = base_raw(
        prompts=a.prompts, group=a.group, max_new=a.max_new_tokens, mini_batches=4, steps=1, preset="paper-gspo"
    )
    spec, task = load_spec_and_task(raw)
    ctx = setup(spec, spec.arms[0], 0, task, model_source(spec, task))
    prompts = [p.prompt for p in task.train_problems(ctx.rng, a.prompts) for _ in range(a.group)]
    torch.manual_seed(0)
    batches = [ctx.engine.generate(prompts), ctx.engine.generate(prompts)]
    print(
        f"compile trial: torch {torch.__version__}, {torch.get_num_threads()} threads; {len(prompts)} sequences, "
        f"max {a.max_new_tokens} new tokens; training rows {a.rows}, widths padded to a multiple of {a.bucket}",
        flush=True,
    )
    if not a.skip_training:
        train, info = train_trial(ctx, batches, a.rows, a.bucket, a.iters)
        print(f"\n## training forward + backward ({len(info['widths'])} widths per iteration: {info['widths']})\n")
        print("\n".join(_table(train)))
        print(f"\npadding to the bucket changed real positions' log-probs by at most {info['pad_gap']:.1e} nats")
    if not a.skip_generation:
        gen = generation_trial(ctx, prompts, a.iters)
        print("\n## generation (our engine, sampler log-probs on)\n")
        print("\n".join(_table(gen)))


if __name__ == "__main__":
    main()
