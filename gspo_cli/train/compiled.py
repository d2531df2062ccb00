"""Compiled updates (`train.compile`): the mini-batch forward and backward of the policy run
through `torch.compile` at a few bucketed widths, and the compiled code is cached on disk, so
only the first run with a given model and width pays for compiling.

What is compiled: the policy's decoder (`model.get_decoder()`, the stack of layers up to the
final norm), not the whole language model. The log-prob head (`rollout.response_logprobs`)
slices the hidden states at the batch's prompt width, a Python int a compiled graph would be
specialised on: compiled whole, every prompt width would be a new graph. The decoder's graph
depends only on the mini-batch's shape (rows, width), and the width is padded up to a multiple
of `train.compile_bucket` on the right (pad tokens with attention 0 and response mask 0: causal
attention and per-token routing leave every real position's output unchanged). Only the
update's forward uses it; generation and the no-grad passes run eagerly (a compiled decode step
did not pay on CPU and recompiled at every step: benchmarks/README.md).

Routing: the routers' forward hooks (RoutingController: recording, R2/R3 replay) are traced
into the graph; torch.compile guards on which mode is active, so a run compiles one graph per
(width, mode), not one per mini-batch, and routes, replay and log-probs equal eager's (tested).

The on-disk cache: inductor's FX graph cache and the AOTAutograd cache (both on by default in
torch 2.13), kept under `<GSPO_CACHE_DIR>/torch-compile` beside the built-in models instead of
the temporary directory (set TORCHINDUCTOR_CACHE_DIR to put it elsewhere). A later process
that meets the same graph (same model size and width) loads the compiled code instead of
compiling; tracing the model still takes a few seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from gspo_cli.models.builtin import cache_root

CACHE_SUBDIR = "torch-compile"
# Each new width is a recompilation of the same frame; torch gives up compiling (and runs that
# frame eagerly) after its recompile limit, 8 by default: too few for a run's widths x routing modes.
RECOMPILE_LIMIT = 64


def compile_cache_dir() -> Path:
    """The directory compiled artefacts are cached in: $TORCHINDUCTOR_CACHE_DIR when the user set
    it, else `<gspo cache>/torch-compile` (and TORCHINDUCTOR_CACHE_DIR is set to it, for inductor)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # Inductor writes its default into the environment the first time it looks (imports do):
    # that value is torch's choice, not the user's.
    if not path or os.path.abspath(path) == os.path.abspath(default_cache_dir()):
        path = str(cache_root() / CACHE_SUBDIR)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return Path(path)


class CompiledUpdate:
    """The compiled decoder of `model`, switched on around an update's forward (`active`)."""

    def __init__(self, model: torch.nn.Module, bucket: int):
        import torch._dynamo
        import torch._functorch.config
        import torch._inductor.config

        self.cache_dir = compile_cache_dir()
        torch._inductor.config.fx_graph_cache = True
        torch._functorch.config.enable_autograd_cache = True
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.bucket = bucket
        self.decoder = model.get_decoder()
        # nn.Module.__call__ runs `_compiled_call_impl` when one is set (what Module.compile()
        # sets): the module, its parameter names and its state dict stay exactly as they were.
        self._fn = torch.compile(self.decoder._call_impl, dynamic=False)
        self.widths: set[int] = set()  # widths seen so far (each compiled once per routing mode)

    @contextlib.contextmanager
    def active(self):
        """Forwards of the decoder inside run compiled; outside (generation, no-grad passes), eager."""
        self.decoder._compiled_call_impl = self._fn
        try:
            yield
        finally:
            self.decoder._compiled_call_impl = None

    def width(self, T: int) -> int:
        """`T` rounded up to a multiple of the bucket."""
        return -(-T // self.bucket) * self.bucket

    def pad(self, batch, routes_LbTk: torch.Tensor | None):
        """`batch` (a RolloutBatch of b rows, width T = P + C) and its routes (L, b, T, k) or None,
        padded on the right to width `self.width(T)`: token 0 with attention 0 and response mask
        0; routes repeat the last column (any experts do: nothing real attends to those
        positions). Positions come from the attention mask, so real tokens keep theirs."""
        T = batch.input_ids.shape[1]
        extra = self.width(T) - T
        self.widths.add(T + extra)
        if not extra:
            return batch, routes_LbTk
        padded = dataclasses.replace(
            batch,
            input_ids=F.pad(batch.input_ids, (0, extra)),
            attention_mask=F.pad(batch.attention_mask, (0, extra)),
            response_mask=F.pad(batch.response_mask, (0, extra)),
            tool_mask=None if batch.tool_mask is None else F.pad(batch.tool_mask, (0, extra)),
        )
        if routes_LbTk is not None:
            routes_LbTk = torch.cat([routes_LbTk, routes_LbTk[:, :, -1:].expand(-1, -1, extra, -1)], dim=2)
        return padded, routes_LbTk


def unpad_routes(routes_LNk: torch.Tensor | None, rows: int, T: int) -> torch.Tensor | None:
    """Routes (L, rows x T', k) of a forward over a batch padded to width T' >= T, as
    (L, rows x T, k): the padding columns dropped."""
    if routes_LNk is None or routes_LNk.shape[1] == rows * T:
        return routes_LNk
    L, N, k = routes_LNk.shape
    return routes_LNk.reshape(L, rows, N // rows, k)[:, :, :T].reshape(L, rows * T, k)


def compiled_context(compiled: CompiledUpdate | None):
    """`compiled.active()`, or nothing when the update is not compiled."""
    return compiled.active() if compiled is not None else contextlib.nullcontext()
