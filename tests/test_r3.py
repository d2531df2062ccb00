"""R3 (replaying the rollout engine's MoE routes) and mismatch corrections in training:
vLLM's routed-experts layout converted by hand, the hf engine's routes replayed in every
forward, and an engine whose log-probs are perturbed on purpose."""

import math
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import TINY

from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.models.engine_routes import routes_from_vllm
from gspo_cli.models.routing import routes_from_BT
from gspo_cli.rollout.vllm_batch import to_batch
from gspo_cli.rollout.vllm_settings import check_routes_supported
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.step import setup, train_step

# --------------------------------------------------------------------------- vLLM layout


def test_routes_from_vllm_places_each_position_by_hand():
    """Two rows, 2 layers, top-2. vLLM gives [len-1, layers, top_k] per row (uint8 up to 256
    experts, uint16 above; int16 here, any integer dtype converts), prompt first.
    Row 0: prompt 2 tokens (1 left pad in width P=3), response 2 -> 3 routed positions.
    Row 1: prompt 3 tokens, response 1 (width C=2) -> 3 routed positions."""
    r0 = np.array(
        [
            [[1, 2], [3, 4]],  # seq position 0: layer 0 experts (1, 2), layer 1 (3, 4)
            [[5, 6], [7, 0]],  # position 1 (last prompt token)
            [[2, 3], [4, 5]],
        ],  # position 2 (response token 0); response token 1 unrouted
        dtype=np.int16,
    )
    r1 = np.array([[[7, 6], [5, 4]], [[3, 2], [1, 0]], [[6, 1], [2, 7]]], dtype=np.int16)
    out = routes_from_vllm([r0, r1], prompt_lens=[2, 3], response_lens=[2, 1], P=3, C=2)
    assert out.shape == (2, 2, 5, 2) and out.dtype == torch.int16  # (L, B, P+C, k)
    fill = [0, 1]  # unrouted columns: experts 0..k-1
    assert out[0, 0].tolist() == [fill, [1, 2], [5, 6], [2, 3], fill]  # pad, prompt, prompt, resp0, resp1
    assert out[1, 0].tolist() == [fill, [3, 4], [7, 0], [4, 5], fill]
    assert out[0, 1].tolist() == [[7, 6], [3, 2], [6, 1], fill, fill]  # its response token and padding
    assert out[1, 1].tolist() == [[5, 4], [1, 0], [2, 7], fill, fill]


def test_routes_from_vllm_refuses_other_shapes():
    ok = np.zeros((3, 2, 2), dtype=np.int16)
    with pytest.raises(ValueError, match=r"row 0: 3 routed positions for a 2-token prompt .* expected .* = 2"):
        routes_from_vllm([ok], [2], [1], P=3, C=2)
    with pytest.raises(ValueError, match="alike in every row"):
        routes_from_vllm([ok, np.zeros((3, 3, 2), dtype=np.int16)], [2, 2], [2, 2], P=3, C=2)
    with pytest.raises(ValueError, match=r"expert id 4 outside \[0, 4\)"):
        routes_from_vllm([ok + 4], [2], [2], P=3, C=2, num_experts=4)


def _completion(tokens, routed=None):
    return SimpleNamespace(
        token_ids=tokens, logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in tokens], routed_experts=routed
    )


def test_vllm_batch_carries_the_converted_routes():
    from gspo_cli.models.builtin import build_tokenizer

    tok = build_tokenizer("0123456789+=?\n")
    ids = tok(["1+2=?\n", "10+20=?\n"], add_special_tokens=False).input_ids
    three, eos = tok.convert_tokens_to_ids("3"), tok.eos_token_id
    gen = np.random.default_rng(0)
    routed = [gen.integers(0, 4, (len(p) + 2 - 1, 3, 2)).astype(np.int16) for p in ids]
    outs = [_completion([three, eos], r) for r in routed]
    batch = to_batch(ids, outs, tok, torch.device("cpu"), [tok.eos_token_id], with_routes=True)
    expected = routes_from_vllm(routed, [len(p) for p in ids], [2, 2], batch.prompt_len, 2)
    assert torch.equal(batch.engine_routes, expected)
    assert torch.equal(batch.rows(torch.tensor([1])).engine_routes, expected[:, 1:])
    assert to_batch(ids, outs, tok, torch.device("cpu"), [tok.eos_token_id]).engine_routes is None
    with pytest.raises(SpecError, match="vLLM returned no routed experts"):
        to_batch(
            ids,
            [_completion([three, eos]) for _ in ids],
            tok,
            torch.device("cpu"),
            [tok.eos_token_id],
            with_routes=True,
        )


def test_r3_with_vllm_is_refused_in_one_line_where_it_cannot_work():
    with pytest.raises(SpecError) as err:
        check_routes_supported(SimpleNamespace(EngineArgs=SimpleNamespace()), on_cpu=True)
    assert "only its GPU model runner returns" in str(err.value) and len(str(err.value).splitlines()) == 1
    old = SimpleNamespace(__version__="0.10.0", EngineArgs=SimpleNamespace())
    with pytest.raises(SpecError, match=r"vLLM 0.10.0 cannot return routed experts"):
        check_routes_supported(old, on_cpu=False)
    new = SimpleNamespace(EngineArgs=SimpleNamespace(enable_return_routed_experts=False))
    assert check_routes_supported(new, on_cpu=False) is True


# --------------------------------------------------------------------------- training on the tiny MoE


@pytest.fixture(scope="module")
def source():
    task = make_task("arithmetic", TINY["task"]["params"])
    return resolve_model_source(ModelConfig(**TINY["model"]), task, log=lambda m: None)


def _ctx(source, arms, rollout=None):
    spec = spec_from_dict({**TINY, "rollout": {**TINY["rollout"], **(rollout or {})}, "arms": arms})
    task = make_task("arithmetic", TINY["task"]["params"])
    return setup(spec, spec.arms[0], 0, task, source), spec


class _Capture:
    """Wraps an engine: keeps the last batch, optionally perturbs its log-probs on purpose.
    A perturbed batch drops the sampler's entropy, as an engine other than the trainer's
    model returns none, so pi_old comes from the trainer's forward."""

    def __init__(self, inner, log_shift=None):
        self.inner, self.log_shift, self.batch = inner, log_shift, None
        self.tokenizer = inner.tokenizer

    def generate(self, prompts):
        b = self.inner.generate(prompts)
        if self.log_shift is not None:
            # engine log-prob = sampler's - shift: rho = pi_old / pi_engine = exp(shift)
            b.engine_logp = (b.engine_logp - self.log_shift(b.engine_logp.shape)) * b.response_mask
            b.engine_entropy = None
        self.batch = b
        return b


def _spy_replays(ctx):
    """Record every replay: the routes handed over and the experts the layers then received."""
    seen = []
    orig = ctx.routing.replaying

    @contextmanager
    def spy(routes):
        with orig(routes) as natural, ctx.routing.recording() as rec:
            yield natural
        seen.append((routes.clone(), rec.routes))

    ctx.routing.replaying = spy
    return seen


@pytest.mark.parametrize("mismatch", ["off", "token_tis"])
def test_r3_replays_the_routes_recorded_during_generate(source, mismatch):
    arm = {
        "name": "r3",
        "preset": "paper-grpo",
        "routing_replay": "r3",
        "mini_batches": 2,
        "mismatch": {"mode": mismatch},
    }
    ctx, _ = _ctx(source, [arm])
    ctx.engine = cap = _Capture(ctx.engine)
    seen = _spy_replays(ctx)
    row_sets = []
    metrics = train_step(ctx, 1)
    b = cap.batch
    B, T = b.input_ids.shape
    assert b.engine_routes is not None and b.engine_routes.shape[1:3] == (B, T)
    # with a correction, pi_old's own forward replays the engine's routes for the whole batch first
    forwards = seen[1:] if mismatch != "off" else seen
    if mismatch != "off":
        assert torch.equal(seen[0][0], routes_from_BT(b.engine_routes))
        assert torch.equal(seen[0][1], routes_from_BT(b.engine_routes))
    assert len(forwards) == 2  # one per mini-batch
    for routes, received in forwards:
        n = routes.shape[1] // T
        per_row = routes.reshape(routes.shape[0], n, T, -1)
        # each replayed row is one of the batch's rows as generate routed it
        idx = [next(i for i in range(B) if torch.equal(per_row[:, j], b.engine_routes[:, i])) for j in range(n)]
        row_sets += idx
        assert torch.equal(received, routes)  # what the experts received is what was replayed
    assert len(row_sets) == B
    # before any update the trainer's router chooses exactly as the hf engine did
    assert metrics["moe/engine_route_diff_frac"] == 0.0
    assert metrics["moe/expert_change_frac"] >= 0.0
    if mismatch != "off":  # the hf engine samples with the trainer's model: weight 1 up to float noise
        assert metrics["mismatch/weight_mean"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["mismatch/truncated_token_frac"] == 0.0
        assert metrics["rollout/logprob_diff_mean"] < 1e-4


MODES = ["token_tis", "token_mask", "seq_tis", "seq_mask", "geo_mask"]


def _expected(mode, lengths, rho):
    """Per-response (weight, masked, truncated) for a constant per-token ratio `rho`."""
    out = []
    for n in lengths:
        prod = rho**n
        if mode == "token_tis":
            out.append((min(rho, 2.0), False, rho > 2.0))
        elif mode == "token_mask":
            out.append((rho, False, False) if 0.5 <= rho <= 2.0 else (0.0, True, False))
        elif mode == "seq_tis":
            out.append((min(prod, 2.0), False, prod > 2.0))
        elif mode == "seq_mask":
            out.append((prod, False, False) if 0.5 <= prod <= 2.0 else (0.0, True, False))
        else:
            out.append((1.0, False, False) if 0.5 <= rho <= 2.0 else (0.0, True, False))
    return out


def test_every_mode_on_an_engine_perturbed_on_purpose(source):
    """The engine reports each sampled token 1.5x less likely than the trainer finds it
    (rho = 1.5): every mode's logged weights and masked/truncated shares are what its rule
    gives for the batch's response lengths."""
    rho = 1.5
    arms = [{"name": m, "preset": "paper-grpo", "mini_batches": 2, "mismatch": {"mode": m}} for m in MODES]
    ctx, spec = _ctx(source, arms)
    ctx.engine = cap = _Capture(ctx.engine, log_shift=lambda shape: torch.full(shape, math.log(rho)))
    for i, arm in enumerate(spec.arms):
        ctx.arm = arm
        m = train_step(ctx, i + 1)
        lengths = cap.batch.response_mask.sum(-1).long().tolist()
        exp = _expected(arm.name, [n for n in lengths if n > 0], rho)
        n_tok = sum(lengths)
        w = sum(e[0] * n for e, n in zip(exp, [n for n in lengths if n > 0])) / n_tok
        assert m["mismatch/weight_mean"] == pytest.approx(w, rel=1e-3), arm.name
        assert m["mismatch/masked_seq_frac"] == pytest.approx(sum(e[1] for e in exp) / len(exp)), arm.name
        assert m["mismatch/truncated_seq_frac"] == pytest.approx(sum(e[2] for e in exp) / len(exp)), arm.name
        assert m["rollout/logprob_diff_mean"] == pytest.approx(math.log(rho), abs=1e-3)


def test_a_fully_masked_batch_leaves_the_weights_unchanged(source):
    """rho = 2.5 everywhere is outside IcePop's [0.5, 2]: every token is dropped, no gradient
    reaches the model, and AdamW (no weight decay, no KL, no aux loss) moves nothing."""
    arm = {"name": "icepop", "preset": "paper-grpo", "mini_batches": 2, "mismatch": {"mode": "token_mask"}}
    ctx, _ = _ctx(source, [arm])
    ctx.engine = _Capture(ctx.engine, log_shift=lambda shape: torch.full(shape, math.log(2.5)))
    before = {k: v.detach().clone() for k, v in ctx.model.named_parameters()}
    m = train_step(ctx, 1)
    assert m["mismatch/masked_token_frac"] == 1.0 and m["mismatch/weight_mean"] == 0.0
    assert m["policy/loss"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in ctx.model.named_parameters())


def test_vllm_layout_round_trip_gives_the_same_log_probs():
    """The hf engine's routes cut to vLLM's layout (each row's routed positions only) and
    converted back differ only where nothing was routed (padding, each row's last token), and
    replaying either gives the same response log-probs: those columns affect no log-prob."""
    from transformers import AutoModelForCausalLM

    from gspo_cli.models.builtin import build_config, build_tokenizer
    from gspo_cli.models.routing import RoutingController
    from gspo_cli.rollout import HFRolloutEngine, response_logprobs
    from gspo_cli.spec import BuiltinModelConfig

    tok = build_tokenizer("0123456789+-=?\n")
    size = BuiltinModelConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=6,
        experts_per_token=2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_config("tiny-moe", size, tok), experts_implementation="eager")
    routing = RoutingController(model)
    engine = HFRolloutEngine(model, tok, max_new_tokens=12, temperature=1.0, sampler_logprobs=True, routing=routing)
    torch.manual_seed(1)
    b = engine.generate(["1+2=?\n", "31+4=?\n", "5=?\n", "12-3=?\n"] * 3)
    P, C = b.prompt_len, b.response_mask.shape[1]
    p_lens = b.attention_mask[:, :P].sum(-1).tolist()
    r_lens = b.response_mask.sum(-1).long().tolist()
    assert len(set(p_lens)) > 1 and min(r_lens) < C  # left and right padding both present
    routed = [
        b.engine_routes[:, i, P - p : P + r - 1].permute(1, 0, 2).numpy().astype(np.int16)
        for i, (p, r) in enumerate(zip(p_lens, r_lens))
    ]
    back = routes_from_vllm(routed, p_lens, r_lens, P, C, num_experts=6)
    for i, (p, r) in enumerate(zip(p_lens, r_lens)):
        assert torch.equal(back[:, i, P - p : P + r - 1].long(), b.engine_routes[:, i, P - p : P + r - 1])
    assert not torch.equal(back.long(), b.engine_routes)  # the unrouted columns do differ
    model.eval()
    with torch.no_grad():
        logps = []
        for routes in (b.engine_routes, back):
            with routing.replaying(routes_from_BT(routes)):
                logps.append(response_logprobs(model, b, 1.0).logp)
    mask = b.response_mask > 0
    assert torch.equal(logps[0][mask], logps[1][mask])
    assert (logps[0] - b.engine_logp).abs()[mask].max() < 1e-4  # and they are the sampler's
