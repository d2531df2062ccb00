"""Micro-batches (train.micro_batch_tokens / micro_batch_rows): the packing of rows to a budget,
and the update run in 1, 2, 3 or 7 micro-batches giving the unsplit gradient (in float64,
within 1e-10 relative: see helpers.in_float64) and the same metrics, for every registered
loss x aggregation, R2 and R3 replay, each mismatch correction, the KL penalty, the router
load-balancing loss and the token filters."""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import TINY, in_float64, learn_capturing_grads, models_in_float64

from gspo_cli.algorithms import AGGREGATIONS, MISMATCH_CORRECTIONS, POLICY_LOSSES
from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.rollout import make_engine
from gspo_cli.rollout.async_worker import WorkerArgs, _WorkerSampler
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Score
from gspo_cli.train.micro import batch_logprobs, split_rows
from gspo_cli.train.step import setup
from gspo_cli.train.update import route_token_mask
from gspo_cli.train.watch import GapWarning

# ----------------------------------------------------------------------------- packing


def test_rows_are_packed_evenly_to_the_token_budget():
    tokens = torch.tensor([9, 1, 5, 5, 4, 2, 6])  # 32 tokens, budget 12: 3 micro-batches
    got = split_rows(torch.arange(7), tokens, 12, None)
    loads = sorted(int(tokens[p].sum()) for p in got.parts)
    assert loads == [10, 11, 11] and got.oversize == 0
    assert sorted(torch.cat(got.parts).tolist()) == list(range(7))  # every row once, never split
    assert all(p.tolist() == sorted(p.tolist()) for p in got.parts)  # rows keep their order


def test_a_row_longer_than_the_budget_runs_alone_and_is_counted():
    tokens = torch.tensor([3, 20, 3, 2])
    got = split_rows(torch.tensor([3, 1, 0, 2]), tokens, 8, None)  # indices into tokens, any order
    assert sorted(p.tolist() for p in got.parts) == [[1], [3, 0, 2]] and got.oversize == 1


def test_row_budget_and_both_bounds():
    tokens = torch.ones(7, dtype=torch.long)
    assert [len(p) for p in split_rows(torch.arange(7), tokens, None, 2).parts] == [2, 2, 2, 1]
    # 4 rows of 5 tokens, budget 10 tokens and 1 row: the row bound wins (4 micro-batches)
    assert len(split_rows(torch.arange(4), torch.full((4,), 5), 10, 1).parts) == 4
    assert len(split_rows(torch.arange(4), torch.full((4,), 5), None, None).parts) == 1


def test_compile_with_micro_batches_is_refused_in_one_line():
    raw = {**TINY, "train": {"compile": True, "micro_batch_tokens": 64}}
    with pytest.raises(SpecError) as info:
        spec_from_dict(raw)
    assert "compile: not with micro_batch_tokens / micro_batch_rows" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


# ----------------------------------------------------------------------------- the update, split

pytestmark = pytest.mark.usefixtures("single_thread")

ROLLOUT = {"prompts_per_step": 7, "group_size": 2, "max_new_tokens": 12, "sampler_logprobs": True}
ROWS_FOR = {1: 14, 2: 7, 3: 5, 7: 2}  # micro_batch_rows giving 1, 2, 3 and 7 micro-batches of 14 rows
NOISY_METRICS = ("time/", "perf/tokens_per_s", "perf/peak_", "perf/micro_batches")


def _spec(arm: dict, train: dict | None = None, model: dict | None = None, rollout: dict | None = None):
    arm = {"name": "a", "preset": "paper-grpo", "mini_batches": 1, **arm}
    raw = {
        **TINY,
        "rollout": {**ROLLOUT, **(rollout or {})},
        "arms": [arm],
        "train": {**TINY["train"], **(train or {})},
    }
    raw["model"] = {**TINY["model"], **(model or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spec_from_dict(raw)


@pytest.fixture(scope="module")
def source():
    task = make_task("arithmetic", TINY["task"]["params"])
    return resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)


@pytest.fixture(scope="module")
def bench(source):
    """One context (a tiny MoE whose engine returns routes) and one sampled batch of 14 rows, with
    rewards that differ in every group and pi_old moved off the policy by row-varying noise, so
    ratios leave the clip range for some rows and not others; the initial weights and
    optimizer state to restore before every update."""
    task = make_task("arithmetic", TINY["task"]["params"])
    spec = _spec({"routing_replay": "r3"})
    ctx = setup(spec, spec.arms[0], 0, task, source)
    problems = task.train_problems(ctx.rng, 7)
    with ctx.compute():
        batch = ctx.engine.generate([p.prompt for p in problems for _ in range(2)])
    g = torch.Generator().manual_seed(1)
    scale_B = torch.tensor([0.3, 0.03, 3e-3, 3e-4])[torch.arange(14) % 4]
    batch.engine_logp = batch.engine_logp + torch.randn(batch.engine_logp.shape, generator=g) * scale_B[:, None]
    batch.engine_logp = batch.engine_logp * batch.response_mask
    scores = [Score(reward=float(r), correct=r > 0.5) for r in torch.rand(14, generator=g).tolist()]
    ref = copy.deepcopy(ctx.model).eval().requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    in_float64(ctx, batch, ref)
    state = (copy.deepcopy(ctx.model.state_dict()), copy.deepcopy(ctx.optimizer.state_dict()))
    return ctx, batch, scores, ref, state


def _learn(bench, spec, ways: int | None = None, **train):
    """(gradient of each optimizer step, the step's metrics) with `ways` micro-batches (or the
    `train` fields given)."""
    ctx, batch, scores, ref, (model_state, opt_state) = bench
    train = {"micro_batch_rows": ROWS_FOR[ways]} if ways else train
    spec = spec.model_copy(update={"train": spec.train.model_copy(update=train)})
    return learn_capturing_grads(ctx, spec, batch, scores, (model_state, opt_state), ref=ref)


def _same(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(NOISY_METRICS)}


def _assert_split_equals_whole(bench, spec, ways=(2, 3, 7)):
    want_grads, want = _learn(bench, spec, 1)
    assert "perf/micro_batches" not in want  # one micro-batch: the plain update
    assert want_grads and all(float(g.norm()) > 0 for g in want_grads)  # a real update to compare
    for n in ways:
        grads, got = _learn(bench, spec, n)
        per_update = math.ceil(14 / spec.arms[0].mini_batches / ROWS_FOR[n])
        assert got.get("perf/micro_batches", 1) == per_update and "perf/oversize_rows" not in got
        _assert_same(grads, _same(got), want_grads, _same(want))


def _assert_same(grads, got, want_grads, want):
    assert len(grads) == len(want_grads)
    for g, w in zip(grads, want_grads):
        assert g.dtype == torch.float64 and float((g - w).norm() / w.norm()) < 1e-10, float((g - w).norm() / w.norm())
    assert got.keys() == want.keys(), got.keys() ^ want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k


LOSS_PARAMS = {  # selections large enough to matter on 14 short rows
    "clip_cov": {"cov_ratio": 0.1, "cov_lb": -10.0, "cov_ub": 10.0},
    "kl_cov": {"cov_ratio": 0.1},
}


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_every_loss_and_aggregation_split_gives_the_unsplit_update(bench, loss):
    for aggregation in sorted(AGGREGATIONS):
        arm = {"loss": loss, "aggregation": aggregation, "loss_params": LOSS_PARAMS.get(loss, {})}
        if loss == "gmpo":
            arm.update(clip_low=0.4, clip_high=0.4)
        _assert_split_equals_whole(bench, _spec(arm), ways=(2, 7) if aggregation != "token_mean" else (2, 3, 7))


@pytest.mark.parametrize(
    "arm,model",
    [
        ({"routing_replay": "r2"}, None),
        ({"routing_replay": "r3", "mini_batches": 2, "epochs": 2}, None),
        ({"kl_coef": 0.1}, None),
        ({}, {"router_aux_loss_coef": 0.01}),
        ({"loss": "clip_cov", "loss_params": LOSS_PARAMS["clip_cov"]}, {"router_aux_loss_coef": 0.01}),
        ({"off_policy_mask": 0.05}, None),
        ({"token_filter": {"entropy_top": 0.3}}, None),
        ({"loss": "kl_cov", "loss_params": LOSS_PARAMS["kl_cov"], "off_policy_mask": 0.05}, None),
    ],
    ids=["r2", "r3-4updates", "kl", "aux", "clip_cov-aux", "off_policy_mask", "entropy_filter", "kl_cov-opm"],
)
def test_replay_penalties_and_filters_split_give_the_unsplit_update(bench, arm, model):
    _assert_split_equals_whole(bench, _spec(arm, model=model))


@pytest.mark.parametrize("mode", sorted(MISMATCH_CORRECTIONS))
def test_each_mismatch_correction_split_gives_the_unsplit_update(bench, mode):
    _assert_split_equals_whole(bench, _spec({"mismatch": {"mode": mode}}), ways=(3, 7))


def test_a_token_budget_below_every_row_runs_each_alone_counts_and_warns_once(bench):
    spec = _spec({"loss": "grpo", "aggregation": "token_mean"})
    want_grads, want = _learn(bench, spec, 1)
    assert want["policy/clip_frac_token"] > 0  # the comparison covers real clipping
    grads, got = _learn(bench, spec, micro_batch_tokens=2)
    assert got["perf/oversize_rows"] == 14 and got["perf/micro_batches"] == 14
    _assert_same(grads, _same(got) | {"perf/oversize_rows": 0}, want_grads, _same(want) | {"perf/oversize_rows": 0})
    lines = []
    warn = GapWarning("a/seed0", 0.2, 0.27)
    for step in (1, 2):
        warn.check({**got, "step": step}, SimpleNamespace(log=lines.append))
    assert lines == [
        "[a/seed0] warning: 14 rows longer than train.micro_batch_tokens ran alone as their own micro-batches "
        "at step 1 (perf/oversize_rows counts them each step)"
    ]


# ----------------------------------------------------------------------------- torchrun

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _dist_update(tmp_path, source, world: int, sharding: str, aggregation: str, micro_tokens: int | None):
    """tests/dist/update_check.py's update (16 fixed rows, rank 0's responses shorter, pi_old
    perturbed, router loss on) in `world` processes; micro-batches of `micro_tokens` tokens."""
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "train": {"steps": 1, **({"micro_batch_tokens": micro_tokens} if micro_tokens else {})},
        "model": {**TINY["model"], "sharding": sharding, "router_aux_loss_coef": 0.5},
        "rollout": {**TINY["rollout"], "prompts_per_step": 4, "group_size": 4},
        "arms": [
            {"name": "a", "preset": "paper-grpo", "aggregation": aggregation, "mini_batches": 1}
            | {"clip_low": 0.2, "clip_high": 0.2}
        ],
    }
    name = f"{sharding}-{aggregation}-{world}-{micro_tokens}"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / f"{name}.pt"
    script = str(Path(__file__).parent / "dist/update_check.py")
    cmd = ([sys.executable] if world == 1 else TORCHRUN) + [script, str(spec), source, str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sharding", "aggregation"), [("ddp", "seq_mean_token_sum_norm"), ("fsdp", "token_mean")], ids=["ddp", "fsdp"]
)
def test_two_processes_in_uneven_micro_batches_update_like_one_unsplit(tmp_path, source, sharding, aggregation):
    """2 gloo processes in micro-batches of 30 tokens: rank 0's 8 rows (8-15 tokens) pack into 4,
    rank 1's (22 tokens each) into 8, so rank 0 pads with 4 forwards of weight 0 (FSDP gathers
    layers collectively; a missing forward would hang). The gradient (DDP: all-reduced in the
    last backward only; FSDP: reduce-scattered in each) and the metrics, router loss included,
    equal one process's unsplit update of the same 16 rows."""
    one = _dist_update(tmp_path, source, 1, "ddp", aggregation, None)
    two = _dist_update(tmp_path, source, 2, sharding, aggregation, 30)
    assert two["metrics"]["perf/micro_batches"] == 6.0  # (4 + 8) / 2: uneven counts ran
    a, b = one["grads"], two["grads"]
    assert set(a) == set(b) and len(a) > 10
    scale = max(g.abs().max().item() for g in a.values())
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert 0 < scale and diff <= 1e-10 * scale, (diff, scale)  # float64: reduction order only (update_check.py)
    m1, m2 = one["metrics"], two["metrics"]
    assert 0 < m1["policy/clip_frac_token"] < 1 and m1["moe/aux_loss"] > 0
    keys = {k for k in m1 if not k.startswith(("time/", "perf/"))}
    assert keys == {k for k in m2 if not k.startswith(("time/", "perf/"))}
    for key in keys:
        assert m2[key] == pytest.approx(m1[key], rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("mode", ["record", "replay"])
def test_no_grad_forwards_in_micro_batches_give_the_whole_batch_values(bench, mode):
    """pi_old's forward (and so the KL reference's and the log-prob checks', the same function)
    in 7 micro-batches: log-probs and entropy of the whole-batch forward, and under recording
    the same experts at every position a loss or a volatility metric reads."""
    ctx, batch, *_ = bench
    whole_spec = _spec({})
    split_spec = whole_spec.model_copy(update={"train": whole_spec.train.model_copy(update={"micro_batch_rows": 2})})
    kw = {"with_entropy": True, "record": mode == "record"}
    if mode == "replay":
        kw["replay_BT"] = batch.engine_routes
    out = []
    for spec in (whole_spec, split_spec):
        ctx.spec = spec
        with torch.no_grad():
            out.append(batch_logprobs(ctx, ctx.model, batch, **kw))
    (whole, whole_routes), (split, split_routes) = out
    m = batch.response_mask > 0
    assert split.logp.dtype == torch.float64
    assert torch.allclose(split.logp[m], whole.logp[m], atol=1e-10) and torch.allclose(
        split.entropy[m], whole.entropy[m], atol=1e-10
    )
    assert float(split.logp[m].abs().sum()) > 0
    if mode == "record":
        at = route_token_mask(batch)
        assert torch.equal(split_routes[:, at], whole_routes[:, at])
    else:
        assert split_routes is None and whole_routes is None


# ----------------------------------------------------------------------------- sampling in chunks


def test_sampling_in_chunks_joins_rows_log_probs_and_routes(bench):
    """rollout.sample_rows 3: 14 rows sampled in chunks of 3, 3, 3, 3, 2 and joined. Near-greedy
    (temperature 0.01) the draws do not depend on the chunking, so the batch is the one-call
    batch: same tokens, masks, sampler log-probs and, at every routed response position, the
    same experts. (At temperature 1 the chunks draw other random numbers than one call does:
    same distribution, other samples.)"""
    ctx, batch, *_ = bench
    task = make_task("arithmetic", TINY["task"]["params"])
    prompts = [p.prompt for p in task.train_problems(random.Random(3), 7) for _ in range(2)]
    got = {}
    for rows in (None, 3):
        spec = _spec({}, rollout={"temperature": 0.01, "sample_rows": rows})
        engine = make_engine(spec.rollout, ctx.model, ctx.engine.tokenizer, model_dir="", routing=ctx.routing)
        calls = []
        inner = engine._sample
        engine._sample = lambda p, on_rows=None, inner=inner, calls=calls: calls.append(len(p)) or inner(p, on_rows)
        with ctx.compute():
            got[rows] = engine.generate(prompts)
        assert calls == ([14] if rows is None else [3, 3, 3, 3, 2])
    one, chunked = got[None], got[3]
    assert chunked.completions == one.completions
    assert torch.equal(chunked.input_ids, one.input_ids) and torch.equal(chunked.attention_mask, one.attention_mask)
    assert torch.equal(chunked.response_mask, one.response_mask)
    m = one.response_mask > 0
    assert chunked.engine_logp.dtype == torch.float64
    assert torch.allclose(chunked.engine_logp[m], one.engine_logp[m], atol=1e-10)
    at = route_token_mask(one)
    assert torch.equal(chunked.engine_routes[:, at], one.engine_routes[:, at])


def test_the_stale_workers_full_forwards_follow_the_budget(bench, source):
    """rollout.staleness 1's worker (sampler_logprobs off: pi_old and the routes from its own
    full forward, plus the check forward) in micro-batches of 2 rows: the same batch, log-probs,
    entropy and recorded experts as its one-forward run."""
    ctx = bench[0]
    spec = _spec({}, rollout={"sampler_logprobs": False})
    prompts = [p.prompt for p in make_task("arithmetic", TINY["task"]["params"]).train_problems(random.Random(5), 4)]
    out = []
    for micro in ((None, None), (None, 2)):
        args = WorkerArgs(source=source, model_cfg=spec.model, rollout_cfg=spec.rollout, seed=0, threads=1)
        worker = _WorkerSampler(dataclasses.replace(args, micro_batch=micro))
        models_in_float64(worker.model)  # the bench's weights are float64 (see helpers.in_float64)
        out.append(worker.sample(ctx.model.state_dict(), 1, [p for p in prompts for _ in range(2)], check=True))
    one, split = out
    assert one.completions == split.completions
    m = one.response_mask > 0
    for name in ("engine_logp", "engine_entropy", "check_logp"):
        assert getattr(split, name).dtype == torch.float64, name
        assert torch.allclose(getattr(split, name)[m], getattr(one, name)[m], atol=1e-10), name
    at = route_token_mask(one)
    assert torch.equal(split.engine_routes[:, at], one.engine_routes[:, at])
