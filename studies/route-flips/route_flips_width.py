"""How the expert change of one update grows with an MoE's width: the sizing measurement
behind `make reproduce-gpu` (experiments/paper_moe_gpu.yaml).

For each hidden size, a built-in MoE with paper_moe's routing (64 experts, top-8, expert width
hidden / 4) is cold-started on the synthetic math task (cached in $GSPO_CACHE_DIR like any
built-in model), then `route_flips.one_seed` applies one Adam-like step (lr x sign(grad), the
routers' step `--router-lr-scale` times larger, as `optimizer.router_lr_scale`) and measures
the share of chosen experts that change. Prints one Markdown row per width and seed.

    OMP_NUM_THREADS=2 python studies/route-flips/route_flips_width.py --widths 128 256 512 --layers 8
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from route_flips import one_seed  # noqa: E402

from gspo_cli.models.builtin import builtin_model_dir  # noqa: E402
from gspo_cli.spec import BuiltinModelConfig, ColdStartConfig  # noqa: E402
from gspo_cli.tasks import make_task  # noqa: E402
from gspo_cli.tasks.arithmetic import ArithmeticTask  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--cold-steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--router-lr-scale", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--prompts", type=int, default=32)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    params = {"source": "synthetic", "num_operands": 3, "max_operand": 20}
    task = make_task("math", params)
    print(f"lr {a.lr}, router x{a.router_lr_scale}, {a.layers} layers, {a.experts} experts, top-{a.top_k}\n")
    print("| hidden | params (M) | cold start s | seed | expert change, all | routers only | all but routers |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for width in a.widths:
        size = BuiltinModelConfig(
            hidden_size=width,
            num_layers=a.layers,
            num_heads=max(2, width // 64),
            num_kv_heads=max(1, width // 128),
            intermediate_size=2 * width,
            num_experts=a.experts,
            experts_per_token=a.top_k,
            moe_intermediate_size=width // 4,
        )
        t0 = time.time()
        path = builtin_model_dir("tiny-moe", size, ColdStartConfig(steps=a.cold_steps), task, log=lambda *_: None)
        built = time.time() - t0
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
        n = sum(p.numel() for p in model.parameters()) / 1e6
        flips_task = ArithmeticTask(num_operands=3, max_operand=20)
        for seed in a.seeds:
            random.seed(seed)
            res = one_seed(model, tok, flips_task, a.lr, seed, a.prompts, 30, a.router_lr_scale)
            means = [100 * sum(v) / len(v) for v in res.values()]
            print(
                f"| {width} | {n:.1f} | {built:.0f} | {seed} | " + " | ".join(f"{m:.2f}%" for m in means) + " |",
                flush=True,
            )


if __name__ == "__main__":
    main()
