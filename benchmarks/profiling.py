"""cProfile of a few of our RL steps (CPU time, so other users of the box do not count),
grouped into buckets: phases of the step and parts of the model.

`worker_profile` is a worker process like those in workers.py: it writes the profile's text
(`profile_<preset>.txt` in its out_dir) and emits the buckets for the report.
"""

from __future__ import annotations

import cProfile
import fnmatch
import io
import linecache
import pstats
import time
from pathlib import Path

from benchmarks.common import base_raw, emit, load_spec_and_task, model_source, set_threads
from benchmarks.render import profile_text


def worker_profile(cfg: dict) -> None:
    """cProfile (CPU time, so other users of the box do not count) of a few of our steps
    after warm-up, for one arm; writes profile_<preset>.txt."""
    from gspo_cli.train.step import setup, train_step

    set_threads(cfg.get("threads", 0))
    raw = base_raw(
        prompts=cfg["prompts"],
        group=cfg["group"],
        max_new=cfg["max_new"],
        mini_batches=cfg["mini_batches"],
        steps=cfg["warmup"] + cfg["steps"],
        preset=cfg["preset"],
        spec_path=cfg.get("spec"),
        smoke=bool(cfg.get("smoke")),
    )
    spec, task = load_spec_and_task(raw)
    ctx = setup(spec, spec.arms[0], cfg["seed"], task, model_source(spec, task))
    for i in range(1, cfg["warmup"] + 1):
        train_step(ctx, i)
    prof = cProfile.Profile(time.process_time)
    t0 = time.process_time()
    prof.enable()
    for i in range(cfg["warmup"] + 1, cfg["warmup"] + cfg["steps"] + 1):
        train_step(ctx, i)
    prof.disable()
    total = time.process_time() - t0
    stats = pstats.Stats(prof)
    buckets = profile_buckets(stats, total)
    by_cumulative, by_own = io.StringIO(), io.StringIO()
    pstats.Stats(prof, stream=by_cumulative).sort_stats("cumulative").print_stats(45)
    pstats.Stats(prof, stream=by_own).sort_stats("tottime").print_stats(30)
    path = Path(cfg["out_dir"]) / f"profile_{cfg['preset']}.txt"
    path.write_text(profile_text(cfg, total, buckets, by_cumulative.getvalue(), by_own.getvalue()))
    emit({"side": "profile", "preset": cfg["preset"], "total_s": total, "buckets": buckets, "file": str(path)})


# (label, filename suffix, function or Class.method): cumulative CPU times out of cProfile.
# An indented label is part of the row above it.
PROFILE_BUCKETS = [
    ("rollout: HFRolloutEngine.generate", "gspo_cli/rollout/hf.py", "HFRolloutEngine.generate"),
    ("  our sampling loop (rollout.decode: compact)", "gspo_cli/rollout/decode.py", "sample"),
    (
        "  transformers generate() sampling loop (rollout.decode: generate)",
        "transformers/generation/utils.py",
        "_sample",
    ),
    ("  KV-cache updates (in place)", "gspo_cli/rollout/decode.py", "InPlaceLayer.update"),
    ("  KV-cache updates (DynamicCache)", "transformers/cache_utils.py", "DynamicLayer.update"),
    ("  decoding completions (batch_decode)", "transformers/tokenization_utils_base.py", "batch_decode"),
    ("scoring: task.score_batch", "gspo_cli/tasks/base.py", "Task.score_batch"),
    (
        "log-prob passes: response_logprobs (one per mini-batch; + the old-policy pass with sampler_logprobs off)",
        "gspo_cli/rollout/base.py",
        "response_logprobs",
    ),
    ("backward (loss.backward)", "torch/_tensor.py", "backward"),
    ("clip_grad_norm_", "torch/nn/utils/clip_grad.py", "clip_grad_norm_"),
    ("optimizer.step (AdamW, fused kernel where parameters are plain)", "torch/optim/adam.py", "adam"),
    ("policy loss function", "gspo_cli/algorithms/losses.py", "*_loss"),
    ("routing hooks (record / replay)", "gspo_cli/models/routing.py", "RoutingController.hook"),
    ("  replay rescoring (_rescore)", "gspo_cli/models/routing.py", "_rescore"),
    ("expert_change_frac (volatility metric)", "gspo_cli/models/routing.py", "expert_change_frac"),
    (
        "every model forward (generation and log-prob passes)",
        "qwen3_moe/modeling_qwen3_moe.py",
        "Qwen3MoeForCausalLM.forward",
    ),
    ("  decoder layers", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeDecoderLayer.forward"),
    (
        "  attention (Qwen3MoeAttention.forward, SDPA + rotary)",
        "qwen3_moe/modeling_qwen3_moe.py",
        "Qwen3MoeAttention.forward",
    ),
    ("  MoE block (router + experts)", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeSparseMoeBlock.forward"),
    ("  experts (Qwen3MoeExperts.forward)", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeExperts.forward"),
    ("  RMSNorm", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeRMSNorm.forward"),
]


def _qualname(fname: str, line: int, name: str) -> str:
    """Class.method for a method defined in a class body (nearest `class` line above), else name."""
    indent = None
    for n in range(line, 0, -1):
        text = linecache.getline(fname, n)
        if not text.strip():
            continue
        if indent is None:
            indent = len(text) - len(text.lstrip())
            if indent == 0:
                return name
            continue
        stripped = text.lstrip()
        if stripped.startswith("class ") and len(text) - len(stripped) < indent:
            return stripped[6:].split("(")[0].split(":")[0].strip() + "." + name
    return name


def profile_buckets(stats: pstats.Stats, total: float) -> list[dict]:
    """One row per PROFILE_BUCKETS entry found in `stats` (label, where, seconds, share of
    `total` CPU seconds; share None when total is 0), plus "everything else"."""
    out = []
    for label, suffix, func in PROFILE_BUCKETS:
        best = None
        for (fname, line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
            if not fname.replace("\\", "/").endswith(suffix):
                continue
            qual = _qualname(fname, line, name) if "." in func else name
            if not fnmatch.fnmatchcase(qual, func):
                continue
            if best is None or ct > best[1]:  # the outermost entry stands for the bucket
                best = (f"{Path(fname).name}:{line} {qual}", ct)
        if best is not None:
            out.append(
                {
                    "label": label,
                    "where": best[0],
                    "seconds": round(best[1], 4),
                    "share": round(best[1] / total, 4) if total else None,
                }
            )
    # What is not the model's forward, backward or optimizer: our step's own code, generate()'s
    # bookkeeping, tokenization, scoring, statistics.
    core = sum(
        b["seconds"]
        for b in out
        if b["label"].startswith(("every model forward", "backward", "clip_grad", "optimizer"))
    )
    out.append(
        {
            "label": "everything else (our code, generate() bookkeeping, tokenizer, scorer, stats)",
            "where": "total minus forwards, backward, clip, optimizer",
            "seconds": round(total - core, 4),
            "share": round((total - core) / total, 4) if total else None,
        }
    )
    return out
