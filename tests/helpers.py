"""Shared test helpers: the tiny end-to-end spec, a free local port. Test modules import
these from here, never from each other."""

import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (for a process group's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TINY = {
    "name": "e2e",
    "seeds": [0],
    "model": {
        "name": "builtin:tiny-moe",
        "builtin": {
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "experts_per_token": 2,
        },
        "cold_start": {"steps": 120, "batch_size": 32, "lr": 1e-2},
    },
    # One-digit sums and a format reward: even a barely trained model gets mixed rewards.
    "task": {
        "name": "arithmetic",
        "params": {"num_operands": 2, "max_operand": 4, "operators": "+", "format_weight": 0.5},
        "eval_size": 4,
    },
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
    "optimizer": {"lr": 1e-3},
    "train": {"steps": 2},
    "arms": [
        {"name": "grpo", "preset": "paper-grpo", "mini_batches": 2},
        {"name": "grpo_rr", "preset": "paper-grpo-rr", "mini_batches": 2},
        {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
        {"name": "gspo_token", "preset": "paper-gspo-token", "mini_batches": 2},
        {"name": "grpo_kl", "preset": "paper-grpo", "mini_batches": 2, "kl_coef": 0.1, "epochs": 2},
    ],
}


def edited_model_copy(base, dest, *, config=None, generation_config=None, tokenizer_config=None):
    """An ordinary local HF model directory: `base` (e.g. a built-in model's) copied to
    `dest`, with the given keys of config.json, generation_config.json (created when
    missing) and tokenizer_config.json replaced. Returns `dest` as a Path."""
    import json
    import shutil
    from pathlib import Path

    dest = Path(dest)
    shutil.copytree(base, dest)
    for name, edits in (
        ("config.json", config),
        ("generation_config.json", generation_config),
        ("tokenizer_config.json", tokenizer_config),
    ):
        if edits:
            path = dest / name
            data = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps({**data, **edits}, indent=1))
    return dest


def tiny_model_dir():
    """Directory of TINY's built-in model (built once per cache, ~20 s cold start)."""
    from gspo_cli.models import resolve_model_source
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task

    spec = spec_from_dict(TINY)
    return resolve_model_source(spec.model, make_task(spec.task.name, spec.task.params), log=lambda m: None)


def rows_batch(lengths, truncated=None, C=None, engine_logp=None):
    """A RolloutBatch of len(lengths) rows, one prompt token each, responses of these lengths
    (padded to C, default the longest); `truncated` per row, default none."""
    import torch  # here, so that the torch-free tests importing this module stay torch-free

    from gspo_cli.rollout import RolloutBatch

    B, C = len(lengths), C or max(lengths)
    mask = (torch.arange(C)[None, :] < torch.tensor(lengths)[:, None]).float()
    return RolloutBatch(
        input_ids=torch.ones(B, 1 + C, dtype=torch.long),
        attention_mask=torch.ones(B, 1 + C, dtype=torch.long),
        response_mask=mask,
        prompt_len=1,
        completions=[""] * B,
        truncated=torch.tensor(list(truncated) if truncated is not None else [False] * B),
        engine_logp=engine_logp,
    )


def learn_capturing_grads(ctx, spec, batch, scores, state, *, ref=None, packed=False):
    """One `train.step.learn` of `batch` (`scores`) under `spec`'s first arm, `ctx`'s model and
    optimizer first reset to `state` ((model, optimizer) state dicts), `ref` the KL reference
    when the arm has a KL term, `packed` the forwards' train.packing: (the flat gradient at each
    optimizer step, the step's metrics)."""
    import copy

    import torch

    from gspo_cli.algorithms import get_advantage_estimator, get_policy_loss
    from gspo_cli.train.step import learn

    model_state, opt_state = state
    ctx.spec, ctx.arm, ctx.packed = spec, spec.arms[0], packed
    ctx.loss_fn = get_policy_loss(ctx.arm.loss)
    ctx.adv_fn = get_advantage_estimator(ctx.arm.advantage)
    ctx.ref_model = ref if ctx.arm.kl_coef > 0 else None
    ctx.model.config.output_router_logits = spec.model.router_aux_loss_coef > 0
    ctx.model.load_state_dict(model_state)
    ctx.optimizer.load_state_dict(opt_state)
    ctx.shuffle = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # Clip-Cov draws its tokens from torch's generator
    grads, step = [], ctx.optimizer.step

    def capture(*a, **k):
        grads.append(torch.cat([p.grad.reshape(-1) for p in ctx.model.parameters() if p.grad is not None]).clone())
        return step(*a, **k)

    ctx.optimizer.step = capture
    try:
        metrics = learn(ctx, copy.copy(batch), scores, 1)
    finally:
        ctx.optimizer.step, ctx.packed = step, False
    return grads, metrics


def models_in_float64(*models):
    """Cast `models` to float64 in place (MoE experts to the eager implementation: torch's grouped
    GEMM has no float64 kernel). See `in_float64` for why equality tests run in float64."""
    for model in models:
        model.double()
        if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
            model.set_experts_implementation("eager")


def in_float64(ctx, batch, *models):
    """Cast `ctx`'s model, the other `models` and `batch`'s floating tensors to float64, in place.

    Equality tests ("micro-batches change memory, not the update", "packed equals padded", "N
    processes equal one") compare two computations that differ only in the order of their sums.
    In float32 that order moves results by a few roundings, and how many depends on the CPU's
    kernels, so a fixed float32 bound passes on one machine and fails on another. In float64
    the same comparison holds to ~1e-12 everywhere, which is also the stronger claim."""
    import dataclasses

    import torch

    models_in_float64(ctx.model, *models)
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        if torch.is_tensor(value) and value.is_floating_point():
            setattr(batch, field.name, value.double())


def max_gap(a, b) -> float:
    """The largest |a - b| (in float64) between two tensors, or two dicts of tensors with the same
    keys: the measure the float32 floors of equality tests use (see `in_float64`)."""
    import torch

    if isinstance(a, dict):
        assert a.keys() == b.keys(), a.keys() ^ b.keys()
        return max((max_gap(a[k], b[k]) for k in a), default=0.0)
    return float((a.detach().double() - b.detach().double()).abs().max()) if torch.is_tensor(a) and a.numel() else 0.0


def tiny_study_spec(path: Path, out: Path, **changes) -> Path:
    """Writes to `path` the tiny end-to-end spec as a study for the executors' tests: two arms
    (grpo, gspo), two seeds, a short cold start, runs under `out`, SLURM resources for this
    machine (1 CPU a run, 1 s between looks); `changes` replace top-level sections."""
    import yaml

    spec = {
        **TINY,
        "name": "tiny",
        "seeds": [0, 1],
        "output_dir": str(out),
        "model": {**TINY["model"], "cold_start": {"steps": 20, "batch_size": 32, "lr": 1e-2}},
        "arms": [a for a in TINY["arms"] if a["name"] in ("grpo", "gspo")],
        "executor": {"kind": "local", "slurm": {"cpus_per_run": 1, "time_min": 10, "poll_s": 1}},
    }
    for key, value in changes.items():
        spec[key] = value
    path.write_text(yaml.safe_dump(spec))
    return path


def tiny_tune_spec(path: Path, out: Path, **changes) -> Path:
    """Writes to `path` the tiny end-to-end spec as a `gspo tune` study: grpo and gspo, two
    clip_high values each on seed 100 (1 step), selected on the `val` set, the final runs on seeds
    0 and 1 compared on the disjoint `test` set, runs under `out`; `changes` replace top-level
    sections (name, model, executor)."""
    import yaml

    sets = {"task": "math", "params": {"source": "synthetic", "num_operands": 2, "max_operand": 20}}
    spec = {
        **TINY,
        "name": "tune",
        "output_dir": str(out),
        "task": {
            **TINY["task"],
            "eval_sets": [{"name": "val", **sets, "size": 4}, {"name": "test", **sets, "size": 4, "skip": 4}],
        },
        "arms": [TINY["arms"][0], TINY["arms"][2]],
        "train": {"steps": 1},
        "tune": {
            "grids": {"grpo": {"arm.clip_high": [0.2, 0.3]}, "gspo": {"arm.clip_high": [3e-4, 6e-4]}},
            "selection_set": "val",
            "test_set": "test",
            "seeds": [100],
            "steps": 1,
            "final_seeds": [0, 1],
        },
    }
    for key, value in changes.items():
        spec[key] = value
    path.write_text(yaml.safe_dump(spec))
    return path


def slow_task(folder: Path, seconds: float = 0.3) -> dict:
    """The tiny task with a reward that sleeps `seconds` per batch (written to folder/slow_reward.py):
    a run whose steps take at least that long on any machine, for tests that must stop one midway."""
    (folder / "slow_reward.py").write_text(
        "import time\n\n\n"
        "def slow(prompts, completions, completion_ids, **columns):\n"
        f"    time.sleep({seconds})\n"
        "    return [float(len(c) % 2) for c in completions]\n"
    )
    return {**TINY["task"], "rewards": [{"function": f"{folder / 'slow_reward.py'}:slow"}]}
