"""One-step-off-policy training (rollout.staleness: 1): the step recipe with an async sampler.

While step k trains, a worker process (rollout/async_worker.py) samples step k+1's batch
from the weights after step k-1; step 1's batch is sampled first, from the initial weights.
Policy versions count finished steps: the batch trained at step k+1 (by the weights of
version k) was sampled by version k-1, one version stale (`rollout/staleness`).

pi_old for that batch is the policy that sampled it: its log-probs, entropy and MoE routes
come from the worker (generate's own forward passes, or one full forward of the same stale
weights), so ratios, clipping and routing replay (r2/r3) are taken against the sampler. On
logprob-check steps the worker also runs a full forward of the stale weights, and the
trainer compares the sampler's log-probs with that, not with its own current weights. The
KL reference (kl_coef) is the initial model, as with staleness 0.

A checkpoint after step k holds the batch pre-sampled for step k+1 (and the problems it
answers): a resumed run trains exactly what an uninterrupted one would, and the worker's
sampling is seeded by (seed, step) alone.

Scoring overlaps the update: a thread of the trainer waits for each pre-sampled batch and
scores it (in the reward pool, or in that thread when rewards run in the trainer) while step
k trains. A checkpoint holds the batch, not its scores: a resumed run scores it again (exact
for a deterministic reward; a non-deterministic one, an LLM judge, makes resume inexact).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from gspo_cli.errors import SpecError
from gspo_cli.rollout.async_worker import AsyncSampler, WorkerArgs
from gspo_cli.rollout.base import RolloutBatch, check_due
from gspo_cli.spec import ExperimentSpec
from gspo_cli.train.step import Ctx, learn

CHECKPOINT_KEY = "pending_rollout"


def check_supported(spec: ExperimentSpec, processes: int) -> None:
    """SpecError (exit 2) where staleness 1 is not built: several processes (torchrun)."""
    if spec.rollout.staleness and processes > 1:
        raise SpecError(
            "rollout.staleness: 1 is not supported with several processes (torchrun) yet; "
            "use staleness 0, or one process"
        )
    if spec.task.environment:  # the user's file loads (or is refused) before any model is built
        check_environment(spec, processes)


def check_environment(spec: ExperimentSpec, processes: int) -> None:
    """SpecError in one line for an environment that cannot be loaded, or with FSDP's synced generation."""
    from gspo_cli.environments import resolve_environment

    resolve_environment(spec.task.environment, spec.task.environment_params)
    if processes > 1 and spec.model.sharding == "fsdp":
        raise SpecError("task.environment: not supported with model.sharding: fsdp (synced generation) yet")


def split_threads(total: int) -> tuple[int, int]:
    """(trainer, worker) torch threads out of `total`: half each, at least one."""
    worker = max(1, total // 2)
    return max(1, total - worker), worker


@dataclass
class Pending:
    """A batch sampled ahead: for training step `step`, by policy `version`."""

    step: int
    version: int
    problems: list  # the Problems its prompts came from (G rows each)
    batch: RolloutBatch | None = None  # None while the worker is still sampling it
    rollout_s: float = 0.0  # the worker's generation time


class StaleRollouts:
    """Pre-samples each step's batch in a worker process; `step(ctx, k)` replaces
    step.train_step. `pending`: what a checkpoint held (`checkpoint_state`), or None.
    Always `close()` it (or use `with`): the worker is stopped and torch's thread count restored."""

    def __init__(self, ctx: Ctx, *, source: str, seed: int, pending: dict | None = None):
        self.steps = ctx.spec.train.steps
        self.next: Pending | None = Pending(**pending) if pending else None
        self.scoring: _Scored | None = None  # the thread fetching and scoring self.next
        self.threads_before = torch.get_num_threads()
        trainer_threads, worker_threads = split_threads(self.threads_before)
        args = WorkerArgs(
            source=source,
            model_cfg=ctx.spec.model,
            rollout_cfg=ctx.spec.rollout,
            seed=seed,
            threads=worker_threads,
            micro_batch=(ctx.spec.train.micro_batch_tokens, ctx.spec.train.micro_batch_rows),
            packed=ctx.packed,
        )
        self.sampler = AsyncSampler(args, ctx.model.state_dict())  # the last thing that can fail
        torch.set_num_threads(trainer_threads)
        if self.next is not None:  # resumed: the checkpoint's batch is scored again, starting now
            self.scoring = _Scored(self, ctx, self.next)

    def step(self, ctx: Ctx, step: int) -> dict:
        t0 = time.time()
        if self.next is None:  # nothing sampled ahead: the first step
            self.next, _ = self._request(ctx, step, version=step - 1)
        item, scores, score_s = self._collect()
        self.next, self.scoring = None, None
        wait_s = time.time() - t0
        sync_s = 0.0
        if step < self.steps:  # sample (and score) the next step's batch while this one trains
            self.next, sync_s = self._request(ctx, step + 1, version=step - 1)
        batch = item.batch
        times = {
            "time/rollout_s": item.rollout_s,
            "time/score_s": score_s,  # in the scoring thread, overlapped with the previous update
            "time/weight_sync_s": sync_s,
            "perf/rollout_wait_s": wait_s,
        }
        metrics = learn(ctx, batch, scores, step, times=times, t0=t0)
        metrics["rollout/staleness"] = (step - 1) - item.version
        return metrics

    def checkpoint_state(self) -> dict:
        """What a checkpoint after the current step must hold: the batch pre-sampled for the
        next step (waiting for the worker to finish it), or nothing after the last step."""
        if self.next is None:
            return {}
        item = self._collect()[0]  # scored too: a failing reward fails this step, as without staleness
        return {CHECKPOINT_KEY: vars(item).copy()}

    def _request(self, ctx: Ctx, step: int, version: int) -> tuple[Pending, float]:
        """(the request for step `step`'s batch, seconds spent copying the weights to the worker)."""
        problems = ctx.task.train_problems(ctx.rng, ctx.spec.rollout.prompts_per_step)
        G = ctx.spec.rollout.group_size
        t = time.time()
        self.sampler.publish(ctx.model.state_dict())  # the worker is idle: nothing outstanding
        sync_s = time.time() - t
        check = check_due(ctx.spec.rollout.logprob_check_every, step)
        self.sampler.request(step, version, [p.prompt for p in problems for _ in range(G)], check)
        item = Pending(step=step, version=version, problems=problems)
        self.scoring = _Scored(self, ctx, item)
        return item, sync_s

    def _fetch(self, item: Pending) -> None:
        """item's batch, waited for if the worker is still sampling it (the scoring thread's)."""
        if item.batch is None:
            item.batch, version, item.rollout_s = self.sampler.wait()
            assert version == item.version, (version, item.version)

    def _collect(self) -> tuple[Pending, list, float]:
        """(self.next, its scores, seconds its scoring took), waited for."""
        scores, seconds = self.scoring.result()
        return self.next, scores, seconds

    def close(self) -> None:
        try:
            self.sampler.close()  # a scoring thread waiting for the worker then fails and ends
        finally:
            torch.set_num_threads(self.threads_before)

    def __enter__(self) -> "StaleRollouts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Scored:
    """A daemon thread that waits for `item`'s batch, then scores it (`result()` joins it and
    raises what it raised: a reward's RunError, the worker's)."""

    def __init__(self, stale: StaleRollouts, ctx: Ctx, item: Pending):
        self.out: dict = {}
        self.thread = threading.Thread(target=self._run, args=(stale, ctx, item), name="gspo-scoring", daemon=True)
        self.thread.start()

    def _run(self, stale: StaleRollouts, ctx: Ctx, item: Pending) -> None:
        try:
            stale._fetch(item)
            t = time.time()
            G = ctx.spec.rollout.group_size
            batch = item.batch
            rows = [item.problems[i // G] for i in range(len(batch.completions))]
            scores = ctx.task.score_rollout(rows, batch.completions, batch.completion_ids, item.step)
            self.out["value"] = (scores, time.time() - t)
        except BaseException as err:  # noqa: BLE001 - raised again in the trainer's thread
            self.out["error"] = err

    def result(self) -> tuple[list, float]:
        while self.thread.is_alive():
            self.thread.join(timeout=0.5)  # a short join: Ctrl-C still reaches the trainer
        if "error" in self.out:
            raise self.out["error"]
        return self.out["value"]
