"""Routing replay (R2) for Hugging Face mixture-of-experts models.

Router detection. A module is taken as an MoE router when (a) it is the ``.gate`` or
``.router`` attribute of its parent, or its class name ends in ``Router``; (b) it has an
integer ``top_k``; and (c) it has a 2-D parameter (the (E, H) routing matrix). Every
candidate is then *probed*: it is called once (eval mode, no grad) on random hidden states
and must return ``(logits (N, E), scores (N, k), indices (N, k) int)`` where ``scores`` is
one of the rules in ``_RULES`` applied to ``logits`` and gathered at ``indices``::

    act(logits.float()).gather(indices)  [/ sum over the k slots]  [* routed_scaling_factor]

with ``act`` softmax or sigmoid.  This covers (transformers 5.x) Qwen2-MoE, Qwen3-MoE,
Qwen3-Next, Mixtral, MiniMax, OLMoE, FlexOlmo, GPT-OSS and GraniteMoE (softmax over the
top-k logits equals renormalised full softmax), DeepSeek-V2 (greedy) and DeepSeek-V3 /
GLM4-MoE (sigmoid; the correction bias only affects the choice, not the weights).
Routers that return something else (Llama4 returns 2 tensors, DBRX only logits) or whose
weights are not a function of the logits alone (Phi-MoE's sparsemixer) fail the probe and
raise :class:`UnsupportedRoutingError`, as does a model without any router (dense).
Verifying the contract numerically is more robust than a class-name allow-list: new
architectures that keep the contract work, ones that silently change it are refused.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import torch
from torch import nn

from gspo_cli.algorithms.precision import upcast

__all__ = [
    "UnsupportedRoutingError",
    "Routes",
    "RoutingController",
    "routes_to_BT",
    "routes_from_BT",
    "routes_from_generate",
    "expert_change_frac",
    "moe_layer_indices",
    "decoder_layer_ids",
]

# (activation, renormalise over the k slots); the router's routed_scaling_factor (default 1)
# is tried on top.  Order = preference when several rules fit the probe equally well.
_RULES = [("softmax", True), ("softmax", False), ("sigmoid", True), ("sigmoid", False)]


class UnsupportedRoutingError(ValueError):
    """The model has no router following the (logits, scores, indices) contract."""


class Routes:
    """Holder yielded by :meth:`RoutingController.recording`; ``.routes`` is set on exit."""

    def __init__(self, num_layers: int):
        self._per_layer: list[torch.Tensor | None] = [None] * num_layers
        self.routes: torch.LongTensor | None = None


def _rescore(rule, logits, idx, scale):
    act, renorm = rule
    probs = upcast(logits).softmax(-1) if act == "softmax" else upcast(logits).sigmoid()
    w = probs.gather(-1, idx)
    if renorm:
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-20)
    return w * scale


class RoutingController:
    """Attach forward hooks to every MoE router of ``model``.

    Hooks are no-ops unless a :meth:`recording` or :meth:`replaying` context is active, so
    ``model.generate`` and plain forwards are unaffected.  The two contexts may be nested
    (``with ctl.replaying(r): with ctl.recording() as rec:``): the recorded indices are then
    those the experts actually received, i.e. the replayed ones.
    """

    def __init__(self, model: nn.Module):
        name = type(model).__name__
        self.routers: list[nn.Module] = []
        self._rules: list[tuple] = []
        experts, top_ks, names = set(), set(), []
        for qual, mod in model.named_modules():
            leaf = qual.rsplit(".", 1)[-1]
            if not (leaf in ("gate", "router") or type(mod).__name__.endswith("Router")):
                continue
            if any(qual.startswith(n + ".") for n in names):  # inside a router (a LoRA wrapper's original)
                continue
            top_k = getattr(mod, "top_k", None)
            if not isinstance(top_k, int) or isinstance(top_k, bool):
                continue
            if next((p for p in mod.parameters() if p.dim() == 2), None) is None:
                continue
            with _whole_parameters(mod):
                mat = next(p for p in mod.parameters() if p.dim() == 2)
                rule, n_exp = self._probe(mod, mat, top_k, name)
            self.routers.append(mod)
            names.append(qual)
            self._rules.append(rule)
            experts.add(n_exp)
            top_ks.add(top_k)
        if not self.routers:
            raise UnsupportedRoutingError(
                f"{name}: no MoE router returning (logits, scores, indices) found "
                "(dense model or unsupported MoE); routing replay unsupported"
            )
        if len(top_ks) != 1 or len(experts) != 1:
            raise UnsupportedRoutingError(
                f"{name}: routers disagree on top_k {sorted(top_ks)} / experts {sorted(experts)}"
            )
        self.num_layers, self.top_k, self.num_experts = len(self.routers), top_ks.pop(), experts.pop()
        # Which decoder layer each router sits in (dense layers have none): how engines that
        # report routes per decoder layer (vLLM) map onto our L routers.
        self.decoder_layers = decoder_layer_ids(names, getattr(model, "config", None))
        self._record: Routes | None = None
        self._replay: torch.Tensor | None = None
        self._natural: Routes | None = None
        self._steps: list[list[torch.Tensor]] | None = None
        self._handles = [r.register_forward_hook(self._make_hook(i)) for i, r in enumerate(self.routers)]

    @staticmethod
    def _probe(mod: nn.Module, mat: torch.Tensor, top_k: int, name: str):
        """Call the router once and find the score rule reproducing its weights."""
        cls = type(mod).__name__
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(16, mat.shape[-1], generator=gen).to(mat.device, mat.dtype)
        was_training, saved = mod.training, None
        try:
            mod.eval()
            with torch.no_grad():
                out = mod(x)
                if torch.is_tensor(out[0]) and float(out[0].float().std(-1).max()) < 1e-6:
                    # all-equal logits (e.g. zero-initialised router) cannot tell the rules
                    # apart: probe once more with a temporary random routing matrix
                    saved = mat.detach().clone()
                    mat.copy_(torch.randn(mat.shape, generator=gen).to(mat))
                    out = mod(x)
        except Exception as e:  # noqa: BLE001 - any failure means the contract is not met
            raise UnsupportedRoutingError(f"{name}: router {cls} cannot be probed ({e})") from e
        finally:
            mod.train(was_training)
            if saved is not None:
                with torch.no_grad():
                    mat.copy_(saved)
        ok = (
            isinstance(out, tuple)
            and len(out) == 3
            and all(torch.is_tensor(t) for t in out)
            and out[0].dim() == 2
            and out[1].shape == out[2].shape == (out[0].shape[0], top_k)
            and not out[2].is_floating_point()
        )
        if not ok:
            raise UnsupportedRoutingError(f"{name}: router {cls} does not return (logits, scores, indices)")
        logits, scores, idx = out
        pref = getattr(mod, "norm_topk_prob", None)
        rules = sorted(_RULES, key=lambda r: r[1] != pref) if isinstance(pref, bool) else _RULES
        scale = float(getattr(mod, "routed_scaling_factor", 1.0) or 1.0)
        tol = 1e-4 if scores.dtype in (torch.float32, torch.float64) else 2e-2
        for rule in rules:
            for s in dict.fromkeys((scale, 1.0)):
                rescored = _rescore(rule, logits, idx.long(), s)  # float64 logits, float32 scores: compare in float64
                if torch.allclose(rescored, upcast(scores).to(rescored.dtype), atol=tol, rtol=tol):
                    return (rule[0], rule[1], s), logits.shape[-1]
        raise UnsupportedRoutingError(f"{name}: router {cls} scores are not a softmax/sigmoid top-k of its logits")

    def _make_hook(self, layer: int):
        def hook(module, args, out):
            if self._steps is not None:
                self._steps[layer].append(out[2].detach().long().clone())
            if self._record is None and self._replay is None:
                return None
            logits, scores, idx = out
            if self._replay is not None:
                if self._natural is not None:  # what this router would have chosen itself
                    self._natural._per_layer[layer] = idx.detach().long().clone()
                idx = self._replay[layer].to(logits.device)
                if idx.shape[0] != logits.shape[0] or idx.shape[-1] != scores.shape[-1]:
                    raise ValueError(
                        f"routing replay: layer {layer} router saw {logits.shape[0]} tokens x top-"
                        f"{scores.shape[-1]} but replayed routes have {tuple(idx.shape)}"
                    )
                act, renorm, s = self._rules[layer]
                scores = _rescore((act, renorm), logits, idx, s).to(scores.dtype)
                out = (logits, scores, idx)
            if self._record is not None:  # several forwards in one context: last one wins
                self._record._per_layer[layer] = idx.detach().long().clone()
            return out if self._replay is not None else None

        return hook

    @contextmanager
    def recording(self):
        """Yield a :class:`Routes`; on exit ``.routes`` is the (L, N, k) LongTensor of the
        LAST forward run inside the context (``None`` if no forward ran)."""
        if self._record is not None:
            raise RuntimeError("RoutingController.recording() is not re-entrant")
        holder = self._record = Routes(self.num_layers)
        try:
            yield holder
        finally:
            self._record = None
        holder.routes = _stack(holder._per_layer)

    @contextmanager
    def replaying(self, routes_LNk: torch.Tensor):
        """Force the recorded expert indices (L, N, k) in every router forward inside.
        Yields a :class:`Routes` whose ``.routes`` (set on exit) are the experts the current
        routers would have chosen themselves in the last forward (to measure volatility).
        With gradient checkpointing call ``backward()`` inside the context too, since the
        recomputed forward must be replayed as well."""
        if routes_LNk.dim() != 3 or routes_LNk.shape[0] != self.num_layers:
            raise ValueError(f"replay routes must be (L={self.num_layers}, N, k), got {tuple(routes_LNk.shape)}")
        if self._replay is not None:
            raise RuntimeError("RoutingController.replaying() is not re-entrant")
        self._replay = routes_LNk.long()
        holder = self._natural = Routes(self.num_layers)
        try:
            yield holder
        finally:
            self._replay = None
            self._natural = None
        holder.routes = _stack(holder._per_layer)

    @contextmanager
    def recording_steps(self):
        """Yield one list per layer that collects the (N, k) indices of EVERY forward inside,
        in call order: a prefill and each decode step of `generate`. Not with replay."""
        if self._steps is not None or self._replay is not None:
            raise RuntimeError("RoutingController.recording_steps(): already recording or replaying")
        self._steps = [[] for _ in range(self.num_layers)]
        try:
            yield self._steps
        finally:
            self._steps = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def decoder_layer_ids(router_names: list[str], config=None) -> list[int]:
    """The decoder-layer index of each router, from its module name (`model.layers.3.mlp.gate`
    -> 3); where a name carries no index, from `config` (`moe_layer_indices`). ValueError if
    neither gives one index per router."""
    ids = [re.search(r"(?:^|\.)layers\.(\d+)\.", n) for n in router_names]
    if all(ids):
        return [int(m.group(1)) for m in ids]
    from_config = moe_layer_indices(config) if config is not None else None
    if from_config is None or len(from_config) != len(router_names):
        raise ValueError(f"cannot tell which decoder layers hold the {len(router_names)} routers")
    return from_config


def moe_layer_indices(config) -> list[int] | None:
    """Decoder layers with a sparse MoE block, by the config conventions transformers' MoE
    families use (None when the config has no layer count):

    - `mlp_only_layers` (dense layers listed) and `decoder_sparse_step` s (every s-th layer
      sparse: layer i when (i + 1) % s == 0): Qwen2-MoE, Qwen3-MoE;
    - `first_k_dense_replace` k (layers 0..k-1 dense) and `moe_layer_freq` f (then layer i
      when i % f == 0): DeepSeek-V2/V3, GLM-4.5 (GLM4-MoE);
    - otherwise every layer (Mixtral, OLMoE, GPT-OSS, ...)."""
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(n, int):
        return None
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    step = getattr(config, "decoder_sparse_step", None) or 1
    first_dense = getattr(config, "first_k_dense_replace", None) or 0
    freq = getattr(config, "moe_layer_freq", None) or 1
    return [i for i in range(n) if i not in dense and (i + 1) % step == 0 and i >= first_dense and i % freq == 0]


def _stack(per: list) -> torch.Tensor | None:
    if all(p is None for p in per):
        return None
    if any(p is None for p in per) or len({p.shape for p in per}) != 1:
        raise RuntimeError("routing recording: not every MoE layer saw the same tokens")
    dev = per[0].device
    return torch.stack([p.to(dev) for p in per])


def routes_to_BT(routes_LNk: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """(L, B*T, k) -> (L, B, T, k); tokens are batch-major as the routers see them."""
    L, N, k = routes_LNk.shape
    if N != B * T:
        raise ValueError(f"routes have N={N} tokens, expected B*T={B}*{T}={B * T}")
    return routes_LNk.reshape(L, B, T, k)


def routes_from_generate(
    steps: list[list[torch.Tensor]],
    B: int,
    P: int,
    T: int,
    rows: list[torch.Tensor | None] | None = None,
    prefill_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routes of one `generate` call, recorded with `recording_steps`, as (L, B, T, k).

    The prefill routes the B x P prompt tokens (batch-major), then decode step j routes the
    j-th sampled token of every row: positions 0 .. T-2. The last sampled token is never fed
    back, so column T-1 has no route; it is filled with the route of column T-2 (any valid
    experts do: position T-1 only produces logits no log-prob uses). Callers measuring
    volatility should leave that column out.

    `rows[j]` (our sampling loop, rollout/decode.py): the rows decode step j ran on, in order,
    None for all B. A row absent from a step had already stopped: its column there (padding)
    takes the row's previous column's route. `prefill_rows` (B,): the prefill ran on distinct
    prompts only, row i's being prefill row prefill_rows[i].
    """
    L = len(steps)
    n_decode = T - 1 - P
    out = []
    for layer, calls in enumerate(steps):
        if len(calls) < 1 + n_decode:
            raise RuntimeError(
                f"routing recording: layer {layer} saw {len(calls)} forwards, expected "
                f"1 prefill + {n_decode} decode steps"
            )
        # With sharded weights (generate's synced_gpus) a process whose rows are all done keeps
        # running forwards until every process is: those come last and route nothing sampled.
        calls = calls[: 1 + n_decode]
        pre = (
            calls[0].reshape(B, P, -1)
            if prefill_rows is None
            else calls[0].reshape(-1, P, calls[0].shape[-1])[prefill_rows]
        )
        if rows is None:
            dec = [c.reshape(B, 1, -1) for c in calls[1:]]
        else:
            dec, prev = [], pre[:, -1]
            for c, r in zip(calls[1:], rows):
                if r is None:
                    col = c.reshape(B, -1)
                else:
                    col = prev.clone()
                    col[r] = c.to(col.dtype)
                dec.append(col[:, None])
                prev = col
        cols = torch.cat([pre, *dec], dim=1)  # (B, T-1, k)
        out.append(torch.cat([cols, cols[:, -1:]], dim=1))
    return torch.stack(out) if L else torch.empty(0)


def routes_from_BT(routes_LBTk: torch.Tensor) -> torch.Tensor:
    """(L, B, T, k) -> (L, B*T, k), e.g. after selecting rows ``routes_LBTk[:, rows]``."""
    L, B, T, k = routes_LBTk.shape
    return routes_LBTk.reshape(L, B * T, k)


def expert_change_frac(old_LNk: torch.Tensor, new_LNk: torch.Tensor, token_mask_N=None) -> float:
    """Share of expert choices in ``new`` absent from ``old``, compared as sets per
    (layer, token) (slot order is ignored), averaged over layers and selected tokens."""
    if old_LNk.shape != new_LNk.shape:
        raise ValueError(f"route shapes differ: {tuple(old_LNk.shape)} vs {tuple(new_LNk.shape)}")
    L, k = old_LNk.shape[0], old_LNk.shape[-1]
    old, new = old_LNk.reshape(L, -1, k), new_LNk.to(old_LNk.device).reshape(L, -1, k)
    missing = ~(new.unsqueeze(-1) == old.unsqueeze(-2)).any(-1)  # (L, N, k)
    frac = missing.float().sum(-1) / k  # (L, N)
    if token_mask_N is not None:
        mask = torch.as_tensor(token_mask_N, device=frac.device).reshape(-1).bool()
        if mask.shape[0] != frac.shape[1]:
            raise ValueError(f"token mask has {mask.shape[0]} entries, routes have {frac.shape[1]} tokens")
        frac = frac[:, mask]
    return float(frac.mean()) if frac.numel() else 0.0


@contextmanager
def _whole_parameters(mod: nn.Module):
    """While probing: a sharded (FSDP2, DTensor) router's own parameters replaced by whole
    copies, so it can run outside its layer's forward; put back after. Gathering is a
    collective: every rank probes the same routers in the same order."""
    saved = {n: p for n, p in mod.named_parameters(recurse=False) if hasattr(p, "full_tensor")}
    for n, p in saved.items():
        mod._parameters[n] = nn.Parameter(p.full_tensor().detach(), requires_grad=False)
    try:
        yield
    finally:
        for n, p in saved.items():
            mod._parameters[n] = p
