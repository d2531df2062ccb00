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
from dataclasses import dataclass, field
from typing import Callable

import torch

from gspo_cli import distributed
from gspo_cli.algorithms import LOSS_LEVELS, get_advantage_estimator, get_policy_loss
from gspo_cli.algorithms.anchors import anchor_correction
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import DivergedError, SpecError
from gspo_cli.models import compute_context, load_model, lora
from gspo_cli.models.routing import RoutingController, UnsupportedRoutingError
from gspo_cli.rewards.judge import record_unparsable
from gspo_cli.rollout import RolloutBatch, RolloutEngine, make_engine, with_environment
from gspo_cli.rollout.base import check_due
from gspo_cli.rollout.packing import resolve_packing
from gspo_cli.spec import ArmConfig, ExperimentSpec
from gspo_cli.tasks import Task
from gspo_cli.train.compiled import CompiledUpdate
from gspo_cli.train.micro import batch_logprobs
from gspo_cli.train.minibatch import minibatch_rows
from gspo_cli.train.old_policy import old_policy
from gspo_cli.train.optim import make_optimizer, make_scheduler
from gspo_cli.train.samples import sample_records, samples_due
from gspo_cli.train.sampling import advantages, dynamic_sampling, record_dynamic, shaped_rewards
from gspo_cli.train.scored_rollout import sample_and_score
from gspo_cli.train.stats import StepStats, record_batch, record_gap
from gspo_cli.train.token_weights import token_weights
from gspo_cli.train.update import route_token_mask, update


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
    seed: int = 0  # the run's seed (samples.jsonl names it)
    samples: list[dict] = field(default_factory=list)  # the last step's samples.jsonl lines (often none)
    # Forward passes run inside compute(): autocast to model.dtype over float32 master weights
    # (FSDP: nothing, its MixedPrecisionPolicy gathers model.dtype copies of the shards).
    compute: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    compiled: CompiledUpdate | None = None  # train.compile: the update's compiled decoder
    packed: bool = False  # train.packing resolved: every training forward runs its rows packed
    packing_line: str = ""  # what the run's setup line says of it (rollout/packing.py)


def setup(
    spec: ExperimentSpec,
    arm: ArmConfig,
    seed: int,
    task: Task,
    source: str,
    weights: str | None = None,
    dist_info: DistInfo = DistInfo(),
    stop=None,
) -> Ctx:
    """Resolve everything a step needs. `weights` (a checkpoint) replaces the initial
    weights when resuming; the KL reference is always the initial model `source`. `stop`: the
    loop's StopFlag, which a blocking environment's calls give way to (rollout/env_calls.py).
    Under torchrun each rank samples with its own seed; rank 0's is the single-process one."""
    torch.manual_seed(distributed.rank_seed(seed, dist_info.rank))
    sharded = dist_info.enabled and spec.model.sharding == "fsdp"
    # fsdp: loaded straight into shards (rank 0 reads, every rank keeps its slice)
    lm = load_model(weights or source, spec.model, dist_info=dist_info)
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
    compiled = CompiledUpdate(model, spec.train.compile_bucket) if spec.train.compile else None
    packed, packing_line = resolve_packing(spec.train.packing, model, spec.model.device, compiled is not None)
    ref_model = lora.AdaptersOff(model) if arm.kl_coef > 0 and lora.is_lora(model) else None  # LoRA: no copy
    if arm.kl_coef > 0 and ref_model is None:
        if sharded:  # sharded like the policy, from rank 0's read of the initial weights
            ref = load_model(source, spec.model, dist_info=dist_info).model
        else:
            ref = load_model(source, spec.model).model if weights else copy.deepcopy(model)
        ref_model = ref.eval().requires_grad_(False)
    train_model = distributed.wrap(model, dist_info, spec.model.sharding)  # before the optimizer sees parameters
    opt_cfg = spec.optimizer
    optimizer = make_optimizer(model, routing, opt_cfg, spec.model.name, sharded)
    scheduler = make_scheduler(optimizer, opt_cfg, spec.train.steps, arm.mini_batches * arm.epochs)
    rollout_cfg = spec.rollout  # staleness 1: the worker owns a server; the trainer evaluates with hf
    if rollout_cfg.staleness and rollout_cfg.engine == "vllm-server":
        rollout_cfg = rollout_cfg.model_copy(update={"engine": "hf", "server": None})
    engine = make_engine(
        rollout_cfg,
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
        engine=with_environment(engine, spec, stop),  # task.environment: multi-turn (rollout/turns.py)
        optimizer=optimizer,
        scheduler=scheduler,
        loss_fn=get_policy_loss(arm.loss),
        adv_fn=get_advantage_estimator(arm.advantage),
        routing=routing,
        ref_model=ref_model,
        rng=random.Random(seed),
        shuffle=shuffle,
        dist=dist_info,
        seed=seed,
        train_model=train_model,
        compute=functools.partial(compute_context, spec.model.dtype, spec.model.device, sharded),
        compiled=compiled,
        packed=packed,
        packing_line=packing_line,
    )


def train_step(ctx: Ctx, step: int) -> dict:
    t0 = time.time()

    # 1-2. Rollout and reward: G samples per prompt from the current policy (= pi_old for this
    # step). Every rank draws the same global prompt list and keeps its share (whole groups).
    times = {"time/rollout_s": 0.0, "time/score_s": 0.0}

    def sample():  # rows are scored as they are sampled where the engine allows (train/scored_rollout.py)
        return sample_and_score(ctx, step, times)

    problems, batch, scores = sample()
    dynamic = None
    if ctx.arm.dynamic_sampling.max_rounds:  # DAPO: more rounds until the groups carry signal
        batch, scores, dynamic = dynamic_sampling(ctx, problems, batch, scores, sample)
    if hasattr(ctx.engine, "sleep"):
        ctx.engine.sleep()  # vLLM sleep mode: its GPU memory goes back to the trainer for the update
    return learn(ctx, batch, scores, step, times=times, t0=t0, dynamic=dynamic)


def learn(
    ctx: Ctx,
    batch: RolloutBatch,
    scores: list,
    step: int,
    times: dict | None = None,
    t0: float | None = None,
    dynamic: dict | None = None,
) -> dict:
    """Everything after sampling and scoring: advantages, pi_old, the mini-batch updates and
    the step's metrics, reduced over all processes (each rank passes its own share of the
    global batch, whole groups). `dynamic`: dynamic sampling's counts (sampling.record_dynamic)."""
    spec, arm = ctx.spec, ctx.arm
    G = spec.rollout.group_size
    t2 = time.time()
    t0 = t2 if t0 is None else t0
    mask_BC = batch.model_mask  # the model's tokens: docs/guides/tools.md lists every mask's use
    rewards_B = shaped_rewards(arm, spec.rollout.max_new_tokens, batch, scores)  # on the host, as scores
    adv_B = advantages(ctx, batch, rewards_B, scores).to(mask_BC.device)  # multi_reward; the loss's device
    stats = StepStats()

    # 3. Old log-probs, entropy and (MoE) the routes pi_old took. A mismatch correction, and a
    # proximal anchor on a stale batch (algorithms/anchors.py), need pi_old from the trainer's own
    # forward, whatever the engine returned; the sampler's log-probs then weigh the loss.
    correct = anchor_correction(arm.anchor, spec.rollout.staleness, arm.mismatch.mode, LOSS_LEVELS[arm.loss])
    old, old_routes, from_sampler = old_policy(ctx, batch)
    with torch.no_grad(), ctx.compute():
        ref_logp = (
            batch_logprobs(ctx, ctx.ref_model, batch)[0].logp  # in micro-batches: train/micro.py
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
                full_logp = batch_logprobs(ctx, ctx.model, batch)[0].logp
        record_gap(stats, batch.engine_logp, full_logp, mask_BC)
    bad = not bool(torch.isfinite(old_logp[mask_BC > 0]).all())
    if distributed.any_rank(bad, ctx.dist):  # every rank stops here, not only the one that saw it
        raise DivergedError(f"step {step}: non-finite log-probs under the current policy")
    weights_BC, loss_mask_BC = token_weights(ctx.arm, stats, correct, old_logp, old.entropy, batch, ctx.dist)
    t3 = time.time()

    # 4. Updates: every epoch, every mini-batch; all but the very first are off-policy.
    route_mask_BT = route_token_mask(batch)
    clipped_B = torch.zeros(len(rewards_B))  # clipped tokens per response, over the epochs (samples.jsonl)
    n_updates = skipped = 0
    for _ in range(arm.epochs):
        for rows in minibatch_rows(len(rewards_B), arm.mini_batches, ctx.shuffle):  # torchrun: train/minibatch.py
            # Before the first update the current router is pi_old's: under r3 its own choices
            # against the engine's routes measure the engine/trainer routing gap instead.
            route_key = (
                "moe/expert_change_frac"
                if n_updates > 0
                else ("moe/engine_route_diff_frac" if arm.routing_replay == "r3" else None)
            )
            done = update(  # train/update.py: in micro-batches when the spec asks
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
                loss_mask_BC=loss_mask_BC,
                minibatch=n_updates + skipped,
                clipped_B=clipped_B,
            )
            n_updates += done
            skipped += not done
    t4 = time.time()

    record_batch(stats, batch, scores, rewards_B, old.entropy, G, ctx.optimizer.param_groups[0]["lr"])
    if dynamic is not None:
        record_dynamic(stats, dynamic)
    record_unparsable(stats, ctx.task, step)  # LLM judges: answers without a score (rewards/judge.py)
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
    due = samples_due(spec.train.log_samples_every, step)  # a few rollouts as the model saw them
    clip_B = clipped_B / arm.epochs
    ctx.samples = (
        sample_records(batch, scores, rewards_B, adv_B, clip_B, weights_BC, ctx.engine.tokenizer, G) if due else []
    )
    metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens") / max(metrics["time/step_s"], 1e-9)
    # 6 significant digits: small quantities (KL ~1e-4, log-prob gaps ~1e-6) keep their value
    return {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in metrics.items()}
