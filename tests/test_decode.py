"""Our sampling loop (rollout/decode.py, `rollout.decode: compact`): the KV cache grown in place,
one prefill per distinct prompt, finished rows dropped from the batch. It must sample what
transformers' `generate` samples (the same distribution, the same stopping rule), return the
sampler's log-probs, entropies and MoE routes of exactly the tokens it drew, and keep sharded
processes in step."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import TopPLogitsWarper

from gspo_cli.rollout import HFRolloutEngine, response_logprobs
from gspo_cli.rollout.decode import InPlaceLayer, in_place_cache, top_p_filter
from tests.test_rollout import build_tiny

HERE = Path(__file__).parent


def test_in_place_layer_holds_what_concatenation_holds():
    """Updates of 3, 1 and 1 positions, a row selection with repeats (a shared prefill copied to
    its rows), then a smaller selection (finished rows dropped), one more update: keys and values
    equal transformers' DynamicLayer's after each, bit for bit, and past the buffer it still grows."""
    g = torch.Generator().manual_seed(0)
    ours, ref = InPlaceLayer(capacity=6), DynamicLayer()
    for n, pick in ((3, None), (1, torch.tensor([0, 0, 1, 1, 1])), (1, torch.tensor([4, 1, 2])), (1, None), (2, None)):
        if pick is not None:
            ours.batch_select_indices(pick)
            ref.batch_select_indices(pick)
        B = ref.keys.shape[0] if ref.is_initialized else 2
        k, v = torch.randn(B, 2, n, 4, generator=g), torch.randn(B, 2, n, 4, generator=g)
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert ours.get_seq_length() == ref.get_seq_length()
    assert ours.get_seq_length() == 8 > 6  # grew past its first capacity


def test_cache_keeps_transformers_layers_it_does_not_replace():
    from gspo_cli.models.builtin import build_config, build_tokenizer
    from gspo_cli.spec import BuiltinModelConfig

    config = build_config("tiny-dense", BuiltinModelConfig(hidden_size=16, num_layers=3), build_tokenizer("0123"))
    cache = in_place_cache(config, 10)
    assert [type(layer) for layer in cache.layers] == [InPlaceLayer] * 3
    config.layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    config.sliding_window = 4
    kinds = [type(layer).__name__ for layer in in_place_cache(config, 10).layers]
    assert kinds == ["DynamicSlidingWindowLayer", "InPlaceLayer", "DynamicSlidingWindowLayer"]


@pytest.mark.parametrize("top_p", [0.3, 0.75, 0.95])
def test_top_p_filter_keeps_what_transformers_keeps(top_p):
    scores = torch.randn(64, 50, generator=torch.Generator().manual_seed(1)) * 3
    want = TopPLogitsWarper(top_p)(None, scores.clone())
    got = top_p_filter(scores, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], scores[~torch.isinf(want)])


@pytest.fixture(scope="module")
def moe():
    from gspo_cli.models.routing import RoutingController

    model, tok = build_tiny("tiny-moe", num_layers=2, num_experts=4, experts_implementation="eager")
    return model.eval(), tok, RoutingController(model)


def _batch_sizes(model):
    """Rows of every forward of `model` while the returned list is alive (a forward pre-hook)."""
    seen = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True)
    return seen, handle


def test_compact_loop_drops_rows_and_returns_the_policy_of_its_draws(moe):
    """Three prompts x 8 samples; six tokens end a response, so rows stop at many different
    steps. The prefill runs on the 3 distinct prompts, later forwards on fewer rows than 24, and
    still each row's sampler log-probs, entropies and MoE routes are a full forward's of that
    row; rows end at their first stop token, padding after it."""
    from gspo_cli.models.routing import routes_to_BT

    model, tok, routing = moe
    stops = [tok.convert_tokens_to_ids(c) for c in "0123"] + [tok.eos_token_id]
    eng = HFRolloutEngine(
        model, tok, max_new_tokens=12, temperature=0.8, sampler_logprobs=True, routing=routing, stop_ids=stops
    )
    prompts = ["1+2=?\n", "31+4=?\n", "5=?\n"] * 8
    seen, handle = _batch_sizes(model)
    try:
        torch.manual_seed(4)
        b = eng.generate(prompts)
    finally:
        handle.remove()
    B, T = b.input_ids.shape
    assert seen[0] == 3  # one prefill per distinct prompt
    assert min(seen[1:]) < B and seen[1] == B  # finished rows left the batch
    lengths = b.response_mask.sum(1)
    assert len(set(lengths.tolist())) >= 4  # rows really stopped at different steps
    resp = b.response_ids
    for i in range(B):
        n = int(lengths[i])
        assert all(t not in stops for t in resp[i, : n - 1].tolist())
        assert resp[i, n - 1] in stops or (n == 12 and b.truncated[i])
        assert (resp[i, n:] == tok.pad_token_id).all()
    with torch.no_grad(), routing.recording() as rec:
        ref = response_logprobs(model, b, 0.8, with_entropy=True)
    mask = b.response_mask > 0
    assert (b.engine_logp - ref.logp).abs()[mask].max() < 1e-4
    assert (b.engine_entropy - ref.entropy).abs()[mask].max() < 1e-4
    assert (b.engine_logp[~mask] == 0).all()
    full = routes_to_BT(rec.routes, B, T)
    same = (full.sort(-1).values == b.engine_routes.sort(-1).values).all(-1)  # (L, B, T)
    # every position a row fed back: its last token is not (it predicts nothing a loss uses,
    # and the step's route mask leaves it out, as it does generate's last column)
    real = b.attention_mask.bool().clone()
    real[torch.arange(B), b.prompt_len + lengths.long() - 1] = False
    assert same[:, real].all()


def test_what_the_loop_returns_can_be_trained_on(moe):
    """The loop samples in inference mode, and what leaves it (tokens, sampler log-probs, the
    engine's routes) is ordinary tensors: a differentiated forward over the sampled tokens, a loss
    against the sampler's log-probs and routing replay of the engine's routes all run backward
    (inference tensors cannot be saved for backward)."""
    model, tok, routing = moe
    eng = HFRolloutEngine(model, tok, max_new_tokens=6, temperature=1.0, sampler_logprobs=True, routing=routing)
    torch.manual_seed(0)
    b = eng.generate(["1+2=?\n", "5=?\n"] * 2)
    for t in (b.input_ids, b.engine_logp, b.engine_entropy, b.engine_routes):
        assert not t.is_inference()
    model.train()
    try:
        L, B, T, k = b.engine_routes.shape
        with routing.replaying(b.engine_routes.reshape(L, B * T, k)):
            new = response_logprobs(model, b, 1.0).logp
            ratio = (new - b.engine_logp).exp()
            (ratio * b.engine_logp * b.response_mask).sum().backward()  # saves engine_logp for backward
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def _close(freq: torch.Tensor, p: torch.Tensor, n: int, samples: int = 1) -> bool:
    """Every frequency within 4.5 standard errors of `p` (`samples` = 2: both are estimates)."""
    se = (samples * p * (1 - p) / n).sqrt().clamp(min=1e-3)
    return bool(((freq - p).abs() <= 4.5 * se).all())


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_without_finished_rows_compact_draws_what_generate_draws(moe, temperature, top_p):
    """Distinct prompts and a stop id no token reaches, so no row leaves and no prefill is
    shared: with the same seed both loops draw the very same tokens (the same sampling rule:
    temperature, nucleus, one multinomial draw per row per step)."""
    model, tok, _ = moe
    prompts = ["1+2=?\n", "31+4=?\n", "5=?\n", "12-3=?\n", "7+7=?\n", "99=?\n"]
    out = {}
    for decode in ("compact", "generate"):
        eng = HFRolloutEngine(
            model, tok, max_new_tokens=10, temperature=temperature, top_p=top_p, stop_ids=[10**6], decode=decode
        )
        torch.manual_seed(7)
        out[decode] = eng.generate(prompts).input_ids
    assert out["compact"].shape == (6, out["compact"].shape[1]) and out["compact"].shape[1] > 10
    assert torch.equal(out["compact"], out["generate"])


def _close(freq: torch.Tensor, p: torch.Tensor, n: int) -> bool:
    """Every frequency within 4.5 standard errors of `p` (both estimates from n draws)."""
    se = (2 * p * (1 - p) / n).sqrt().clamp(min=1e-3)
    return bool(((freq - p).abs() <= 4.5 * se).all())


def test_compact_and_generate_stop_rows_alike(moe):
    """4000 rows of one prompt each way, up to 8 tokens, seven tokens ending a response: the
    response lengths, where rows dropped wrongly or stopped late would show, are distributed
    alike under both loops, bin by bin."""
    model, tok, _ = moe
    stops = [tok.convert_tokens_to_ids(c) for c in "0123456"]
    N, C = 4000, 8
    lengths = {}
    for decode in ("compact", "generate"):
        eng = HFRolloutEngine(model, tok, max_new_tokens=C, temperature=1.0, stop_ids=stops, decode=decode)
        torch.manual_seed(5)
        b = eng.generate(["12+3=?\n"] * N)
        lengths[decode] = torch.bincount(b.response_mask.sum(1).long(), minlength=C + 1).float() / N
    assert (lengths["compact"][1:] > 0.02).sum() >= 5  # many lengths: a difference would show
    pooled = (lengths["compact"] + lengths["generate"]) / 2
    assert _close(lengths["compact"], pooled, N) and _close(lengths["generate"], pooled, N)


def test_top_p_sampling_never_draws_outside_the_nucleus(moe):
    model, tok, _ = moe
    eng = HFRolloutEngine(model, tok, max_new_tokens=1, temperature=1.0, top_p=0.5)
    torch.manual_seed(6)
    b = eng.generate(["12+3=?\n"] * 500)
    with torch.no_grad():
        scores = model(input_ids=b.input_ids[:1, : b.prompt_len]).logits[0, -1:]
    allowed = ~torch.isinf(top_p_filter(scores, 0.5))[0]
    drawn = b.response_ids[:, 0].unique()
    assert allowed[drawn].all() and allowed.sum() < scores.shape[-1]


def test_decode_is_an_hf_setting():
    from gspo_cli.errors import SpecError
    from gspo_cli.spec import RolloutConfig

    assert RolloutConfig().decode == "compact"
    assert RolloutConfig(decode="generate").decode == "generate"
    with pytest.raises((SpecError, ValueError), match="decode"):
        RolloutConfig(engine="vllm", decode="generate")
    # a saved spec spells every default out: with vLLM it loads again
    saved = RolloutConfig(engine="vllm").model_dump()
    assert saved["decode"] == "compact" and RolloutConfig(**saved).engine == "vllm"
    with pytest.raises((SpecError, ValueError), match="decode"):
        RolloutConfig(decode="beam")
    with pytest.raises(ValueError, match="decode"):
        HFRolloutEngine(None, None, max_new_tokens=1, temperature=1.0, stop_ids=[0], prompt_format=str, decode="beam")


def test_sharded_processes_keep_forwarding_until_all_are_done():
    """2 FSDP processes, one done after a token and one sampling six: both run the same number
    of forwards (no hang), and each process's log-probs are a full forward's."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    res = subprocess.run(torchrun + [str(HERE / "dist/decode_check.py")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ok forwards 6" in res.stdout


def test_a_cache_layer_it_cannot_move_keeps_every_row(moe, monkeypatch):
    """A cache layer of a kind the loop does not know (a linear-attention layer's recurrent state
    would not move with a row selection of its keys and values): no shared prefill, no dropped
    rows, and still the policy's log-probs."""
    import gspo_cli.rollout.decode as decode
    from gspo_cli.rollout.decode import InPlaceLayer

    class Unknown(InPlaceLayer):
        pass

    real = decode.in_place_cache

    def with_unknown(config, capacity):
        cache = real(config, capacity)
        cache.layers[0] = Unknown(capacity)
        return cache

    monkeypatch.setattr(decode, "in_place_cache", with_unknown)
    model, tok, _ = moe
    stops = [tok.convert_tokens_to_ids(c) for c in "0123"]
    eng = HFRolloutEngine(model, tok, max_new_tokens=8, temperature=1.0, sampler_logprobs=True, stop_ids=stops)
    seen, handle = _batch_sizes(model)
    try:
        torch.manual_seed(8)
        b = eng.generate(["1+2=?\n", "5=?\n"] * 6)
    finally:
        handle.remove()
    assert set(seen) == {12} and len(seen) == b.response_mask.shape[1]
    assert len(set(b.response_mask.sum(1).tolist())) > 1  # rows did stop at different steps
    with torch.no_grad():
        ref = response_logprobs(model, b, 1.0)
    assert (b.engine_logp - ref.logp).abs()[b.response_mask > 0].max() < 1e-4
