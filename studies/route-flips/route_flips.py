"""Where do an MoE's route changes come from? One Adam-like step on a saved checkpoint, three
ways, and the share of chosen experts that change in each layer:

- all: every weight moved by lr x sign(its gradient) (Adam's first step, bias-corrected);
- routers only: only the routers' weights (`mlp.gate.weight`) moved;
- all but routers: everything else moved, the routers kept: route changes that come only from
  the hidden states reaching the routers (the cascade through earlier layers).

The gradient is that of a GRPO-like surrogate: random N(0, 1) advantages times each sampled
response's mean token log-prob (the trainer's `response_logprobs`), on responses sampled at
temperature 1 by the trainer's hf engine from the task's training prompts. The expert change
is `moe/expert_change_frac`'s: the share of (token, slot) experts not in the token's earlier
top-k set, over every prompt and response token.

    OMP_NUM_THREADS=1 python studies/route-flips/route_flips.py MODEL_DIR --lr 5e-5 --seeds 0 1 2

MODEL_DIR: a Hugging Face MoE directory that returns router logits (Qwen3-MoE and similar),
e.g. a cold-started built-in model under $GSPO_CACHE_DIR/models/. Task: synthetic math
(--operands, --max-operand). Prints one table per seed; writes nothing. The numbers in README.md
beside it (and docs/results.md, "The GSPO paper's MoE findings") came from this script.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gspo_cli.models.routing import expert_change_frac  # noqa: E402
from gspo_cli.rollout.base import RolloutBatch, response_logprobs  # noqa: E402
from gspo_cli.rollout.hf import HFRolloutEngine  # noqa: E402
from gspo_cli.tasks.arithmetic import ArithmeticTask  # noqa: E402


def routes(model, batch: RolloutBatch, k: int) -> torch.Tensor:
    """(L, N, k) chosen experts of every position of `batch` (positions as the trainer's)."""
    with torch.no_grad():
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            output_router_logits=True,
        )
    return torch.stack([lg.topk(k, -1).indices for lg in out.router_logits])


def one_seed(
    model, tok, task: ArithmeticTask, lr: float, seed: int, prompts: int, new_tokens: int, router_scale: float = 1.0
) -> dict:
    engine = HFRolloutEngine(model, tok, max_new_tokens=new_tokens, temperature=1.0)
    torch.manual_seed(seed)
    batch = engine.generate([p.prompt for p in task.train_problems(random.Random(seed), prompts)])
    k = model.config.num_experts_per_tok
    tokens = batch.attention_mask.reshape(-1).bool()
    before = routes(model, batch, k)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    logp = response_logprobs(model, batch).logp
    rmask = batch.response_mask.float()
    adv = torch.randn(logp.shape[0])
    (-((logp * rmask).sum(1) / rmask.sum(1).clamp(min=1) * adv).mean()).backward()

    def is_router(name: str) -> bool:
        return name.endswith("mlp.gate.weight")

    # optimizer.router_lr_scale: the routers' Adam step is that many times the others'
    step = {n: lr * (router_scale if is_router(n) else 1.0) * p.grad.sign() for n, p in model.named_parameters()}

    res = {}
    variants = (("all", lambda n: True), ("routers only", is_router), ("all but routers", lambda n: not is_router(n)))
    for label, moved in variants:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n] - step[n] if moved(n) else start[n])
        after = routes(model, batch, k)
        res[label] = [expert_change_frac(before[i : i + 1], after[i : i + 1], tokens) for i in range(len(before))]
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(start[n])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=30)
    ap.add_argument("--operands", type=int, default=3)
    ap.add_argument("--max-operand", type=int, default=20)
    ap.add_argument("--router-lr-scale", type=float, default=1.0, help="optimizer.router_lr_scale")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    task = ArithmeticTask(num_operands=a.operands, max_operand=a.max_operand)
    print(f"{a.model_dir.name}: {model.config.num_hidden_layers} layers, lr {a.lr}")
    for seed in a.seeds:
        res = one_seed(model, tok, task, a.lr, seed, a.prompts, a.new_tokens, a.router_lr_scale)
        print(f"\nseed {seed}\n\n| moved | mean | per layer (%) |\n|---|---:|---|")
        for label, per_layer in res.items():
            mean = 100 * sum(per_layer) / len(per_layer)
            print(f"| {label} | {mean:.2f}% | {' '.join(f'{100 * x:.2f}' for x in per_layer)} |")


if __name__ == "__main__":
    main()
