"""One optimizer update on a fixed batch, in 1 process or under torchrun; rank 0 saves the
gradients (all-reduced by DDP) and the loss so the test can compare world sizes. Not a
pytest module. Gradients, not parameters: Adam's first step is ~lr*sign(g), so parameters
whose gradient is float noise around 0 would differ by 2*lr without anything being wrong."""

import sys

import torch

from gspo_cli import distributed
from gspo_cli.spec_loading import spec_from_dict
from gspo_cli.rollout import RolloutBatch, response_logprobs
from gspo_cli.step import _route_token_mask, _update, setup
from gspo_cli.tasks import make_task


def fixed_batch(tok, task, n):
    """Prompts and their reference solutions, left-padded prompts + right-padded responses."""
    import random

    probs = task.train_problems(random.Random(0), n)
    p_ids = [tok(p.prompt, add_special_tokens=False).input_ids for p in probs]
    r_ids = [tok(p.solution, add_special_tokens=False).input_ids + [tok.eos_token_id] for p in probs]
    P, C = max(map(len, p_ids)), max(map(len, r_ids))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (P - len(a)) + a + b + [pad] * (C - len(b)) for a, b in zip(p_ids, r_ids)])
    attn = torch.tensor([[0] * (P - len(a)) + [1] * (len(a) + len(b)) + [0] * (C - len(b)) for a, b in zip(p_ids, r_ids)])
    rmask = torch.tensor([[1.0] * len(b) + [0.0] * (C - len(b)) for b in r_ids])
    return RolloutBatch(ids, attn, rmask, P, [""] * n, torch.zeros(n, dtype=torch.bool))


def main(spec_yaml: str, source: str, out: str) -> None:
    import yaml

    spec = spec_from_dict(yaml.safe_load(open(spec_yaml)))
    info = distributed.setup()
    task = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arms[0], 0, task, source, dist_info=info)
    G = spec.rollout.group_size
    B = 16
    batch = fixed_batch(ctx.engine.tokenizer, task, B)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(B)])
    adv = ctx.adv_fn(rewards, G, eps=1e-6)
    n = B // info.world_size  # whole groups per rank
    rows = torch.arange(info.rank * n, (info.rank + 1) * n)
    local = batch.rows(rows)
    with torch.no_grad():
        old = response_logprobs(ctx.model, batch).logp
    # a perturbed "old" policy (the same on every rank) so ratios differ from 1 and some clip
    old = (old + 0.05 * torch.sin(torch.arange(old.numel(), dtype=torch.float32)).reshape(old.shape))[rows]
    loss, stats, _ = _update(ctx, local, torch.arange(n), old, None, adv[rows], None, measure_routes=False, step=1,
                             route_mask_BT=_route_token_mask(local))
    if info.is_main:
        grads = {k: p.grad.detach().clone() for k, p in ctx.model.named_parameters() if p.grad is not None}
        torch.save({"grads": grads, "clip_frac": float(stats["clip_frac_token"])}, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
