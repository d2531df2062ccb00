"""One mini-batch's update (train/step.py's `learn` calls `update` per mini-batch): policy loss
(+ KL and router aux loss), backward, clip, optimizer step, its statistics.

With `train.micro_batch_tokens` / `train.micro_batch_rows` the mini-batch runs in micro-batches
(train/micro.py) whose gradients accumulate before one optimizer step, and the update equals
the unsplit one:
- every loss is a sum over rows divided by the mini-batch's count (tokens, responses, Dr. GRPO's
  rows x max_new_tokens), so each micro-batch divides its own sum by the whole mini-batch's
  count, over every process, computed before they run (`_denominator`); a row is never split,
  so GSPO's sequence ratios and a response's token mean are whole;
- what is nonlinear over the mini-batch comes from a no-grad forward of it (`_prepass`, itself
  in micro-batches): Clip-Cov's and KL-Cov's token selection (losses.MINIBATCH_SELECTIONS,
  the same draw as one call over the mini-batch) and the router load-balancing loss's pick
  fractions f_e (the loss is then linear in the router probabilities: models/aux_loss.py);
  it costs one more no-grad forward of the mini-batch, only for those losses;
- gradients are clipped once, after the last micro-batch; DDP's all-reduce runs only in the
  last micro-batch's backward, FSDP reduce-scatters in each (`_sync` says why); under torchrun
  every process runs as many micro-batches as the one with most (padding with forwards of
  weight 0);
- the statistics of the micro-batches add up to the mini-batch's (StepStats parts); the loss,
  gradient norm and aux loss are recorded once per mini-batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from gspo_cli import distributed
from gspo_cli.algorithms import CONSTANT_LENGTH, aggregate, aggregation_count, kl_k3_BC
from gspo_cli.algorithms.losses import MINIBATCH_SELECTIONS, SELECTION_KWARG
from gspo_cli.errors import DivergedError
from gspo_cli.models.aux_loss import load_balance_counts, router_aux_loss, router_aux_share
from gspo_cli.models.routing import expert_change_frac, routes_from_BT
from gspo_cli.rollout import RolloutBatch, response_logprobs
from gspo_cli.rollout.packing import Packing
from gspo_cli.train import micro
from gspo_cli.train.compiled import compiled_context, unpad_routes
from gspo_cli.train.stats import StepStats, record_logratio_var, record_update
from gspo_cli.train.token_weights import off_policy_weights

# Recorded once per mini-batch, not summed over its micro-batches' records.
PER_MINIBATCH = ("policy/loss", "policy/grad_norm", "moe/aux_loss")


@dataclass
class Prepass:
    """What a no-grad forward of the whole mini-batch fixed before its micro-batches run, in
    the step batch's coordinates: Clip-Cov/KL-Cov's selected tokens (B, C) and the router
    loss's pick fractions f_E over every process with its row count."""

    selected_BC: torch.Tensor | None = None
    f_E: torch.Tensor | None = None
    rows_all: torch.Tensor | None = None


def update(
    ctx,
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
    """One mini-batch (`rows` of `batch`, a train.step.Ctx `ctx`): policy loss (+ optional KL
    and router aux loss), backward, clip, step; its statistics go into `stats`. `weights_BC`
    (B, C): the per-token loss weights (mismatch correction, token filter), or None;
    `loss_mask_BC` (B, C): the mask the loss aggregates over (None: the response mask).
    `route_key`: the metric the current router's own expert choices, compared with
    `old_routes`, are logged under (None: not measured). Returns False for a skipped
    non-finite mini-batch (a decision all ranks take together). `clipped_B` (B,), when given,
    gets each row's clipped-token count added."""
    spec = ctx.spec
    mask_BC = (
        batch.model_mask if loss_mask_BC is None else loss_mask_BC
    )  # the model's tokens (tools: docs/guides/tools.md)
    max_tokens, max_rows = micro.budget(spec)
    split = micro.split_rows(rows, micro.row_tokens(batch), max_tokens, max_rows)
    runs = micro.padded_count(len(split.parts), ctx.dist) if (max_tokens or max_rows) else 1
    parts = split.parts + [rows[:1]] * (runs - len(split.parts))  # weight-0 forwards: rollout/micro_batches.py
    whole = runs == 1
    denominator = _denominator(ctx, mask_BC[rows], split=not whole)
    pre = (
        None
        if whole
        else _prepass(ctx, batch, rows, parts, len(split.parts), old_logp_BC, adv_B, old_routes, mask_BC, weights_BC)
    )
    ctx.optimizer.zero_grad(set_to_none=True)
    part_stats, loss, prob_E, aux_value, clipped = StepStats(), 0.0, None, None, []
    for j, mb in enumerate(parts):
        real = j < len(split.parts)
        with _sync(ctx, last=j == runs - 1):
            out = _micro(
                ctx,
                batch,
                mb,
                old_logp_BC,
                ref_logp_BC,
                adv_B,
                old_routes,
                part_stats if real else StepStats(),
                mask_BC=mask_BC,
                weights_BC=weights_BC,
                denominator=denominator,
                pre=pre,
                scale=1.0 if real else 0.0,
                route_key=route_key,
                route_mask_BT=route_mask_BT,
                minibatch=minibatch,
            )
        if real:
            loss = loss + out["loss"]
            aux_value = out.get("aux_value", aux_value)
            if "prob_E" in out:
                prob_E = out["prob_E"] if prob_E is None else prob_E + out["prob_E"]
            clipped.append((mb, out["clipped"]))
    if prob_E is not None:  # the router loss's value: all micro-batches' prob sums, every process
        prob_E = distributed.total_tensor(prob_E, ctx.dist)
        aux_value = ctx.model.config.num_experts * (pre.f_E * prob_E / pre.rows_all).sum()
    grad_norm = distributed.scalar(torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), spec.optimizer.grad_clip))
    loss = torch.as_tensor(loss)
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
    for mb, counts in clipped if clipped_B is not None else ():
        clipped_B.index_add_(0, mb, counts)
    for key in PER_MINIBATCH:
        part_stats.parts.pop(key, None)
    stats.absorb(part_stats)
    stats.mean("policy/loss", float(loss), 1.0)
    stats.mean("policy/grad_norm", float(grad_norm), 1.0)  # equal on every rank after the all-reduce
    if aux_value is not None:
        stats.mean("moe/aux_loss", float(aux_value), 1.0)
    if not whole:
        stats.mean("perf/micro_batches", len(split.parts), 1.0)
    if split.oversize:
        stats.sum("perf/oversize_rows", split.oversize)
    return True


def _micro(
    ctx,
    batch,
    rows,
    old_logp_BC,
    ref_logp_BC,
    adv_B,
    old_routes,
    stats,
    *,
    mask_BC,
    weights_BC,
    denominator,
    pre,
    scale,
    route_key,
    route_mask_BT,
    minibatch,
) -> dict:
    """Forward and backward of the rows `rows` (a micro-batch, or the whole mini-batch), the loss
    times `scale` (0: a padding forward); their statistics into `stats`. Returns the detached
    loss, each row's clipped-token count and, for the router loss, its value or prob sums."""
    arm, spec = ctx.arm, ctx.spec
    # The rows, without the columns that are padding in all of them: the same log-probs and
    # loss, with a forward and backward only as wide as these rows need.
    sub, lo, c = batch.rows(rows, sampler=False).trimmed()
    hi = batch.prompt_len + c
    m_bc = mask_BC[rows][:, :c]
    old_logp_bc = old_logp_BC[rows][:, :c]
    w_bc = None if weights_BC is None else weights_BC[rows][:, :c]
    mb_routes = None if old_routes is None else old_routes[:, rows, lo:hi]
    # train.compile: the forward runs on the rows padded to a bucketed width (train/compiled.py)
    fwd, fwd_routes = (sub, mb_routes) if ctx.compiled is None else ctx.compiled.pad(sub, mb_routes)
    packing = Packing.of(fwd) if ctx.packed else None  # train.packing: one padding-free row
    out: dict = {}
    # Backward inside the routing context: gradient checkpointing recomputes the forward
    # there, and a replayed forward must be replayed again.
    with _routing(ctx, fwd_routes, packing) as rec:
        with ctx.compute(), compiled_context(ctx.compiled):
            new = response_logprobs(ctx.train_model or ctx.model, fwd, spec.rollout.temperature, packed=ctx.packed)
        new.logp = new.logp[:, :c]
        if arm.off_policy_mask is not None:  # DeepSeek-V3.2: needs pi_theta, so per mini-batch
            keep_bc = off_policy_weights(arm.off_policy_mask, stats, batch, rows, new.logp, old_logp_bc, adv_B, m_bc)
            w_bc = keep_bc if w_bc is None else w_bc * keep_bc
        selection = {}
        if pre is not None and pre.selected_BC is not None:
            selection[SELECTION_KWARG] = pre.selected_BC[rows][:, :c]
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
            **selection,
        )
        extra = {}
        if ref_logp_BC is not None:
            k3_BC = kl_k3_BC(new.logp, ref_logp_BC[rows][:, :c])
            loss = loss + arm.kl_coef * aggregate(k3_BC, m_bc, arm.aggregation, denominator)
            extra["kl_ref"] = torch.where(m_bc > 0, k3_BC.detach(), torch.zeros_like(k3_BC)).sum()
            extra["kl_ref_tokens"] = float((m_bc > 0).sum())  # what the penalty averages over, weight 0 too
        if new.aux_loss is not None and spec.model.router_aux_loss_coef > 0:  # the whole batch's, all ranks
            if pre is None:
                aux, out["aux_value"] = router_aux_loss(
                    new.aux_loss, new.router_logits, _routed_tokens(fwd), ctx.model.config, ctx.dist
                )
            else:
                aux, out["prob_E"] = router_aux_share(
                    new.router_logits, _routed_tokens(fwd), ctx.model.config, pre.f_E, pre.rows_all, ctx.dist
                )
            loss = loss + spec.model.router_aux_loss_coef * aux
        # on every rank, even a non-finite one: DDP's gradient all-reduce needs all
        (loss if scale == 1.0 else loss * scale).backward()
    out["loss"] = loss.detach()
    routes_now = None
    if rec is not None:
        routes_now = packing.routes_out(rec.routes) if packing else unpad_routes(rec.routes, len(rows), hi - lo)
    # Statistics over the tokens the loss can move; the rest (dropped by a correction or filter)
    # are counted apart, so "clipped" and "dropped" stay distinguishable.
    kept_bc = (m_bc > 0) if w_bc is None else (m_bc > 0) & (w_bc != 0)
    response_bc = sub.model_mask > 0
    stats.mean("policy/dropped_token_frac", float((response_bc & ~kept_bc).sum()), float(response_bc.sum()))
    record_update(stats, loss, loss_stats, extra, torch.zeros(()), kept_bc.to(m_bc.dtype))
    out["clipped"] = loss_stats["clipped_tokens_B"].float().cpu()
    record_logratio_var(stats, new.logp, old_logp_bc, kept_bc.to(m_bc.dtype), minibatch)
    if routes_now is not None and route_key is not None and mb_routes is not None:
        tokens_N = route_mask_BT[rows, lo:hi].reshape(-1)
        frac = expert_change_frac(routes_from_BT(mb_routes), routes_now, tokens_N)
        stats.mean(route_key, frac * tokens_N.sum().item(), tokens_N.sum().item())
    return out


def _prepass(ctx, batch, rows, parts, n_real, old_logp_BC, adv_B, old_routes, mask_BC, weights_BC) -> Prepass | None:
    """A no-grad forward of the mini-batch `rows`, in its micro-batches `parts` (the first
    `n_real` real, the rest padding), for what is nonlinear over the mini-batch (module
    docstring). None when neither the loss nor the router loss needs it."""
    arm, spec = ctx.arm, ctx.spec
    select = MINIBATCH_SELECTIONS.get(arm.loss)
    aux = spec.model.router_aux_loss_coef > 0 and getattr(ctx.model.config, "num_experts", None)
    if select is None and not aux:
        return None
    logp_BC = torch.zeros_like(old_logp_BC)
    picks_E, n_rows = 0.0, 0.0
    for j, mb in enumerate(parts):
        sub, lo, c = batch.rows(mb, sampler=False).trimmed()
        mb_routes = None if old_routes is None else old_routes[:, mb, lo : batch.prompt_len + c]
        packing = Packing.of(sub) if ctx.packed else None
        with torch.no_grad(), _routing(ctx, mb_routes, packing), ctx.compute():
            new = response_logprobs(ctx.model, sub, spec.rollout.temperature, packed=ctx.packed)
        if j >= n_real:
            continue
        logp_BC[mb, :c] = new.logp[:, :c].to(logp_BC.dtype)
        if aux and new.router_logits is not None:
            p, r = load_balance_counts(new.router_logits, _routed_tokens(sub), ctx.model.config)
            picks_E, n_rows = picks_E + p, n_rows + r
    pre = Prepass()
    if aux and isinstance(picks_E, torch.Tensor):
        pre.rows_all = distributed.total_tensor(torch.as_tensor(n_rows), ctx.dist).clamp(min=1)
        pre.f_E = distributed.total_tensor(picks_E, ctx.dist) / pre.rows_all
    if select is not None:
        _, _, c = batch.rows(rows, sampler=False).trimmed()
        m_bc, old_bc = mask_BC[rows][:, :c], old_logp_BC[rows][:, :c]
        w_bc = None if weights_BC is None else weights_BC[rows][:, :c]
        new_bc = logp_BC[rows][:, :c]
        if arm.off_policy_mask is not None:
            keep_bc = off_policy_weights(arm.off_policy_mask, StepStats(), batch, rows, new_bc, old_bc, adv_B, m_bc)
            w_bc = keep_bc if w_bc is None else w_bc * keep_bc
        params = {**arm.loss_params, **({} if arm.clip_dual is None else {"clip_dual": arm.clip_dual})}
        sel_bc = select(
            new_bc, old_bc, adv_B[rows], m_bc, clip_low=arm.clip_low, clip_high=arm.clip_high, weights_BC=w_bc, **params
        )
        pre.selected_BC = torch.zeros(mask_BC.shape, dtype=torch.bool, device=mask_BC.device)
        pre.selected_BC[rows, :c] = sel_bc
    return pre


def _sync(ctx, last: bool):
    """Around a micro-batch's forward and backward. DDP: gradients are all-reduced only in the
    last one's backward (`no_sync` before; each process holds whole gradients anyway). FSDP:
    every backward reduce-scatters, the shards accumulating the sum: FSDP2's
    `set_requires_gradient_sync(False)` would keep every layer's *unsharded* gradients until the
    last micro-batch, the whole model's gradients on each GPU (122 GB in fp32 for a 30 B model),
    which defeats sharding; the reduce-scatter of a sum is the sum of the reduce-scatters."""
    model = ctx.train_model or ctx.model
    if last or not ctx.dist.enabled or hasattr(model, "set_requires_gradient_sync"):  # FSDP2: sharded in place
        return contextlib.nullcontext()
    return model.no_sync()


def _denominator(ctx, mask_bc: torch.Tensor, split: bool = False) -> torch.Tensor | None:
    """What this rank divides its share of the mini-batch loss by: the global count (tokens
    or responses, by the arm's aggregation) / world size, since DDP averages gradients; in
    micro-batches (`split`), the whole mini-batch's count. A constant-length aggregation (Dr.
    GRPO) counts rows x rollout.max_new_tokens, not the mini-batch's trimmed width. None: the
    loss's own count (one process, one forward)."""
    agg = ctx.arm.aggregation
    max_len = ctx.spec.rollout.max_new_tokens if agg in CONSTANT_LENGTH else None
    if not ctx.dist.enabled and not split:
        return None if max_len is None else aggregation_count(mask_bc, agg, max_len)
    count = distributed.total(float(aggregation_count(mask_bc, agg, max_len)), ctx.dist)
    return torch.tensor(max(count, 1.0) / ctx.dist.world_size)


@contextlib.contextmanager
def _routing(ctx, old_routes, packing: Packing | None = None):
    """Around a mini-batch's forward and backward: with routing replay, `old_routes` (the
    mini-batch's (L, b, t, k), columns as its forward sees them) forced in
    every router (r2: pi_old's, r3: the rollout engine's; see old_policy.py); for any MoE, the
    experts the current routers choose themselves recorded (for volatility). Yields a Routes
    holder (`.routes` set on exit, in the forward's own layout: `packing`'s packed row when
    given), or None for a dense model."""
    if ctx.routing is None:
        yield None
    elif ctx.arm.routing_replay != "off":
        routes_LNk = routes_from_BT(old_routes) if packing is None else packing.routes_in(old_routes)
        with ctx.routing.replaying(routes_LNk) as rec:
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


def route_token_mask(batch: RolloutBatch) -> torch.Tensor:
    """(B, T) mask of the positions whose outputs are the response log-probs, where expert
    volatility is measured: position t predicts token t+1, so response token j (column P+j)
    is predicted at column P-1+j. Each row's last token predicts nothing a loss uses, and no
    engine routes it (generate never feeds the last sampled token back, vLLM's routed_experts
    stop one short), so it is left out; so is padding."""
    m = torch.zeros(batch.input_ids.shape, dtype=torch.bool, device=batch.response_mask.device)
    P = batch.prompt_len
    m[:, P - 1 : -1] = batch.model_mask > 0  # tool output: routed and replayed, not measured
    return m
