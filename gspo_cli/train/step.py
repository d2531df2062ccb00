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
from gspo_cli.algorithms import (
    CONSTANT_LENGTH,
    aggregate,
    aggregation_count,
    get_advantage_estimator,
    get_mismatch_correction,
    get_policy_loss,
    kl_k3_BC,
)
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import DivergedError, SpecError
from gspo_cli.models import compute_context, load_model
from gspo_cli.models.aux_loss import router_aux_loss
from gspo_cli.models.routing import RoutingController, UnsupportedRoutingError, expert_change_frac, routes_from_BT
from gspo_cli.rollout import RolloutBatch, RolloutEngine, make_engine, response_logprobs, with_environment
from gspo_cli.rollout.base import check_due
from gspo_cli.spec import ArmConfig, ExperimentSpec
from gspo_cli.tasks import Task
from gspo_cli.tasks.judge import record_unparsable
from gspo_cli.train.compiled import CompiledUpdate, compiled_context, unpad_routes
from gspo_cli.train.minibatch import minibatch_rows
from gspo_cli.train.old_policy import old_policy
from gspo_cli.train.optim import make_optimizer, make_scheduler
from gspo_cli.train.samples import sample_records, samples_due
from gspo_cli.train.sampling import advantages, dynamic_sampling, record_dynamic, shaped_rewards
from gspo_cli.train.stats import StepStats, record_batch, record_gap, record_logratio_var, record_update
from gspo_cli.train.token_weights import off_policy_weights, token_weights


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
    ref_model = None
    if arm.kl_coef > 0:
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
        engine=with_environment(engine, spec),  # task.environment: multi-turn (rollout/turns.py)
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
    )


def train_step(ctx: Ctx, step: int) -> dict:
    spec = ctx.spec
    G = spec.rollout.group_size
    t0 = time.time()

    # 1-2. Rollout and reward: G samples per prompt from the current policy (= pi_old for this
    # step). Every rank draws the same global prompt list and keeps its share (whole groups).
    times = {"time/rollout_s": 0.0, "time/score_s": 0.0}

    def sample():
        t = time.time()
        problems = distributed.shard(ctx.task.train_problems(ctx.rng, spec.rollout.prompts_per_step), ctx.dist)
        with ctx.compute():
            batch = ctx.engine.generate([p.prompt for p in problems for _ in range(G)])
        t1 = time.time()
        rows = [problems[i // G] for i in range(len(batch.completions))]
        scores = ctx.task.score_rollout(rows, batch.completions, batch.completion_ids, step)
        times["time/rollout_s"] += t1 - t
        times["time/score_s"] += time.time() - t1
        return problems, batch, scores

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

    # 3. Old log-probs, entropy and (MoE) the routes pi_old took. A mismatch correction needs
    # pi_old from the trainer's own forward, whatever the engine returned (see _mismatch_weights).
    correct = None if arm.mismatch.mode == "off" else get_mismatch_correction(arm.mismatch.mode)
    old, old_routes, from_sampler = old_policy(ctx, batch)
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
    weights_BC, loss_mask_BC = token_weights(ctx.arm, stats, correct, old_logp, old.entropy, batch)
    t3 = time.time()

    # 4. Updates: every epoch, every mini-batch; all but the very first are off-policy.
    route_mask_BT = _route_token_mask(batch)
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
    record_unparsable(stats, ctx.task, step)  # LLM judges: answers without a score (tasks/judge.py)
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


def _denominator(ctx: Ctx, mask_BC: torch.Tensor) -> torch.Tensor | None:
    """What this rank divides its share of the mini-batch loss by: the global count (tokens
    or responses, by the arm's aggregation) / world size, since DDP averages gradients. A
    constant-length aggregation (Dr. GRPO) counts rows x rollout.max_new_tokens, not the
    mini-batch's trimmed width."""
    agg = ctx.arm.aggregation
    max_len = ctx.spec.rollout.max_new_tokens if agg in CONSTANT_LENGTH else None
    if not ctx.dist.enabled:
        return None if max_len is None else aggregation_count(mask_BC, agg, max_len)
    count = distributed.total(float(aggregation_count(mask_BC, agg, max_len)), ctx.dist)
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
    loss_mask_BC=None,
    minibatch: int = 0,
    clipped_B: torch.Tensor | None = None,
) -> bool:
    """One mini-batch: policy loss (+ optional KL and router aux loss), backward, clip, step; its statistics go into
    `stats`. `weights_BC` (B, C): the per-token loss weights (mismatch correction, token filter), or None;
    `loss_mask_BC` (B, C): the mask the loss aggregates over (None: the response mask). `route_key`: the metric the
    current router's own expert choices, compared with `old_routes`, are logged under (None: not measured). Returns
    False for a skipped non-finite mini-batch (a decision all ranks take together). `clipped_B` (B,), when given,
    gets each row's clipped-token count added."""
    arm, spec = ctx.arm, ctx.spec
    # The mini-batch's rows, without the columns that are padding in all of them: the same
    # log-probs and loss, with a forward and backward only as wide as these rows need.
    sub, lo, c = batch.rows(rows, sampler=False).trimmed()
    hi = batch.prompt_len + c
    m_bc = sub.model_mask if loss_mask_BC is None else loss_mask_BC[rows][:, :c]
    old_logp_bc = old_logp_BC[rows][:, :c]
    w_bc = None if weights_BC is None else weights_BC[rows][:, :c]
    mb_routes = None if old_routes is None else old_routes[:, rows, lo:hi]
    denominator = _denominator(ctx, m_bc)
    # train.compile: the forward runs on the rows padded to a bucketed width (train/compiled.py)
    fwd, fwd_routes = (sub, mb_routes) if ctx.compiled is None else ctx.compiled.pad(sub, mb_routes)
    # Backward inside the routing context: gradient checkpointing recomputes the forward
    # there, and a replayed forward must be replayed again.
    with _routing(ctx, fwd_routes) as rec:
        with ctx.compute(), compiled_context(ctx.compiled):
            new = response_logprobs(ctx.train_model or ctx.model, fwd, spec.rollout.temperature)
        new.logp = new.logp[:, :c]
        if arm.off_policy_mask is not None:  # DeepSeek-V3.2: needs pi_theta, so per mini-batch
            keep_bc = off_policy_weights(arm.off_policy_mask, stats, batch, rows, new.logp, old_logp_bc, adv_B, m_bc)
            w_bc = keep_bc if w_bc is None else w_bc * keep_bc
        loss, loss_stats = ctx.loss_fn(
            new.logp,
            old_logp_bc,
            adv_B[rows],
            m_bc,
            clip_low=arm.clip_low,
            clip_high=arm.clip_high,
            aggregation=arm.aggregation,
            denominator=denominator,
            weights_BC=w_bc,
            **({} if arm.clip_dual is None else {"clip_dual": arm.clip_dual}),
            **arm.loss_params,
        )
        extra = {}
        if ref_logp_BC is not None:
            k3_BC = kl_k3_BC(new.logp, ref_logp_BC[rows][:, :c])
            loss = loss + arm.kl_coef * aggregate(k3_BC, m_bc, arm.aggregation, denominator)
            extra["kl_ref"] = torch.where(m_bc > 0, k3_BC.detach(), torch.zeros_like(k3_BC)).sum()
            extra["kl_ref_tokens"] = float((m_bc > 0).sum())  # what the penalty averages over, weight 0 too
        if new.aux_loss is not None and spec.model.router_aux_loss_coef > 0:  # the whole batch's, all ranks
            aux, extra["aux_loss"] = router_aux_loss(
                new.aux_loss, new.router_logits, _routed_tokens(fwd), ctx.model.config, ctx.dist
            )
            loss = loss + spec.model.router_aux_loss_coef * aux
        ctx.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # on every rank, even a non-finite one: DDP's gradient all-reduce needs all
    routes_now = unpad_routes(rec.routes, len(rows), hi - lo) if rec is not None else None
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
    # Statistics over the tokens the loss can move; the rest (dropped by a correction or filter)
    # are counted apart, so "clipped" and "dropped" stay distinguishable.
    kept_bc = (m_bc > 0) if w_bc is None else (m_bc > 0) & (w_bc != 0)
    response_bc = sub.model_mask > 0
    stats.mean("policy/dropped_token_frac", float((response_bc & ~kept_bc).sum()), float(response_bc.sum()))
    record_update(stats, loss, loss_stats, extra, grad_norm, kept_bc.to(m_bc.dtype))
    if clipped_B is not None:
        clipped_B.index_add_(0, rows, loss_stats["clipped_tokens_B"].float().cpu())
    record_logratio_var(stats, new.logp, old_logp_bc, kept_bc.to(m_bc.dtype), minibatch)
    if routes_now is not None and route_key is not None and mb_routes is not None:
        tokens_N = route_mask_BT[rows, lo:hi].reshape(-1)
        frac = expert_change_frac(routes_from_BT(mb_routes), routes_now, tokens_N)
        stats.mean(route_key, frac * tokens_N.sum().item(), tokens_N.sum().item())
    return True


@contextlib.contextmanager
def _routing(ctx: Ctx, old_routes):
    """Around a mini-batch's forward and backward: with routing replay, `old_routes` (the mini-batch's (L, b, t, k),
    columns as its forward sees them) forced in every router (r2: pi_old's, r3: the rollout engine's; see
    old_policy.py); for any MoE, the experts the current routers choose themselves recorded (for volatility). Yields
    a Routes holder (`.routes` set on exit), or None for a dense model."""
    if ctx.routing is None:
        yield None
    elif ctx.arm.routing_replay != "off":
        with ctx.routing.replaying(routes_from_BT(old_routes)) as rec:
            yield rec
    else:
        with ctx.routing.recording() as rec:
            yield rec


def _routed_tokens(batch: RolloutBatch) -> torch.Tensor:
    """(B, T) 1 on the prompt and response tokens: the rows the load-balancing loss averages over.
    Not the attention mask: an attended position past a row's response mask is kept or trimmed
    with the other rows of its mini-batch (RolloutBatch.trimmed), so counting it would make the
    loss depend on how the batch is split across mini-batches and processes."""
    P = batch.prompt_len
    response_BC = (batch.response_mask > 0).to(batch.attention_mask.dtype) * batch.attention_mask[:, P:]
    return torch.cat([batch.attention_mask[:, :P], response_BC], dim=1)


def _route_token_mask(batch: RolloutBatch) -> torch.Tensor:
    """(B, T) mask of the positions whose outputs are the response log-probs, where expert
    volatility is measured: position t predicts token t+1, so response token j (column P+j)
    is predicted at column P-1+j. Each row's last token predicts nothing a loss uses, and no
    engine routes it (generate never feeds the last sampled token back, vLLM's routed_experts
    stop one short), so it is left out; so is padding."""
    m = torch.zeros(batch.input_ids.shape, dtype=torch.bool, device=batch.response_mask.device)
    P = batch.prompt_len
    m[:, P - 1 : -1] = batch.model_mask > 0  # tool output: routed and replayed, not measured
    return m
