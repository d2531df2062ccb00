"""Common random numbers for in-run evaluations.

Every in-run evaluation samples from random numbers fixed by (run seed, step, evaluation set)
alone: two arms at the same seed and step draw their evaluation samples with the same random
numbers, whatever training did before, so the difference of their scores is not blurred by
sampling luck that differs between them. Training's random state after an evaluation is
exactly what it was before it: the torch generators (CPU, and the current CUDA device) are
saved, reseeded for the evaluation and restored (`torch.random.fork_rng`), so training never
depends on how many numbers an evaluation drew.

What each engine makes of it:

- hf: samples with torch's global generators, so its evaluation draws are fixed by the seed.
- vllm on a GPU: each request gets its own seed (`SamplingParams.seed`), derived from the
  evaluation seed and the row; vllm on CPU cannot take per-request seeds (it fails with them),
  so there the engine's own generator, seeded once at start, keeps running through training
  and evaluations: step-0 evaluations coincide between arms, later ones do not.
- vllm-server: sampled in another process; as vllm on CPU, no per-evaluation seeds.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator


def eval_seed(run_seed: int, step: int, set_name: str) -> int:
    """The seed of the evaluation of set `set_name` at `step` of a run seeded `run_seed`: a hash of
    the three (63 bits), so sets and steps never share draws and arms at equal seed always do."""
    digest = hashlib.sha256(f"eval:{run_seed}:{step}:{set_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@contextlib.contextmanager
def fixed_draws(engine, seed: int) -> Iterator[None]:
    """Inside the block `engine` samples with random numbers fixed by `seed`; torch's generators
    (CPU and the current CUDA device) are restored afterwards, as if nothing had been drawn.
    An engine that takes per-request seeds (vllm on a GPU: `takes_request_seeds`) is given `seed`
    for the block (`seed_requests`)."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    takes = getattr(engine, "takes_request_seeds", False)
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)  # the current device only
        if takes:
            engine.seed_requests(seed)
        try:
            yield
        finally:
            if takes:
                engine.seed_requests(None)
