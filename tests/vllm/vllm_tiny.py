"""The tiny model and prompts the vLLM tests share."""

import copy

from gspo_cli.spec.loading import spec_from_dict

# Head dimension 32 (hidden 64 / 2 heads): vLLM's CPU attention has no kernel for 16.
TINY = {
    "name": "vllm",
    "seeds": [0],
    "model": {
        "name": "builtin:tiny-moe",
        "builtin": {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 64,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "experts_per_token": 2,
        },
        "cold_start": {"steps": 60, "batch_size": 32, "lr": 1e-2},
    },
    "task": {
        "name": "arithmetic",
        "params": {"num_operands": 2, "max_operand": 4, "operators": "+", "format_weight": 0.5},
        "eval_size": 4,
    },
    "rollout": {"engine": "vllm", "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
    "optimizer": {"lr": 1e-3},
    "train": {"steps": 2},
    "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
}

PROMPTS = [f"{a}+{b}=?\n" for a in range(5) for b in range(5)]  # the task's prompt format


def tiny_spec(**overrides):
    return spec_from_dict({**copy.deepcopy(TINY), **overrides})
