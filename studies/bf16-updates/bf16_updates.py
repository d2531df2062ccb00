"""How many weights small updates change in bf16: the README's mixed-precision numbers.

    .venv/bin/python studies/bf16-updates/bf16_updates.py [OUT_DIR]

Trains the tests' tiny MoE (tests/helpers.py) for 5 steps x 4 mini-batches at lr 1e-5 with
`model.dtype` float32 and bfloat16, then counts the weights whose bf16 value differs from the
initial model's. Before fp32 master weights (bf16 weights updated in place) this was 3.6% in
bf16 against 22.3% in fp32; with them, 23.0%.
"""

import glob
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers import TINY  # noqa: E402 - the tests' tiny MoE

from gspo_cli.models import resolve_model_source  # noqa: E402
from gspo_cli.spec import ModelConfig  # noqa: E402
from gspo_cli.spec.loading import spec_from_dict  # noqa: E402
from gspo_cli.tasks import make_task  # noqa: E402
from gspo_cli.train.loop import train_experiment  # noqa: E402
from gspo_cli.train.reporting import quiet_reporter  # noqa: E402


def weights(directory) -> dict:
    return {k: v for f in glob.glob(f"{directory}/*.safetensors") for k, v in load_file(f).items()}


def main(out: str) -> None:
    task = make_task("arithmetic", TINY["task"]["params"])
    init = weights(resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None))
    for dtype in ("float32", "bfloat16"):
        raw = {
            **TINY,
            "output_dir": out,
            "name": f"bf16_{dtype}",
            "model": {**TINY["model"], "dtype": dtype},
            "optimizer": {"lr": 1e-5},
            "train": {"steps": 5, "checkpoint_every": 0},
            "task": {**TINY["task"], "eval_size": 0},
            "arms": [{"name": "grpo", "preset": "paper-grpo", "mini_batches": 4}],
        }
        (res,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
        final = weights(sorted(glob.glob(f"{res.path}/checkpoints/step_*"))[-1])
        changed = sum(int((v.to(torch.bfloat16) != final[k].to(torch.bfloat16)).sum()) for k, v in init.items())
        total = sum(v.numel() for v in init.values())
        print(f"{dtype}: {res.status}, changed (seen in bf16) {changed / total:.1%} of {total} weights")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
