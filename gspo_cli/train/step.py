"""One RL step, the recipe: rollout -> reward -> advantages -> old log-probs (+ routes)
-> for each epoch, for each mini-batch: loss, backward, clip, optimizer step -> metrics.

Every mini-batch after the first of a step is off-policy: that is where GRPO's token
ratios and GSPO's sequence ratios start to differ. The loss, aggregation, advantage
estimator and routing replay are resolved once (`setup`) from the arm; nothing below
branches on an algorithm's name.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import random
import time
from dataclasses import dataclass
from typing import Callable

import torch

from gspo_cli import distributed
from gspo_cli.algorithms import (
    aggregate,
    aggregation_count,
    correction_stats,
    get_advantage_estimator,
    get_mismatch_correction,
    get_policy_loss,
    kl_k3_BC,
)
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import DivergedError, SpecError
from gspo_cli.metrics import MISMATCH_STAT_KEYS
from gspo_cli.models import compute_context, load_model
from gspo_cli.models.routing import (
    RoutingController,
    UnsupportedRoutingError,
    expert_change_frac,
    routes_from_BT,
    routes_to_BT,
)
from gspo_cli.rollout import RolloutBatch, RolloutEngine, make_engine, response_logprobs
from gspo_cli.rollout.base import LogProbs, check_due
from gspo_cli.spec import ArmConfig, ExperimentSpec
from gspo_cli.tasks import Task
from gspo_cli.train.optim import make_optimizer
from gspo_cli.train.stats import StepStats, record_batch, record_gap, record_logratio_var, record_update


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
    # Forward passes run inside compute(): autocast to model.dtype over float32 master weights.
    compute: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def setup(
    spec: ExperimentSpec,
    arm: ArmConfig,
    seed: int,
    task: Task,
    source: str,
    weights: str | None = None,
    dist_info: DistInfo = DistInfo(),
) -> Ctx:
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
        raise SpecError(
            f"arms.{arm.name}.routing_replay: {arm.routing_replay} needs an MoE model; {spec.model.name} is dense"
        )
    if spec.train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref_model = None
    if arm.kl_coef > 0:
        ref = load_model(source, spec.model).model if weights else copy.deepcopy(model)
        ref_model = ref.eval().requires_grad_(False)
    sharded = dist_info.enabled and spec.model.sharding == "fsdp"
    if sharded and ref_model is not None:
        distributed.shard_(ref_model)
    train_model = distributed.wrap(model, dist_info, spec.model.sharding)  # before the optimizer sees parameters
    opt_cfg = spec.optimizer
    optimizer = make_optimizer(model, routing, opt_cfg, spec.model.name, sharded)
    warm = opt_cfg.warmup_steps * arm.mini_batches * arm.epochs  # warmup counted in rollout steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0)
    engine = make_engine(
        spec.rollout,
        model,
        lm.tokenizer,
        model_dir=lm.source,
        dtype=spec.model.dtype,
        seed=seed,
        routing=routing,
        synced=sharded,
        return_routes=arm.routing_replay == "r3",
    )
    shuffle = torch.Generator().manual_seed(seed)
    return Ctx(
        spec=spec,
        arm=arm,
        task=task,
        model=model,
        engine=engine,
        optimizer=optimizer,
        scheduler=scheduler,
        loss_fn=get_policy_loss(arm.loss),
        adv_fn=get_advantage_estimator(arm.advantage),
        routing=routing,
        ref_model=ref_model,
        rng=random.Random(seed),
        shuffle=shuffle,
        dist=dist_info,
        train_model=train_model,
        compute=functools.partial(compute_context, spec.model.dtype, spec.model.device),
    )


def train_step(ctx: Ctx, step: int) -> dict:
    spec = ctx.spec
    G = spec.rollout.group_size
    t0 = time.time()

    # 1. Rollout: G samples per prompt from the current policy (= pi_old for this step).
    # Every rank draws the same global prompt list and keeps its share (whole groups).
    problems = distributed.shard(ctx.task.train_problems(ctx.rng, spec.rollout.prompts_per_step), ctx.dist)
    with ctx.compute():
        batch = ctx.engine.generate([p.prompt for p in problems for _ in range(G)])
    if hasattr(ctx.engine, "sleep"):
        ctx.engine.sleep()  # vLLM sleep mode: its GPU memory goes back to the trainer for the update
    t1 = time.time()

    # 2. Reward.
    scores = ctx.task.score_batch([problems[i // G] for i in range(len(batch.completions))], batch.completions)
    t2 = time.time()
    return learn(ctx, batch, scores, step, times={"time/rollout_s": t1 - t0, "time/score_s": t2 - t1}, t0=t0)


def learn(
    ctx: Ctx, batch: RolloutBatch, scores: list, step: int, times: dict | None = None, t0: float | None = None
) -> dict:
    """Everything after sampling and scoring: advantages, pi_old, the mini-batch updates and
    the step's metrics, reduced over all processes (each rank passes its own share of the
    global batch, whole groups)."""
    spec, arm = ctx.spec, ctx.arm
    G = spec.rollout.group_size
    t2 = time.time()
    t0 = t2 if t0 is None else t0
    rewards_B = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    adv_B = ctx.adv_fn(rewards_B, G, eps=arm.adv_eps)
    stats = StepStats()

    # 3. Old log-probs, entropy and (MoE) the routes pi_old took. A mismatch correction needs
    # pi_old from the trainer's own forward, whatever the engine returned (see _mismatch_weights).
    mask_BC = batch.response_mask
    correct = None if arm.mismatch.mode == "off" else get_mismatch_correction(arm.mismatch.mode)
    old, old_routes, from_sampler = _old_policy(ctx, batch)
    with torch.no_grad(), ctx.compute():
        ref_logp = (
            response_logprobs(ctx.ref_model, batch, spec.rollout.temperature).logp
            if ctx.ref_model is not None
            else None
        )
    # pi_old: the trainer's log-probs, or the sampler's own (use_engine_logprobs, paper 5.4).
    old_logp = old.logp
    if batch.engine_logp is not None and not from_sampler:
        record_gap(stats, batch.engine_logp, old.logp, mask_BC)
        if spec.rollout.use_engine_logprobs:
            old_logp = batch.engine_logp
    elif from_sampler and check_due(spec.rollout.logprob_check_every, step):
        # The sampler's log-probs are pi_old here; compare them with one full forward of the
        # weights that sampled: the trainer's own, or (rollout.staleness 1) the worker's.
        full_logp = batch.check_logp
        if full_logp is None:
            with torch.no_grad(), ctx.compute():
                full_logp = response_logprobs(ctx.model, batch, spec.rollout.temperature).logp
        record_gap(stats, batch.engine_logp, full_logp, mask_BC)
    bad = not bool(torch.isfinite(old_logp[mask_BC > 0]).all())
    if distributed.any_rank(bad, ctx.dist):  # every rank stops here, not only the one that saw it
        raise DivergedError(f"step {step}: non-finite log-probs under the current policy")
    weights_BC = None if correct is None else _mismatch_weights(stats, correct, arm, old_logp, batch, mask_BC)
    t3 = time.time()

    # 4. Updates: every epoch, every mini-batch; all but the very first are off-policy.
    route_mask_BT = _route_token_mask(batch)
    n_updates = skipped = 0
    for _ in range(arm.epochs):
        order = torch.randperm(len(rewards_B), generator=ctx.shuffle)
        for rows in order.chunk(arm.mini_batches):
            # Before the first update the current router is pi_old's: under r3 its own choices
            # against the engine's routes measure the engine/trainer routing gap instead.
            route_key = (
                "moe/expert_change_frac"
                if n_updates > 0
                else ("moe/engine_route_diff_frac" if arm.routing_replay == "r3" else None)
            )
            done = _update(
                ctx,
                batch,
                rows,
                old_logp,
                ref_logp,
                adv_B,
                old_routes,
                stats,
                route_key=route_key,
                step=step,
                route_mask_BT=route_mask_BT,
                weights_BC=weights_BC,
                minibatch=n_updates + skipped,
            )
            n_updates += done
            skipped += not done
    t4 = time.time()

    record_batch(stats, batch, scores, rewards_B, old.entropy, G, ctx.optimizer.param_groups[0]["lr"])
    if skipped:
        stats.same("policy/skipped_minibatches", skipped)  # decided together: equal on every rank
    for key, seconds in {
        **(times or {}),
        "time/old_logp_s": t3 - t2,
        "time/update_s": t4 - t3,
        "time/step_s": t4 - t0,
    }.items():
        stats.max(key, seconds)  # the slowest rank sets the pace
    metrics = {"step": step, **stats.reduce(ctx.dist)}
    metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens") / max(metrics["time/step_s"], 1e-9)
    # 6 significant digits: small quantities (KL ~1e-4, log-prob gaps ~1e-6) keep their value
    return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in metrics.items()}


def _old_policy(ctx: Ctx, batch: RolloutBatch):
    """(pi_old's LogProbs with entropy, the routes (L, B, T, k) every pi_theta forward replays
    or compares with (None for a dense model), whether the log-probs came from the sampler).

    With the hf engine they came from generate's own forwards already (rollout.sampler_logprobs)
    unless the arm's mismatch correction needs the trainer's; otherwise one no-grad pass computes them: r2
    (and no replay) records the routes it takes, r3 replays the engine's routes in it, so
    pi_old is the trainer's probability of the very sub-network the engine sampled with."""
    r3 = ctx.arm.routing_replay == "r3"
    if r3 and batch.engine_routes is None:
        raise SpecError(
            f"arms.{ctx.arm.name}.routing_replay: r3 needs the rollout engine's routes and this "
            "batch has none (the hf engine records them only within its logits budget, "
            "rollout/hf.py LOGITS_BUDGET; vLLM only when started to return them)"
        )
    own_forward = ctx.arm.mismatch.mode != "off"  # the correction compares the trainer's pi_old with the engine
    if (
        not own_forward
        and batch.engine_entropy is not None
        and (ctx.routing is None or batch.engine_routes is not None)
    ):
        return LogProbs(logp=batch.engine_logp, entropy=batch.engine_entropy), batch.engine_routes, True
    temp = ctx.spec.rollout.temperature
    B, T = batch.input_ids.shape
    with torch.no_grad(), ctx.compute():
        if ctx.routing is None:
            return response_logprobs(ctx.model, batch, temp, with_entropy=True), None, False
        if r3:
            with ctx.routing.replaying(routes_from_BT(batch.engine_routes)):
                return response_logprobs(ctx.model, batch, temp, with_entropy=True), batch.engine_routes, False
        with ctx.routing.recording() as rec:
            old = response_logprobs(ctx.model, batch, temp, with_entropy=True)
    return old, routes_to_BT(rec.routes, B, T), False


def _mismatch_weights(
    stats: StepStats, correct: Callable, arm: ArmConfig, trainer_logp_BC, batch: RolloutBatch, mask_BC
) -> torch.Tensor:
    """(B, C) per-token loss weights of the arm's mismatch correction: the engine sampled
    (behaviour policy `batch.engine_logp`), the loss's ratios are taken against the trainer's
    pi_old (`trainer_logp_BC`), so each token is reweighted by pi_old / pi_engine, bounded
    as the mode says. Its statistics go into `stats`."""
    if batch.engine_logp is None:
        raise SpecError(
            f"arms.{arm.name}.mismatch.mode: {arm.mismatch.mode} needs the engine's log-probs and this "
            "batch has none (the hf engine returns them only within its logits budget, "
            "rollout/hf.py LOGITS_BUDGET)"
        )
    corr = correct(trainer_logp_BC, batch.engine_logp, mask_BC, low=arm.mismatch.low, high=arm.mismatch.high)
    for k, (total, weight) in correction_stats(corr, mask_BC).items():  # weights: tokens or responses
        stats.mean(MISMATCH_STAT_KEYS[k][0], total, weight)
    return corr.weight_BC


def _denominator(ctx: Ctx, mask_BC: torch.Tensor) -> torch.Tensor | None:
    """What this rank divides its share of the mini-batch loss by: the global count (tokens
    or responses, by the arm's aggregation) / world size, since DDP averages gradients."""
    if not ctx.dist.enabled:
        return None
    count = distributed.total(float(aggregation_count(mask_BC, ctx.arm.aggregation)), ctx.dist)
    return torch.tensor(max(count, 1.0) / ctx.dist.world_size)


def _update(
    ctx: Ctx,
    batch: RolloutBatch,
    rows,
    old_logp_BC,
    ref_logp_BC,
    adv_B,
    old_routes,
    stats: StepStats,
    *,
    route_key: str | None,
    step: int,
    route_mask_BT: torch.Tensor,
    weights_BC=None,
    minibatch: int = 0,
) -> bool:
    """One mini-batch: policy loss (+ optional KL and router aux loss), backward, clip, step;
    its statistics go into `stats`. `weights_BC` (B, C): the mismatch correction's per-token
    loss weights, or None. `route_key`: the metric the current router's own expert choices,
    compared with `old_routes`, are logged under (None: not measured). Returns False for a
    skipped non-finite mini-batch (a decision all ranks take together)."""
    arm, spec = ctx.arm, ctx.spec
    # The mini-batch's rows, without the columns that are padding in all of them: the same
    # log-probs and loss, with a forward and backward only as wide as these rows need.
    sub, lo, c = batch.rows(rows, sampler=False).trimmed()
    hi = batch.prompt_len + c
    m_bc = sub.response_mask
    old_logp_bc = old_logp_BC[rows][:, :c]
    mb_routes = None if old_routes is None else old_routes[:, rows, lo:hi]
    denominator = _denominator(ctx, m_bc)
    # Backward inside the routing context: gradient checkpointing recomputes the forward
    # there, and a replayed forward must be replayed again.
    with _routing(ctx, mb_routes) as rec:
        with ctx.compute():
            new = response_logprobs(ctx.train_model or ctx.model, sub, spec.rollout.temperature)
        loss, loss_stats = ctx.loss_fn(
            new.logp,
            old_logp_bc,
            adv_B[rows],
            m_bc,
            clip_low=arm.clip_low,
            clip_high=arm.clip_high,
            aggregation=arm.aggregation,
            denominator=denominator,
            weights_BC=None if weights_BC is None else weights_BC[rows][:, :c],
        )
        extra = {}
        if ref_logp_BC is not None:
            k3_BC = kl_k3_BC(new.logp, ref_logp_BC[rows][:, :c])
            loss = loss + arm.kl_coef * aggregate(k3_BC, m_bc, arm.aggregation, denominator)
            extra["kl_ref"] = torch.where(m_bc > 0, k3_BC.detach(), torch.zeros_like(k3_BC)).sum()
        if new.aux_loss is not None and spec.model.router_aux_loss_coef > 0:
            loss = loss + spec.model.router_aux_loss_coef * new.aux_loss
            extra["aux_loss"] = new.aux_loss.detach()
        ctx.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # on every rank, even a non-finite one: DDP's gradient all-reduce needs all
    routes_now = rec.routes if rec is not None else None
    grad_norm = distributed.scalar(torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), spec.optimizer.grad_clip))
    bad = not (torch.isfinite(loss) and torch.isfinite(grad_norm))
    if distributed.any_rank(bad, ctx.dist):
        div = spec.train.divergence
        if not div.skip_bad_batches or ctx.skipped >= div.max_skipped:
            raise DivergedError(
                f"step {step}: non-finite loss or gradient norm"
                + (f" (after {ctx.skipped} skipped mini-batches)" if ctx.skipped else "")
            )
        ctx.optimizer.zero_grad(set_to_none=True)  # an isolated bad batch: drop it, keep going
        ctx.skipped += 1
        return False
    ctx.optimizer.step()
    ctx.scheduler.step()
    record_update(stats, loss, loss_stats, extra, grad_norm, m_bc)
    record_logratio_var(stats, new.logp, old_logp_bc, m_bc, minibatch)
    if routes_now is not None and route_key is not None:
        tokens_N = route_mask_BT[rows, lo:hi].reshape(-1)
        frac = expert_change_frac(routes_from_BT(mb_routes), routes_now, tokens_N)
        stats.mean(route_key, frac * tokens_N.sum().item(), tokens_N.sum().item())
    return True


@contextlib.contextmanager
def _routing(ctx: Ctx, old_routes):
    """Around a mini-batch's forward and backward: with routing replay, `old_routes` (the
    mini-batch's (L, b, t, k), columns as its forward sees them) forced in
    every router (r2: pi_old's, r3: the rollout engine's; see _old_policy); for any MoE, the
    experts the current routers choose themselves recorded (for volatility). Yields a Routes
    holder (`.routes` set on exit), or None for a dense model."""
    if ctx.routing is None:
        yield None
    elif ctx.arm.routing_replay != "off":
        with ctx.routing.replaying(routes_from_BT(old_routes)) as rec:
            yield rec
    else:
        with ctx.routing.recording() as rec:
            yield rec


def _route_token_mask(batch: RolloutBatch) -> torch.Tensor:
    """(B, T) mask of the positions whose outputs are the response log-probs, where expert
    volatility is measured: position t predicts token t+1, so response token j (column P+j)
    is predicted at column P-1+j. Each row's last token predicts nothing a loss uses, and no
    engine routes it (generate never feeds the last sampled token back, vLLM's routed_experts
    stop one short), so it is left out; so is padding."""
    m = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    P = batch.prompt_len
    m[:, P - 1 : -1] = batch.response_mask > 0
    return m
