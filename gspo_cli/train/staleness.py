"""Off-policy training by k steps (rollout.staleness: k >= 1): the step recipe with an async sampler.

A worker process (rollout/async_worker.py) samples ahead: while step s trains, the batches of
steps s+1 .. s+k are in flight or done, and the one of step s+k was requested at the start of
step s from the weights after step s-1. Policy versions count finished steps, so the batch
trained at step s (by the weights of version s-1) was sampled by version s-1-k: k versions
stale (`rollout/staleness`, `_mean`, `_max`) once warmed up; steps 1..k train batches sampled
by the initial weights (lag 0..k-1). Each row's version is in samples.jsonl (`policy_version`).

pi_old for that batch is the policy that sampled it: its log-probs, entropy and MoE routes
come from the worker (generate's own forward passes, or one full forward of the same stale
weights), so ratios, clipping and routing replay (r2/r3) are taken against the sampler, unless
the arm's `anchor` is `proximal` (train/step.py: the trainer's own forward of the weights
before this step's first update, the sampler's log-probs then only weigh the loss). On
logprob-check steps the worker also runs a full forward of the stale weights, and the trainer
compares the sampler's log-probs with that, not with its own current weights. The KL
reference (kl_coef) is the initial model, as with staleness 0.

A checkpoint after step s holds the batches pre-sampled for steps s+1 .. s+k (and the problems
they answer): a resumed run trains exactly what an uninterrupted one would, and the worker's
sampling is seeded by (seed, step) alone.

Scoring overlaps the update: one thread of the trainer per pre-sampled batch waits for it and
scores it (in the reward pool, or in that thread when rewards run in the trainer) while earlier
steps train; one batch is scored at a time (a reward function is never called from two threads
at once), so a reward slower than a step still bounds the pace. A checkpoint holds the batches,
not their scores: a resumed run scores them again (exact for a deterministic reward; a
non-deterministic one, an LLM judge, makes resume inexact).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from gspo_cli.errors import RunError, SpecError
from gspo_cli.rollout.async_worker import POLL_S, AsyncSampler, WorkerArgs
from gspo_cli.rollout.base import RolloutBatch, check_due
from gspo_cli.spec import ExperimentSpec
from gspo_cli.train.step import Ctx, learn

CHECKPOINT_KEY = "pending_rollout"


def check_supported(spec: ExperimentSpec, processes: int) -> None:
    """SpecError (exit 2) where staleness is not built: several processes (torchrun)."""
    if spec.rollout.staleness and processes > 1:
        raise SpecError(
            f"rollout.staleness: {spec.rollout.staleness} is not supported with several processes (torchrun) yet "
            "(the sampler is one worker process beside one trainer); use staleness 0, or one process"
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

    def __init__(self, ctx: Ctx, *, source: str, seed: int, pending: list | dict | None = None):
        self.steps = ctx.spec.train.steps
        self.k = ctx.spec.rollout.staleness
        if isinstance(pending, dict):  # a checkpoint of staleness 1 from before several were held
            pending = [pending]
        self.queue: list[Pending] = [Pending(**p) for p in pending or []]  # requested, oldest first
        self.scoring: dict[int, _Scored] = {}  # step -> the thread fetching and scoring its batch
        self.answers = threading.Condition()  # the scoring threads take the worker's answers in turn
        self.failed: BaseException | None = None  # what the worker's answers raised, for every thread
        self.scoring_lock = threading.Lock()  # the batches are scored one at a time
        self.published: int | None = None  # the policy version last copied to the worker
        self.requested = self.queue[-1].step if self.queue else 0  # the last step whose batch was requested
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
        self.sampler = AsyncSampler(args, ctx.model.state_dict(), slots=self.k)  # the last thing that can fail
        torch.set_num_threads(trainer_threads)
        for item in self.queue:  # resumed: the checkpoint's batches are scored again, starting now
            self.scoring[item.step] = _Scored(self, ctx, item)

    def step(self, ctx: Ctx, step: int) -> dict:
        t0 = time.time()
        sync_s = 0.0
        if not self.queue:  # nothing sampled ahead: the first step; k batches from the initial weights
            sync_s += self._fill(ctx, step, last=min(step + self.k - 1, self.steps))
        item, scores, score_s = self._collect(step)
        wait_s = time.time() - t0 - sync_s
        # sample (and score) step + k's batch while this one trains, from the weights of version step - 1
        sync_s += self._fill(ctx, step, last=min(step + self.k, self.steps))
        batch = item.batch
        times = {
            "time/rollout_s": item.rollout_s,
            "time/score_s": score_s,  # in the scoring thread, overlapped with earlier updates
            "time/weight_sync_s": sync_s,
            "perf/rollout_wait_s": wait_s,
        }
        metrics = learn(ctx, batch, scores, step, times=times, t0=t0)
        lag = (step - 1) - item.version  # every row of the batch was sampled by the same version
        metrics["rollout/staleness"] = lag
        metrics["rollout/staleness_mean"] = float(lag)
        metrics["rollout/staleness_max"] = lag
        for record in ctx.samples:  # samples.jsonl: the policy version that sampled each row
            record["policy_version"] = item.version
        return metrics

    def checkpoint_state(self) -> dict:
        """What a checkpoint after the current step must hold: the batches pre-sampled for the
        next steps (waiting for the worker to finish them), oldest first, or nothing after the
        last step."""
        if not self.queue:
            return {}
        for item in self.queue:  # scored too: a failing reward fails this step, as without staleness
            self.scoring[item.step].result()
        return {CHECKPOINT_KEY: [vars(item).copy() for item in self.queue]}

    def _fill(self, ctx: Ctx, step: int, last: int) -> float:
        """Request every batch up to step `last` not yet requested, from the current weights
        (policy version step - 1); the seconds spent copying the weights to the worker."""
        first = max(step, self.requested + 1)
        if first > last:
            return 0.0
        version = step - 1
        t = time.time()
        if self.published != version:
            self.sampler.publish(ctx.model.state_dict(), version)
            self.published = version
        sync_s = time.time() - t
        G = ctx.spec.rollout.group_size
        for s in range(first, last + 1):
            problems = ctx.task.train_problems(ctx.rng, ctx.spec.rollout.prompts_per_step)
            check = check_due(ctx.spec.rollout.logprob_check_every, s)
            self.sampler.request(s, version, [p.prompt for p in problems for _ in range(G)], check)
            item = Pending(step=s, version=version, problems=problems)
            self.queue.append(item)
            self.requested = s
            self.scoring[s] = _Scored(self, ctx, item)
        return sync_s

    def _fetch(self, item: Pending) -> None:
        """item's batch, waited for if the worker is still sampling it (a scoring thread's). The
        worker answers in order: the thread of the oldest batch not yet read reads the next
        answer, the others wait for theirs; a failure reaches every waiting thread."""
        with self.answers:
            while item.batch is None:
                if self.failed is not None:
                    raise self.failed
                oldest = next((p for p in list(self.queue) if p.batch is None), item)
                if oldest is not item:
                    self.answers.wait(timeout=POLL_S)
                    continue
                try:
                    batch, version, seconds, step = self.sampler.wait()
                except BaseException as err:
                    self.failed = err
                    raise
                finally:
                    self.answers.notify_all()
                assert (step, version) == (item.step, item.version), (step, version, item.step, item.version)
                item.batch, item.rollout_s = batch, seconds

    def _collect(self, step: int) -> tuple[Pending, list, float]:
        """(the batch of step `step`, its scores, seconds its scoring took), waited for."""
        item = self.queue[0]
        assert item.step == step, (item.step, step)
        scores, seconds = self.scoring[step].result()
        self.queue.pop(0)
        del self.scoring[step]
        return item, scores, seconds

    def close(self) -> None:
        self.failed = self.failed or RunError("rollout worker stopped")  # threads still waiting end
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
            with stale.scoring_lock:  # one batch at a time: a user's reward need not be thread-safe
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
