"""Sharded checkpoints (torch.distributed.checkpoint, one file per rank) resume with 1, 2 and
4 processes bit for bit; whole-model checkpoints resume sharded; `gspo export` writes an
HF directory (several safetensors files, float32 or bfloat16) that transformers loads and
that scores the same logits. gloo, a tiny random Qwen3-MoE built from a config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gspo_cli.cli.app import app

HERE = Path(__file__).parent
SCRIPT = str(HERE / "dist/ckpt_check.py")


def launch(world: int, *args) -> None:
    head = (
        [sys.executable]
        if world == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
    )
    res = subprocess.run(head + [SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def assert_same(a, b, path=""):
    """Bit-equal nested state (tensors, lists, scalars)."""
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), (path, (a.float() - b.float()).abs().max())
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, (path, a, b)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """A checkpoint written by 2 FSDP processes, and the state they held."""
    root = tmp_path_factory.mktemp("sharded")
    launch(2, "save", root / "run", root / "saved.pt")
    return root / "run", torch.load(root / "saved.pt", weights_only=False)


def test_sharded_checkpoint_is_one_file_per_rank_and_no_hf_weights(sharded_run):
    run, _ = sharded_run
    ckpt = run / "checkpoints/step_000002"
    files = sorted(p.name for p in (ckpt / "state").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not list(ckpt.glob("*.safetensors"))
    assert "optimizer" not in torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_sharded_checkpoint_resumes_with_any_process_count(sharded_run, tmp_path, world):
    """Weights, AdamW moments and step counts, learning rate and RNG streams come back bit for
    bit, in 1 (unsharded), 2 or 4 (resharded) processes; the next step's loss matches."""
    run, saved = sharded_run
    launch(world, "load", run, tmp_path / "loaded.pt")
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=False)
    assert loaded["losses"] == [2]  # the step the checkpoint holds
    assert_same(saved["model"], loaded["model"])
    assert_same(saved["optim"], loaded["optim"])
    assert loaded["lr"] == saved["lr"] == [pytest.approx(0.01 / 3)]
    assert loaded["python_rng"] == saved["python_rng"] and torch.equal(loaded["shuffle"], saved["shuffle"])
    assert loaded["next_loss"] == pytest.approx(saved["next_loss"], rel=1e-6)


@pytest.mark.slow
def test_whole_checkpoint_resumes_sharded(tmp_path):
    """A one-process checkpoint (today's HF directory + optimizer state) loads into 2 FSDP ranks."""
    launch(1, "save", tmp_path / "run", tmp_path / "saved.pt")
    assert (tmp_path / "run/checkpoints/step_000002/model.safetensors").is_file()
    launch(2, "load", tmp_path / "run", tmp_path / "loaded.pt")
    saved, loaded = (torch.load(tmp_path / f, weights_only=False) for f in ("saved.pt", "loaded.pt"))
    assert_same(saved["model"], loaded["model"])
    assert_same(saved["optim"], loaded["optim"])


def _logits(model_dir_or_state):
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(HERE / "dist"))
    from ckpt_check import tiny_config

    if isinstance(model_dir_or_state, dict):
        model = AutoModelForCausalLM.from_config(tiny_config())
        model.load_state_dict(model_dir_or_state)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir_or_state)
    ids = torch.arange(24).reshape(2, 12) % 61 + 3
    with torch.no_grad():
        return model(ids).logits.float(), model


def test_export_writes_several_files_that_transformers_loads_exactly(sharded_run, tmp_path):
    run, saved = sharded_run
    res = CliRunner().invoke(app, ["export", str(run), "--max-shard-gb", "0.00002", "-o", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "hf"
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) == 5  # 83,840 bytes of weights in files of at most 20,000 (one tensor may be more)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in index["weight_map"]  # transformers' saved names
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embedding
    assert json.loads((out / "export.json").read_text()) == {
        "checkpoint": "step_000002",
        "step": 2,
        "dtype": "float32",
        "files": 5,
    }
    want, _ = _logits(saved["model"])
    got, model = _logits(out)
    assert model.dtype == torch.float32 and torch.equal(got, want)


def test_export_in_bf16_holds_the_rounded_weights(sharded_run, tmp_path):
    run, saved = sharded_run
    res = CliRunner().invoke(app, ["export", str(run / "checkpoints/step_000002"), "--dtype", "bfloat16"])
    assert res.exit_code == 0, res.output
    out = run / "checkpoints/step_000002-hf"
    assert (out / "model.safetensors").is_file() and json.loads((out / "config.json").read_text())[
        "dtype"
    ] == "bfloat16"
    from safetensors.torch import load_file

    weights = load_file(out / "model.safetensors")
    assert torch.equal(weights["model.norm.weight"], saved["model"]["model.norm.weight"].to(torch.bfloat16))
    got, model = _logits(out)
    want, _ = _logits(saved["model"])
    assert model.dtype == torch.bfloat16 and (got - want).abs().max() < 0.1


@pytest.mark.slow
def test_export_under_torchrun_splits_the_files_between_ranks(sharded_run, tmp_path):
    run, saved = sharded_run
    launch(2, "export", run, tmp_path / "hf")
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) == 5
    got, _ = _logits(tmp_path / "hf")
    want, _ = _logits(saved["model"])
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--checkpoint", "9"], "has no complete checkpoint 'step_000009' (it has: step_000002)"),
        (["--dtype", "float16"], "--dtype: 'float16' is not one of float32, bfloat16"),
    ],
)
def test_export_bad_input_is_one_line(sharded_run, tmp_path, args, message):
    run, _ = sharded_run
    res = CliRunner().invoke(app, ["export", str(run), *args, "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["export", str(tmp_path)])
    assert res.exit_code == 2 and "is neither a run directory nor a checkpoint" in res.output


def test_eval_reads_a_sharded_checkpoint_through_its_export(sharded_run, tmp_path):
    """`gspo eval RUN` on a sharded checkpoint: one line saying which export to run, then
    the exported directory for that step."""
    import shutil

    from helpers import TINY

    from gspo_cli.errors import SpecError
    from gspo_cli.eval.run import resolve_target
    from gspo_cli.spec.loading import dump_spec, spec_from_dict

    run = tmp_path / "run"
    shutil.copytree(sharded_run[0], run)
    for made in (run / "checkpoints").glob("*-hf"):  # an earlier test's default-path export
        shutil.rmtree(made)
    (run / "spec.yaml").write_text(dump_spec(spec_from_dict(TINY)))
    with pytest.raises(SpecError, match=f"gspo export {run} --checkpoint step_000002"):
        resolve_target(str(run))
    assert CliRunner().invoke(app, ["export", str(run)]).exit_code == 0
    target = resolve_target(str(run))
    assert target.source == str(run / "model") and target.checkpoint == "step_000002"


def test_export_of_a_whole_checkpoint_recasts_and_splits_it(tmp_path):
    """A one-process checkpoint (an HF directory already) exports the same way: bf16 files."""
    sys.path.insert(0, str(HERE / "dist"))
    import ckpt_check

    ckpt_check.main("save", str(tmp_path / "run"), str(tmp_path / "saved.pt"))
    saved = torch.load(tmp_path / "saved.pt", weights_only=False)
    res = CliRunner().invoke(app, ["export", str(tmp_path / "run"), "--dtype", "bfloat16", "--max-shard-gb", "0.00001"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "run/model"
    assert len(list(out.glob("model-*.safetensors"))) > 1
    got, model = _logits(out)
    want, _ = _logits(saved["model"])
    assert model.dtype == torch.bfloat16 and (got - want).abs().max() < 0.1
    assert json.loads((out / "export.json").read_text())["step"] == 2


@pytest.mark.parametrize(
    "damage,message",
    [
        ("trainer_state.pt", "unreadable checkpoint"),
        ("state/__1_0.distcp", "cannot load its sharded state"),
        ("state/.metadata", "cannot load its sharded state"),
    ],
)
def test_a_damaged_sharded_checkpoint_is_one_line(sharded_run, tmp_path, damage, message):
    """A truncated trainer state, shard or shard index: a RunError (one line, naming the
    checkpoint) from load_trainer_state, not a traceback from torch."""
    import random
    import shutil

    sys.path.insert(0, str(HERE / "dist"))
    from ckpt_check import build

    from gspo_cli.distributed import DistInfo
    from gspo_cli.errors import RunError
    from gspo_cli.train.checkpoint import load_trainer_state

    run, _ = sharded_run
    ckpt = tmp_path / "step_000002"
    shutil.copytree(run / "checkpoints/step_000002", ckpt)
    target = ckpt / damage
    target.write_bytes(target.read_bytes()[:40])
    model, opt, sched = build(1, DistInfo())
    with pytest.raises(RunError) as err:
        load_trainer_state(ckpt, model, opt, sched, rng=random.Random(0), shuffle=torch.Generator())
    text = str(err.value)
    assert message in text and str(ckpt) in text and "\n" not in text, text


@pytest.mark.parametrize("damage", ["state/__0_0.distcp", "state/.metadata"])
def test_export_of_a_damaged_sharded_checkpoint_is_one_line(sharded_run, tmp_path, damage):
    """`gspo export` of a run whose shard or shard index is truncated: exit 1 and one line."""
    import shutil

    run, _ = sharded_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    target = copy / "checkpoints/step_000002" / damage
    target.write_bytes(target.read_bytes()[:40])
    res = CliRunner().invoke(app, ["export", str(copy)])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "cannot read its sharded state" in lines[0], res.output
