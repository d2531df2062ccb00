"""`gspo plan` against measured peaks: per-phase peak RSS of real training processes (CPU,
gloo, model.device cpu, so a process's "device memory" is its resident memory) next to the
plan's per-process figure for the same spec, model and prompt length.

    PYTHONPATH=. .venv/bin/python benchmarks/plan_check.py [--out results/bench/plan_check.md] [--only NAME]
    PYTHONPATH=. .venv/bin/python benchmarks/plan_check.py --smoke --out DIR/plan_check.md  # the test suite's

Each configuration runs in fresh processes (torchrun for 2). A worker loads the model
(`setup`, phase "load"), trains two steps and writes one checkpoint; the peak of each phase is
the kernel's high-water mark (VmHWM) after resetting it at the phase's start (writing 5 to
/proc/self/clear_refs), the largest over the two steps and over ranks. The plan (layout
"today", now called "before": the code before meta-device loading, chunked log-probs and
per-rank checkpoints; the `sharded` column is the code as
it is now and is printed beside it) is compared with the measured peak minus the worker's
baseline (its RSS after torch, transformers and process-group start, before the model and
its code are loaded): the plan's CPU runtime allowance is a guess, the baseline is measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("load", "rollout", "pi_old", "update", "checkpoint")
TAG = "PLAN_CHECK "

# a batch of 64 rows in one mini-batch: the activation and logits terms dominate the update
BIG = {"rollout": {"prompts_per_step": 16, "group_size": 4}, "arm": {"mini_batches": 1}}

BUILTIN = {
    "hidden_size": 512,
    "num_layers": 8,
    "num_heads": 8,
    "num_kv_heads": 4,
    "num_experts": 32,
    "experts_per_token": 4,
    "moe_intermediate_size": 256,
    "intermediate_size": 1024,
}


def local(kind: str, hidden: int, layers: int, vocab: int, **kw) -> dict:
    heads = max(2, hidden // 64)
    cfg = {
        "model_type": kind,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "head_dim": 64,
        "intermediate_size": kw.pop("intermediate", 4 * hidden),
        "tie_word_embeddings": False,
        "max_position_embeddings": 512,
    }
    if kind == "qwen3_moe":
        cfg |= {
            "num_experts": kw.pop("experts", 16),
            "num_experts_per_tok": kw.pop("top_k", 4),
            "moe_intermediate_size": kw.pop("moe_intermediate", hidden),
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "norm_topk_prob": True,
            "router_aux_loss_coef": 0.0,
        }
    return cfg


MOE_10M = local("qwen3_moe", 256, 4, 8000, experts=8, moe_intermediate=256)

# name, model (builtin size or local config), processes, sharding, gradient checkpointing,
# spec overrides (rollout / train fields, arm fields)
CONFIGS = [
    ("builtin-moe-110M", {"builtin": BUILTIN}, 1, "ddp", False, {}),
    ("moe-10M", {"local": local("qwen3_moe", 256, 4, 8000, experts=8, moe_intermediate=256)}, 1, "ddp", False, {}),
    ("moe-10M", {"local": local("qwen3_moe", 256, 4, 8000, experts=8, moe_intermediate=256)}, 2, "fsdp", False, {}),
    ("dense-100M", {"local": local("qwen3", 768, 8, 32000)}, 1, "ddp", False, {}),
    ("dense-100M", {"local": local("qwen3", 768, 8, 32000)}, 2, "fsdp", True, {}),
    ("moe-300M", {"local": local("qwen3_moe", 640, 8, 32000, experts=32, moe_intermediate=512)}, 1, "ddp", True, {}),
    ("moe-300M", {"local": local("qwen3_moe", 640, 8, 32000, experts=32, moe_intermediate=512)}, 2, "fsdp", False, {}),
    # micro-batches: one mini-batch of 64 rows, unsplit and in micro-batches of 256 tokens (about 3 rows)
    ("moe-10M-64rows", {"local": MOE_10M}, 1, "ddp", False, BIG),
    ("moe-10M-64rows-mb256", {"local": MOE_10M}, 1, "ddp", False, BIG | {"train": {"micro_batch_tokens": 256}}),
]
# --smoke: one process, a ~0.1 M-parameter MoE, 2 prompts x 2 samples of up to 8 tokens, one step
SMOKE = [
    (
        "smoke-moe",
        {"local": local("qwen3_moe", 64, 2, 128, experts=4, top_k=2, moe_intermediate=64)},
        1,
        "ddp",
        False,
        {
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
            "train": {"steps": 1},
            "arm": {"mini_batches": 1},
        },
    )
]


def raw_spec(
    model: dict, sharding: str, checkpointing: bool, out: Path, model_dir: str | None, extra: dict | None = None
) -> dict:
    extra = extra or {}
    m = (
        {"name": "builtin:tiny-moe", "builtin": model["builtin"], "cold_start": {"steps": 0}}
        if "builtin" in model
        else {"name": model_dir}
    )
    return {
        "name": "plan_check",
        "output_dir": str(out),
        "model": {**m, "sharding": sharding},
        "task": {"name": "arithmetic", "eval_size": 0},
        "rollout": {
            "prompts_per_step": 4,
            "group_size": 4,
            "max_new_tokens": 48,
            "chat_template": "none",
            **extra.get("rollout", {}),
        },
        "train": {"steps": 2, "checkpoint_every": 0, "gradient_checkpointing": checkpointing, **extra.get("train", {})},
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2, **extra.get("arm", {})}],
    }


def write_local_model(cfg: dict, path: Path) -> None:
    """A randomly initialised model of `cfg` and a tokenizer covering its whole vocabulary
    (the built-in character tokens, then filler tokens), so sampled ids always decode."""
    import torch
    from tokenizers import Tokenizer, decoders, models
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    from gspo_cli.tasks.base import character_vocabulary

    tokens = character_vocabulary("")
    tokens += [f"<t{i}>" for i in range(cfg["vocab_size"] - len(tokens))]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    config = AutoConfig.for_model(**cfg, pad_token_id=0, bos_token_id=1, eos_token_id=2, dtype="float32")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)


# ---------------------------------------------------------------------------------------
# Measuring (inside the training processes)


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class PhaseMeter:
    """Peak resident memory per named phase: the high-water mark is reset when a phase starts."""

    def __init__(self):
        self.peaks: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        try:
            yield
        finally:
            self.peaks[name] = max(self.peaks.get(name, 0.0), _hwm_mb())

    def wrap(self, name: str, fn):
        def wrapped(*args, **kwargs):
            with self(name):
                return fn(*args, **kwargs)

        return wrapped


def worker(spec_file: str) -> None:
    import gc
    import warnings

    from gspo_cli import distributed
    from gspo_cli.spec.loading import load_spec
    from gspo_cli.tasks import make_task

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = load_spec(spec_file)
    info = distributed.setup(spec.model.device)
    task = make_task(spec.task.name, spec.task.params)
    gc.collect()
    # Before the model code is imported: gspo_cli.models imports transformers' MoE integration
    # (gspo_cli/models/experts.py, about 80 MB), which the plan counts as libraries loaded with
    # the model (memory.CPU_LOAD_LIBRARIES); at 2026-12-04's measurements it came with the load.
    baseline = _rss_mb()
    from gspo_cli.models import resolve_model_source
    from gspo_cli.runs import RunDir
    from gspo_cli.train import loop, step

    source = resolve_model_source(spec.model, task, log=lambda *a: None)
    meter = PhaseMeter()
    with meter("load"):
        ctx = step.setup(spec, spec.arms[0], 0, task, source, dist_info=info)
    ctx.engine.generate = meter.wrap("rollout", ctx.engine.generate)
    step.old_policy = meter.wrap("pi_old", step.old_policy)  # as step.py imported it
    step.update = meter.wrap("update", step.update)
    prompt_len = 0
    generate = ctx.engine.generate

    def generate_and_note(prompts):
        nonlocal prompt_len
        batch = generate(prompts)
        prompt_len = max(prompt_len, batch.prompt_len)
        return batch

    ctx.engine.generate = generate_and_note
    for i in range(1, spec.train.steps + 1):
        step.train_step(ctx, i)
    with tempfile.TemporaryDirectory() as tmp, meter("checkpoint"):
        loop._checkpoint(ctx, RunDir(Path(tmp) / "run"), spec.train.steps)
    row = {"rank": info.rank, "baseline_mb": baseline, "prompt_len": prompt_len, "peaks_mb": meter.peaks}
    print(TAG + json.dumps(row), flush=True)


# ---------------------------------------------------------------------------------------
# Orchestrating and rendering


def measure(name: str, model: dict, world: int, sharding: str, ckpt: bool, extra: dict, work: Path) -> dict:
    import yaml

    model_dir = None
    if "local" in model:
        model_dir = str(work / "model")
        write_local_model(model["local"], Path(model_dir))
    raw = raw_spec(model, sharding, ckpt, work / "out", model_dir, extra)
    spec_file = work / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        if world > 1
        else [sys.executable]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        launcher + [__file__, "--worker", str(spec_file)], capture_output=True, text=True, env=env, cwd=ROOT
    )
    rows = [json.loads(line[len(TAG) :]) for line in res.stdout.splitlines() if line.startswith(TAG)]
    if res.returncode != 0 or len(rows) != world:
        raise RuntimeError(f"{name} x{world}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return {"raw": raw, "ranks": rows}


def plan_for(raw: dict, world: int, prompt_len: int) -> dict:
    """The plan's per-process device figure (runtime allowance left out) per phase, per layout."""
    from gspo_cli.plan import Hardware, model_shape, plan_memory
    from gspo_cli.spec.loading import spec_from_dict

    spec = spec_from_dict(raw)
    shape, _ = model_shape(spec)
    out = {"params": shape.total_params()}
    for layout in ("today", "sharded"):
        p = plan_memory(shape, spec, Hardware(gpus_per_node=world), prompt_tokens=prompt_len, layout=layout)
        out[layout] = {ph.name: ph.device_total for ph in p.phases}
    return out


def render(results: list[dict], layout: str = "sharded") -> str:
    """The table; plan / measured uses `layout`'s plan: "sharded" (the code as it is; measure
    with it) or "today" (the code before meta-device loading and per-rank checkpoints: measurements
    taken before they landed)."""
    other = "today" if layout == "sharded" else "sharded"
    names = {"sharded": "plan, the code as it is (MB)", "today": "plan, the code before (MB)"}
    lines = [
        "| model | parameters | processes | sharding | act. ckpt | phase | measured peak - baseline (MB) "
        f"| {names[layout]} | plan / measured | {names[other]} |",
        "|---|---:|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        for phase in PHASES:
            meas = r["measured_mb"][phase]
            mine = r["plan"][layout][phase] / 2**20
            theirs = r["plan"][other][phase] / 2**20
            lines.append(
                f"| {r['name']} | {r['plan']['params'] / 1e6:,.1f} M | {r['world']} | {r['sharding']} | "
                f"{'yes' if r['ckpt'] else 'no'} | {phase} | {meas:,.0f} | {mine:,.0f} | "
                f"{mine / max(meas, 1):.2f} | {theirs:,.0f} |"
            )
    ratios = [r["plan"][layout][ph] / 2**20 / max(r["measured_mb"][ph], 1) for r in results for ph in PHASES]
    within = sum(0.75 <= x <= 1.25 for x in ratios)
    base = ", ".join(f"{r['name']} x{r['world']}: {r['baseline_mb']:,.0f}" for r in results)
    return (
        "\n".join(lines)
        + f"\n\nWithin 25% of measured: {within} of {len(ratios)} phases "
        + f"(plan / measured {min(ratios):.2f}-{max(ratios):.2f}). Baselines (MB, largest rank): {base}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "plan_check.md"))
    ap.add_argument("--only", help="run only configurations whose name contains this")
    ap.add_argument("--replan", nargs="+", metavar="JSON", help="re-render saved measurements with the current plan")
    ap.add_argument(
        "--layout",
        default="sharded",
        choices=("sharded", "today"),
        help="plan for the ratio (today: the code before meta-device loading)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's check that it runs: one small configuration (SMOKE), one step, one process",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.replan:
        results = [r for path in args.replan for r in json.loads(Path(path).read_text())]
        for r in results:
            r["plan"] = replan(r)
        write(render(results, args.layout), results, args.out)
        return
    results = []
    for name, model, world, sharding, ckpt, extra in SMOKE if args.smoke else CONFIGS:
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:  # the plan reads the model's config.json from it
            got = measure(name, model, world, sharding, ckpt, extra, Path(tmp))
            ranks = got["ranks"]
            plan = plan_for(got["raw"], world, max(r["prompt_len"] for r in ranks))
        baseline = max(r["baseline_mb"] for r in ranks)
        measured = {ph: max(r["peaks_mb"][ph] - r["baseline_mb"] for r in ranks) for ph in PHASES}
        results.append(
            {
                "name": name,
                "world": world,
                "sharding": sharding if world > 1 else "-",
                "ckpt": ckpt,
                "baseline_mb": baseline,
                "measured_mb": measured,
                "plan": plan,
                "ranks": ranks,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    write(render(results, args.layout), results, args.out)


def write(text: str, results: list[dict], out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    Path(out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)


def replan(r: dict) -> dict:
    """The current plan for a saved measurement (its configuration found again by name,
    processes and checkpointing; a local model's config.json written to a scratch directory)."""
    name, model, world, sharding, ckpt, extra = next(
        c for c in CONFIGS if c[0] == r["name"] and c[2] == r["world"] and c[4] == r["ckpt"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = None
        if "local" in model:
            model_dir = tmp
            Path(tmp, "config.json").write_text(json.dumps(model["local"]))
        raw = raw_spec(model, sharding, ckpt, Path(tmp) / "out", model_dir, extra)
        return plan_for(raw, world, max(x["prompt_len"] for x in r["ranks"]))


if __name__ == "__main__":
    if __package__ in (None, ""):  # run as a script: `benchmarks.*` from the repository root
        sys.path[0] = str(ROOT)
    from benchmarks.common import spec_errors_in_one_line

    with spec_errors_in_one_line("plan_check"):
        main()
