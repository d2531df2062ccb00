"""Does `gspo train` train the policy whose ratios it computes, whatever the checkpoint ships?

Measures three points on ordinary local HF directories made from the
built-in tiny MoE (same weights, one file edited each time), with the public training step:

1. generation_config.json leaking into sampling: zero-variance group share and mean response
   length over a few steps, clean copy vs one whose generation_config sets sampling options;
2. dropout in the RL forwards: policy/kl_old_k3 of the first (on-policy) mini-batch with
   `attention_dropout: 0.5` vs 0 in config.json;
3. stop ids: response length and truncated share for a checkpoint whose tokenizer EOS is not
   what the model ends turns with, while generation_config lists both (like Llama 3); and the
   prompt text the sampler was fed for a tokenizer with a chat template.

Run from a checkout (PYTHONPATH at it): `python studies/checkpoint-hygiene/checkpoint_hygiene.py [--steps 3]`.
Only public entry points are used, so the same script measures an older checkout too.
Prints one JSON object per variant.

Measured (3 steps x 32 samples, seed 0, 2-core CPU), before -> after the fixes
(2026-12-03):
  polluted generation_config: zero-variance groups 0.667 -> 0.25, length 14.1 -> 16.4
    (clean copy: 0.25, 16.4; after, every metric equals the clean copy's);
  attention_dropout 0.5: first on-policy kl_old_k3 1.07 -> 0.0 nats (clean: 0.0);
  second stop id: truncated 1.0 -> 0.010, length 32.0 (max_new_tokens) -> 16.4;
  chat template: prompt "3+3=?\n" -> "Q: 3+3=?\nA: ".
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from gspo_cli.models import resolve_model_source
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.step import setup, train_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import TINY  # noqa: E402 - the tests' tiny MoE, so both measure the same model

SPEC = {
    **TINY,
    "name": "hygiene",
    "rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 32},
    # One mini-batch: the only update of a step is on-policy, its KL(pi_old||pi_theta) ~ 0.
    "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 1}],
}

# Sampling options a checkpoint may set (within what the older code survives: no
# stop_strings, which needs a tokenizer, no num_return_sequences, which changes the batch).
POLLUTED_GENERATION = {
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "min_p": 0.2,
    "typical_p": 0.5,
    "epsilon_cutoff": 3e-3,
    "eta_cutoff": 3e-3,
    "no_repeat_ngram_size": 2,
    "repetition_penalty": 1.3,
    "min_new_tokens": 2,
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[{{ m['content'] }}]{% else %}"
    "Q: {{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)


def edited_copy(base: Path, dest: Path, *, config=None, generation=None, tokenizer=None) -> Path:
    """`base` copied to `dest` with keys of config.json / generation_config.json /
    tokenizer_config.json replaced (a missing generation_config.json is created)."""
    shutil.copytree(base, dest)
    for name, edits in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tokenizer),
    ):
        if edits:
            path = dest / name
            data = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps({**data, **edits}, indent=1))
    return dest


def measure(source: Path, steps: int, seed: int = 0) -> dict:
    spec = spec_from_dict({**SPEC, "model": {**SPEC["model"], "name": str(source)}, "train": {"steps": steps}})
    task = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arms[0], seed, task, str(source))
    first_batch = {}
    real_generate = ctx.engine.generate

    def spy(prompts):
        batch = real_generate(prompts)
        if not first_batch:
            first_batch["prompt"] = ctx.engine.tokenizer.decode(
                batch.input_ids[0, : batch.prompt_len], skip_special_tokens=False
            )
        return batch

    ctx.engine.generate = spy
    ms = [train_step(ctx, s) for s in range(1, steps + 1)]

    def mean(k):
        return round(sum(m[k] for m in ms) / len(ms), 4)

    return {
        "zero_var_group_frac": mean("reward/zero_var_group_frac"),
        "length_mean": mean("response/length_mean"),
        "truncated_frac": mean("response/truncated_frac"),
        "reward_mean": mean("reward/mean"),
        "kl_old_k3_first": ms[0]["policy/kl_old_k3"],
        "first_prompt": first_batch["prompt"].lstrip("<pad>"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = spec_from_dict({**SPEC, "train": {"steps": 1}})
    base = Path(resolve_model_source(spec.model, make_task(spec.task.name, spec.task.params), log=lambda m: None))
    tok = json.loads((base / "tokenizer_config.json").read_text())
    vocab = json.loads((base / "tokenizer.json").read_text())["model"]["vocab"]
    eos, unk = vocab[tok["eos_token"]], vocab["<unk>"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        variants = {
            "clean": edited_copy(base, tmp / "clean"),
            "polluted_generation_config": edited_copy(base, tmp / "polluted", generation=POLLUTED_GENERATION),
            "attention_dropout_0.5": edited_copy(base, tmp / "dropout", config={"attention_dropout": 0.5}),
            # The tokenizer's EOS is a token the model never ends with; the generation config
            # lists it and the one the model does end with (Llama 3's <|end_of_text|> / <|eot_id|>).
            "second_stop_id": edited_copy(
                base, tmp / "stops", tokenizer={"eos_token": "<unk>"}, generation={"eos_token_id": [unk, eos]}
            ),
            "chat_template": edited_copy(base, tmp / "chat", tokenizer={"chat_template": CHAT_TEMPLATE}),
        }
        for name, path in variants.items():
            print(json.dumps({"variant": name, **measure(path, args.steps)}), flush=True)


if __name__ == "__main__":
    main()
