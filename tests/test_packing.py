"""Padding-free packing (train.packing): rows concatenated into one with per-row positions give
the padded forward's log-probs, entropies, routes and router logits, and the update the padded
gradient (fp32, float rounding only), on the built-in model (R2, R3, tool masks, router loss,
micro-batches) and on a Qwen3-MoE built from another config (sdpa and eager); where the
attention cannot pack, padding, said in one setup line."""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY, in_float64, learn_capturing_grads
from transformers import AutoModelForCausalLM, Qwen3MoeConfig

from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.models.routing import RoutingController, routes_from_BT, routes_to_BT
from gspo_cli.rollout import RolloutBatch, response_logprobs
from gspo_cli.rollout.packing import Packing, resolve_packing
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Score
from gspo_cli.train.micro import batch_logprobs
from gspo_cli.train.step import setup
from gspo_cli.train.update import route_token_mask

pytestmark = pytest.mark.usefixtures("single_thread")


def _batch(prompt_lens, response_lens, P=5, C=8, vocab=50, seed=0) -> RolloutBatch:
    """Left-padded prompts and right-padded responses of these lengths, random ids."""
    B = len(prompt_lens)
    attn = torch.zeros(B, P + C, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attn[i, P - p : P] = 1
        attn[i, P : P + r] = 1
    ids = torch.randint(3, vocab, (B, P + C), generator=torch.Generator().manual_seed(seed)) * attn
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=attn[:, P:].double(),  # float64 throughout: see helpers.in_float64
        prompt_len=P,
        completions=[""] * B,
        truncated=torch.zeros(B, dtype=torch.bool),
    )


def test_packing_maps_real_tokens_in_and_out():
    b = _batch([2, 1], [1, 3], P=2, C=3)  # row 0: 2 + 1 tokens, row 1: 1 + 3
    pk = Packing.of(b)
    got = pk.inputs(b)
    assert got["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3]] and got["attention_mask"] is None
    assert got["input_ids"][0].tolist() == b.input_ids[b.attention_mask > 0].tolist()
    assert pk.index_BT().tolist() == [[0, 1, 2, -1, -1], [-1, 3, 4, 5, 6]]
    routes_LNk = torch.arange(7 * 2).reshape(1, 7, 2) + 10
    out = routes_to_BT(pk.routes_out(routes_LNk), 2, 5)
    assert out[0, 0].tolist() == [[10, 11], [12, 13], [14, 15], [0, 1], [0, 1]]  # padding: experts 0..k-1
    assert torch.equal(pk.routes_in(out), routes_LNk)  # a round trip
    rows = pk.rows_out(torch.ones(7, 3))
    assert rows.sum(-1).tolist() == [3, 3, 3, 0, 0, 0, 3, 3, 3, 3]


# ----------------------------------------------------------------------------- a Qwen3-MoE from config


def _qwen3_moe(attn: str):
    cfg = Qwen3MoeConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        mlp_only_layers=[1],  # a dense layer between two sparse ones
        max_position_embeddings=64,
        output_router_logits=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="eager", attn_implementation=attn).double()
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("TopKRouter"):
                m.weight.normal_(0.0, 0.5)  # from_config zeroes them: every token would tie
    return model


def _grads_and_outputs(model, routing, batch, packed: bool, replay_BT=None):
    """(log-probs, entropy, recorded routes (L, B, T, k), gradient) of sum(logp x model mask) +
    0.1 x the router loss's prob sums, one forward and backward."""
    model.zero_grad(set_to_none=True)
    pk = Packing.of(batch) if packed else None
    if replay_BT is None:
        around = routing.recording()
    else:
        around = routing.replaying(pk.routes_in(replay_BT) if packed else routes_from_BT(replay_BT))
    with around as rec:
        out = response_logprobs(model, batch, 0.7, with_entropy=True, packed=packed)
        tokens = batch.attention_mask.reshape(-1, 1).double()
        aux = sum(
            (torch.softmax(r, -1) * tokens).sum(0) @ torch.arange(6.0, dtype=torch.float64) for r in out.router_logits
        )
        ((out.logp * batch.model_mask).sum() + 0.1 * aux).backward()
    routes = pk.routes_out(rec.routes) if packed else rec.routes
    B, T = batch.input_ids.shape
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return out.logp.detach(), out.entropy.detach(), routes_to_BT(routes, B, T), grad


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_qwen3_moe_from_config_packed_equals_padded(attn):
    """Skewed rows (responses 1..8 tokens, one 3-token tool span counted out of the loss):
    log-probs, entropies, experts at every real position and the gradient, recorded and then
    replayed (R3's path), packed as padded, in float64 (helpers.in_float64).

    transformers' eager attention takes its softmax in float32 whatever the model's dtype, so its
    comparison has a float32 floor: the same padded forward with sdpa's float64 softmax measures
    it (7.8e-8 relative in the gradient, 1.9e-8 in log-probs, on a 2-core x86 box; packed vs
    padded: 7.5e-8 and 2.2e-8), and packed may differ from padded by at most 10x that. Its
    float32 softmax also turns a fully masked row (a left-padding position) into NaN in float64,
    so its rows share one prompt length (sdpa's cover left padding)."""
    model = _qwen3_moe(attn)
    routing = RoutingController(model)
    batch = _batch([5, 2, 3, 1] if attn == "sdpa" else [5, 5, 5, 5], [8, 1, 4, 2])
    batch.tool_mask = torch.zeros_like(batch.response_mask)
    batch.tool_mask[0, 2:5] = 1.0
    real = batch.attention_mask > 0
    m = batch.response_mask > 0

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    pad = _grads_and_outputs(model, routing, batch, packed=False)
    pack = _grads_and_outputs(model, routing, batch, packed=True)
    atol, grad_bound = 1e-10, 1e-10
    if attn == "eager":
        model.set_attn_implementation("sdpa")
        exact = _grads_and_outputs(model, routing, batch, packed=False)
        model.set_attn_implementation("eager")
        floor_logp, floor_grad = float((pad[0] - exact[0])[m].abs().max()), rel(pad[3], exact[3])
        assert 0 < floor_grad < 1e-5 and floor_logp < 1e-5, (floor_logp, floor_grad)  # float32's, not a bug
        atol, grad_bound = 10 * floor_logp + 1e-10, 10 * floor_grad
    assert float(pad[0][m].abs().min()) > 0 and float(pad[3].norm()) > 0
    assert pad[0].dtype == pad[3].dtype == torch.float64
    assert torch.allclose(pack[0][m], pad[0][m], atol=atol) and torch.allclose(pack[1][m], pad[1][m], atol=atol)
    assert torch.equal(pack[2][:, real], pad[2][:, real])
    assert rel(pack[3], pad[3]) < grad_bound, (rel(pack[3], pad[3]), grad_bound)
    # replay another draw of experts (as R3 replays the engine's): packed replays them the same
    gen = torch.Generator().manual_seed(1)
    forced = torch.rand(*pad[2].shape[:-1], 6, generator=gen).topk(2, dim=-1).indices
    pad_r = _grads_and_outputs(model, routing, batch, packed=False, replay_BT=forced)
    pack_r = _grads_and_outputs(model, routing, batch, packed=True, replay_BT=forced)
    assert not torch.allclose(pad_r[0][m], pad[0][m], atol=1e-3)  # the replay changed the outputs
    assert torch.allclose(pack_r[0][m], pad_r[0][m], atol=atol)
    assert rel(pack_r[3], pad_r[3]) < grad_bound, (rel(pack_r[3], pad_r[3]), grad_bound)


# ----------------------------------------------------------------------------- the built-in model's update

ROLLOUT = {"prompts_per_step": 6, "group_size": 2, "max_new_tokens": 12, "sampler_logprobs": True}


def _spec(arm: dict, train: dict | None = None, model: dict | None = None):
    raw = {
        **TINY,
        "rollout": ROLLOUT,
        "arms": [{"name": "a", "preset": "paper-grpo", "mini_batches": 1, **arm}],
        "train": {**TINY["train"], **(train or {})},
        "model": {**TINY["model"], **(model or {})},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spec_from_dict(raw)


@pytest.fixture(scope="module")
def bench():
    """The built-in tiny MoE (engine routes on), 12 sampled rows with a tool span in every row
    long enough, pi_old moved off the policy, rewards varying; the state to restore."""
    task = make_task("arithmetic", TINY["task"]["params"])
    source = resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)
    spec = _spec({"routing_replay": "r3"})
    ctx = setup(spec, spec.arms[0], 0, task, source)
    with ctx.compute():
        batch = ctx.engine.generate([p.prompt for p in task.train_problems(ctx.rng, 6) for _ in range(2)])
    g = torch.Generator().manual_seed(1)
    batch.engine_logp = (batch.engine_logp + torch.randn(batch.engine_logp.shape, generator=g) * 0.1) * (
        batch.response_mask
    )
    batch.tool_mask = torch.zeros_like(batch.response_mask)
    long = batch.response_mask.sum(-1) >= 6
    batch.tool_mask[long, 2:4] = 1.0  # environment tokens: attended and routed, out of every loss
    scores = [Score(reward=float(r), correct=r > 0.5) for r in torch.rand(12, generator=g).tolist()]
    in_float64(ctx, batch)
    state = (copy.deepcopy(ctx.model.state_dict()), copy.deepcopy(ctx.optimizer.state_dict()))
    return ctx, batch, scores, state


def _learn(bench, spec, packed: bool):
    ctx, batch, scores, state = bench
    grads, metrics = learn_capturing_grads(ctx, spec, batch, scores, state, packed=packed)
    return grads, {k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/tokens_per_s", "perf/peak_"))}


@pytest.mark.parametrize(
    "arm,train,model",
    [
        ({"routing_replay": "r2"}, None, None),
        ({"routing_replay": "r3", "mini_batches": 2}, {"micro_batch_rows": 2}, {"router_aux_loss_coef": 0.01}),
        ({"loss": "gspo", "aggregation": "seq_mean_token_mean"}, {"micro_batch_tokens": 60}, None),
    ],
    ids=["r2", "r3-micro-aux", "gspo-micro"],
)
def test_the_built_in_models_update_packed_equals_padded(bench, arm, train, model, monkeypatch):
    spec = _spec(arm, train, model)
    want_grads, want = _learn(bench, spec, packed=False)
    rows_packed = []
    inputs = Packing.inputs
    monkeypatch.setattr(Packing, "inputs", lambda self, b: rows_packed.append(len(b.input_ids)) or inputs(self, b))
    grads, got = _learn(bench, spec, packed=True)
    assert sum(rows_packed) >= 12 and max(rows_packed) > 1  # the update's forwards ran packed
    assert want["policy/clip_frac_token"] > 0 or arm.get("loss") == "gspo"  # real clipping compared
    assert len(grads) == len(want_grads) >= 1
    for g, w in zip(grads, want_grads):
        assert g.dtype == torch.float64 and float(w.norm()) > 0
        assert float((g - w).norm() / w.norm()) < 1e-10, float((g - w).norm() / w.norm())
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), k


def test_the_batch_wide_forward_packed_records_the_padded_routes(bench):
    """pi_old's forward (R2 records its routes) in micro-batches of 5 rows, packed: log-probs,
    entropies and the experts at every routed position of the padded forward."""
    ctx, batch, *_ = bench
    ctx.spec = _spec({}, {"micro_batch_rows": 5})
    out = []
    for packed in (False, True):
        ctx.packed = packed
        with torch.no_grad():
            out.append(batch_logprobs(ctx, ctx.model, batch, with_entropy=True, record=True))
    ctx.packed = False
    (pad, pad_routes), (pack, pack_routes) = out
    m = batch.response_mask > 0
    assert pack.logp.dtype == torch.float64
    assert torch.allclose(pack.logp[m], pad.logp[m], atol=1e-10) and torch.allclose(
        pack.entropy[m], pad.entropy[m], atol=1e-10
    )
    at = route_token_mask(batch)
    assert torch.equal(pack_routes[:, at], pad_routes[:, at])


# ----------------------------------------------------------------------------- which path runs


def test_the_setup_line_says_which_path_runs_and_falls_back_in_one_line():
    model = _qwen3_moe("sdpa")
    assert resolve_packing("off", model, "cpu", False) == (False, "forwards: padded rows (train.packing: off)")
    packed, line = resolve_packing("auto", model, "cpu", False)  # mixed on CPU: benchmarks/README.md
    assert not packed and line == (
        "forwards: padded rows (train.packing: auto; sdpa attention on cpu packs, but was not measured "
        "faster there: benchmarks/README.md)"
    )
    eager = _qwen3_moe("eager")
    assert not resolve_packing("auto", eager, "cuda", False)[0] and resolve_packing("on", eager, "cuda", False)[0]
    assert resolve_packing("on", model, "cpu", False) == (
        True,
        "forwards: packed rows, padding-free (sdpa attention on cpu, train.packing: on)",
    )
    packed, line = resolve_packing("on", model, "cpu", True)
    assert not packed and line == "forwards: padded rows (train.packing: on falls back: train.compile pads to buckets)"
    packed, line = resolve_packing("on", torch.nn.Linear(2, 2), "cpu", False)
    assert (
        not packed
        and line == "forwards: padded rows (train.packing: on falls back: Linear is not a transformers model)"
    )
    model.config._attn_implementation = "paged|sdpa"  # kernels without a packed path
    packed, line = resolve_packing("on", model, "cuda", False)
    assert not packed and "has no packed-sequence path" in line and "\n" not in line


def test_bare_yaml_on_and_off_are_taken_as_meant_and_a_bad_value_is_one_line():
    for text, want in (("on", "on"), ("off", "off"), ("auto", "auto")):
        assert spec_from_dict({**TINY, "train": yaml.safe_load(f"packing: {text}")}).train.packing == want
    with pytest.raises(SpecError) as info:
        spec_from_dict({**TINY, "train": {"packing": "yes"}})
    assert "packing" in str(info.value) and len(str(info.value).splitlines()) == 1


# ----------------------------------------------------------------------------- torchrun

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _dist_update(tmp_path, world: int, train: dict, sharding: str = "ddp", arm: dict | None = None):
    """tests/dist/update_check.py's update (16 fixed rows, rank 0's responses shorter, pi_old
    perturbed, router loss on) in `world` processes (`sharding`) with these `train` fields and
    `arm` fields over paper-grpo's."""
    task = make_task("arithmetic", TINY["task"]["params"])
    source = resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)
    raw = {
        **TINY,
        "output_dir": str(tmp_path / "out"),
        "train": {"steps": 1, **train},
        "model": {**TINY["model"], "router_aux_loss_coef": 0.5, "sharding": sharding},
        "rollout": {**TINY["rollout"], "prompts_per_step": 4, "group_size": 4},
        "arms": [
            {"name": "a", "preset": "paper-grpo", "mini_batches": 1, "clip_low": 0.2, "clip_high": 0.2, **(arm or {})}
        ],
    }
    name = f"{world}-{sharding}-" + "-".join(f"{k}{v}" for k, v in {**train, **(arm or {})}.items())
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / f"{name}.pt"
    script = str(Path(__file__).parent / "dist/update_check.py")
    cmd = ([sys.executable] if world == 1 else TORCHRUN) + [script, str(spec), source, str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return torch.load(out)


def _same_update(one: dict, two: dict) -> None:
    """The gradient within 1e-5 of the largest (float reduction order only) and the metrics
    (router loss included) of `one` equal `two`'s."""
    a, b = one["grads"], two["grads"]
    assert set(a) == set(b) and len(a) > 10
    scale = max(g.abs().max().item() for g in a.values())
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert 0 < scale and diff <= 1e-10 * scale, (diff, scale)  # float64 (update_check.py)
    m1, m2 = one["metrics"], two["metrics"]
    assert 0 < m1["policy/clip_frac_token"] < 1 and m1["moe/aux_loss"] > 0
    keys = {k for k in m1 if not k.startswith(("time/", "perf/"))}
    assert keys == {k for k in m2 if not k.startswith(("time/", "perf/"))}
    for key in keys:
        assert m2[key] == pytest.approx(m1[key], rel=1e-9, abs=1e-12), key


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sharding", "packing"), [("ddp", "on"), ("ddp", "off"), ("fsdp", "on")], ids=["ddp-on", "ddp-off", "fsdp-on"]
)
def test_two_processes_packed_or_padded_update_like_one_padded(tmp_path, sharding, packing):
    """2 gloo processes (DDP, or FSDP: a sharded model whose layers are gathered in every
    packed forward) in uneven micro-batches of 30 tokens (rank 0: 4, rank 1: 8, so under FSDP
    rank 0 runs 4 packed forwards of weight 0), packed or padded: the gradient and metrics
    (router loss included) of one process's unsplit, padded update of the same 16 rows."""
    one = _dist_update(tmp_path, 1, {"packing": "off"})
    two = _dist_update(tmp_path, 2, {"packing": packing, "micro_batch_tokens": 30}, sharding)
    assert not one["packed"] and two["packed"] == (packing == "on")
    assert two["metrics"]["perf/micro_batches"] == 6.0
    _same_update(one, two)


@pytest.mark.slow
def test_two_fsdp_processes_in_row_micro_batches_replaying_r2_update_like_one_unsplit(tmp_path):
    """R2 under FSDP in micro-batches of at most 3 rows (8 rows a rank: 3 each), GSPO's
    sequence-level loss, router loss on, packed: every micro-batch replays pi_old's routes
    (every other position's experts shifted, so the replay moves the gradient) at its own rows'
    packed positions, and the gradient and metrics equal one process's unsplit, padded R2
    update of the same 16 rows."""
    arm = {"preset": "paper-gspo", "routing_replay": "r2", "clip_low": 3e-4, "clip_high": 4e-4}
    one = _dist_update(tmp_path, 1, {"packing": "off"}, arm=arm)
    free = _dist_update(tmp_path, 1, {"packing": "off"}, arm={**arm, "routing_replay": "off"})
    scale = max(g.abs().max().item() for g in one["grads"].values())
    moved = max((one["grads"][k] - free["grads"][k]).abs().max().item() for k in one["grads"])
    assert moved > 1e-2 * scale, (moved, scale)  # the shifted routes were replayed
    two = _dist_update(tmp_path, 2, {"packing": "on", "micro_batch_rows": 3}, "fsdp", arm=arm)
    assert two["packed"] and two["metrics"]["perf/micro_batches"] == 3.0
    _same_update(one, two)


def test_a_lora_wrapped_model_packs_and_gives_the_padded_gradient():
    """PEFT wraps the transformers model (model.lora): it is still found, packs, and the adapters'
    gradient is the padded one."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_qwen3_moe("sdpa"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)  # PEFT starts B at 0: give the adapters a gradient path both ways
    assert resolve_packing("on", model, "cpu", False)[0]
    batch = _batch([5, 2, 3], [8, 1, 4])
    out = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, batch, 1.0, packed=packed).logp
        (logp * batch.response_mask).sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        out.append((logp.detach(), grads))
    m = batch.response_mask > 0
    (pad, pad_g), (pack, pack_g) = out
    assert pack.dtype == torch.float64 and float(pad_g.norm()) > 0
    assert torch.allclose(pack[m], pad[m], atol=1e-10)
    assert float((pack_g - pad_g).norm() / pad_g.norm()) < 1e-10
