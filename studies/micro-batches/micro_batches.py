"""Peak resident memory of one update with micro-batches (`train.micro_batch_tokens`) against the
unsplit update, on CPU: the test suite's tiny MoE (cold-started once, cached), one fixed batch of
ROWS rows x (PROMPT + RESPONSE) random tokens, one mini-batch, pi_old perturbed so the update
clips; `learn` (pi_old's no-grad forward, the update, its metrics) runs once per process, each
budget in a fresh process so every peak is its own. Reported: the peak RSS during `learn` above
the RSS before it (Linux VmHWM after the setup is reset through /proc/self/clear_refs), the
update's seconds and the micro-batch count; the gradient norm and loss, which must not depend on
the split.

    python studies/micro-batches/micro_batches.py --response 128   # 256 rows: ~8 min on a busy 2-core box
    python studies/micro-batches/micro_batches.py --rows 128       # smaller

Prints markdown; writes nothing. The numbers in README.md beside it came from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The test suite's tiny MoE (tests/helpers.py TINY): cold-started once and cached, like every
# built-in model (hidden 32, 2 layers, 4 experts top-2).
MODEL = """
name: builtin:tiny-moe
builtin: {hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 64,
          moe_intermediate_size: 32, num_experts: 4, experts_per_token: 2}
cold_start: {steps: 120, batch_size: 32, lr: 0.01}
"""


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def worker(rows: int, prompt: int, response: int, budget: int | None) -> dict:
    import torch
    import yaml

    from gspo_cli.models import resolve_model_source
    from gspo_cli.rollout import RolloutBatch
    from gspo_cli.rollout.base import LogProbs
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task
    from gspo_cli.tasks.base import Score
    from gspo_cli.train import step as step_mod

    raw = {
        "name": "micro",
        "model": yaml.safe_load(MODEL),
        "task": {"name": "arithmetic", "params": {"num_operands": 2, "max_operand": 4, "operators": "+"}},
        "rollout": {"prompts_per_step": rows // 8, "group_size": 8, "max_new_tokens": response},
        "train": {"micro_batch_tokens": budget, "eval_every": 0, "checkpoint_every": 0},
        "arms": [{"name": "grpo", "preset": "paper-grpo", "mini_batches": 1}],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one mini-batch: "on-policy" (pi_old is perturbed below)
        spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    ctx = step_mod.setup(spec, spec.arms[0], 0, task, resolve_model_source(spec.model, task, log=lambda m: None))
    g = torch.Generator().manual_seed(0)
    V = ctx.model.config.vocab_size
    ids = torch.randint(3, V, (rows, prompt + response), generator=g)
    lengths = torch.randint(response // 4, response + 1, (rows,), generator=g)
    rmask = (torch.arange(response)[None, :] < lengths[:, None]).float()
    attn = torch.cat([torch.ones(rows, prompt, dtype=torch.long), rmask.long()], dim=1)
    batch = RolloutBatch(ids, attn, rmask, prompt, [""] * rows, torch.zeros(rows, dtype=torch.bool))
    wobble = 0.2 * torch.sin(torch.arange(rows * response, dtype=torch.float32)).reshape(rows, response)

    def old_policy(ctx_, b):  # pi_old by the trainer's own (micro-batched) forward, then perturbed
        lp, routes, _ = real_old_policy(ctx_, b)
        return LogProbs(logp=(lp.logp + wobble) * b.response_mask, entropy=lp.entropy), routes, False

    real_old_policy = step_mod.old_policy
    step_mod.old_policy = old_policy
    scores = [Score(reward=float(i % 3 == 0), correct=i % 3 == 0) for i in range(rows)]
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kb("VmRSS")
    t = time.time()
    metrics = step_mod.learn(ctx, batch, scores, step=1)
    seconds = time.time() - t
    return {
        "budget": budget,
        "peak_above_mb": (_status_kb("VmHWM") - before) / 1024,
        "rss_before_mb": before / 1024,
        "learn_s": seconds,
        "update_s": metrics["time/update_s"],
        "micro_batches": metrics.get("perf/micro_batches", 1.0),
        "grad_norm": metrics["policy/grad_norm"],
        "loss": metrics["policy/loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--worker", type=str, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        budget = None if args.worker == "none" else int(args.worker)
        print("RESULT " + json.dumps(worker(args.rows, args.prompt, args.response, budget)), flush=True)
        return
    whole = args.rows * (args.prompt + args.response)
    budgets = [None] + [whole // k for k in (2, 4, 8, 16)]
    out = []
    for b in budgets:
        cmd = [sys.executable, __file__, "--rows", str(args.rows), "--prompt", str(args.prompt)]
        cmd += ["--response", str(args.response), "--worker", "none" if b is None else str(b)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        out.append(json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[7:]))
    print(f"{args.rows} rows x ({args.prompt} + up to {args.response}) tokens, the tiny MoE, CPU\n")
    print(
        "| micro_batch_tokens | micro-batches | peak RSS above start of `learn` (MB) | learn s | update s "
        "| grad norm | loss |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in out:
        print(
            f"| {r['budget'] or 'none (unsplit)'} | {r['micro_batches']:g} | {r['peak_above_mb']:.0f} | "
            f"{r['learn_s']:.2f} | {r['update_s']:.2f} | {r['grad_norm']:.6g} | {r['loss']:.6g} |"
        )


if __name__ == "__main__":
    main()
