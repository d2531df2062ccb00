"""`make bench`: one RL step of gspo-cli next to the same step in TRL's GRPOTrainer.

Equal work on both sides: the built-in tiny MoE of the quickstart (its cold-started
checkpoint, grouped_mm experts on both sides), the quickstart task's prompts in the same order, G samples per
prompt, the same max new tokens, pure sampling (temperature 1, no top-k, top-p 1), the same
number of optimizer steps per rollout (our `mini_batches` = TRL's `steps_per_generation`,
one epoch = `num_iterations=1`), GSPO's sequence ratio with the paper's clip range and
aggregation (TRL: `importance_sampling_level="sequence"`, `loss_type="grpo"`), no KL, no
router load-balancing loss, fp32, no gradient checkpointing, no logging, no saving, the
same optimizer (AdamW, constant lr, grad clip 1) and a reward that is our task's scorer.

Each side runs in its own process (so its peak RSS is its own). The two processes run in
lockstep, one RL step on one side then one on the other, alternating who goes first, over
several pairs of fresh processes (one seed each). The headline ratio is the median over
steps of ours/TRL measured back to back, so other work on a shared box hits both alike.
Arm overheads and scaling run our trainer only, with the variants stepped round-robin in
one process for the same reason. On a busy box each process gets one torch thread
(`--threads auto`): with one thread per core, OpenMP spin-waits stall steps for seconds.

    python benchmarks/bench.py                     # everything, ~3-4 min on 2 cores (model cached)
    python benchmarks/bench.py --quick             # a smoke run, ~30 s
    python benchmarks/bench.py --quickstart-full   # only: time the whole quickstart from a cold cache
                                                   # (-> quickstart.json, shown in later reports)

Results: benchmarks/results/bench.md (the report, also printed), bench.json (every
measurement), profile_<arm>.txt (cProfile, CPU time, of a few of our steps).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
RESULT_TAG = "BENCH_RESULT "
SHARED_LOAD = 2.5  # 1-minute load average above which the box counts as shared (2 cores)


# ---------------------------------------------------------------------------------------
# Sizes and specs


def base_raw(*, prompts: int, group: int, max_new: int, mini_batches: int, steps: int, preset: str) -> dict:
    """The quickstart spec (model, task, optimizer) with the benchmark's rollout sizes and one arm."""
    import yaml

    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["rollout"].update(prompts_per_step=prompts, group_size=group, max_new_tokens=max_new, temperature=1.0)
    raw["train"].update(steps=steps, eval_every=0, checkpoint_every=0)
    raw["arms"] = [{"name": preset, "preset": preset, "mini_batches": mini_batches, "epochs": 1}]
    return raw


def load_spec_and_task(raw: dict):
    from gspo_cli.spec_loading import spec_from_dict
    from gspo_cli.tasks import make_task

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_dict(raw)
    return spec, make_task(spec.task.name, spec.task.params)


def model_source(spec, task) -> str:
    from gspo_cli.models import resolve_model_source

    return resolve_model_source(spec.model, task, log=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def pick_threads(arg: str, load: float) -> tuple[int, str]:
    """(threads, why); 0 means torch's default. On a busy box, torch's default of one thread
    per core stalls: a thread waiting at an OpenMP barrier spins while its partner is
    descheduled, and single steps took 20-40 s instead of ~1 s here (2 cores, load ~4)."""
    cores = os.cpu_count() or 1
    if arg == "default":
        return 0, "torch's default"
    if arg == "auto":
        if load > cores / 2:
            return 1, (f"1 (auto: the box was busy at start, load {load:.2f} on {cores} cores; with a thread per "
                       "core, OpenMP spin-waits stall a loaded box)")
        return 0, "torch's default (auto: idle box)"
    return int(arg), f"{int(arg)} (--threads)"


def thread_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else dict(os.environ)


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------
# Workers. Each runs in its own process and answers on stdout with tagged JSON lines. The
# ours/TRL workers run in lockstep: after set-up they wait on stdin for "step", run one RL
# step (TRL: one generation round and its optimizer steps), report it and wait again, so
# the orchestrator can alternate the two sides step by step while the idle one sleeps.


def emit(obj: dict) -> None:
    print(RESULT_TAG + json.dumps(obj), flush=True)


def wait_for_step() -> bool:
    """True on "step", False on "done"; anything else (EOF: the orchestrator died) ends the process."""
    cmd = sys.stdin.readline().strip()
    if cmd in ("step", "done"):
        return cmd == "step"
    raise SystemExit(f"bench worker: unexpected command {cmd!r}")


def set_threads(cfg: dict) -> None:
    import torch

    if cfg.get("threads"):
        torch.set_num_threads(cfg["threads"])


def worker_ours(cfg: dict) -> None:
    """Our trainer: setup() once, then one train_step() per "step"."""
    import torch

    from gspo_cli.step import setup, train_step

    set_threads(cfg)
    raw = base_raw(prompts=cfg["prompts"], group=cfg["group"], max_new=cfg["max_new"],
                   mini_batches=cfg["mini_batches"], steps=cfg["rounds"], preset=cfg["preset"])
    spec, task = load_spec_and_task(raw)
    source = model_source(spec, task)
    t0 = time.perf_counter()
    ctx = setup(spec, spec.arms[0], cfg["seed"], task, source)
    emit({"ready": True, "setup_s": time.perf_counter() - t0})
    B = cfg["prompts"] * cfg["group"]
    i = 0
    while wait_for_step():
        i += 1
        c0 = time.process_time()
        m = train_step(ctx, i)
        emit({**_our_step_record(m, B), "cpu_s": time.process_time() - c0})
    emit({"final": True, "peak_rss_mb": peak_rss_mb(), "torch_threads": torch.get_num_threads()})


def _our_step_record(m: dict, B: int) -> dict:
    gen_tokens = m["response/length_mean"] * B
    return {
        "step_s": m["time/step_s"], "rollout_s": m["time/rollout_s"], "score_s": m["time/score_s"],
        "old_logp_s": m["time/old_logp_s"], "update_s": m["time/update_s"],
        "gen_tokens": gen_tokens, "gen_tok_per_s": gen_tokens / max(m["time/rollout_s"], 1e-9),
        "length_mean": m["response/length_mean"], "length_max": m["response/length_max"],
        "gen_ms_per_token_step": 1000 * m["time/rollout_s"] / max(m["response/length_max"], 1),
        "reward_mean": m["reward/mean"],
    }


def worker_trl(cfg: dict) -> None:
    """TRL's GRPOTrainer doing the same step; one round = one generation + `mini_batches` optimizer steps."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    hf_logging.set_verbosity_error()
    set_threads(cfg)
    raw = base_raw(prompts=cfg["prompts"], group=cfg["group"], max_new=cfg["max_new"],
                   mini_batches=cfg["mini_batches"], steps=cfg["rounds"], preset=cfg["preset"])
    spec, task = load_spec_and_task(raw)
    source = model_source(spec, task)
    arm = spec.arms[0]
    rounds, mb = cfg["rounds"], cfg["mini_batches"]

    torch.manual_seed(cfg["seed"])
    t0 = time.perf_counter()
    # The same expert kernels as our trainer (transformers' own default is grouped_mm too).
    model = AutoModelForCausalLM.from_pretrained(source, experts_implementation=spec.model.experts_implementation,
                                                 dtype=torch.float32)
    model.config.router_aux_loss_coef = 0.0  # TRL would add the load-balancing loss (DESIGN: TRL facts)
    model.config.output_router_logits = False
    tok = AutoTokenizer.from_pretrained(source)
    tok.padding_side = "left"

    # The prompts our trainer draws: train_problems(Random(seed), prompts) once per step, in order.
    rng = random.Random(cfg["seed"])
    problems = [p for _ in range(rounds + 1) for p in task.train_problems(rng, cfg["prompts"])]
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems], "pid": list(range(len(problems)))})

    def task_reward(prompts, completions, pid, **_):
        return [task.score(problems[i], c).reward for i, c in zip(pid, completions)]

    out_dir = tempfile.mkdtemp(prefix="gspo-bench-trl-")
    opt = spec.optimizer
    args = GRPOConfig(
        output_dir=out_dir, seed=cfg["seed"], use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, report_to="none", logging_strategy="no", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, shuffle_dataset=False,
        max_steps=mb * rounds,
        # one rollout = prompts x group completions, split into `mb` optimizer steps, one epoch
        per_device_train_batch_size=cfg["prompts"] * cfg["group"] // mb, gradient_accumulation_steps=1,
        steps_per_generation=mb, num_iterations=arm.epochs, num_generations=cfg["group"],
        max_completion_length=cfg["max_new"], temperature=1.0, top_k=0, top_p=1.0, min_p=None,
        repetition_penalty=1.0,
        loss_type="grpo", importance_sampling_level="sequence" if arm.loss == "gspo" else "token",
        epsilon=arm.clip_low, epsilon_high=arm.clip_high, beta=0.0, router_aux_loss_coef=0.0,
        learning_rate=opt.lr, weight_decay=opt.weight_decay, adam_beta1=opt.beta1, adam_beta2=opt.beta2,
        max_grad_norm=opt.grad_clip, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
    )
    trainer = GRPOTrainer(model=model, reward_funcs=task_reward, args=args, train_dataset=dataset,
                          processing_class=tok)
    setup_s = time.perf_counter() - t0

    # Phase timers: wrap the trainer's own methods (instance attributes shadow the class's).
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
    B = cfg["prompts"] * cfg["group"]

    class Lockstep(TrainerCallback):
        """Hold the training loop at every round boundary until the orchestrator says "step"."""

        def _go(self):
            if not wait_for_step():
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
            emit({"step_s": step_s, "cpu_s": time.process_time() - self.c0, "rollout_s": gen, "score_s": reward,
                  "old_logp_s": prep - gen - reward, "update_s": step_s - prep, "gen_tokens": gen_tokens[r],
                  "gen_tok_per_s": gen_tokens[r] / max(gen, 1e-9), "length_mean": gen_tokens[r] / B,
                  "length_max": gen_longest[r], "gen_ms_per_token_step": 1000 * gen / max(gen_longest[r], 1)})
            if state.global_step < args.max_steps:
                self._go()

    trainer.add_callback(Lockstep())
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    wait_for_step()  # "done"
    import trl

    emit({"final": True, "peak_rss_mb": peak_rss_mb(), "torch_threads": torch.get_num_threads(),
          "trl_version": trl.__version__})


def worker_variants(cfg: dict) -> dict:
    """Several of our configurations in one process, stepped round-robin (rotating order),
    so that load changes on the box affect them alike. Variant keys: label, preset, group,
    max_new, ignore_eos (sample exactly max_new tokens: only the rollout's stopping rule
    changes; rewards and the loss still end at the first EOS)."""
    from gspo_cli.step import setup, train_step

    set_threads(cfg)
    ctxs = []
    for v in cfg["variants"]:
        raw = base_raw(prompts=cfg["prompts"], group=v["group"], max_new=v["max_new"],
                       mini_batches=cfg["mini_batches"], steps=cfg["rounds"], preset=v["preset"])
        spec, task = load_spec_and_task(raw)
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
                rec = _our_step_record(m, cfg["prompts"] * v["group"])
                rec.update(round=r, cpu_s=cpu)
                records[v["label"]].append(rec)
    emit({"side": "ours-variants", "records": records, "peak_rss_mb": peak_rss_mb()})


def worker_profile(cfg: dict) -> dict:
    """cProfile (CPU time, so other users of the box do not count) of a few of our steps
    after warm-up, for one arm; writes profile_<preset>.txt."""
    from gspo_cli.step import setup, train_step

    set_threads(cfg)
    raw = base_raw(prompts=cfg["prompts"], group=cfg["group"], max_new=cfg["max_new"],
                   mini_batches=cfg["mini_batches"], steps=cfg["warmup"] + cfg["steps"], preset=cfg["preset"])
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
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
    text2 = io.StringIO()
    pstats.Stats(prof, stream=text2).sort_stats("tottime").print_stats(30)
    path = Path(cfg["out_dir"]) / f"profile_{cfg['preset']}.txt"
    lines = [(f"cProfile of {cfg['steps']} steps of {cfg['preset']} after {cfg['warmup']} warm-up "
             f"({cfg['prompts']} prompts x {cfg['group']}, max_new_tokens {cfg['max_new']}, "
             f"{cfg['mini_batches']} mini-batches); profiled CPU time {total:.2f} s "
             "(process time of all threads; cProfile inflates Python-heavy code)."), "", "Buckets (cumulative time, share of profiled time):"]
    lines += [f"  {b['share']:6.1%}  {b['seconds']:7.3f} s  {b['label']}  [{b['where']}]" for b in buckets]
    lines += ["", "Top by cumulative time:", text.getvalue(), "Top by own time:", text2.getvalue()]
    path.write_text("\n".join(lines))
    emit({"side": "profile", "preset": cfg["preset"], "total_s": total, "buckets": buckets, "file": str(path)})


# (label, filename suffix, function or Class.method): cumulative CPU times out of cProfile.
# An indented label is part of the row above it.
PROFILE_BUCKETS = [
    ("rollout: HFRolloutEngine.generate", "gspo_cli/rollout/hf.py", "HFRolloutEngine.generate"),
    ("  transformers generate() sampling loop", "transformers/generation/utils.py", "_sample"),
    ("  KV-cache updates (DynamicCache)", "transformers/cache_utils.py", "update"),
    ("  decoding completions (batch_decode)", "transformers/tokenization_utils_base.py", "batch_decode"),
    ("scoring: task.score_batch", "gspo_cli/tasks/base.py", "Task.score_batch"),
    ("log-prob passes: response_logprobs (one per mini-batch; + the old-policy pass with sampler_logprobs off)",
     "gspo_cli/rollout/base.py", "response_logprobs"),
    ("backward (loss.backward)", "torch/_tensor.py", "backward"),
    ("clip_grad_norm_", "torch/nn/utils/clip_grad.py", "clip_grad_norm_"),
    ("optimizer.step (AdamW, single-tensor path on CPU)", "torch/optim/adam.py", "adam"),
    ("policy loss function", "gspo_cli/algorithms/losses.py", "*_loss"),
    ("routing hooks (record / replay)", "gspo_cli/models/routing.py", "RoutingController.hook"),
    ("  replay rescoring (_rescore)", "gspo_cli/models/routing.py", "_rescore"),
    ("expert_change_frac (volatility metric)", "gspo_cli/models/routing.py", "expert_change_frac"),
    ("every model forward (generation and log-prob passes)", "qwen3_moe/modeling_qwen3_moe.py",
     "Qwen3MoeForCausalLM.forward"),
    ("  decoder layers", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeDecoderLayer.forward"),
    ("  attention (Qwen3MoeAttention.forward, SDPA + rotary)", "qwen3_moe/modeling_qwen3_moe.py",
     "Qwen3MoeAttention.forward"),
    ("  MoE block (router + experts)", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeSparseMoeBlock.forward"),
    ("  experts (Qwen3MoeExperts.forward)", "qwen3_moe/modeling_qwen3_moe.py",
     "Qwen3MoeExperts.forward"),
    ("  RMSNorm", "qwen3_moe/modeling_qwen3_moe.py", "Qwen3MoeRMSNorm.forward"),
]


def _qualname(fname: str, line: int, name: str) -> str:
    """Class.method for a method defined in a class body (nearest `class` line above), else name."""
    import linecache

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
    import fnmatch

    out = []
    for label, suffix, func in PROFILE_BUCKETS:
        best = None
        for (fname, line, name), (cc, nc, tt, ct, callers) in stats.stats.items():
            if not fname.replace("\\", "/").endswith(suffix):
                continue
            qual = _qualname(fname, line, name) if "." in func else name
            if not fnmatch.fnmatchcase(qual, func):
                continue
            if best is None or ct > best[1]:  # the outermost entry stands for the bucket
                best = (f"{Path(fname).name}:{line} {qual}", ct)
        if best is not None:
            out.append({"label": label, "where": best[0], "seconds": round(best[1], 4),
                        "share": round(best[1] / total, 4) if total else None})
    # What is not the model's forward, backward or optimizer: our step's own code, generate()'s
    # bookkeeping, tokenization, scoring, statistics.
    core = sum(b["seconds"] for b in out if b["label"].startswith(("every model forward", "backward", "clip_grad",
                                                                   "optimizer")))
    out.append({"label": "everything else (our code, generate() bookkeeping, tokenizer, scorer, stats)",
                "where": "total minus forwards, backward, clip, optimizer", "seconds": round(total - core, 4),
                "share": round((total - core) / total, 4) if total else None})
    return out


WORKERS = {"ours": worker_ours, "trl": worker_trl, "variants": worker_variants, "profile": worker_profile}


# ---------------------------------------------------------------------------------------
# The orchestrator


class Worker:
    """A worker process; its stderr goes to a temporary file, shown if it fails."""

    def __init__(self, kind: str, cfg: dict):
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.kind, self.label = kind, f"{kind} {cfg.get('preset', '')}".strip()
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finish()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", kind, json.dumps(cfg)], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True)

    def recv(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.err.seek(0)
                sys.stderr.write(self.err.read()[-8000:])
                raise SystemExit(f"bench: worker {self.label} failed (exit {self.proc.returncode})")
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def finish(self) -> dict:
        res = self.recv()
        self.proc.stdin.close()
        self.proc.wait()
        self.err.close()
        res["process_wall_s"] = time.perf_counter() - self.t0
        return res


def run_worker(kind: str, cfg: dict, log) -> dict:
    """A worker that runs to completion and answers once."""
    w = Worker(kind, cfg)
    res = w.finish()
    log(f"  {w.label:22s} done in {res['process_wall_s']:5.1f} s (load {loadavg():.2f})")
    return res


def ours_vs_trl(cfg: dict, reps: int, warmup: int, steps: int, log) -> dict:
    """`reps` pairs of fresh processes; inside each, the two sides alternate step by step
    (who goes first alternates too), so both see the same load at nearly the same time."""
    records = {"ours": [], "trl": []}
    finals = {"ours": [], "trl": []}
    for rep in range(reps):
        # a new seed per repetition (the same for both sides: same prompts), so the samples differ
        rep_cfg = {**cfg, "rounds": warmup + steps, "seed": cfg["seed"] + rep}
        workers = {side: Worker(side, rep_cfg) for side in ("ours", "trl")}
        ready = {side: w.recv() for side, w in workers.items()}
        for i in range(warmup + steps):
            order = ("ours", "trl") if (i + rep) % 2 == 0 else ("trl", "ours")
            for side in order:
                workers[side].send("step")
                rec = workers[side].recv()
                if i >= warmup:
                    records[side].append({**rec, "rep": rep, "round": i, "load": loadavg()})
        for side, w in workers.items():
            w.send("done")
            finals[side].append({**w.finish(), "setup_s": ready[side]["setup_s"]})
        last = {side: records[side][-steps:] for side in records}
        log(f"  repetition {rep + 1}/{reps}: ours {median([r['step_s'] for r in last['ours']]):.3f} s, "
            f"TRL {median([r['step_s'] for r in last['trl']]):.3f} s per step (load {loadavg():.2f})")
    return {"records": records, "finals": finals}


STEP_KEYS = ("step_s", "cpu_s", "rollout_s", "score_s", "old_logp_s", "update_s", "gen_tok_per_s", "length_mean",
             "length_max", "gen_ms_per_token_step")


def summarize_side(recs: list[dict], finals: list[dict]) -> dict:
    out = _summ(recs)
    reps = sorted({r["rep"] for r in recs})
    out["per_rep_step_s"] = [median([r["step_s"] for r in recs if r["rep"] == k]) for k in reps]
    out["peak_rss_mb"] = median([f["peak_rss_mb"] for f in finals])
    out["peak_rss_mb_max"] = max(f["peak_rss_mb"] for f in finals)
    out["setup_s"] = median([f["setup_s"] for f in finals])
    out["torch_threads"] = finals[0].get("torch_threads")
    return out


def paired(a_recs: list[dict], b_recs: list[dict], key: str = "step_s", id_keys=("rep", "round")):
    """Median over rounds of a/b, the two measured in the same round (adjacent in time)."""
    by = {tuple(r.get(k) for k in id_keys): r[key] for r in b_recs}
    return median([r[key] / by[tuple(r.get(k) for k in id_keys)] for r in a_recs
                   if by.get(tuple(r.get(k) for k in id_keys))])


def _summ(recs: list[dict]) -> dict:
    return {**{k: median([r.get(k) for r in recs]) for k in STEP_KEYS}, "n_steps": len(recs)}


def quickstart_memory(steps: int, log, threads: int = 0) -> dict:
    """Peak RSS (and wall time) of `gspo train experiments/quickstart.yaml --set train.steps=N`."""
    gspo = Path(sys.executable).parent / "gspo"
    load0 = loadavg()
    with tempfile.TemporaryDirectory(prefix="gspo-bench-qs-") as out:
        cmd = ["/usr/bin/time", "-v", str(gspo), "train", str(QUICKSTART), "--set", f"train.steps={steps}",
               "-o", out]
        res = _timed_command(cmd, log, label=f"quickstart train, {steps} steps (cached cold start)",
                             env=thread_env(threads))
    return {**res, "steps": steps, "load_start": load0, "threads": threads}


def _timed_command(cmd: list[str], log, label: str, env=None) -> dict:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"bench: {' '.join(cmd)} failed (exit {proc.returncode})")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    res = {"command": " ".join(cmd[2:]) if cmd[0].endswith("time") else " ".join(cmd), "wall_s": wall,
           "max_rss_mb": int(rss.group(1)) / 1024 if rss else None, "loadavg_after": loadavg()}
    log(f"  {label}: {wall:.1f} s, max RSS {res['max_rss_mb'] or float('nan'):.0f} MB")
    return res


def quickstart_full(log, threads_arg: str) -> dict:
    """What `make run` does after setup, from an empty model cache (cold start included)."""
    gspo = str(Path(sys.executable).parent / "gspo")
    load0 = loadavg()
    threads, why = pick_threads(threads_arg, load0)
    log(f"quickstart from an empty model cache; load average {load0:.2f}; torch threads: {why}")
    with tempfile.TemporaryDirectory(prefix="gspo-bench-qsfull-") as tmp:
        env = {**thread_env(threads), "GSPO_CACHE_DIR": str(Path(tmp) / "cache")}
        out = Path(tmp) / "results"
        t = time.perf_counter()
        # As `make run`: the two arms side by side (the sweep splits the cores between them).
        train = _timed_command(["/usr/bin/time", "-v", gspo, "sweep", str(QUICKSTART), "--jobs", "2",
                                "--set", f"output_dir={out}"], log,
                               label="quickstart sweep --jobs 2, full, cold cache", env=env)
        _timed_command([gspo, "compare", str(out / "quickstart")], log, label="compare", env=env)
        _timed_command([gspo, "plot", str(out / "quickstart")], log, label="plot", env=env)
        total = time.perf_counter() - t
        cold = json.loads(next((Path(tmp) / "cache" / "models").glob("*/cold_start.json")).read_text())
    load1 = loadavg()
    return {"when": time.strftime("%Y-%m-%d %H:%M:%S %z"), "train": train, "total_s": total,
            "cold_start_s": cold.get("seconds"), "load": {"start": load0, "end": load1}, "threads": why,
            "shared": max(load0, load1) > SHARED_LOAD}


def orchestrate(a) -> dict:
    a.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    loads = [loadavg()]

    def log(msg):
        print(msg, flush=True)
        loads.append(loadavg())

    threads, threads_why = pick_threads(a.threads, loads[0])
    common = {"prompts": a.prompts, "group": a.group, "max_new": a.max_new_tokens, "mini_batches": a.mini_batches,
              "seed": a.seed, "threads": threads}
    log(f"gspo bench: {a.prompts} prompts x {a.group} samples, max {a.max_new_tokens} new tokens, "
        f"{a.mini_batches} mini-batches, {a.warmup} warm-up + {a.steps} measured steps, {a.reps} repetitions; "
        f"load average {loads[0]:.2f} on {os.cpu_count()} cores; torch threads per process: {threads_why}")

    # The model (cold start on first use, cached afterwards) is built once, before any timing.
    t = time.perf_counter()
    raw = base_raw(prompts=a.prompts, group=a.group, max_new=a.max_new_tokens, mini_batches=a.mini_batches,
                   steps=1, preset="paper-gspo")
    spec, task = load_spec_and_task(raw)
    source = model_source(spec, task)
    log(f"model: {source} ({time.perf_counter() - t:.1f} s to resolve)")

    # 1. Ours vs TRL: one process each, stepped alternately.
    log("1/5 ours vs TRL (GSPO): two processes stepped alternately")
    side_cfg = {**common, "preset": "paper-gspo"}
    duel = ours_vs_trl(side_cfg, a.reps, a.warmup, a.steps, log)
    rec_o, rec_t = duel["records"]["ours"], duel["records"]["trl"]
    ours, trl = summarize_side(rec_o, duel["finals"]["ours"]), summarize_side(rec_t, duel["finals"]["trl"])

    # 2. Arm overheads, 3. scaling: our trainer, variants round-robin in one process each.
    log("2/5 arm overheads (routing replay, GSPO vs GRPO), round-robin in one process")
    rounds = a.warmup + a.steps * a.reps
    arm_variants = [{"label": p, "preset": p, "group": a.group, "max_new": a.max_new_tokens}
                    for p in ("paper-grpo", "paper-grpo-rr", "paper-gspo")]
    arms = run_worker("variants", {**common, "variants": arm_variants, "warmup": a.warmup, "rounds": rounds}, log)
    log("3/5 scaling with group size and response length, round-robin in one process")
    g_sizes = sorted({max(2, a.group // 2), a.group, a.group * 2})
    t_sizes = sorted({max(4, a.max_new_tokens // 3), 2 * a.max_new_tokens // 3, 4 * a.max_new_tokens // 3})
    scale_variants = [{"label": f"G={g}", "preset": "paper-gspo", "group": g, "max_new": a.max_new_tokens}
                      for g in g_sizes]
    scale_variants += [{"label": f"T={t}", "preset": "paper-gspo", "group": a.group, "max_new": t, "ignore_eos": True}
                       for t in t_sizes]
    scale_rounds = a.warmup + max(2, a.steps * a.reps // 2)
    scaling = run_worker("variants", {**common, "variants": scale_variants, "warmup": a.warmup,
                                      "rounds": scale_rounds}, log)

    # 4. Quickstart memory (the full quickstart is timed separately: --quickstart-full).
    log("4/5 quickstart peak memory")
    qs_mem = quickstart_memory(a.quickstart_steps, log, threads) if a.quickstart_steps else None
    qs_file = a.out / "quickstart.json"
    qs_full = json.loads(qs_file.read_text()) if qs_file.is_file() else None

    # 5. Profiles of our step.
    log("5/5 profiles (cProfile, CPU time) of our step")
    profiles = [run_worker("profile", {**common, "preset": p, "warmup": a.warmup, "steps": a.profile_steps,
                                       "out_dir": str(a.out)}, log)
                for p in ("paper-gspo", "paper-grpo-rr")] if a.profile_steps else []

    ar, base = arms["records"], f"G={a.group}"
    loads.append(loadavg())
    loads += [r["load"] for r in rec_o + rec_t]
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "versions": _versions()},
        "config": {**common, "warmup": a.warmup, "steps": a.steps, "reps": a.reps, "model_source": source,
                   "threads_why": threads_why},
        "load": {"start": loads[0], "max": max(loads), "median": median(loads), "shared": max(loads) > SHARED_LOAD},
        "ours": ours, "trl": trl,
        "ratio": {
            "step_paired": paired(rec_o, rec_t),  # the target's number: robust to load drifts
            "step_of_medians": ours["step_s"] / trl["step_s"],
            "cpu_paired": paired(rec_o, rec_t, "cpu_s"),
            **{k: paired(rec_o, rec_t, k) for k in ("rollout_s", "old_logp_s", "update_s", "gen_tok_per_s",
                                                    "gen_ms_per_token_step")},
        },
        "arms": {lab: _summ(recs) for lab, recs in ar.items()},
        "rr_overhead": paired(ar["paper-grpo-rr"], ar["paper-grpo"], id_keys=("round",)) - 1,
        "rr_overhead_cpu": paired(ar["paper-grpo-rr"], ar["paper-grpo"], "cpu_s", ("round",)) - 1,
        "rr_overhead_update": paired(ar["paper-grpo-rr"], ar["paper-grpo"], "update_s", ("round",)) - 1,
        "gspo_vs_grpo": paired(ar["paper-gspo"], ar["paper-grpo"], id_keys=("round",)) - 1,
        "gspo_vs_grpo_cpu": paired(ar["paper-gspo"], ar["paper-grpo"], "cpu_s", ("round",)) - 1,
        "gspo_vs_grpo_update": paired(ar["paper-gspo"], ar["paper-grpo"], "update_s", ("round",)) - 1,
        "scaling": {v["label"]: {**_summ(scaling["records"][v["label"]]), "group": v["group"],
                                 "max_new": v["max_new"], "ignore_eos": bool(v.get("ignore_eos")),
                                 "vs_base": paired(scaling["records"][v["label"]], scaling["records"][base],
                                                   id_keys=("round",)),
                                 "vs_base_cpu": paired(scaling["records"][v["label"]], scaling["records"][base],
                                                       "cpu_s", ("round",))}
                    for v in scale_variants},
        "quickstart_memory": qs_mem, "quickstart_full": qs_full,
        "profiles": profiles,
        "raw": {"ours_vs_trl": duel, "arms": arms, "scaling": scaling},
        "bench_wall_s": time.time() - started,
    }
    return result


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "trl", "accelerate", "gspo-cli"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


# ---------------------------------------------------------------------------------------
# Report


def fmt_s(x):
    return "—" if x is None else f"{x:.3f} s"


def pct(x):
    return "—" if x is None else f"{x:+.1%}"


def render(r: dict) -> str:
    c, o, t, q = r["config"], r["ours"], r["trl"], r["ratio"]
    load = r["load"]
    v = r["host"]["versions"]
    lines = [
        "# gspo-cli vs TRL: one RL step on the built-in tiny MoE",
        "",
        (f"{r['when']}; {r['host']['cores']} cores; torch threads per process: {c['threads_why']}; "
         f"torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}. "
         f"Load average {load['start']:.2f} at start, {load['max']:.2f} at most."),
        "",
    ]
    if load["shared"]:
        lines += [(f"**The box was shared** (load average up to {load['max']:.2f} > {SHARED_LOAD} on "
                   f"{r['host']['cores']} cores): absolute times are inflated and noisy. The two sides were "
                   "stepped alternately, so read the paired ratios (median over rounds of ours/TRL measured "
                   "back to back) and the CPU times."), ""]
    lines += [
        (f"Work per RL step: {c['prompts']} prompts x {c['group']} samples, at most {c['max_new']} new tokens, "
         f"{c['mini_batches']} optimizer steps (mini-batches), GSPO loss (sequence ratio, clip 3e-4/4e-4, "
         f"seq-mean-token-mean), fp32, grouped_mm experts on both sides. Medians of {o['n_steps']} measured steps per side: "
         f"{c['reps']} pairs of fresh processes (seeds {c['seed']}..{c['seed'] + c['reps'] - 1}) x {c['steps']} "
         f"steps, after {c['warmup']} warm-up step(s) each, the two processes stepped alternately."),
        "",
        "| | gspo-cli | TRL GRPOTrainer | ours / TRL (paired) |",
        "|---|---:|---:|---:|",
        f"| **wall time per RL step** | {fmt_s(o['step_s'])} | {fmt_s(t['step_s'])} | **{q['step_paired']:.2f}x** |",
        f"| CPU time per RL step (all threads) | {fmt_s(o['cpu_s'])} | {fmt_s(t['cpu_s'])} | {q['cpu_paired']:.2f}x |",
    ]
    for key, name in (("rollout_s", "generation"), ("score_s", "scoring"),
                      ("old_logp_s", "old log-probs (+ advantages; TRL: + batch stats)"),
                      ("update_s", "updates (all mini-batches)")):
        ratio = q.get(key)
        lines.append(f"| {name} | {fmt_s(o[key])} ({o[key] / o['step_s']:.0%}) | "
                     f"{fmt_s(t[key])} ({t[key] / t['step_s']:.0%}) | {'' if ratio is None else f'{ratio:.2f}x'} |")
    lines += [
        (f"| generation tokens/s | {o['gen_tok_per_s']:.0f} | {t['gen_tok_per_s']:.0f} | "
         f"{q['gen_tok_per_s']:.2f}x |"),
        (f"| generation time per sampling step (÷ longest response) | {o['gen_ms_per_token_step']:.1f} ms | "
         f"{t['gen_ms_per_token_step']:.1f} ms | {q['gen_ms_per_token_step']:.2f}x |"),
        (f"| response length, mean / longest (tokens, incl. EOS) | {o['length_mean']:.1f} / {o['length_max']:.0f} | "
         f"{t['length_mean']:.1f} / {t['length_max']:.0f} | |"),
        (f"| peak RSS of the process | {o['peak_rss_mb']:.0f} MB | {t['peak_rss_mb']:.0f} MB | "
         f"{o['peak_rss_mb'] / t['peak_rss_mb']:.2f}x |"),
        (f"| median step per repetition | {', '.join(f'{x:.3f}' for x in o['per_rep_step_s'])} | "
         f"{', '.join(f'{x:.3f}' for x in t['per_rep_step_s'])} | ratio of medians {q['step_of_medians']:.2f}x |"),
        "",
        ("Phase shares are of the step's wall time. TRL's phases come from timing its own methods "
         "(`_generate`, `_calculate_rewards`, `_generate_and_score_completions`) inside each round; its "
         "\"updates\" are the round minus those."),
        "",
        "## Our arms (one process, stepped round-robin)",
        "",
        "| arm | step | CPU | generation | old log-probs | updates | step vs paper-grpo (paired) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for lab, s in r["arms"].items():
        vs = {"paper-grpo": "—", "paper-grpo-rr": pct(r["rr_overhead"]), "paper-gspo": pct(r["gspo_vs_grpo"])}[lab]
        lines.append(f"| {lab} | {fmt_s(s['step_s'])} | {fmt_s(s['cpu_s'])} | {fmt_s(s['rollout_s'])} | "
                     f"{fmt_s(s['old_logp_s'])} | {fmt_s(s['update_s'])} | {vs} |")
    lines += [
        "",
        (f"Routing replay (paper-grpo-rr vs paper-grpo): {pct(r['rr_overhead'])} step wall time, "
         f"{pct(r['rr_overhead_cpu'])} step CPU time, {pct(r['rr_overhead_update'])} update time. "
         f"GSPO vs GRPO loss: {pct(r['gspo_vs_grpo'])} step wall time, {pct(r['gspo_vs_grpo_cpu'])} CPU time, "
         f"{pct(r['gspo_vs_grpo_update'])} update time. Medians of per-round ratios; paper-grpo already records "
         "the routes (to measure expert volatility), so the difference is the replay itself."),
        "",
        "## Scaling (paper-gspo, our trainer, one process, stepped round-robin)",
        "",
        ("| group size G | max new tokens T | rollouts | tokens per sequence | step | CPU | generation | updates "
         "| step / base (paired) | CPU / base (paired) |"),
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in r["scaling"].values():
        per_seq = f"exactly {s['max_new']} (EOS ignored)" if s["ignore_eos"] else f"{s['length_mean']:.1f} (to EOS)"
        lines.append(f"| {s['group']} | {s['max_new']} | {c['prompts'] * s['group']} | {per_seq} | "
                     f"{fmt_s(s['step_s'])} | {fmt_s(s['cpu_s'])} | {fmt_s(s['rollout_s'])} | "
                     f"{fmt_s(s['update_s'])} | {s['vs_base']:.2f}x | {s['vs_base_cpu']:.2f}x |")
    lines += ["", ("Base: G = {g}, T = {t}. The cold-started model ends its answers with EOS after ~20 tokens, so "
                   "the response-length rows sample a fixed number of tokens (EOS ignored while sampling; rewards "
                   "and the loss still stop at the first EOS, but every forward and backward runs over the full "
                   "width).").format(g=c["group"], t=c["max_new"]), ""]
    qs = r.get("quickstart_memory")
    qf = r.get("quickstart_full")
    if qs or qf:
        lines += ["## Quickstart", "", "| measurement | wall time | max RSS |", "|---|---:|---:|"]
        if qs:
            omp = f", OMP_NUM_THREADS={qs['threads']}" if qs.get("threads") else ""
            lines.append(f"| `gspo train experiments/quickstart.yaml --set train.steps={qs['steps']}` (cached "
                         f"cold start, load {qs['load_start']:.1f}→{qs['loadavg_after']:.1f}{omp}) | "
                         f"{qs['wall_s']:.0f} s | {qs['max_rss_mb']:.0f} MB |")
        if qf:
            lines.append(f"| `make run` equivalent (sweep --jobs 2 + compare + plot) from an empty model cache, cold start "
                         f"{qf['cold_start_s']:.0f} s included ({qf['when']}, load {qf['load']['start']:.1f}"
                         f"→{qf['load']['end']:.1f}{', box shared' if qf['shared'] else ''}; torch threads: "
                         f"{qf.get('threads', 'default').split(' (')[0]}) | "
                         f"{qf['total_s']:.0f} s ({qf['total_s'] / 60:.1f} min) | {qf['train']['max_rss_mb']:.0f} MB (largest process) |")
        lines.append("")
    if r.get("profiles"):
        lines += ["## Where our step's CPU time goes (cProfile; nested rows are part of the row above)", ""]
        for p in r["profiles"]:
            lines += [f"{p['preset']} ({p['total_s']:.2f} s CPU profiled; details in `{Path(p['file']).name}`):", ""]
            lines += [f"{'  - ' if b['label'].startswith(' ') else '- '}{b['share']:.1%} {b['label'].strip()} "
                      f"(`{b['where']}`)" for b in p["buckets"]]
            lines.append("")
    lines += ["## Targets", ""]
    lines += [(f"- ours ≤ 0.5x TRL per RL step: {q['step_paired']:.2f}x wall (paired), {q['cpu_paired']:.2f}x CPU — "
               f"{'met' if q['step_paired'] <= 0.5 else 'missed'}"),
              (f"- routing replay ≤ +10% step time: {pct(r['rr_overhead'])} wall, {pct(r['rr_overhead_cpu'])} CPU — "
               f"{'met' if r['rr_overhead'] <= 0.10 else 'missed'}")]
    if qs:
        lines.append(f"- quickstart peak memory ≤ 4 GB: {qs['max_rss_mb']:.0f} MB max RSS "
                     f"(train.steps={qs['steps']}) — {'met' if qs['max_rss_mb'] <= 4096 else 'missed'}")
    if qf:
        lines.append(f"- quickstart ≤ 5 min with cold start: {qf['total_s'] / 60:.1f} min — "
                     f"{'met' if qf['total_s'] <= 300 else 'missed'}"
                     + (" (box shared)" if qf["shared"] else ""))
    lines += ["", (f"Benchmark wall time: {r['bench_wall_s']:.0f} s. Reproduce: `make bench` "
                   "(options: `.venv/bin/python benchmarks/bench.py --help`).")]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mini-batches", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps per process, not measured")
    p.add_argument("--steps", type=int, default=4, help="measured steps per process")
    p.add_argument("--reps", type=int, default=3, help="alternating repetitions of ours / TRL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", default="auto",
                   help="torch threads per process: a number, 'default' (torch's choice: one per core), or 'auto' "
                        "(default): 1 when the box is busy at start (load average > cores/2), else torch's choice")
    p.add_argument("--quickstart-steps", type=int, default=20,
                   help="steps of the quickstart run whose peak RSS is measured (0: skip)")
    p.add_argument("--quickstart-full", action="store_true",
                   help="only time the whole quickstart (train + compare + plot) from an empty model cache and write "
                        "quickstart.json, which later bench reports include")
    p.add_argument("--profile-steps", type=int, default=3, help="steps under cProfile per profiled arm (0: skip)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 repetition, small sizes, no quickstart; writes to $TMPDIR/gspo-bench-quick")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for bench.md / bench.json")
    p.add_argument("--worker", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        kind, cfg = a.worker
        WORKERS[kind](json.loads(cfg))
        return
    if a.quickstart_full:
        a.out.mkdir(parents=True, exist_ok=True)
        res = quickstart_full(lambda m: print(m, flush=True), a.threads)
        (a.out / "quickstart.json").write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res, indent=1))
        return
    if a.quick:
        a.prompts, a.group, a.max_new_tokens, a.steps, a.reps = 4, 4, 16, 1, 1
        a.quickstart_steps, a.profile_steps = 0, 1
        if a.out == RESULTS:  # a smoke run never replaces the real results
            a.out = Path(tempfile.gettempdir()) / "gspo-bench-quick"
    result = orchestrate(a)
    text = render(result)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bench.md").write_text(text)
    (a.out / "bench.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print()
    print(text)
    print(f"wrote {a.out / 'bench.md'} and {a.out / 'bench.json'}")


if __name__ == "__main__":
    main()
