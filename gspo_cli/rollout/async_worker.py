"""A rollout worker in its own process, for off-policy training (rollout.staleness k >= 1).

The trainer keeps up to k requests outstanding; the worker answers them in order:

- trainer: writes its weights (policy version v) into slot v % k of `shared` (k state dicts in
  shared memory, allocated once), never into a slot an outstanding request still reads, then
  sends ("sample", step, version, prompts, check, slot);
- worker: copies slot `slot` into its own model, seeds torch from (seed, step), samples with
  the hf engine (or a vLLM server, which its engine pushes these weights to first), completes
  pi_old (log-probs, entropy, MoE routes) from one full forward of the same weights when the
  sampler did not return them, adds the log-prob check when `check` (a full forward against
  generate's log-probs; a server's log-probs against pi_old's forward), and answers
  ("ok", step, version, batch, seconds);
- any failure in the worker answers ("error", message); ("stop",) ends it.

The worker ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the trainer
decides when to stop and then stops the worker) and dies with its parent (PR_SET_PDEATHSIG),
so it is never left behind, even when the trainer is killed with SIGKILL.

Memory: k copies of the weights in shared memory (k = rollout.staleness), one per policy
version that an outstanding request may still read: the request for step s + k is made with
the weights of version s - 1 while those of versions s - k .. s - 2 wait to be read.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Any

import torch

from gspo_cli.errors import RunError
from gspo_cli.spawned import child_signals, requests_until_stop, starting_child

# How often (s) a waiting side checks that the other is still alive.
POLL_S = 0.5
# Seeds per step of a run: generation at step k of seed s is seeded s * STRIDE + k.
SEED_STRIDE = 1_000_003
# How long (s) `close` lets the worker finish the batch it is sampling before terminating it.
STOP_TIMEOUT_S = 30


def sample_seed(seed: int, step: int) -> int:
    """The torch seed the worker samples the batch of training step `step` with: a function of
    (run seed, step) only, so a resumed run samples exactly what an uninterrupted one did."""
    return seed * SEED_STRIDE + step


@dataclass(frozen=True)
class WorkerArgs:
    source: str  # HF model directory the worker builds its model from (weights come from `shared`)
    model_cfg: Any  # ModelConfig
    rollout_cfg: Any  # RolloutConfig
    seed: int
    threads: int  # torch threads of the worker process
    micro_batch: tuple = (None, None)  # train.micro_batch_tokens, micro_batch_rows: its full forwards
    packed: bool = False  # train.packing as the trainer resolved it: its full forwards packed


class AsyncSampler:
    """Client side: starts the worker (spawn), hands it weights and prompts, collects batches.

    `weights`: the trainer model's state dict (name -> tensor); `slots` shared-memory copies of
    the same shapes are allocated once and refreshed by `publish`. Use as a context manager, or
    call `close()`: the worker is always stopped, and killed if it does not stop."""

    def __init__(self, args: WorkerArgs, weights: dict[str, torch.Tensor], slots: int = 1):
        self.slots = max(1, slots)
        self.shared = [
            {k: v.detach().to("cpu", copy=True).share_memory_() for k, v in weights.items()} for _ in range(self.slots)
        ]
        mp = torch.multiprocessing.get_context("spawn")
        self.requests, self.results = mp.Queue(), mp.Queue()
        self.proc = mp.Process(
            target=_worker_main,
            args=(args, self.shared, self.requests, self.results),
            name="gspo-rollout-worker",
            daemon=True,  # belt and braces: multiprocessing also ends it at interpreter exit
        )
        with starting_child():
            self.proc.start()
        self.outstanding: list[tuple[int, int]] = []  # (step, slot) of each request, oldest first

    def slot(self, version: int) -> int:
        return version % self.slots

    def publish(self, weights: dict[str, torch.Tensor], version: int = 0) -> None:
        """Copy `weights` (policy `version`) into its slot of shared memory; never into a slot
        an outstanding request still reads (the worker reads a slot only while it serves one)."""
        slot = self.slot(version)
        if any(s == slot for _, s in self.outstanding):
            raise RuntimeError(f"AsyncSampler.publish into slot {slot}, which an outstanding request reads")
        with torch.no_grad():
            for name, t in weights.items():
                self.shared[slot][name].copy_(t.detach())

    def request(self, step: int, version: int, prompts: list[str], check: bool) -> None:
        """Ask for training step `step`'s batch from the weights published as `version`."""
        if len(self.outstanding) >= self.slots:
            raise RuntimeError(f"AsyncSampler.request with {self.slots} requests outstanding already")
        slot = self.slot(version)
        self.outstanding.append((step, slot))
        self.requests.put(("sample", step, version, list(prompts), bool(check), slot))

    def wait(self):
        """(batch, version, generation seconds, step) of the oldest outstanding request. A worker
        that failed or died is a RunError, never a hang."""
        if not self.outstanding:
            raise RuntimeError("AsyncSampler.wait without a request")
        while True:
            try:
                msg = self.results.get(timeout=POLL_S)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RunError(
                        f"rollout worker (rollout.staleness) exited unexpectedly with code {self.proc.exitcode}"
                    ) from None
                continue
            if msg[0] == "ready":
                continue
            if msg[0] == "error":
                raise RunError(f"rollout worker (rollout.staleness) failed: {msg[1]}")
            _, step, version, batch, seconds = msg
            expected = self.outstanding[0][0]
            if step != expected:
                raise RuntimeError(f"rollout worker answered step {step}, expected {expected}")
            self.outstanding.pop(0)
            return batch, version, seconds, step

    def close(self) -> None:
        """Stop the worker: ask, then terminate, then kill; returns once it is gone."""
        if self.proc.is_alive():
            try:
                self.requests.put(("stop",))
            except (ValueError, OSError):  # queue already closed
                pass
            # A batch still being sampled is put on `results` before the worker reads "stop";
            # reading it lets the worker's queue flush, so that it can exit.
            deadline = time.time() + STOP_TIMEOUT_S
            while self.proc.is_alive() and time.time() < deadline:
                try:
                    self.results.get(timeout=POLL_S)
                except (queue.Empty, OSError, EOFError):
                    pass
            self.proc.join(timeout=POLL_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        # Messages the worker left unread must not block this process's exit.
        self.requests.cancel_join_thread()
        self.requests.close()
        self.results.close()

    def __enter__(self) -> "AsyncSampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Worker process


def _worker_main(args: WorkerArgs, shared: dict, requests, results) -> None:
    child_signals()
    try:
        torch.set_num_threads(args.threads)
        sampler = _WorkerSampler(args)
        results.put(("ready",))
        for msg in requests_until_stop(requests, POLL_S):
            _, step, version, prompts, check, slot = msg
            t = time.time()
            batch = sampler.sample(shared[slot], step, prompts, check)
            results.put(("ok", step, version, batch, time.time() - t))
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the trainer as one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        results.put(("error", f"{type(err).__name__}: {first}"))


class _WorkerSampler:
    """The worker's own model (float32 master copy, as the trainer's) and hf engine."""

    def __init__(self, args: WorkerArgs):
        from gspo_cli.models import compute_context, load_model
        from gspo_cli.models.routing import RoutingController, UnsupportedRoutingError
        from gspo_cli.rollout import make_engine

        lm = load_model(args.source, args.model_cfg)
        self.model = lm.model.eval().requires_grad_(False)
        self.routing = None
        if lm.is_moe:
            try:
                self.routing = RoutingController(self.model)
            except UnsupportedRoutingError:
                pass  # the trainer refused any replay already; nothing to record
        self.engine = make_engine(
            args.rollout_cfg,
            self.model,
            lm.tokenizer,
            model_dir=lm.source,
            dtype=args.model_cfg.dtype,
            seed=args.seed,
            routing=self.routing,
        )
        self.temperature = args.rollout_cfg.temperature
        self.seed = args.seed
        self.micro_batch = args.micro_batch
        self.packed = args.packed
        self.compute = lambda: compute_context(args.model_cfg.dtype, args.model_cfg.device)

    @torch.no_grad()
    def sample(self, shared: dict, step: int, prompts: list[str], check: bool):
        from gspo_cli.rollout.micro_batches import forward_logprobs

        def forward(**kw):  # one full forward of these weights, in micro-batches (train.micro_batch_*)
            return forward_logprobs(
                self.model, batch, self.temperature, *self.micro_batch, routing=self.routing, packed=self.packed, **kw
            )

        for name, t in self.model.state_dict().items():
            t.copy_(shared[name])
        torch.manual_seed(sample_seed(self.seed, step))
        with self.compute():
            batch = self.engine.generate(prompts)  # a vllm-server engine pushes these weights first
            served = batch.engine_logp if batch.engine_entropy is None else None  # a server's own
            incomplete = batch.engine_logp is None or batch.engine_entropy is None
            if incomplete or (self.routing is not None and batch.engine_routes is None):
                # generate read no log-probs (sampler_logprobs off): pi_old
                # from one full forward of these same weights, routes recorded in it.
                old, routes = forward(with_entropy=True, record=self.routing is not None)
                if routes is not None:
                    batch.engine_routes = routes
                batch.engine_logp = old.logp * batch.response_mask
                batch.engine_entropy = old.entropy * batch.response_mask
            if check:
                # The sampler's log-probs against one full forward of the same weights: a
                # server's (then pi_old is the forward above, as for a colocated vLLM), or generate's.
                full = forward()[0].logp if served is None else served
                batch.check_logp = full
        return batch
