"""Under torchrun (2 processes, gloo): our sampling loop (`rollout/decode.py`) on an FSDP2-sharded
MoE with `synced`, the processes' rows stopping at different steps (rank 0's stop set holds every
token, so its rows end after one token; rank 1's is empty, so it samples the full length). Every
forward gathers the shards from both processes, so a process that stopped running forwards
early would hang the other; the check also counts the forwards on each process (equal), the
widths each returns, and compares the sampler's log-probs with a full forward on each process.
Not a pytest module; prints "ok" on success.

usage: decode_check.py
"""

import torch
import torch.distributed as dist
import transformers as tf

from gspo_cli.distributed import leave_process_group, setup, shard_
from gspo_cli.rollout.base import RolloutBatch, response_logprobs
from gspo_cli.rollout.decode import sample

MAX_NEW = 6


def main():
    setup("cpu")
    rank = dist.get_rank()
    cfg = tf.Qwen3MoeConfig(
        vocab_size=37,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = tf.Qwen3MoeForCausalLM(cfg).eval()
    shard_(model)
    forwards = []
    model.register_forward_hook(lambda m, args, out: forwards.append(1))
    torch.manual_seed(1 + rank)
    ids = torch.randint(1, 37, (4, 5))
    attn = torch.ones_like(ids)
    ids[0, :2], attn[0, :2] = 0, 0  # one left-padded row
    stops = list(range(37)) if rank == 0 else []
    got = sample(
        model,
        ids,
        attn,
        max_new_tokens=MAX_NEW,
        temperature=0.8,
        stop_ids=stops,
        pad_id=0,
        want_logprobs=True,
        synced=True,
    )
    C = got.ids.shape[1] - 5
    assert C == (1 if rank == 0 else MAX_NEW), (rank, C)
    n = torch.tensor([len(forwards)])
    all_n = [torch.zeros_like(n) for _ in range(2)]
    dist.all_gather(all_n, n)
    assert all_n[0] == all_n[1] == MAX_NEW, all_n  # a prefill and MAX_NEW - 1 decode steps on both
    resp_mask = torch.ones(4, C)
    batch = RolloutBatch(
        input_ids=got.ids,
        attention_mask=torch.cat([attn, resp_mask.long()], 1),
        response_mask=resp_mask,
        prompt_len=5,
        completions=[""] * 4,
        truncated=torch.zeros(4, dtype=torch.bool),
    )
    with torch.no_grad():
        ref = response_logprobs(model, batch, 0.8).logp
    gap = (ref - got.logp).abs().max().item()
    assert gap < 1e-4, gap
    if rank == 0:
        print(f"ok forwards {int(all_n[0])} gap {gap:.1e}", flush=True)


if __name__ == "__main__":
    main()
    leave_process_group(0, exit_now=True)  # gloo's destructors at interpreter exit can abort
