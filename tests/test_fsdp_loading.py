"""FSDP at scale on gloo/CPU: shards loaded from rank 0's read of the checkpoint (meta build,
broadcast), and bf16 compute through FSDP2's MixedPrecisionPolicy."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY

from gspo_cli.models import load_model, resolve_model_source
from gspo_cli.spec import ModelConfig
from gspo_cli.tasks import make_task

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def torchrun(world: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]


@pytest.fixture(scope="module")
def source():
    task = make_task("arithmetic", TINY["task"]["params"])
    return resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)


def _bf16_copy(source, dest) -> str:
    """`source` saved again with bfloat16 weights (config.json's dtype says so)."""
    import shutil

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(dest)
    for f in Path(source).glob("tokenizer*"):
        shutil.copy(f, dest)
    return str(dest)


@pytest.mark.parametrize(("world", "checkpoint"), [(2, "float32"), (4, "float32"), (2, "bfloat16")])
def test_sharded_load_equals_a_single_process_load_bit_for_bit(tmp_path, source, world, checkpoint):
    """Every rank builds the model on the meta device and fills its shards from rank 0's
    broadcast: gathered back, the weights are a plain load's bit for bit, each rank's shard is
    its slice of them, the rotary buffers (not in the checkpoint, garbage after to_empty) are
    rebuilt, and every rank computes the plain model's logits exactly. A bf16 checkpoint is
    read in bf16 by rank 0 and widened into the float32 shards: the same values as a plain
    float32 load of it."""
    if checkpoint == "bfloat16":
        source = _bf16_copy(source, tmp_path / "bf16")
    res = subprocess.run(
        torchrun(world) + [str(HERE / "dist/load_check.py"), source, "float32", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    plain = load_model(source, ModelConfig(name=source)).model
    want = plain.state_dict()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    with torch.no_grad():
        want_logits = plain(input_ids=ids).logits
    for r in range(world):
        got = torch.load(tmp_path / f"rank{r}.pt")
        assert got["dtypes"] == {torch.float32}
        assert set(got["whole"]) == set(want)
        for k, v in want.items():
            assert torch.equal(got["whole"][k], v), k
        for k, b in plain.named_buffers():
            assert torch.equal(got["buffers"][k], b), k
        assert torch.equal(got["logits"], want_logits)
        for k, shard in got["local"].items():  # dim-0 shards of ceil(n / world) rows
            n = -(-want[k].shape[0] // world)
            assert torch.equal(shard, want[k][r * n : (r + 1) * n]), k
    # the shards of all ranks together are the whole model once: 1/world per rank
    sizes = [sum(v.numel() for v in torch.load(tmp_path / f"rank{r}.pt")["local"].values()) for r in range(world)]
    assert sum(sizes) == sum(v.numel() for k, v in want.items() if k in got["local"])


def test_bf16_fsdp_keeps_float32_masters_and_computes_in_bf16(tmp_path, source):
    """model.dtype bfloat16 under FSDP: the shards (master weights) stay float32, forwards run
    in bf16 without autocast (MixedPrecisionPolicy gathers bf16 copies), and the logits are a
    single-process bf16 forward's within bf16 rounding."""
    res = subprocess.run(
        torchrun(2) + [str(HERE / "dist/load_check.py"), source, "bfloat16", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = torch.load(tmp_path / "rank0.pt")
    assert got["dtypes"] == {torch.float32}
    plain = load_model(source, ModelConfig(name=source)).model
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    with torch.no_grad():
        fp32 = plain(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = plain(input_ids=ids).logits.float()
    gap_fp32 = (got["logits"] - fp32).abs().max().item()
    assert 0 < gap_fp32 < 0.05 * fp32.abs().max().item()  # bf16 compute, not fp32
    assert (got["logits"] - bf16).abs().max().item() <= 2 * (bf16 - fp32).abs().max().item()


def test_bf16_fsdp_step_matches_a_single_process_bf16_step(tmp_path, source):
    """One update on the same global batch: 2 FSDP ranks with MixedPrecisionPolicy (bf16
    gathers, float32 gradient reduction) against 1 process under bf16 autocast. Both compute
    in bf16 (with different casts: autocast keeps norms and some ops in float32), so the
    gradients agree to bf16 rounding: no further from autocast's than autocast's own are from
    a float32 update, and the same direction."""
    fp32 = _update(tmp_path, source, 1, "ddp", "float32")
    one = _update(tmp_path, source, 1, "ddp", "bfloat16")
    two = _update(tmp_path, source, 2, "fsdp", "bfloat16")
    a, b, f = one["grads"], two["grads"], fp32["grads"]
    assert set(a) == set(b) == set(f) and len(a) > 10
    assert all(g.dtype == torch.float32 for g in b.values())

    def gap(x, y):
        return max((x[k] - y[k]).abs().max().item() for k in x)

    bf16_rounding = gap(a, f)
    assert 0 < gap(b, f)  # the FSDP run did compute in bf16
    assert gap(b, a) <= 2 * bf16_rounding, (gap(b, a), bf16_rounding)
    flat = [torch.cat([g[k].flatten() for k in sorted(a)]) for g in (a, b)]
    assert torch.nn.functional.cosine_similarity(*flat, dim=0) > 0.995  # 0.998 measured
    for key in ("policy/loss", "policy/clip_frac_token", "policy/grad_norm"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=2e-2, abs=1e-3), key


def _update(tmp_path, source, world, sharding, dtype):
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "train": {"steps": 1},
        "model": {**TINY["model"], "sharding": sharding, "dtype": dtype},
        "rollout": {**TINY["rollout"], "prompts_per_step": 4, "group_size": 4},
        "arms": [{"name": "a", "preset": "paper-grpo", "mini_batches": 1, "clip_low": 0.2, "clip_high": 0.2}],
    }
    spec = tmp_path / f"{dtype}-{world}.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / f"{dtype}-{world}.pt"
    cmd = ([sys.executable] if world == 1 else torchrun(world)) + [
        str(HERE / "dist/update_check.py"),
        str(spec),
        source,
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)
