"""Load a model as `gspo train` does (model.sharding fsdp under torchrun: meta build, shards
filled from rank 0) and save what every rank holds, gathered whole, for the test to compare
with a single-process load. Not a pytest module.

usage: load_check.py MODEL_DIR DTYPE OUT_DIR
"""

import os
import sys

import torch

from gspo_cli import distributed
from gspo_cli.models import load_model
from gspo_cli.spec import ModelConfig


def main(source: str, dtype: str, out: str) -> None:
    info = distributed.setup()
    cfg = ModelConfig(name=source, sharding="fsdp", dtype=dtype)
    model = load_model(source, cfg, dist_info=info).model
    assert distributed.is_sharded(model) == info.enabled
    # every rank's own shards, and the whole tensors they make (gathering is a collective)
    local = {k: v.to_local().clone() for k, v in model.state_dict().items() if hasattr(v, "to_local")}
    whole = {k: distributed.scalar(v).clone() for k, v in model.state_dict().items()}
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    dtypes = {p.dtype for p in model.parameters()}  # the shards; a forward leaves the root's gathered
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    torch.save(
        {"whole": whole, "local": local, "buffers": buffers, "logits": logits, "dtypes": dtypes},
        os.path.join(out, f"rank{info.rank}.pt"),
    )
    distributed.leave_process_group(0, exit_now=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
