"""Data parallel with torchrun (gloo, CPU, 2 processes)."""

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY, free_port

from gspo_cli.models import resolve_model_source
from gspo_cli.runs import RunDir
from gspo_cli.spec import ModelConfig
from gspo_cli.tasks import make_task

pytestmark = pytest.mark.slow
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
HERE = Path(__file__).parent


def spec_file(tmp_path, **train):
    raw = {
        **TINY,
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
        "train": {"steps": 3, "checkpoint_every": 1, **train},
        "output_dir": str(tmp_path / "out"),
    }
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.fixture(scope="module")
def source():
    task = make_task("arithmetic", TINY["task"]["params"])
    return resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)


def _run_update_check(
    tmp_path, source, aggregation, loss, world, sharding="ddp", checkpointing=False, mini_batches=1, aux=0.0, emulate=1
):
    raw = {
        **TINY,
        # Adam's first step is ~lr x sign(g): a gradient element that is float noise around 0 can
        # flip sign between world sizes and move its parameter by 2 x lr, which the second
        # mini-batch's gradient then carries. At TINY's 1e-3 that reached 3.2e-5 of the gradient's
        # scale (2026-12-05: embedding 2.1e-6 of 0.066); at 1e-5 it is ~1e-6 of it, leaving the
        # reduction order alone to compare.
        "optimizer": {**TINY["optimizer"], "lr": 1e-5 if mini_batches > 1 else TINY["optimizer"]["lr"]},
        "output_dir": str(tmp_path / "out"),
        "train": {"steps": 1, "gradient_checkpointing": checkpointing},
        "model": {**TINY["model"], "sharding": sharding, "router_aux_loss_coef": aux},
        "rollout": {**TINY["rollout"], "prompts_per_step": 4, "group_size": 4},
        "arms": [
            {
                "name": "a",
                "preset": "paper-grpo",
                "loss": loss,
                "aggregation": aggregation,
                "mini_batches": mini_batches,
                "clip_low": 0.2,
                "clip_high": 0.2,
            }
        ],
    }
    name = f"{aggregation}-{loss}-{sharding}-{checkpointing}-{mini_batches}-{aux}"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / f"{name}-{world}-{emulate}.pt"
    cmd = ([sys.executable] if world == 1 else TORCHRUN) + [
        str(HERE / "dist/update_check.py"),
        str(spec),
        source,
        str(out),
        str(emulate),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
def test_two_processes_update_and_log_like_one(tmp_path, source, aggregation):
    """The same global batch, split into whole groups across 2 ranks (uneven response lengths,
    an empty response on rank 0), gives the gradient and the step metrics of 1 process, for
    every aggregation. Per-rank denominators and plain means of per-rank metrics fail this:
    token_mean's gradient norm was 0.099 on 2 ranks against 0.126 on 1."""
    _assert_same_update(
        _run_update_check(tmp_path, source, aggregation, "grpo", 1),
        _run_update_check(tmp_path, source, aggregation, "grpo", 2),
    )


@pytest.mark.parametrize(
    ("world", "sharding", "checkpointing"), [(2, "fsdp", False), (2, "fsdp", True), (2, "ddp", True), (1, "ddp", True)]
)
def test_fsdp_and_gradient_checkpointing_update_like_one_process(tmp_path, source, world, sharding, checkpointing):
    """FSDP's first update (sharded parameters, gradients gathered for the comparison) and
    activation checkpointing (one process, DDP, FSDP) give the single-process gradient and
    step metrics on the same global batch."""
    _assert_same_update(
        _run_update_check(tmp_path, source, "token_mean", "grpo", 1),
        _run_update_check(tmp_path, source, "token_mean", "grpo", world, sharding, checkpointing),
    )


def test_two_processes_with_two_mini_batches_update_like_one_on_the_same_rows(tmp_path, source):
    """mini_batches 2 under DDP: each rank splits its own share (train/minibatch.py), so
    mini-batch j is the union of the ranks' j-th chunks. One process given that split
    (ddp_equivalent_rows) reproduces the two-process run: the gradient after the second,
    off-policy update and every step metric (both updates' statistics, ratio/logvar_mb1)."""
    one = _run_update_check(tmp_path, source, "token_mean", "grpo", 1, mini_batches=2, emulate=2)
    two = _run_update_check(tmp_path, source, "token_mean", "grpo", 2, mini_batches=2)
    assert "ratio/logvar_mb1" in one["metrics"]
    _assert_same_update(one, two)


# (ddp, 1 mini-batch) is left out: (ddp, 2) covers it and more, and each case costs a torchrun
@pytest.mark.parametrize(("sharding", "mini_batches"), [("fsdp", 1), ("ddp", 2)])
def test_load_balancing_loss_is_the_whole_batch_under_ddp(tmp_path, source, sharding, mini_batches):
    """router_aux_loss_coef > 0: the load-balancing loss (a product of two means) of 2 ranks is
    the whole batch's, in value (moe/aux_loss) and gradient, with FSDP, and with DDP and 2
    mini-batches (against one process given the same rows). Rank-local, it was not (review:
    whole batch 2.152 vs mean of halves 2.218). Two bugs hid behind this: the chunked log-prob
    path dropped the router logits (so every rank fell back to its own aux_loss), and rows were
    counted by the attention mask, whose attended-but-unmasked tail (rank 0's cut responses
    here) one process keeps and a rank's trimmed mini-batch drops: DDP, 1 mini-batch, max
    gradient diff 0.0139 of scale 0.0204 before, 1.1e-8 of 0.033 after."""
    emulate = 2 if mini_batches > 1 else 1
    one = _run_update_check(
        tmp_path, source, "token_mean", "grpo", 1, mini_batches=mini_batches, aux=0.5, emulate=emulate
    )
    two = _run_update_check(tmp_path, source, "token_mean", "grpo", 2, sharding, mini_batches=mini_batches, aux=0.5)
    assert one["metrics"]["moe/aux_loss"] > 0
    _assert_same_update(one, two)


def _assert_same_update(one, two):
    a, b = one["grads"], two["grads"]
    assert set(a) == set(b) and len(a) > 10
    scale = max(g.abs().max().item() for g in a.values())
    assert scale > 0
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-10 * scale, (diff, scale)  # float64: reduction order only (update_check.py)
    m1, m2 = one["metrics"], two["metrics"]
    assert 0 < m1["policy/clip_frac_token"] < 1  # the perturbed pi_old makes some tokens clip
    skip = ("time/", "perf/")
    assert {k for k in m1 if not k.startswith(skip)} == {k for k in m2 if not k.startswith(skip)}
    for key, v in m1.items():
        if not key.startswith(skip):
            assert m2[key] == pytest.approx(v, rel=1e-9, abs=1e-12), key


def test_a_nan_on_one_rank_ends_the_run_on_both(tmp_path, source):
    """Rank 1's loss turns NaN at one mini-batch: both ranks decide together. Without
    skipping the run is `diverged` on both ranks (no hang); with skip_bad_batches both skip
    that mini-batch and it counts once, not once per rank."""
    for skip, status in ((False, "diverged"), (True, "completed")):
        out = tmp_path / f"skip{skip}"
        raw = {
            **TINY,
            "output_dir": str(out),
            "train": {"steps": 2, "divergence": {"skip_bad_batches": skip}},
            "task": {**TINY["task"], "eval_size": 0},
            "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
        }
        spec = tmp_path / f"nan{skip}.yaml"
        spec.write_text(yaml.safe_dump(raw))
        t0 = time.time()
        res = subprocess.run(
            TORCHRUN + [str(HERE / "dist/nan_check.py"), str(spec), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == [status, status]
        assert time.time() - t0 < 120
        rd = RunDir(out / "e2e/gspo/seed0")
        assert rd.status() == status
        ms = rd.metrics()
        if skip:
            assert [m.get("policy/skipped_minibatches") for m in ms] == [1, None]
        else:
            assert ms == [] and "step 1: non-finite" in rd.info()["error"]


def test_the_entropy_threshold_is_the_whole_batchs_on_two_processes(tmp_path):
    """token_filter.entropy_top 0.55 on a planted batch (tests/dist/entropy_check.py): one process
    keeps the 10 tokens of rows 2-3 and none of rows 0-1. Two processes, each with two rows, keep
    the same; with a threshold per process they kept 4 of rank 0's 8 tokens and 5 of rank 1's 10."""
    one, two = tmp_path / "one", tmp_path / "two"
    for out, cmd in ((one, [sys.executable]), (two, TORCHRUN)):
        out.mkdir()
        res = subprocess.run(
            cmd + [str(HERE / "dist/entropy_check.py"), str(out)], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr[-3000:]
    whole = json.loads((one / "kept0.json").read_text())
    assert whole["rows"] == [0, 1, 2, 3]
    assert whole["kept"] == [[0.0] * 5, [0.0] * 5, [1.0] * 5, [1.0] * 5]
    split = [json.loads((two / f"kept{r}.json").read_text()) for r in (0, 1)]
    assert [s["rows"] for s in split] == [[0, 1], [2, 3]]
    assert split[0]["kept"] + split[1]["kept"] == whole["kept"]


def test_torchrun_trains_writes_once_and_resumes_with_one_process(tmp_path, source):
    spec = spec_file(tmp_path, steps=4)
    rd = RunDir(tmp_path / "out/e2e/gspo/seed0")
    proc = subprocess.Popen(
        TORCHRUN + ["-m", "gspo_cli", "train", str(spec), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while len(rd.metrics()) < 1 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    ms = rd.metrics()
    if len(ms) == 4:
        pytest.skip("all 4 steps finished before the signal landed")
    assert rd.status() == "interrupted", err[-3000:]
    assert [m["step"] for m in ms] == list(range(1, len(ms) + 1))  # one writer: no duplicate lines
    assert rd.latest_checkpoint().name == f"step_{len(ms):06d}"
    # metrics were reduced over both ranks' halves of the batch
    assert ms[0]["response/length_max"] >= ms[0]["response/length_mean"]
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "train", str(spec), "--json"], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["status"] == "completed"
    assert [m["step"] for m in rd.metrics()] == [1, 2, 3, 4]
    assert rd.info()["resumes"] == 1


def test_world_size_must_divide_the_prompts(tmp_path, source):
    raw = yaml.safe_load(spec_file(tmp_path).read_text())
    raw["rollout"]["prompts_per_step"] = 3
    raw["rollout"]["group_size"] = 4
    raw["arms"][0]["mini_batches"] = 1
    p = tmp_path / "odd.yaml"
    p.write_text(yaml.safe_dump(raw))
    res = subprocess.run(TORCHRUN + ["-m", "gspo_cli", "train", str(p)], capture_output=True, text=True)
    assert res.returncode != 0
    assert "rollout.prompts_per_step: 3 is not divisible by the 2 processes" in res.stderr


def _fsdp_spec(tmp_path, steps, sharding):
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "model": {**TINY["model"], "sharding": sharding},
        "train": {"steps": steps, "checkpoint_every": 2},  # evaluation on: every rank samples it
        "arms": [{"name": "grpo_rr", "preset": "paper-grpo-rr", "mini_batches": 2}],
    }
    p = tmp_path / f"fsdp{steps}{sharding}.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@pytest.mark.parametrize("first", ["fsdp", "one"])
def test_fsdp_runs_checkpoint_for_transformers_and_resume_across_process_counts(tmp_path, first):
    """An FSDP run (routing replay on the sharded MoE, generation with sharded weights) writes
    sharded checkpoints and exports an HF directory at the end; a 2-step FSDP run continues
    in 1 process and the reverse."""
    from transformers import AutoModelForCausalLM

    rd = RunDir(tmp_path / "out/e2e/grpo_rr/seed0")
    fsdp_cmd = TORCHRUN + ["-m", "gspo_cli", "train"]
    one_cmd = [sys.executable, "-m", "gspo_cli", "train"]
    cmds = [fsdp_cmd, one_cmd] if first == "fsdp" else [one_cmd, fsdp_cmd]
    res = subprocess.run(
        cmds[0] + [str(_fsdp_spec(tmp_path, 2, "fsdp")), "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)[0]["status"] == "completed"  # one JSON document, however many processes
    assert rd.status() == "completed" and [m["step"] for m in rd.metrics()] == [1, 2]
    ckpt = rd.latest_checkpoint()
    assert (ckpt / "state/.metadata").is_file() == (first == "fsdp")  # per-rank shards, or an HF directory
    hf = rd.path / "model" if first == "fsdp" else ckpt  # the FSDP run's export
    model = AutoModelForCausalLM.from_pretrained(hf)  # whole weights, loadable by transformers
    assert sum(p.numel() for p in model.parameters()) > 10_000
    # the same run, 2 more steps: its spec differs only in train.steps, so move the finished
    # run aside as an unfinished one (status running) to continue it with the other world size
    rd.update_info(status="running")
    spec4 = _fsdp_spec(tmp_path, 4, "fsdp")
    (rd.path / "spec.yaml").write_text((rd.path / "spec.yaml").read_text().replace("steps: 2", "steps: 4"))
    res = subprocess.run(cmds[1] + [str(spec4), "--quiet"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ms = rd.metrics()
    assert rd.status() == "completed" and [m["step"] for m in ms] == [1, 2, 3, 4], res.stderr[-2000:]
    assert rd.info()["resumes"] == 1
    assert [e["step"] for e in rd.evals()] == [0, 2, 4]
    assert all(math.isfinite(m["policy/loss"]) for m in ms)
    assert all(0 <= m["moe/expert_change_frac"] < 0.5 for m in ms)


def test_sharded_weights_stream_as_the_whole_model_converts():
    """The FSDP -> vLLM weight stream, without vLLM: on each of 2 processes, the gathered,
    name-converted parameters (uneven shards included) equal the unsharded model's
    save_pretrained-layout weights, name for name and bit for bit."""
    res = subprocess.run(TORCHRUN + [str(HERE / "dist/stream_check.py")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ok 32 tensors" in res.stdout


LEAVE = """
import sys
import torch.distributed as dist
from gspo_cli.distributed import leave_process_group
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
leave_process_group({code}, exit_now={exit_now})
print("returned", dist.is_initialized(), flush=True)
"""


@pytest.mark.parametrize("code,exit_now,rc,out", [(0, False, 0, "returned False"), (0, True, 0, ""), (3, False, 3, "")])
def test_leaving_the_process_group(code, exit_now, rc, out):
    """Success destroys the group and returns (the interpreter's exit handlers still run) unless
    told to exit at once; an error leaves at once with its code, without a collective."""
    script = LEAVE.format(port=free_port(), code=code, exit_now=exit_now)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == rc, res.stderr[-2000:]
    assert res.stdout.strip() == out
