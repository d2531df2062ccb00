"""Rollout throughput, HF generate vs vLLM, on the quickstart's tiny MoE (CPU).

    .venv-vllm/bin/python studies/vllm-rollout/vllm_rollout.py [--prompts 128] [--tokens 40]

Random weights (no cold start) so that nearly every response runs to the token limit:
the same number of tokens for both engines. Prints tokens/s (best and median of 3 after a warm-up;
the machine may be shared),
the weight-sync time, and the engine-vs-trainer log-prob gap. This file measures; the
report's layout is render.py's `vllm_rollout_text`. Needs vLLM (`make test-vllm` builds
`.venv-vllm`).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: import `benchmarks.*` from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from benchmarks.render import vllm_rollout_text


def main():
    import os

    os.environ.setdefault("GSPO_CACHE_DIR", tempfile.mkdtemp(prefix="gspo-bench-"))
    import torch

    from gspo_cli.models import load_model, resolve_model_source
    from gspo_cli.rollout import HFRolloutEngine, logprob_mismatch, response_logprobs
    from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=40)
    args = ap.parse_args()
    spec = spec_from_dict(
        {"name": "bench", "arms": [{"name": "a", "preset": "paper-gspo"}], "model": {"cold_start": {"steps": 0}}}
    )
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=lambda m: None)
    lm = load_model(source, spec.model)
    prompts = [f"{a}+{b}=?\n" for a in range(16) for b in range(16)][: args.prompts]

    def bench(engine):
        engine.generate(prompts)  # warm-up
        rates, batch = [], None
        for _ in range(3):
            t = time.time()
            batch = engine.generate(prompts)
            rates.append(batch.response_mask.sum().item() / (time.time() - t))
        return (max(rates), statistics.median(rates)), batch.response_mask.sum(1).mean().item(), batch

    hf = HFRolloutEngine(lm.model, lm.tokenizer, max_new_tokens=args.tokens, temperature=1.0)
    hf_rate, hf_len, _ = bench(hf)
    t = time.time()
    vl = VLLMRolloutEngine(lm.model, lm.tokenizer, model_dir=source, max_new_tokens=args.tokens, temperature=1.0)
    start_s = time.time() - t
    vl_rate, vl_len, batch = bench(vl)
    with torch.no_grad():
        gap = logprob_mismatch(batch.engine_logp, response_logprobs(lm.model, batch).logp, batch.response_mask)
        for p in lm.model.parameters():
            p.add_(1e-3)
    t = time.time()
    vl.sync_weights()
    sync_s = time.time() - t
    vl.close()
    print(
        vllm_rollout_text(
            {
                "threads": torch.get_num_threads(),
                "prompts": args.prompts,
                "tokens": args.tokens,
                "params_m": sum(p.numel() for p in lm.model.parameters()) / 1e6,
                "hf_best": hf_rate[0],
                "hf_median": hf_rate[1],
                "hf_length": hf_len,
                "vllm_best": vl_rate[0],
                "vllm_median": vl_rate[1],
                "vllm_length": vl_len,
                "start_s": start_s,
                "sync_s": sync_s,
                "gap_mean": gap["rollout/logprob_diff_mean"],
                "gap_max": gap["rollout/logprob_diff_max"],
            }
        ),
        end="",
    )


if __name__ == "__main__":  # vLLM may spawn processes that re-import this file
    main()
