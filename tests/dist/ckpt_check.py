"""Sharded checkpoints across process counts, in 1 process or under torchrun (gloo). Not a
pytest module.

`save`: a tiny random Qwen3-MoE (the same seed on every rank), FSDP-sharded when there are
several processes, takes two AdamW steps on a fixed batch, writes a checkpoint (train.
checkpoint) under RUN_DIR, and rank 0 saves the full model and optimizer state it holds,
plus the loss of one more step, to OUT_PT.
`export`: export RUN_DIR's checkpoint to OUT (an HF directory, several files).
`load`: the same model and optimizer, freshly built (other weights: another seed), resume
from RUN_DIR's checkpoint; rank 0 saves the full state it holds after loading and the loss
of the next step to OUT_PT.

usage: ckpt_check.py save|load|export RUN_DIR OUT
"""

import copy
import random
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from gspo_cli import distributed
from gspo_cli.runs import RunDir
from gspo_cli.train.checkpoint import load_trainer_state, save_checkpoint, valid_checkpoints, weights_to_load
from gspo_cli.train.export import export_checkpoint


def tiny_config() -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def build(seed: int, info, weights: str | None = None):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config())
    if weights is not None:  # a whole checkpoint's weights come with the model (load_model)
        model = AutoModelForCausalLM.from_pretrained(weights)
    if info.enabled:
        distributed.shard_(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (i + 1))
    return model, opt, sched


def step(model, opt, sched) -> float:
    ids = torch.arange(3 * 12).reshape(3, 12) % 61 + 3  # the same batch on every rank
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    return loss.item()


def full_state(model, opt) -> dict:
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {
        "model": {k: v.clone() for k, v in get_model_state_dict(model, options=opts).items()},
        "optim": copy.deepcopy(get_optimizer_state_dict(model, opt, options=opts)),  # the next step mutates it
    }


class Tok:  # what save_checkpoint asks of a tokenizer
    def save_pretrained(self, path):
        (path / "tokenizer_config.json").write_text("{}")


def main(mode: str, run_dir: str, out: str) -> None:
    info = distributed.setup()
    rd = RunDir(run_dir)
    rng, shuffle = random.Random(5), torch.Generator().manual_seed(7)
    if mode == "save":
        model, opt, sched = build(0, info)
        losses = [step(model, opt, sched), step(model, opt, sched)]
        save_checkpoint(rd, 2, model, opt, Tok(), sched, info=info, rng=rng, shuffle=shuffle, keep=2)
    elif mode == "export":
        export_checkpoint(valid_checkpoints(rd)[-1], Path(out), max_shard_bytes=20_000, info=info, step=2)
        return
    else:
        ckpt = valid_checkpoints(rd)[-1]
        model, opt, sched = build(1, info, weights_to_load(ckpt))
        state = load_trainer_state(ckpt, model, opt, sched, rng=rng, shuffle=shuffle, info=info)
        losses = [state["step"]]
    full = full_state(model, opt)
    extra = {"lr": sched.get_last_lr(), "python_rng": rng.random(), "shuffle": torch.rand(1, generator=shuffle)}
    next_loss = step(model, opt, sched)
    if info.is_main:
        torch.save({**full, **extra, "losses": losses, "next_loss": next_loss}, out)


def leave() -> None:
    """For the script only (tests import this module and call its functions)."""
    distributed.leave_process_group(0, exit_now=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
    leave()
