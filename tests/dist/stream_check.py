"""Under torchrun (2 processes, gloo): FSDP2-shard a small Qwen3-MoE whose parameters have
row counts that do not divide by 2, and check that the weight stream (`checkpoint_weights`)
yields on every process exactly what the unsharded model's whole-model conversion gives:
same names, same values. Not a pytest module; prints "ok" on success.

usage: stream_check.py
"""

import torch
import torch.distributed as dist
import transformers as tf
from transformers.core_model_loading import revert_weight_conversion

from gspo_cli.distributed import leave_process_group, setup, shard_
from gspo_cli.rollout.vllm_weights import checkpoint_weights, gather_full


def main():
    setup("cpu")
    cfg = tf.Qwen3MoeConfig(
        vocab_size=37,  # odd: the embedding's shards are uneven
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_experts=3,  # odd: the experts' 3-D parameters shard unevenly too
        num_experts_per_tok=2,
        mlp_only_layers=[0],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = tf.Qwen3MoeForCausalLM(cfg)
    want = revert_weight_conversion(model, {n: p.detach().clone() for n, p in model.named_parameters()})
    shard_(model)
    for p in model.parameters():
        assert torch.equal(gather_full(p), p.full_tensor())
    # one row over two processes: rank 1's shard is empty (nothing to broadcast from it)
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = model.model.embed_tokens.weight.device_mesh
    one_row = distribute_tensor(torch.arange(3.0)[None], mesh, [Shard(0)])
    assert torch.equal(gather_full(one_row), torch.arange(3.0)[None])
    got = dict(checkpoint_weights(model))
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for name, t in want.items():
        assert torch.equal(got[name], t), name
    # in the engine's dtype: each shard cast before its gather, the values of a cast afterwards
    for p in model.parameters():
        assert torch.equal(gather_full(p, torch.bfloat16), p.full_tensor().to(torch.bfloat16))
    half = dict(checkpoint_weights(model, torch.bfloat16))
    assert sorted(half) == sorted(want)
    for name, t in want.items():
        assert half[name].dtype == torch.bfloat16 and torch.equal(half[name], t.to(torch.bfloat16)), name
    if dist.get_rank() == 0:
        print(f"ok {len(got)} tensors", flush=True)


if __name__ == "__main__":
    main()
    leave_process_group(0, exit_now=True)  # gloo's destructors at interpreter exit can abort
