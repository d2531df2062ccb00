"""How a step's rollout batch is split into mini-batches, on one process and under torchrun.

One process permutes its rows and cuts the permutation into `mini_batches` chunks. Under
torchrun every rank holds a contiguous share of whole groups and does the same over its own
rows, with the same generator state (the run's seed) on every rank, so it draws the same
permutation of local positions: mini-batch j of the step is the union, over ranks, of the
rows at the same local positions. What is therefore equal to one process:
- with one mini-batch: everything (the gradient and every metric; tests/test_distributed.py);
- with several: the number of updates, their sizes, each update's gradient and metrics *given
  the same rows*: a one-process run whose split is `ddp_equivalent_rows` reproduces a
  W-process run exactly (test_distributed.py's multi-mini-batch test). A plain one-process
  run with the same seed draws a permutation of the whole batch instead, so its mini-batches
  hold other rows: same distribution of splits, not the same numbers.
"""

from __future__ import annotations

import torch


def minibatch_rows(n_rows: int, mini_batches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """This process's row indices of each mini-batch: a permutation of range(n_rows) in
    `mini_batches` chunks (one draw from `generator`)."""
    return list(torch.randperm(n_rows, generator=generator).chunk(mini_batches))


def ddp_equivalent_rows(n_rows: int, mini_batches: int, generator: torch.Generator, world: int) -> list[torch.Tensor]:
    """On one process holding the whole batch (`n_rows` = world x a rank's rows): the rows a
    `world`-process run puts in each mini-batch (see the module docstring); same generator use
    as `minibatch_rows`, so it can stand in for it."""
    if n_rows % world:
        raise ValueError(f"{n_rows} rows do not split over {world} processes")
    n = n_rows // world
    chunks = torch.randperm(n, generator=generator).chunk(mini_batches)
    return [torch.cat([r * n + c for r in range(world)]) for c in chunks]
