"""Padding-free packing (`train.packing`) against padding, on CPU: forward + backward time and
peak resident memory of one micro-batch's log-probs (`rollout.response_logprobs`, the update's
forward, loss sum(log-prob x mask)), on responses with skewed lengths: each row's response drawn
in [median/2, 3 median/2], then one row set to 8x the median (the longest 8x the median).

Models are Qwen3-MoE networks built from configs (no weights needed for timing): `tiny` is the
test suite's built-in size (hidden 32, 2 layers, 4 experts top-2), `small` a larger one (hidden
256, 4 layers, 8 experts top-2). Each (model, attention, rows, mode) runs in its own process,
padded and packed alternating, `--rounds` times: a process times `--reps` forward+backward
passes after one warm-up (the median is reported) and measures its peak RSS above the RSS
before the first pass (Linux VmHWM, reset through /proc/self/clear_refs).

    python studies/packing/packing.py                       # ~10 min on a busy 2-core box
    python studies/packing/packing.py --rows 8,32 --models tiny

Prints markdown; writes nothing. The numbers in README.md beside it came from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZES = {
    "tiny": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=4,
    ),  # fmt: skip
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        moe_intermediate_size=256,
        num_experts=8,
    ),  # fmt: skip
}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def skewed_batch(rows: int, prompt: int, median: int, vocab: int, seed: int = 0):
    """A RolloutBatch: `rows` prompts of `prompt` tokens, responses in [median/2, 3 median/2]
    with row 0's set to 8 x median (right-padded to it)."""
    import torch

    from gspo_cli.rollout import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(median // 2, 3 * median // 2 + 1, (rows,), generator=g)
    lengths[0] = 8 * median
    C = int(lengths.max())
    rmask = (torch.arange(C)[None, :] < lengths[:, None]).float()
    attn = torch.cat([torch.ones(rows, prompt, dtype=torch.long), rmask.long()], dim=1)
    ids = torch.randint(3, vocab, (rows, prompt + C), generator=g) * attn
    return RolloutBatch(ids, attn, rmask, prompt, [""] * rows, torch.zeros(rows, dtype=torch.bool))


def worker(model: str, attn: str, rows: int, prompt: int, median: int, packed: bool, reps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from gspo_cli.rollout import response_logprobs

    torch.set_num_threads(1)  # one thread each, as the tests run
    cfg = Qwen3MoeConfig(
        vocab_size=96, num_experts_per_tok=2, max_position_embeddings=16 * median + prompt, **SIZES[model]
    )
    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_config(cfg, experts_implementation="eager", attn_implementation=attn)
    batch = skewed_batch(rows, prompt, median, cfg.vocab_size)
    lengths = batch.response_mask.sum(-1)

    def step():
        net.zero_grad(set_to_none=True)
        out = response_logprobs(net, batch, 1.0, packed=packed)
        (out.logp * batch.response_mask).sum().backward()

    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kb("VmRSS")
    step()  # warm-up, and the peak
    peak = (_status_kb("VmHWM") - before) / 1024
    seconds = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t)
    real = int(batch.attention_mask.sum())
    return {
        "model": model,
        "attn": attn,
        "rows": rows,
        "packed": packed,
        "median": float(lengths.median()),
        "longest": float(lengths.max()),
        "positions": real if packed else batch.attention_mask.numel(),
        "real": real,
        "s": statistics.median(seconds),
        "peak_mb": peak,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--attn", default="sdpa,eager")
    ap.add_argument("--rows", default="8,32,128")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--median", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        model, attn, rows, packed = args.worker.split(":")
        res = worker(model, attn, int(rows), args.prompt, args.median, packed == "1", args.reps)
        print("RESULT " + json.dumps(res), flush=True)
        return
    results: dict[tuple, list[dict]] = {}
    for _ in range(args.rounds):
        for model in args.models.split(","):
            for attn in args.attn.split(","):
                for rows in args.rows.split(","):
                    for packed in ("0", "1"):  # alternating, so the box's load hits both alike
                        cmd = [sys.executable, __file__, "--prompt", str(args.prompt), "--median", str(args.median)]
                        cmd += ["--reps", str(args.reps), "--worker", f"{model}:{attn}:{rows}:{packed}"]
                        res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
                        r = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[7:])
                        results.setdefault((model, attn, int(rows), packed), []).append(r)
    render(results, args)


def render(results: dict, args) -> None:
    print(
        f"prompts {args.prompt} tokens, responses median ~{args.median} (longest 8x), forward + backward of "
        f"the log-probs, CPU, 1 thread; median of {args.reps} passes per process, {args.rounds} processes per "
        "cell (each shown)\n"
    )
    print("| model | attention | rows | real tokens | padded positions | padded s | packed s | packed/padded "
          "| padded peak MB | packed peak MB |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (model, attn, rows, packed), runs in results.items():
        if packed != "0":
            continue
        pad, pack = runs, results[(model, attn, rows, "1")]
        ps, ks = [r["s"] for r in pad], [r["s"] for r in pack]
        ratio = statistics.median(ks) / statistics.median(ps)
        peaks = [" / ".join(f"{r['peak_mb']:.0f}" for r in side) for side in (pad, pack)]
        print(
            f"| {model} | {attn} | {rows} | {pad[0]['real']} | {pad[0]['positions']} | "
            f"{' / '.join(f'{s:.3f}' for s in ps)} | {' / '.join(f'{s:.3f}' for s in ks)} | {ratio:.2f} | "
            f"{peaks[0]} | {peaks[1]} |"
        )


if __name__ == "__main__":
    main()
