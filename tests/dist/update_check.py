"""One RL update on a fixed global batch, in 1 process or under torchrun; rank 0 saves the
gradients (all-reduced by DDP) and the step's metrics so the test can compare world sizes.
Not a pytest module.

The batch is built to make per-rank shortcuts visible: responses of uneven length (rank 0's
half shorter than rank 1's), one empty response, and a pi_old perturbed so that ratios move
away from 1 and some clip. Under routing_replay r2, pi_old's routes are those of one padded
forward of the whole batch, every other position's experts shifted by one (perturbed as
pi_old is), the same on every world size. Gradients, not
parameters: Adam's first step is ~lr*sign(g), so parameters whose gradient is float noise
around 0 would differ by 2*lr without anything being wrong.

usage: update_check.py SPEC_YAML MODEL_DIR OUT_PT [EMULATE_WORLD]

EMULATE_WORLD (one process only): split mini-batches as that many processes would
(train/minibatch.ddp_equivalent_rows), to compare multi-mini-batch updates.

A float32 spec trains in float64 (`_float64_models`): the tests compare world sizes, which differ
only in the order of their sums, and in float32 that order moves gradients by an amount that
depends on the CPU's kernels (tests/helpers.in_float64).
"""

import random
import sys

import torch
import yaml

import gspo_cli.train.step as step_mod
from gspo_cli import distributed
from gspo_cli.rollout import RolloutBatch, response_logprobs
from gspo_cli.rollout.base import LogProbs
from gspo_cli.rollout.micro_batches import forward_logprobs
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Score
from gspo_cli.train.minibatch import ddp_equivalent_rows


def _float64_models() -> None:
    """Every model transformers builds or loads in this process comes out in float64 with eager
    experts (torch's grouped GEMM has no float64 kernel), before DDP or FSDP wraps it; LoRA's
    adapters stay float64 too."""
    import transformers

    from gspo_cli.models import lora

    def float64(make):
        def build(*args, **kwargs):
            kwargs["dtype"] = torch.float64
            if "experts_implementation" in kwargs:
                kwargs["experts_implementation"] = "eager"
            return make(*args, **kwargs)

        return build

    auto = transformers.AutoModelForCausalLM
    auto.from_pretrained = float64(auto.from_pretrained)
    auto.from_config = float64(auto.from_config)
    inject = lora.apply_lora

    def apply_lora(model, spec, name):
        return inject(model, spec, name).double()

    lora.apply_lora = apply_lora


def fixed_batch(tok, task, n):
    """Prompts and their reference solutions, left-padded prompts + right-padded responses."""
    probs = task.train_problems(random.Random(0), n)
    p_ids = [tok(p.prompt, add_special_tokens=False).input_ids for p in probs]
    r_ids = [tok(p.solution, add_special_tokens=False).input_ids + [tok.eos_token_id] for p in probs]
    P, C = max(map(len, p_ids)), max(map(len, r_ids))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (P - len(a)) + a + b + [pad] * (C - len(b)) for a, b in zip(p_ids, r_ids)])
    attn = torch.tensor(
        [[0] * (P - len(a)) + [1] * (len(a) + len(b)) + [0] * (C - len(b)) for a, b in zip(p_ids, r_ids)]
    )
    rmask = torch.tensor([[1.0] * len(b) + [0.0] * (C - len(b)) for b in r_ids])
    for i in range(n // 2):  # the first half (rank 0's) keeps 2..9 tokens
        rmask[i, 2 + i :] = 0.0
    rmask[1] = 0.0  # an empty response
    return RolloutBatch(ids, attn, rmask, P, [""] * n, torch.zeros(n, dtype=torch.bool))


def main(spec_yaml: str, source: str, out: str, emulate: str = "1") -> None:
    spec = spec_from_dict(yaml.safe_load(open(spec_yaml)))
    if spec.model.dtype == "float32":  # a bf16 spec compares bf16 paths (tests/test_fsdp_loading.py)
        _float64_models()
    info = distributed.setup()
    if int(emulate) > 1:
        world = int(emulate)
        step_mod.minibatch_rows = lambda n, m, g: ddp_equivalent_rows(n, m, g, world)
    task = make_task(spec.task.name, spec.task.params)
    ctx = step_mod.setup(spec, spec.arms[0], 0, task, source, dist_info=info)
    G, B = spec.rollout.group_size, 16
    batch = fixed_batch(ctx.engine.tokenizer, task, B)
    rewards = [float(i % 3 == 0) for i in range(B)]
    n = B // info.world_size  # whole groups per rank
    rows = torch.arange(info.rank * n, (info.rank + 1) * n)
    with torch.no_grad(), ctx.compute():  # in model.dtype, as the step's own pi_old pass
        full = response_logprobs(ctx.model, batch, with_entropy=True)
    wobble = 0.3 * torch.sin(torch.arange(full.logp.numel(), dtype=full.logp.dtype)).reshape(full.logp.shape)
    old = LogProbs(logp=(full.logp + wobble)[rows], entropy=full.entropy[rows])
    routes = None  # R2: the routes of one padded forward of the whole batch, each rank's rows
    if spec.arms[0].routing_replay == "r2":
        with torch.no_grad(), ctx.compute():
            _, all_routes = forward_logprobs(ctx.model, batch, 1.0, None, None, routing=ctx.routing, record=True)
        # every other position replays experts shifted by one, not those the router would pick
        # anyway, so a replay that misses a position changes the gradient
        shifted = (all_routes + 1) % ctx.model.config.num_experts
        odd = (torch.arange(all_routes.shape[2]) % 2 == 1)[None, None, :, None]
        routes = torch.where(odd, shifted, all_routes)[:, rows]
    # pi_old is the perturbed policy, the same rows (and routes) on every world size
    step_mod.old_policy = lambda ctx, b: (old, routes, False)
    scores = [Score(reward=rewards[i], correct=rewards[i] > 0) for i in rows.tolist()]
    assert len(scores) % G == 0
    metrics = step_mod.learn(ctx, batch.rows(rows), scores, step=1)
    # whole gradients on every rank (gathering FSDP's shards is a collective), saved by rank 0
    grads = {
        k: distributed.scalar(p.grad).detach().clone() for k, p in ctx.model.named_parameters() if p.grad is not None
    }
    if info.is_main:
        torch.save({"grads": grads, "metrics": metrics, "packed": ctx.packed}, out)
    distributed.leave_process_group(0, exit_now=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
