"""The RL loop, top to bottom.

One step = one rollout batch:
    sample G responses per prompt -> score -> group advantages -> old log-probs (+ routes)
    -> for each epoch, for each mini-batch: policy loss, backward, clip, optimizer step
    -> metrics (-> eval / checkpoint).
Every mini-batch after the first of a step is off-policy: that is where GRPO's token
ratios and GSPO's sequence ratios start to differ. The loss, aggregation, advantage
estimator and routing replay are resolved once from the arm; nothing below branches on
an algorithm's name.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import shutil
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from gspo_cli.algorithms import aggregate, get_advantage_estimator, get_policy_loss, zero_variance_group_frac
from gspo_cli.checkpoint import load_trainer_state, save_checkpoint, valid_checkpoints
from gspo_cli.config import ArmConfig, ExperimentSpec, dump_spec
from gspo_cli.errors import DivergedError, GspoError, InterruptedRun, RunError, SpecError
from gspo_cli.evaluate import evaluate_policy
from gspo_cli.metrics import LOSS_STAT_KEYS
from gspo_cli.models import load_model, resolve_model_source
from gspo_cli.models.routing import RoutingController, UnsupportedRoutingError, expert_change_frac, routes_from_BT, routes_to_BT
from gspo_cli.rollout import HFRolloutEngine, RolloutBatch, response_logprobs
from gspo_cli.runs import RunDir, git_commit, now_iso, run_path, truncate_jsonl, versions
from gspo_cli.tasks import Task, make_task


class Reporter(Protocol):
    """How the trainer talks to a user interface (the CLI renders it with Rich)."""

    def log(self, msg: str) -> None: ...
    def run_started(self, name: str, total_steps: int) -> None: ...
    def step_done(self, name: str, metrics: dict) -> None: ...
    def run_finished(self, name: str, status: str, summary: dict) -> None: ...


class PrintReporter:  # used when no reporter is given (library use)
    def log(self, msg: str) -> None:
        print(msg, flush=True)

    def run_started(self, name, total_steps):
        self.log(f"[{name}] start: {total_steps} steps")

    def step_done(self, name, m):
        self.log(f"[{name}] step {m['step']}: reward {m['reward/mean']:.3f} "
                 f"clip {m['policy/clip_frac_token']:.2e} ({m['time/step_s']:.1f}s)")

    def run_finished(self, name, status, summary):
        self.log(f"[{name}] {status}: {summary}")


@dataclass
class RunResult:
    arm: str
    seed: int
    path: str
    status: str
    summary: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Experiment: every arm x seed


def train_experiment(spec: ExperimentSpec, *, arms: list[str] | None = None, seeds: list[int] | None = None,
                     reporter: Reporter | None = None, force: bool = False) -> list[RunResult]:
    """Train the selected arms x seeds one after another.

    A run that fails or diverges is recorded and the next one starts; a bad spec or model
    (SpecError) or a stop signal (InterruptedRun) ends the whole call.
    """
    reporter = reporter or PrintReporter()
    selected = [spec.arm(a) for a in arms] if arms else list(spec.arms)
    seed_list = seeds if seeds else spec.seeds
    task = make_task(spec.task.name, spec.task.params)
    source = resolve_model_source(spec.model, task, log=reporter.log)  # cold start once, shared
    results = []
    with stop_on_signals() as stop:
        for arm in selected:
            for seed in seed_list:
                try:
                    results.append(train_run(spec, arm, seed, task, source, reporter=reporter, force=force,
                                             stop=stop))
                except (DivergedError, RunError) as err:
                    status = "diverged" if isinstance(err, DivergedError) else "failed"
                    reporter.log(f"[{arm.name}/seed{seed}] {status}: {err}")
                    path = run_path(spec.output_dir, spec.name, arm.name, seed)
                    results.append(RunResult(arm.name, seed, str(path), status, {"error": str(err)}))
    return results


@contextlib.contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM set a flag the loop checks between steps (checkpoint, then stop);
    a second SIGINT interrupts at once. Only the main thread can own signal handlers."""
    stop = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_spec(spec: ExperimentSpec, arm: ArmConfig, seed: int) -> ExperimentSpec:
    """The spec of exactly one run: this arm, this seed (itself runnable)."""
    return spec.model_copy(update={"arms": [arm], "seeds": [seed], "sweep": None})


# ---------------------------------------------------------------------------------------
# One run


@dataclass
class Ctx:
    """What a training step needs, resolved once from the spec."""

    spec: ExperimentSpec
    arm: ArmConfig
    task: Task
    model: torch.nn.Module
    engine: HFRolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    loss_fn: Callable
    adv_fn: Callable
    routing: RoutingController | None
    ref_model: torch.nn.Module | None
    rng: random.Random  # problem sampling
    shuffle: torch.Generator  # mini-batch split
    train_time: float = 0.0  # seconds spent in training steps so far (survives resume)


def train_run(spec: ExperimentSpec, arm: ArmConfig, seed: int, task: Task, source: str, *,
              reporter: Reporter, force: bool = False, stop: "StopFlag | None" = None) -> RunResult:
    """Train one arm x seed into its run directory.

    A completed run is skipped (unless `force`); a run with a checkpoint is resumed from it
    with its optimizer and RNG state, metrics rewound to that step; anything else starts
    afresh. The model is loaded before any file is touched, so a bad model name costs nothing.
    """
    name = f"{arm.name}/seed{seed}"
    rd = RunDir(run_path(spec.output_dir, spec.name, arm.name, seed))
    own_spec = run_spec(spec, arm, seed)
    if rd.status() == "completed" and not force:
        reporter.log(f"[{name}] already completed in {rd.path}; skipping (use --force to rerun)")
        return RunResult(arm.name, seed, str(rd.path), "completed", rd.info().get("summary", {}))
    ckpt = None if force else _resumable_checkpoint(rd, own_spec)
    ctx = _setup(spec, arm, seed, task, source, weights=str(ckpt) if ckpt else None)
    t_start = time.time()
    if ckpt is not None:
        start_step = _restore(ctx, rd, ckpt)
        reporter.log(f"[{name}] resuming from {ckpt.name}")
        rd.update_info(status="running", resumed_at=now_iso(), resumed_from=ckpt.name, step=start_step,
                       resumes=rd.info().get("resumes", 0) + 1, ended_at=None)
    else:
        start_step = 0
        rd.reset()
        rd.path.mkdir(parents=True)
        rd.spec_file.write_text(dump_spec(own_spec))
        rd.update_info(status="running", experiment=spec.name, arm=arm.name, seed=seed, step=0,
                       total_steps=spec.train.steps, started_at=now_iso(), host=socket.gethostname(),
                       git_commit=git_commit(), versions=versions(), model_source=source)
    prior_wall = rd.info().get("wall_s", 0.0) if ckpt is not None else 0.0

    def finish(status: str, **fields) -> None:
        rd.update_info(status=status, ended_at=now_iso(), wall_s=round(prior_wall + time.time() - t_start, 2),
                       **fields)

    try:
        summary = _loop(ctx, rd, name, reporter, start_step, stop if stop is not None else StopFlag())
    except InterruptedRun:
        finish("interrupted")
        raise
    except KeyboardInterrupt:  # a second Ctrl-C: no checkpoint this time
        finish("interrupted")
        raise
    except DivergedError as err:
        finish("diverged", error=str(err))
        raise
    except GspoError as err:
        finish("failed", error=str(err))
        raise
    except Exception as err:  # a bug: keep the traceback in run.json, then let it surface
        finish("failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
        raise
    finish("completed", summary=summary)
    reporter.run_finished(name, "completed", summary)
    return RunResult(arm.name, seed, str(rd.path), "completed", summary)


def _resumable_checkpoint(rd: RunDir, own_spec: ExperimentSpec):
    """The latest complete checkpoint of an unfinished run with the same spec, else None."""
    if not rd.exists():
        return None
    ckpts = valid_checkpoints(rd)
    if not ckpts:
        return None
    if rd.spec_file.is_file() and rd.spec_file.read_text() != dump_spec(own_spec):
        raise SpecError(f"{rd.path}: holds an unfinished run of a different spec; "
                        "use --force to start it again or choose another --output-dir")
    return ckpts[-1]


def _restore(ctx: "Ctx", rd: RunDir, ckpt) -> int:
    state = load_trainer_state(ckpt, ctx.optimizer, ctx.scheduler, rng=ctx.rng, shuffle=ctx.shuffle)
    step = int(state["step"])
    ctx.train_time = float(state.get("train_time", 0.0))
    truncate_jsonl(rd.metrics_file, step)
    truncate_jsonl(rd.eval_file, step)
    for later in rd.checkpoint_dirs():  # checkpoints past the one we resume from are orphans
        if later.name > ckpt.name:
            shutil.rmtree(later, ignore_errors=True)
    return step


class StopFlag:
    """Set by a signal handler; the loop checks it between steps and stops cleanly."""

    def __init__(self):
        self.signal_name: str | None = None

    def set(self, signal_name: str) -> None:
        self.signal_name = signal_name

    def __bool__(self) -> bool:
        return self.signal_name is not None


def _setup(spec: ExperimentSpec, arm: ArmConfig, seed: int, task: Task, source: str,
           weights: str | None = None) -> Ctx:
    """Resolve everything a step needs. `weights` (a checkpoint) replaces the initial
    weights when resuming; the KL reference is always the initial model `source`."""
    torch.manual_seed(seed)
    lm = load_model(weights or source, spec.model)
    model = lm.model
    model.train()
    routing = None
    if lm.is_moe:
        try:
            routing = RoutingController(model)
        except UnsupportedRoutingError as err:
            if arm.routing_replay != "off":
                raise SpecError(f"arms.{arm.name}.routing_replay: {err}") from None
    elif arm.routing_replay != "off":
        raise SpecError(f"arms.{arm.name}.routing_replay: {arm.routing_replay} needs an MoE model; "
                        f"{spec.model.name} is dense")
    opt_cfg = spec.optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=opt_cfg.lr, betas=(opt_cfg.beta1, opt_cfg.beta2),
                                  weight_decay=opt_cfg.weight_decay)
    warm = opt_cfg.warmup_steps * arm.mini_batches * arm.epochs  # warmup counted in rollout steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0)
    ref_model = None
    if arm.kl_coef > 0:
        ref = load_model(source, spec.model).model if weights else copy.deepcopy(model)
        ref_model = ref.eval().requires_grad_(False)
    r = spec.rollout
    engine = HFRolloutEngine(model, lm.tokenizer, max_new_tokens=r.max_new_tokens, temperature=r.temperature)
    shuffle = torch.Generator().manual_seed(seed)
    return Ctx(spec=spec, arm=arm, task=task, model=model, engine=engine, optimizer=optimizer,
               scheduler=scheduler, loss_fn=get_policy_loss(arm.loss), adv_fn=get_advantage_estimator(arm.advantage),
               routing=routing, ref_model=ref_model, rng=random.Random(seed), shuffle=shuffle)


def _loop(ctx: Ctx, rd: RunDir, name: str, reporter: Reporter, start_step: int, stop: StopFlag) -> dict:
    spec = ctx.spec
    steps = spec.train.steps
    eval_problems = ctx.task.eval_problems(spec.task.eval_size)
    reporter.run_started(name, steps)
    if start_step == 0:
        _evaluate(ctx, rd, eval_problems, step=0)
    for step in range(start_step + 1, steps + 1):
        metrics = train_step(ctx, step)
        ctx.train_time += metrics["time/step_s"]
        metrics["time/elapsed_s"] = round(ctx.train_time, 3)
        _check_finite(metrics, step)
        rd.log_metrics(metrics)
        rd.update_info(step=step)
        reporter.step_done(name, metrics)
        is_last = step == steps
        if is_last or (spec.train.eval_every and step % spec.train.eval_every == 0):
            _evaluate(ctx, rd, eval_problems, step=step)
        if is_last or stop or (spec.train.checkpoint_every and step % spec.train.checkpoint_every == 0):
            save_checkpoint(rd, step, ctx.model, ctx.engine.tokenizer, ctx.optimizer, ctx.scheduler,
                            rng=ctx.rng, shuffle=ctx.shuffle, keep=spec.train.keep_checkpoints,
                            extra={"train_time": ctx.train_time})
        if stop and not is_last:
            raise InterruptedRun(f"{name}: stopped by {stop.signal_name} after step {step}; "
                                 f"checkpoint written, rerun the same command to resume")
    return _summary(rd, steps)


def _summary(rd: RunDir, steps: int) -> dict:
    metrics, evals = rd.metrics(), rd.evals()
    first = [m["reward/mean"] for m in metrics[: max(1, steps // 10)]]
    last = [m["reward/mean"] for m in metrics[-max(1, steps // 10):]]
    return {
        "steps": steps,
        "reward_first": round(sum(first) / max(len(first), 1), 4),
        "reward_last": round(sum(last) / max(len(last), 1), 4),
        "eval_first": evals[0]["scores"] if evals else None,
        "eval_last": evals[-1]["scores"] if evals else None,
        "train_s": round(metrics[-1]["time/elapsed_s"], 1) if metrics else 0.0,
    }


def _check_finite(metrics: dict, step: int) -> None:
    for key in ("policy/loss", "policy/grad_norm"):
        v = metrics.get(key)
        if v is not None and not math.isfinite(v):
            raise DivergedError(f"step {step}: {key} is {v}")


def _evaluate(ctx: Ctx, rd: RunDir, problems, step: int) -> None:
    if not problems:
        return
    t = time.time()
    scores = evaluate_policy(ctx.engine, ctx.task, problems, ctx.spec.train.eval_samples)
    rd.log_eval({"step": step, "task": ctx.task.name, "n": len(problems), "samples": ctx.spec.train.eval_samples,
                 "scores": scores, "time_s": round(time.time() - t, 3)})


# ---------------------------------------------------------------------------------------
# One step: the recipe


def train_step(ctx: Ctx, step: int) -> dict:
    spec, arm = ctx.spec, ctx.arm
    G = spec.rollout.group_size
    temp = spec.rollout.temperature
    t0 = time.time()

    # 1. Rollout: G samples per prompt from the current policy (= pi_old for this step).
    problems = ctx.task.train_problems(ctx.rng, spec.rollout.prompts_per_step)
    batch = ctx.engine.generate([p.prompt for p in problems for _ in range(G)])
    t1 = time.time()

    # 2. Reward and group advantages.
    scores = [ctx.task.score(problems[i // G], c) for i, c in enumerate(batch.completions)]
    rewards_B = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    adv_B = ctx.adv_fn(rewards_B, G, eps=arm.adv_eps)
    t2 = time.time()

    # 3. Old log-probs, entropy and (MoE) the routes pi_old took, in one no-grad pass.
    mask_BC = batch.response_mask
    B, T = batch.input_ids.shape
    with torch.no_grad():
        if ctx.routing is not None:
            with ctx.routing.recording() as rec:
                old = response_logprobs(ctx.model, batch, temp, with_entropy=True)
            old_routes = routes_to_BT(rec.routes, B, T)  # (L, B, T, k)
        else:
            old = response_logprobs(ctx.model, batch, temp, with_entropy=True)
            old_routes = None
        ref_logp = response_logprobs(ctx.ref_model, batch, temp).logp if ctx.ref_model is not None else None
    t3 = time.time()

    # 4. Updates: every epoch, every mini-batch; all but the very first are off-policy.
    acc = _StatAccumulator()
    n_updates = 0
    for _ in range(arm.epochs):
        order = torch.randperm(B, generator=ctx.shuffle)
        for rows in order.chunk(arm.mini_batches):
            sub = batch.rows(rows)
            new, routes_now = _policy_forward(ctx, sub, old_routes, rows, temp)
            m_bc = mask_BC[rows]
            loss, stats = ctx.loss_fn(new.logp, old.logp[rows], adv_B[rows], m_bc,
                                      clip_low=arm.clip_low, clip_high=arm.clip_high, aggregation=arm.aggregation)
            if ref_logp is not None:
                log_r = (ref_logp[rows] - new.logp).clamp(-20, 20)
                kl_ref = aggregate(torch.exp(log_r) - 1 - log_r, m_bc, arm.aggregation)
                loss = loss + arm.kl_coef * kl_ref
                stats["kl_ref_k3"] = kl_ref.detach()
            if new.aux_loss is not None and spec.model.router_aux_loss_coef > 0:
                loss = loss + spec.model.router_aux_loss_coef * new.aux_loss
                stats["aux_loss"] = new.aux_loss.detach()
            ctx.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), spec.optimizer.grad_clip)
            ctx.optimizer.step()
            ctx.scheduler.step()
            if routes_now is not None and n_updates > 0:
                tok_mask = _route_token_mask(batch, rows)
                stats["expert_change"] = torch.tensor(expert_change_frac(
                    routes_from_BT(old_routes[:, rows]), routes_now, tok_mask))
            n_updates += 1
            acc.add(loss.detach(), stats, grad_norm, int(m_bc.sum()))
    t4 = time.time()

    lengths = mask_BC.sum(-1)
    entropy = (old.entropy * mask_BC).sum() / mask_BC.sum().clamp(min=1)
    metrics = {
        "step": step,
        "reward/mean": rewards_B.mean().item(),
        "reward/std": rewards_B.std().item() if len(rewards_B) > 1 else 0.0,
        "reward/accuracy": sum(s.correct for s in scores) / len(scores),
        **{f"reward/{k}": sum(s.components.get(k, 0.0) for s in scores) / len(scores) for k in scores[0].components},
        "reward/zero_var_group_frac": zero_variance_group_frac(rewards_B, G),
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/truncated_frac": batch.truncated.float().mean().item(),
        "policy/entropy": entropy.item(),
        "policy/lr": ctx.optimizer.param_groups[0]["lr"],
        **acc.result(),
        "time/rollout_s": t1 - t0, "time/score_s": t2 - t1, "time/old_logp_s": t3 - t2, "time/update_s": t4 - t3,
        "time/step_s": t4 - t0,
        "perf/tokens_per_s": lengths.sum().item() / max(t4 - t0, 1e-9),
    }
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}


def _policy_forward(ctx: Ctx, sub: RolloutBatch, old_routes, rows, temp):
    """Current-policy log-probs for a mini-batch; with routing replay, forced onto pi_old's
    experts. Also returns the experts the current router itself would pick (for volatility)."""
    if ctx.routing is None:
        return response_logprobs(ctx.model, sub, temp), None
    if ctx.arm.routing_replay == "r2":
        with ctx.routing.replaying(routes_from_BT(old_routes[:, rows])) as rec:
            out = response_logprobs(ctx.model, sub, temp)
        return out, rec.routes
    with ctx.routing.recording() as rec:
        out = response_logprobs(ctx.model, sub, temp)
    return out, rec.routes


def _route_token_mask(batch: RolloutBatch, rows) -> torch.Tensor:
    """(b*T,) mask of response-token positions, matching the router's flattened order."""
    m = torch.zeros(len(rows), batch.input_ids.shape[1], dtype=torch.bool)
    m[:, batch.prompt_len:] = batch.response_mask[rows] > 0
    return m.reshape(-1)


class _StatAccumulator:
    """Combines per-mini-batch loss statistics into one value per step: token-weighted
    means (min/max for the ratio extremes), reduced once at the end."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.ratio_min = math.inf
        self.ratio_max = -math.inf

    def _add(self, key, value, w):
        self.sums[key] = self.sums.get(key, 0.0) + float(value) * w
        self.weights[key] = self.weights.get(key, 0.0) + w

    def add(self, loss, stats, grad_norm, n_tokens):
        self._add("policy/loss", loss, 1.0)
        self._add("policy/grad_norm", grad_norm, 1.0)
        for k, key in LOSS_STAT_KEYS.items():
            if k in stats:
                self._add(key, stats[k], n_tokens)
        for k, key in (("kl_ref_k3", "policy/kl_ref_k3"), ("aux_loss", "moe/aux_loss"),
                       ("expert_change", "moe/expert_change_frac")):
            if k in stats:
                self._add(key, stats[k], 1.0)
        self.ratio_min = min(self.ratio_min, float(stats["ratio_min"]))
        self.ratio_max = max(self.ratio_max, float(stats["ratio_max"]))

    def result(self) -> dict:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        out["policy/ratio_min"] = self.ratio_min
        out["policy/ratio_max"] = self.ratio_max
        return out
