"""The 80/20 entropy filter (token_filter.entropy_top: 0.55) on a planted batch of 4 rows, each
process holding its contiguous share of the rows (under torchrun: rank 0 rows 0-1, rank 1 rows
2-3) or one process all of them. Rows 0-1 hold 8 trained tokens of entropy below 1, rows 2-3
hold 10 of entropy 2 and above: over the whole batch the tokens at or above the 0.45 quantile
of the 18 are rows 2-3's 10.
Writes OUT_DIR/kept<RANK>.json: {"rows": [...], "kept": the (rows, 5) 0/1 weights}.
Not a pytest module.

usage: entropy_check.py OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers
from helpers import rows_batch  # noqa: E402

from gspo_cli import distributed  # noqa: E402
from gspo_cli.spec.loading import spec_from_dict  # noqa: E402
from gspo_cli.train.stats import StepStats  # noqa: E402
from gspo_cli.train.token_weights import token_weights  # noqa: E402

LENGTHS = [5, 3, 5, 5]
ENTROPY = torch.tensor(
    [
        [0.1, 0.2, 0.3, 0.4, 0.5],
        [0.6, 0.7, 0.8, 9.0, 9.0],  # the 9.0s are padding (length 3): never trained, never counted
        [2.0, 2.1, 2.2, 2.3, 2.4],
        [2.5, 2.6, 2.7, 2.8, 2.9],
    ]
)


def main(out_dir: str) -> None:
    info = distributed.setup()
    spec = spec_from_dict(
        {
            "name": "e",
            "rollout": {"prompts_per_step": 2, "group_size": 2},
            "arms": [{"name": "a", "preset": "paper-grpo", "token_filter": {"entropy_top": 0.55}}],
        }
    )
    rows = distributed.shard(list(range(len(LENGTHS))), info)
    batch = rows_batch([LENGTHS[r] for r in rows], C=5)
    weights, _ = token_weights(spec.arms[0], StepStats(), None, torch.zeros(len(rows), 5), ENTROPY[rows], batch, info)
    with open(os.path.join(out_dir, f"kept{info.rank}.json"), "w") as f:
        json.dump({"rows": rows, "kept": weights.tolist()}, f)


if __name__ == "__main__":
    main(sys.argv[1])
    distributed.leave_process_group(0, exit_now=True)
