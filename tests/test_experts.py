"""Fused MoE experts (`model.experts_implementation`: `grouped_mm`, transformers' grouped-GEMM
experts, and `gspo_grouped_mm`, the same with index_select gathers) compute what the loop over
experts (`eager`) computes: forward, backward, routes, routing replay and the expert-change
metric, in float32; all load the same checkpoints; ours equals grouped_mm bit for bit.

The grouped GEMM has no float64 kernel, so float32 is the point here: each comparison measures
its floor, the loop in float32 against the same loop in float64, and the two float32 paths may
differ by at most 4x it (each is about one floor from the float64 result)."""

import copy

import pytest
import torch
import transformers as tf
from helpers import TINY, max_gap, models_in_float64

from gspo_cli.models import experts, load_model, resolve_model_source
from gspo_cli.models.routing import RoutingController, expert_change_frac
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.step import setup, train_step

V, E, K = 48, 8, 2
FUSED = ("grouped_mm", "gspo_grouped_mm")


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py


def _pair(impl="grouped_mm"):
    """The same tiny Qwen3-MoE (random routers, so tokens spread over the experts) twice: experts
    as a loop and as `impl`."""
    cfg = tf.Qwen3MoeConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        moe_intermediate_size=24,
        num_experts=E,
        num_experts_per_tok=K,
        norm_topk_prob=True,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    # one config object each: from_config records the implementation in the config it is given
    loop = tf.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), experts_implementation="eager").train()
    with torch.no_grad():
        for name, p in loop.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
    fused = tf.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), experts_implementation=impl).train()
    fused.load_state_dict(loop.state_dict())
    assert loop.config._experts_implementation == "eager" and fused.config._experts_implementation == impl
    return loop, fused


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (3, 10), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # left padding
    attn[2, -2:] = 0  # right padding
    return dict(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0), use_cache=False)


def _fwd_bwd(model, ctl, seed, replay=None):
    """(logits, {name: grad}, routes): routes recorded, or under `replay` the routers' own choices."""
    ctx = ctl.replaying(replay) if replay is not None else ctl.recording()
    with ctx as rec:
        logits = model(**_inputs(seed)).logits
        (logits.log_softmax(-1)[..., 5].sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads, rec.routes


def _within_floor(loop, fused, exact, what):
    """`fused` (float32) differs from `loop` (float32) by at most 4x the loop's own float32 floor,
    its gap to `exact` (the loop in float64); tensors or dicts of them."""
    floor, gap = max_gap(loop, exact), max_gap(fused, loop)
    assert 0 < floor < 1e-4, (what, floor)  # float32's rounding: nonzero, and small
    assert gap <= 4 * floor, (what, gap, floor)


@pytest.mark.parametrize("impl", FUSED)
def test_grouped_experts_equal_the_loop_forward_backward_routes_replay(impl):
    loop, fused = _pair(impl)
    exact = copy.deepcopy(loop)
    models_in_float64(exact)
    c_loop, c_fused, c_exact = RoutingController(loop), RoutingController(fused), RoutingController(exact)
    l1, g1, r1 = _fwd_bwd(loop, c_loop, seed=1)
    l2, g2, r2 = _fwd_bwd(fused, c_fused, seed=1)
    lx, gx, rx = _fwd_bwd(exact, c_exact, seed=1)
    assert lx.dtype == torch.float64 and torch.equal(rx, r1)
    _within_floor(l1, l2, lx, "logits")
    assert len(g1) == len(g2) == len(list(loop.parameters())) and any(".experts." in k for k in g1)
    _within_floor(g1, g2, gx, "gradient")
    assert torch.equal(r1, r2) and r1.shape == (2, 30, K)
    assert len(r1.unique()) > E // 2  # several experts in use: the comparison covers the grouping

    # R2: replay another batch's routes (forced experts): same outputs, gradients, own choices
    forced = _fwd_bwd(loop, c_loop, seed=2)[2]
    l1, g1, own1 = _fwd_bwd(loop, c_loop, seed=1, replay=forced)
    l2, g2, own2 = _fwd_bwd(fused, c_fused, seed=1, replay=forced)
    lx, gx, _ = _fwd_bwd(exact, c_exact, seed=1, replay=forced)
    _within_floor(l1, l2, lx, "logits under replay")
    _within_floor(g1, g2, gx, "gradient under replay")
    assert torch.equal(own1, own2)
    assert torch.equal(own1[0], r1[0])  # the first layer's own choices: unreplayed ones (later layers see replay)
    frac = expert_change_frac(forced, own1)
    assert 0 < frac < 1 and frac == expert_change_frac(forced, own2)


def test_one_checkpoint_loads_either_way(tmp_path):
    """The experts' parameters are the same 3-D tensors either way: a checkpoint saved from the
    loop (as every cached built-in model is) loads fused, and gives the same forward."""
    loop, _ = _pair()
    loop.save_pretrained(tmp_path / "m")
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=_char_tokenizer(), pad_token="<pad>", eos_token="</s>")
    tok.save_pretrained(tmp_path / "m")
    models = {}
    for impl in ("eager", *FUSED):
        lm = load_model(str(tmp_path / "m"), ModelConfig(name=str(tmp_path / "m"), experts_implementation=impl))
        assert lm.model.config._experts_implementation == impl and lm.is_moe
        models[impl] = lm.model
    sd_loop, sd_fused = models["eager"].state_dict(), models["grouped_mm"].state_dict()
    assert {k: v.shape for k, v in sd_loop.items()} == {k: v.shape for k, v in sd_fused.items()}
    assert all(torch.equal(sd_loop[k], sd_fused[k]) for k in sd_loop)
    exact = copy.deepcopy(models["eager"])
    models_in_float64(exact)
    with torch.no_grad():
        a, b, c, x = (m(**_inputs(3)).logits for m in (*(models[i] for i in ("eager", *FUSED)), exact))
    _within_floor(a, b, x, "logits")
    assert torch.equal(b, c)


def _char_tokenizer():
    from tokenizers import Tokenizer, models

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", *[chr(97 + i) for i in range(V - 3)]])}
    return Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<pad>"))


@pytest.mark.parametrize("arm", ["grpo", "grpo_rr"])
def test_a_training_step_is_the_same_with_either_experts(tmp_path, arm):
    """One step of the trainer on the built-in tiny MoE (route recording, or R2 replay) with
    each implementation: the same losses, clip fractions, expert-change metric and weights, within
    4x the float32 floor that the same step with eager experts in float64 measures (metrics also
    within one unit of the 6 significant digits the step reports)."""
    out = {}
    for impl in ("eager", "float64", *FUSED):
        raw = {
            **TINY,
            "output_dir": str(tmp_path / impl),
            "model": {**TINY["model"], "experts_implementation": "eager" if impl == "float64" else impl},
            "arms": [a for a in TINY["arms"] if a["name"] == arm],
        }
        spec = spec_from_dict(raw)
        task = make_task(spec.task.name, spec.task.params)
        ctx = setup(spec, spec.arms[0], 0, task, resolve_model_source(spec.model, task, log=lambda m: None))
        if impl == "float64":
            models_in_float64(ctx.model)
        assert ctx.model.config._experts_implementation == ("eager" if impl == "float64" else impl)
        out[impl] = (train_step(ctx, 1), ctx.model.state_dict())
    (m1, w1), (mx, wx) = out["eager"], out["float64"]
    keys = [k for k in m1 if k.startswith(("policy/", "ratio/", "moe/", "reward/"))]
    assert "moe/expert_change_frac" in keys
    for impl in FUSED:
        m2, w2 = out[impl]
        for k in keys:
            assert abs(m2[k] - m1[k]) <= 4 * abs(m1[k] - mx[k]) + 1e-5 * abs(m1[k]), (impl, k, m1[k], m2[k], mx[k])
        _within_floor(w1, w2, wx, f"{impl} weights")
    # ours and transformers' grouped_mm: the same step to the last bit
    (m2, w2), (m3, w3) = out["grouped_mm"], out["gspo_grouped_mm"]
    assert all(m2[k] == m3[k] for k in keys)
    assert all(torch.equal(w2[k], w3[k]) for k in w2)


def _experts_pair():
    """One experts module of the tiny config, its forward as grouped_mm and as ours."""
    loop, fused = _pair("grouped_mm")
    return fused.model.layers[0].mlp.experts


@pytest.mark.parametrize("repeats", [True, False])
def test_ours_equals_grouped_mm_bit_for_bit_with_idle_experts(repeats, monkeypatch):
    """Forward and backward (input, routing weights, both expert matrices) of one experts layer
    equal transformers' grouped_mm exactly, with experts that get no token; for both ways of
    gathering the rows (with index repeats, CPU; each token's k copies permuted, other devices)."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    mod = _experts_pair()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(13, mod.gate_up_proj.shape[-1], generator=g)
    idx = torch.randint(0, 4, (13, K), generator=g)  # experts 4..7 idle
    idx[:, 1] = (idx[:, 0] + 1) % 4  # two different experts per token
    w = torch.rand(13, K, generator=g)
    if not repeats:
        monkeypatch.setattr(experts, "_gather_with_repeats", lambda hidden: False)

    def run(fn):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(mod, xx, idx, ww)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(6)))
        grads = [xx.grad, ww.grad, mod.gate_up_proj.grad.clone(), mod.down_proj.grad.clone()]
        mod.zero_grad(set_to_none=True)
        return out.detach(), grads

    (o1, g1), (o2, g2) = run(grouped_mm_experts_forward), run(experts.gspo_grouped_mm_forward)
    assert torch.equal(o1, o2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)
    assert g1[2][4:].abs().sum() == 0 and g1[2][:4].abs().sum() > 0  # idle experts get zero gradient


def test_ours_is_registered_and_falls_back_for_experts_it_does_not_handle(monkeypatch):
    """Models accept `gspo_grouped_mm` by name; experts with a post-expert norm or expert
    parallelism run transformers' grouped_mm instead."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert ALL_EXPERTS_FUNCTIONS[experts.NAME] is experts.gspo_grouped_mm_forward
    mod = _experts_pair()
    calls = []
    monkeypatch.setattr(experts, "grouped_mm_experts_forward", lambda *a: calls.append(1) or a[1])
    x, idx, w = torch.randn(4, mod.gate_up_proj.shape[-1]), torch.tensor([[0, 1]] * 4), torch.full((4, K), 0.5)
    assert experts.gspo_grouped_mm_forward(mod, x, idx, w) is not x and not calls  # handled: ours
    for attr in ("has_post_expert_norm", "_is_expert_parallel"):
        monkeypatch.setattr(mod, attr, True)
        assert experts.gspo_grouped_mm_forward(mod, x, idx, w) is x
        monkeypatch.setattr(mod, attr, False)
    assert len(calls) == 2
