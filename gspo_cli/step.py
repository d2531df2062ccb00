"""One RL step, the recipe: rollout -> reward -> advantages -> old log-probs (+ routes)
-> for each epoch, for each mini-batch: loss, backward, clip, optimizer step -> metrics.

Every mini-batch after the first of a step is off-policy: that is where GRPO's token
ratios and GSPO's sequence ratios start to differ. The loss, aggregation, advantage
estimator and routing replay are resolved once (`setup`) from the arm; nothing below
branches on an algorithm's name.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch

from gspo_cli import distributed
from gspo_cli.algorithms import (
    aggregate,
    get_advantage_estimator,
    get_policy_loss,
    kl_k3_BC,
    zero_variance_group_frac,
)
from gspo_cli.config import ArmConfig, ExperimentSpec
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import DivergedError, SpecError
from gspo_cli.metrics import LOSS_STAT_KEYS
from gspo_cli.models import load_model
from gspo_cli.models.routing import (
    RoutingController,
    UnsupportedRoutingError,
    expert_change_frac,
    routes_from_BT,
    routes_to_BT,
)
from gspo_cli.rollout.base import LogProbs
from gspo_cli.rollout import (
    RolloutBatch,
    RolloutEngine,
    logprob_mismatch,
    make_engine,
    response_logprobs,
)
from gspo_cli.tasks import Task


@dataclass
class Ctx:
    """What a training step needs, resolved once from the spec."""

    spec: ExperimentSpec
    arm: ArmConfig
    task: Task
    model: torch.nn.Module
    engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    loss_fn: Callable
    adv_fn: Callable
    routing: RoutingController | None
    ref_model: torch.nn.Module | None
    rng: random.Random  # problem sampling
    shuffle: torch.Generator  # mini-batch split
    dist: DistInfo = DistInfo()
    train_model: torch.nn.Module | None = None  # `model`, wrapped in DDP under torchrun
    train_time: float = 0.0  # seconds spent in training steps so far (survives resume)
    skipped: int = 0  # non-finite mini-batches skipped so far (survives resume)


def setup(spec: ExperimentSpec, arm: ArmConfig, seed: int, task: Task, source: str,
           weights: str | None = None, dist_info: DistInfo = DistInfo()) -> Ctx:
    """Resolve everything a step needs. `weights` (a checkpoint) replaces the initial
    weights when resuming; the KL reference is always the initial model `source`.
    Under torchrun each rank samples with its own seed; rank 0's is the single-process one."""
    torch.manual_seed(distributed.rank_seed(seed, dist_info.rank))
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
    engine = make_engine(spec.rollout, model, lm.tokenizer, model_dir=lm.source, dtype=spec.model.dtype, seed=seed,
                         routing=routing)
    shuffle = torch.Generator().manual_seed(seed)
    return Ctx(spec=spec, arm=arm, task=task, model=model, engine=engine, optimizer=optimizer,
               scheduler=scheduler, loss_fn=get_policy_loss(arm.loss), adv_fn=get_advantage_estimator(arm.advantage),
               routing=routing, ref_model=ref_model, rng=random.Random(seed), shuffle=shuffle,
               dist=dist_info, train_model=distributed.wrap(model, dist_info))


def train_step(ctx: Ctx, step: int) -> dict:
    spec, arm = ctx.spec, ctx.arm
    G = spec.rollout.group_size
    temp = spec.rollout.temperature
    t0 = time.time()

    # 1. Rollout: G samples per prompt from the current policy (= pi_old for this step).
    # Every rank draws the same global prompt list and keeps its share (whole groups).
    problems = distributed.shard(ctx.task.train_problems(ctx.rng, spec.rollout.prompts_per_step), ctx.dist)
    batch = ctx.engine.generate([p.prompt for p in problems for _ in range(G)])
    t1 = time.time()

    # 2. Reward and group advantages.
    scores = ctx.task.score_batch([problems[i // G] for i in range(len(batch.completions))], batch.completions)
    rewards_B = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    adv_B = ctx.adv_fn(rewards_B, G, eps=arm.adv_eps)
    t2 = time.time()

    # 3. Old log-probs, entropy and (MoE) the routes pi_old took, in one no-grad pass.
    mask_BC = batch.response_mask
    B, T = batch.input_ids.shape
    # With the hf engine these came from generate's own forwards already (sampler_logprobs).
    from_sampler = batch.engine_entropy is not None and (ctx.routing is None or batch.engine_routes is not None)
    route_mask_BT = _route_token_mask(batch, skip_last=from_sampler)
    with torch.no_grad():
        if from_sampler:
            old = LogProbs(logp=batch.engine_logp, entropy=batch.engine_entropy)
            old_routes = batch.engine_routes  # (L, B, T, k)
        elif ctx.routing is not None:
            with ctx.routing.recording() as rec:
                old = response_logprobs(ctx.model, batch, temp, with_entropy=True)
            old_routes = routes_to_BT(rec.routes, B, T)  # (L, B, T, k)
        else:
            old = response_logprobs(ctx.model, batch, temp, with_entropy=True)
            old_routes = None
        ref_logp = response_logprobs(ctx.ref_model, batch, temp).logp if ctx.ref_model is not None else None
    t3 = time.time()

    # pi_old: the trainer's log-probs, or the sampler's own (use_engine_logprobs, paper 5.4).
    old_logp = old.logp
    engine_stats = {}
    if batch.engine_logp is not None and not from_sampler:
        engine_stats = logprob_mismatch(batch.engine_logp, old.logp, mask_BC)
        if spec.rollout.use_engine_logprobs:
            old_logp = batch.engine_logp
    if not bool(torch.isfinite(old_logp[mask_BC > 0]).all()):
        raise DivergedError(f"step {step}: non-finite log-probs under the current policy")

    # 4. Updates: every epoch, every mini-batch; all but the very first are off-policy.
    acc = _StatAccumulator()
    n_updates = 0
    for _ in range(arm.epochs):
        order = torch.randperm(B, generator=ctx.shuffle)
        for rows in order.chunk(arm.mini_batches):
            loss, stats, grad_norm = _update(ctx, batch, rows, old_logp, ref_logp, adv_B, old_routes,
                                             measure_routes=n_updates > 0, step=step, route_mask_BT=route_mask_BT)
            if loss is None:
                acc.skipped += 1
                continue
            n_updates += 1
            acc.add(loss, stats, grad_norm, int(mask_BC[rows].sum()))
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
        **engine_stats,
        "time/rollout_s": t1 - t0, "time/score_s": t2 - t1, "time/old_logp_s": t3 - t2, "time/update_s": t4 - t3,
        "time/step_s": t4 - t0,
        "perf/tokens_per_s": lengths.sum().item() / max(t4 - t0, 1e-9),
    }
    metrics = distributed.reduce_metrics(metrics, ctx.dist)
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in metrics.items()}


def _update(ctx: Ctx, batch: RolloutBatch, rows, old_logp_BC, ref_logp_BC, adv_B, old_routes, *,
            measure_routes: bool, step: int, route_mask_BT: torch.Tensor):
    """One mini-batch: policy loss (+ optional KL and router aux loss), backward, clip, step.
    Returns (loss, stats, grad_norm), or (None, None, None) for a skipped non-finite batch."""
    arm, spec = ctx.arm, ctx.spec
    sub = batch.rows(rows)
    m_bc = batch.response_mask[rows]
    new, routes_now = _policy_forward(ctx, sub, old_routes, rows, spec.rollout.temperature)
    loss, stats = ctx.loss_fn(new.logp, old_logp_BC[rows], adv_B[rows], m_bc,
                              clip_low=arm.clip_low, clip_high=arm.clip_high, aggregation=arm.aggregation)
    if ref_logp_BC is not None:
        kl_ref = aggregate(kl_k3_BC(new.logp, ref_logp_BC[rows]), m_bc, arm.aggregation)
        loss = loss + arm.kl_coef * kl_ref
        stats["kl_ref_k3"] = kl_ref.detach()
    if new.aux_loss is not None and spec.model.router_aux_loss_coef > 0:
        loss = loss + spec.model.router_aux_loss_coef * new.aux_loss
        stats["aux_loss"] = new.aux_loss.detach()
    ctx.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), spec.optimizer.grad_clip)
    if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
        what = "loss" if not torch.isfinite(loss) else "gradient norm"
        div = spec.train.divergence
        if not div.skip_bad_batches or ctx.skipped >= div.max_skipped:
            raise DivergedError(f"step {step}: non-finite {what}"
                                + (f" (after {ctx.skipped} skipped mini-batches)" if ctx.skipped else ""))
        ctx.optimizer.zero_grad(set_to_none=True)  # an isolated bad batch: drop it, keep going
        ctx.skipped += 1
        return None, None, None
    ctx.optimizer.step()
    ctx.scheduler.step()
    if routes_now is not None and measure_routes:
        stats["expert_change"] = torch.tensor(expert_change_frac(
            routes_from_BT(old_routes[:, rows]), routes_now, route_mask_BT[rows].reshape(-1)))
    return loss.detach(), stats, grad_norm


def _policy_forward(ctx: Ctx, sub: RolloutBatch, old_routes, rows, temp):
    """Current-policy log-probs for a mini-batch; with routing replay, forced onto pi_old's
    experts. Also returns the experts the current router itself would pick (for volatility)."""
    model = ctx.train_model or ctx.model  # DDP under torchrun: its backward all-reduces gradients
    if ctx.routing is None:
        return response_logprobs(model, sub, temp), None
    if ctx.arm.routing_replay == "r2":
        with ctx.routing.replaying(routes_from_BT(old_routes[:, rows])) as rec:
            out = response_logprobs(model, sub, temp)
        return out, rec.routes
    with ctx.routing.recording() as rec:
        out = response_logprobs(model, sub, temp)
    return out, rec.routes


def _route_token_mask(batch: RolloutBatch, skip_last: bool = False) -> torch.Tensor:
    """(B, T) mask of response-token positions, where expert volatility is measured.
    `skip_last`: leave out column T-1, which routes recorded during generate lack."""
    m = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    m[:, batch.prompt_len:] = batch.response_mask > 0
    if skip_last:
        m[:, -1] = False
    return m


class _StatAccumulator:
    """Combines per-mini-batch loss statistics into one value per step: token-weighted
    means (min/max for the ratio extremes), reduced once at the end."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.ratio_min = math.inf
        self.ratio_max = -math.inf
        self.skipped = 0  # non-finite mini-batches dropped this step

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
        if self.sums:  # every mini-batch may have been skipped
            out["policy/ratio_min"] = self.ratio_min
            out["policy/ratio_max"] = self.ratio_max
        if self.skipped:
            out["policy/skipped_minibatches"] = self.skipped
        return out
