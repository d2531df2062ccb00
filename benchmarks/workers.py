"""The measuring side of `make bench`: one worker per process, for our trainer and for TRL's
GRPOTrainer doing the same RL step (the equal-work terms are in bench.py's docstring).

Each worker reads its config (a dict, from the orchestrator's command line), answers with
tagged JSON lines (`common.emit`) and times only; summaries and the report are elsewhere
(orchestrate.py, render.py).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time

from benchmarks.common import base_raw, emit, load_spec_and_task, model_source, peak_rss_mb, set_threads, wait_for_step


def _spec_for(
    cfg: dict, *, steps: int, group: int | None = None, max_new: int | None = None, preset: str | None = None
):
    """(spec, task) of the quickstart at a worker's sizes; group/max_new/preset override cfg's,
    cfg["staleness"] (default 0) is rollout.staleness."""
    raw = base_raw(
        prompts=cfg["prompts"],
        group=group or cfg["group"],
        max_new=max_new or cfg["max_new"],
        mini_batches=cfg["mini_batches"],
        steps=steps,
        preset=preset or cfg["preset"],
        staleness=cfg.get("staleness", 0),
    )
    return load_spec_and_task(raw)


def worker_ours(cfg: dict) -> None:
    """Our trainer: setup() once, then `rounds` steps, each on "step" (lockstep), or back to
    back with cfg["block"] (a block: the orchestrator runs nothing else meanwhile). With
    cfg["staleness"] = 1 the steps are stale.StaleRollouts' (a worker process samples one step
    ahead, torch threads split as the trainer splits them); the spec then has one step more
    than is run, so every measured step overlaps the next step's sampling (steady state)."""
    import torch

    from gspo_cli.train.staleness import StaleRollouts, split_threads
    from gspo_cli.train.step import setup, train_step

    set_threads(cfg)
    block, stale_on = cfg.get("block", False), bool(cfg.get("staleness"))
    spec, task = _spec_for(cfg, steps=cfg["rounds"] + stale_on)
    source = model_source(spec, task)
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    ctx = setup(spec, spec.arms[0], cfg["seed"], task, source)
    # the worker process starts here, inside the set-up time; its first batch is warm-up's
    stale = StaleRollouts(ctx, source=source, seed=cfg["seed"]) if stale_on else None
    emit({"ready": True, "setup_s": time.perf_counter() - t0})
    B = cfg["prompts"] * cfg["group"]
    try:
        for i in range(1, cfg["rounds"] + 1):
            if not block and not wait_for_step():
                break
            c0 = time.process_time()
            m = stale.step(ctx, i) if stale else train_step(ctx, i)
            rec = {**our_step_record(m, B), "cpu_s": time.process_time() - c0, "t_end": time.perf_counter()}
            if stale:
                rec["wait_s"] = m["perf/rollout_wait_s"]
            emit(rec)
    finally:
        if stale:
            stale.close()
    if not block:
        wait_for_step()  # "done"
    threads_desc = "{} trainer + {} worker".format(*split_threads(threads)) if stale else threads
    emit({"final": True, "peak_rss_mb": peak_rss_mb(), "torch_threads": threads_desc})


def our_step_record(m: dict, B: int) -> dict:
    """One step's record (seconds, tokens, tokens/s) from our trainer's metrics; B = rollouts per step."""
    gen_tokens = m["response/length_mean"] * B
    return {
        "step_s": m["time/step_s"],
        "rollout_s": m["time/rollout_s"],
        "score_s": m["time/score_s"],
        "old_logp_s": m["time/old_logp_s"],
        "update_s": m["time/update_s"],
        "gen_tokens": gen_tokens,
        "gen_tok_per_s": gen_tokens / max(m["time/rollout_s"], 1e-9),
        "length_mean": m["response/length_mean"],
        "length_max": m["response/length_max"],
        "gen_ms_per_token_step": 1000 * m["time/rollout_s"] / max(m["response/length_max"], 1),
        "reward_mean": m["reward/mean"],
    }


def _trl_trainer(cfg: dict, spec, task, source: str, out_dir: str):
    """TRL's GRPOTrainer set up for the same work as our arm `spec.arms[0]`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    arm, mb = spec.arms[0], cfg["mini_batches"]
    torch.manual_seed(cfg["seed"])
    # The same expert kernels as our trainer (transformers' own default is grouped_mm too).
    model = AutoModelForCausalLM.from_pretrained(
        source, experts_implementation=spec.model.experts_implementation, dtype=torch.float32
    )
    model.config.router_aux_loss_coef = 0.0  # TRL would add the load-balancing loss (DESIGN: TRL facts)
    model.config.output_router_logits = False
    tok = AutoTokenizer.from_pretrained(source)
    tok.padding_side = "left"

    # The prompts our trainer draws: train_problems(Random(seed), prompts) once per step, in order.
    rng = random.Random(cfg["seed"])
    problems = [p for _ in range(cfg["rounds"] + 1) for p in task.train_problems(rng, cfg["prompts"])]
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems], "pid": list(range(len(problems)))})

    def task_reward(prompts, completions, pid, **_):
        return [task.score(problems[i], c).reward for i, c in zip(pid, completions)]

    opt = spec.optimizer
    args = GRPOConfig(
        output_dir=out_dir,
        seed=cfg["seed"],
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=False,
        max_steps=mb * cfg["rounds"],
        # one rollout = prompts x group completions, split into `mb` optimizer steps, one epoch
        per_device_train_batch_size=cfg["prompts"] * cfg["group"] // mb,
        gradient_accumulation_steps=1,
        steps_per_generation=mb,
        num_iterations=arm.epochs,
        num_generations=cfg["group"],
        max_completion_length=cfg["max_new"],
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        repetition_penalty=1.0,
        loss_type="grpo",
        importance_sampling_level="sequence" if arm.loss == "gspo" else "token",
        epsilon=arm.clip_low,
        epsilon_high=arm.clip_high,
        beta=0.0,
        router_aux_loss_coef=0.0,
        learning_rate=opt.lr,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.beta1,
        adam_beta2=opt.beta2,
        max_grad_norm=opt.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
    )
    return GRPOTrainer(model=model, reward_funcs=task_reward, args=args, train_dataset=dataset, processing_class=tok)


def _time_trl_phases(trainer) -> tuple[dict[str, list[float]], list[int], list[int]]:
    """Wrap the trainer's own methods with timers (instance attributes shadow the class's).
    Returns (seconds per call by phase "prep"/"gen"/"reward", generated tokens per round,
    longest completion per round); the lists fill as the trainer runs."""
    phases: dict[str, list[float]] = {"prep": [], "gen": [], "reward": []}
    gen_tokens: list[int] = []
    gen_longest: list[int] = []

    def timed(name, fn, count_tokens=False):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            phases[name].append(time.perf_counter() - t)
            if count_tokens:
                gen_tokens.append(sum(len(c) for c in out[1]))  # completion ids up to and incl. EOS
                gen_longest.append(max(len(c) for c in out[1]))
            return out

        return wrapper

    trainer._generate_and_score_completions = timed("prep", trainer._generate_and_score_completions)
    trainer._generate = timed("gen", trainer._generate, count_tokens=True)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    return phases, gen_tokens, gen_longest


def worker_trl(cfg: dict) -> None:
    """TRL's GRPOTrainer doing the same step; one round = one generation + `mini_batches` optimizer
    steps, each on "step" (lockstep), or back to back with cfg["block"]."""
    import torch
    import trl
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    set_threads(cfg)
    spec, task = _spec_for(cfg, steps=cfg["rounds"])
    source = model_source(spec, task)
    mb, B = cfg["mini_batches"], cfg["prompts"] * cfg["group"]

    t0 = time.perf_counter()
    out_dir = tempfile.mkdtemp(prefix="gspo-bench-trl-")
    trainer = _trl_trainer(cfg, spec, task, source, out_dir)
    setup_s = time.perf_counter() - t0
    phases, gen_tokens, gen_longest = _time_trl_phases(trainer)

    class Lockstep(TrainerCallback):
        """Hold the training loop at every round boundary until the orchestrator says "step"."""

        def _go(self):
            if not cfg.get("block") and not wait_for_step():
                raise SystemExit("bench worker: stopped before the last round")
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_begin(self, *a, **kw):
            emit({"ready": True, "setup_s": setup_s})
            self._go()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % mb:
                return
            r = state.global_step // mb - 1
            step_s = time.perf_counter() - self.t0
            gen, reward, prep = phases["gen"][r], phases["reward"][r], phases["prep"][r]
            emit(
                {
                    "step_s": step_s,
                    "cpu_s": time.process_time() - self.c0,
                    "rollout_s": gen,
                    "score_s": reward,
                    "old_logp_s": prep - gen - reward,
                    "update_s": step_s - prep,
                    "gen_tokens": gen_tokens[r],
                    "gen_tok_per_s": gen_tokens[r] / max(gen, 1e-9),
                    "length_mean": gen_tokens[r] / B,
                    "length_max": gen_longest[r],
                    "gen_ms_per_token_step": 1000 * gen / max(gen_longest[r], 1),
                    "t_end": time.perf_counter(),
                }
            )
            if state.global_step < args.max_steps:
                self._go()

    trainer.add_callback(Lockstep())
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    if not cfg.get("block"):
        wait_for_step()  # "done"
    emit(
        {
            "final": True,
            "peak_rss_mb": peak_rss_mb(),
            "torch_threads": torch.get_num_threads(),
            "trl_version": trl.__version__,
        }
    )


def worker_variants(cfg: dict) -> None:
    """Several of our configurations in one process, stepped round-robin (rotating order),
    so that load changes on the box affect them alike. Variant keys: label, preset, group,
    max_new, ignore_eos (sample exactly max_new tokens: only the rollout's stopping rule
    changes; rewards and the loss still end at the first EOS)."""
    from gspo_cli.train.step import setup, train_step

    set_threads(cfg)
    ctxs = []
    for v in cfg["variants"]:
        spec, task = _spec_for(cfg, steps=cfg["rounds"], group=v["group"], max_new=v["max_new"], preset=v["preset"])
        ctx = setup(spec, spec.arms[0], cfg["seed"], task, model_source(spec, task))
        if v.get("ignore_eos"):
            # an id no sampled token can equal: generate() then never stops early
            ctx.engine.gen_config.eos_token_id = len(ctx.engine.tokenizer) + 1000
        ctxs.append(ctx)
    records: dict[str, list[dict]] = {v["label"]: [] for v in cfg["variants"]}
    n = len(ctxs)
    for r in range(cfg["rounds"]):
        for j in range(n):
            k = (j + r) % n
            v = cfg["variants"][k]
            c0 = time.process_time()
            m = train_step(ctxs[k], r + 1)
            cpu = time.process_time() - c0
            if r >= cfg["warmup"]:
                rec = our_step_record(m, cfg["prompts"] * v["group"])
                rec.update(round=r, cpu_s=cpu)
                records[v["label"]].append(rec)
    emit({"side": "ours-variants", "records": records, "peak_rss_mb": peak_rss_mb()})
