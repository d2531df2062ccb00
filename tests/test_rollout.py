"""The sampler must be the policy: no hidden top-k/top-p, left padding handled exactly."""

import copy

import pytest
import torch
from helpers import models_in_float64
from transformers import AutoModelForCausalLM

from gspo_cli.models.builtin import build_config, build_tokenizer
from gspo_cli.rollout import HFRolloutEngine, RolloutBatch, response_logprobs
from gspo_cli.spec import BuiltinModelConfig


def build_tiny(kind: str, num_layers: int, num_experts: int, **from_config):
    """A randomly initialised (seed 0) built-in model and its character tokenizer."""
    tok = build_tokenizer("0123456789+-=?\n")
    size = BuiltinModelConfig(
        hidden_size=32,
        num_layers=num_layers,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=num_experts,
        experts_per_token=2,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(build_config(kind, size, tok), **from_config), tok


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-dense", num_layers=2, num_experts=4)
    return model.eval(), tok


def test_sampler_keeps_the_tail_of_the_distribution(tiny):
    """A near-uniform policy over ~100 tokens: generate's default top_k=50 would never emit
    the tokens outside the 50 most likely; ours must emit them at their probability mass."""
    model, tok = tiny
    eng = HFRolloutEngine(model, tok, max_new_tokens=1, temperature=1.0)
    torch.manual_seed(1)
    batch = eng.generate(["1+2=?\n"] * 2000)
    logp = response_logprobs(model, batch.rows(torch.tensor([0]))).logp  # distribution of the first token
    out = model(input_ids=batch.input_ids[:1, :-1]).logits[0, -1].log_softmax(-1)
    top50 = set(out.topk(50).indices.tolist())
    tail_mass = 1 - out.exp()[list(top50)].sum().item()
    assert tail_mass > 0.2  # the test means something only if the tail is heavy
    first = batch.response_ids[:, 0].tolist()
    tail_freq = sum(t not in top50 for t in first) / len(first)
    assert abs(tail_freq - tail_mass) < 0.05
    assert torch.isfinite(logp).all()


def test_response_mask_stops_after_first_eos(tiny):
    model, tok = tiny
    eng = HFRolloutEngine(model, tok, max_new_tokens=12, temperature=1.0)
    torch.manual_seed(2)
    b = eng.generate(["1+2=?\n", "33-4=?\n"] * 16)
    eos = tok.eos_token_id
    for i in range(len(b.completions)):
        ids = b.response_ids[i].tolist()
        m = b.response_mask[i].tolist()
        if eos in ids:
            j = ids.index(eos)
            assert m == [1.0] * (j + 1) + [0.0] * (len(ids) - j - 1)
            assert not b.truncated[i]
        else:
            assert all(v == 1.0 for v in m) and b.truncated[i]


def test_logprobs_do_not_depend_on_left_padding(tiny):
    """Batched (left-padded) log-probs equal those of each sequence run alone (in float64:
    helpers.in_float64)."""
    model, tok = tiny
    eng = HFRolloutEngine(model, tok, max_new_tokens=6, temperature=0.7)
    torch.manual_seed(3)
    b = eng.generate(["1+2=?\n", "123+456-7=?\n"])
    model = copy.deepcopy(model)
    models_in_float64(model)
    batched = response_logprobs(model, b, temperature=0.7).logp
    for i in range(2):
        keep = b.attention_mask[i, : b.prompt_len].bool()
        ids = torch.cat([b.input_ids[i, : b.prompt_len][keep], b.response_ids[i]]).unsqueeze(0)
        P = int(keep.sum())
        single = RolloutBatch(
            input_ids=ids,
            attention_mask=torch.cat([torch.ones(1, P, dtype=torch.long), b.response_mask[i : i + 1].long()], 1),
            response_mask=b.response_mask[i : i + 1],
            prompt_len=P,
            completions=[""],
            truncated=b.truncated[i : i + 1],
        )
        alone = response_logprobs(model, single, temperature=0.7).logp
        m = b.response_mask[i].bool()
        assert alone.dtype == torch.float64
        torch.testing.assert_close(batched[i][m], alone[0][m], atol=1e-10, rtol=0)


def test_tokenizer_round_trips_text():
    tok = build_tokenizer("12+3=?\n\\boxed{15}")
    text = "12 + 3=?\n\\boxed{15}  tail~"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text


@pytest.fixture(scope="module")
def tiny_moe():
    from gspo_cli.models.routing import RoutingController

    model, tok = build_tiny("tiny-moe", num_layers=3, num_experts=6, experts_implementation="eager")
    model.train()
    return model, tok, RoutingController(model)


def test_sampler_logprobs_entropy_and_routes_match_a_full_forward(tiny_moe):
    """pi_old taken from generate's own forwards must be what a separate no-grad pass gives:
    same samples, log-probs and entropies to float32 rounding, the same experts everywhere."""
    from gspo_cli.models.routing import routes_to_BT

    model, tok, routing = tiny_moe
    prompts = ["1+2=?\n", "31+4=?\n", "5=?\n"] * 6
    plain = HFRolloutEngine(model, tok, max_new_tokens=10, temperature=0.7)
    rich = HFRolloutEngine(model, tok, max_new_tokens=10, temperature=0.7, sampler_logprobs=True, routing=routing)
    torch.manual_seed(3)
    a = plain.generate(prompts)
    torch.manual_seed(3)
    b = rich.generate(prompts)
    assert torch.equal(a.input_ids, b.input_ids)  # asking for logits and routes changes no sample
    assert a.engine_logp is None and b.engine_logp is not None
    assert model.training  # generate's eval() is undone
    with torch.no_grad(), routing.recording() as rec:
        ref = response_logprobs(model, b, 0.7, with_entropy=True)
    mask = b.response_mask > 0
    assert mask.sum() > 20
    assert (b.engine_logp - ref.logp).abs()[mask].max() < 1e-4
    assert (b.engine_entropy - ref.entropy).abs()[mask].max() < 1e-4
    assert (b.engine_logp[~mask] == 0).all() and (b.engine_logp[mask] < 0).all()
    B, T = b.input_ids.shape
    full = routes_to_BT(rec.routes, B, T)
    assert b.engine_routes.shape == full.shape == (3, B, T, 2)
    same = (full.sort(-1).values == b.engine_routes.sort(-1).values).all(-1)  # (L, B, T)
    assert same[:, :, :-1].all()  # every routed position; column T-1 is never fed back
    # rows() carries the sampler's tensors along
    sub = b.rows(torch.tensor([2, 0]))
    assert torch.equal(sub.engine_routes, b.engine_routes[:, [2, 0]])
    assert torch.equal(sub.engine_entropy, b.engine_entropy[[2, 0]])
    # ... unless the caller is a trainer's forward, which reads only tokens and masks
    bare = b.rows(torch.tensor([2, 0]), sampler=False)
    assert bare.engine_routes is None and bare.engine_logp is None and bare.engine_entropy is None
    assert torch.equal(bare.input_ids, sub.input_ids) and torch.equal(bare.response_mask, sub.response_mask)


def test_sampler_logprobs_keep_no_logits_and_have_no_budget(tiny_moe, monkeypatch):
    """The sampler's log-probs are read step by step: generate is asked for no logits at all
    (they were (B, max_new_tokens, vocab) floats, and over a 1 GiB budget R3 and mismatch
    corrections had nothing to work with), and every batch gets log-probs and routes."""
    model, tok, routing = tiny_moe
    seen = {}
    plain = model.generate

    def spy(**kw):
        seen.update(kw)
        return plain(**kw)

    monkeypatch.setattr(model, "generate", spy)
    eng = HFRolloutEngine(
        model, tok, max_new_tokens=6, temperature=0.7, sampler_logprobs=True, routing=routing, decode="generate"
    )
    b = eng.generate(["1+2=?\n"] * 4)
    assert seen  # transformers' generate sampled (rollout.decode: generate)
    assert "output_logits" not in seen and "return_dict_in_generate" not in seen
    assert b.engine_logp is not None and b.engine_entropy is not None and b.engine_routes is not None
    mask = b.response_mask > 0
    ref = response_logprobs(model, b, temperature=0.7, with_entropy=True)
    assert (b.engine_logp - ref.logp).abs()[mask].max() < 1e-4


def test_sampler_logprobs_and_routes_for_a_vocabulary_over_the_former_budget():
    """16 rows x 16 new tokens x a 1.1 M-token vocabulary is over 1 GiB of float32 logits: the
    former LOGITS_BUDGET returned no sampler log-probs or routes for it, so R3 and the mismatch
    corrections stopped (step.py's SpecErrors). Read per step, they are all there."""
    import gspo_cli.rollout.hf as hf
    from gspo_cli.models.routing import RoutingController

    assert not hasattr(hf, "LOGITS_BUDGET")
    tok = build_tokenizer("0123456789+-=?\n")
    size = BuiltinModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, moe_intermediate_size=16, num_experts=4
    )
    config = build_config("tiny-moe", size, tok)
    config.vocab_size = 1_100_000  # ids past the tokenizer's are sampled but never decoded to text that matters
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation="eager").eval()
    B, C = 16, 16
    assert B * C * config.vocab_size * 4 > 1 << 30
    eng = HFRolloutEngine(
        model, tok, max_new_tokens=C, temperature=1.0, sampler_logprobs=True, routing=RoutingController(model)
    )
    b = eng.generate(["1+2=?\n"] * B)
    assert b.engine_logp is not None and b.engine_entropy is not None and b.engine_routes is not None
    mask = b.response_mask > 0
    assert (b.engine_logp[mask] < 0).all() and (b.engine_entropy[mask] > 10).all()  # ~log(1.1 M) = 13.9


def test_chunked_logprobs_equal_the_whole_batch_values_and_gradients(tiny_moe):
    """Log-probs and entropy from the head run in chunks (here 3 positions each, a remainder
    too) equal those of whole-batch logits to 1e-10 in float64 (helpers.in_float64), and so do
    the gradients of a loss of both; no forward builds (B, T, V) logits."""
    from gspo_cli.rollout.base import _logprobs_whole

    model, tok, _ = tiny_moe
    model = copy.deepcopy(model)
    models_in_float64(model)
    b = _hand_batch(tok, ["123+456=?\n", "1+2=?\n", "5=?\n"], [9, 3, 7], C=9)
    V = model.get_output_embeddings().out_features
    grads, vals = [], []
    for fn in (
        lambda: _logprobs_whole(model, b, 0.8, True),
        lambda: response_logprobs(model, b, 0.8, with_entropy=True, chunk_bytes=3 * 4 * V),
    ):
        model.zero_grad(set_to_none=True)
        lp = fn()
        assert lp.logp.shape == lp.entropy.shape == b.response_mask.shape
        ((lp.logp * b.response_mask).sum() + 0.1 * (lp.entropy * b.response_mask).sum()).backward()
        vals.append((lp.logp.detach(), lp.entropy.detach()))
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    mask = b.response_mask > 0
    for whole, chunked in zip(*vals):
        assert whole.dtype == torch.float64 and (whole - chunked).abs()[mask].max() < 1e-10
    assert set(grads[0]) == set(grads[1]) and len(grads[0]) > 10
    scale = max(g.abs().max().item() for g in grads[0].values())
    assert scale > 0 and max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) < 1e-10 * scale
    # the head is the model's own again afterwards, and a plain forward still gives (B, T, V)
    assert "forward" not in vars(model.get_output_embeddings())
    with torch.no_grad():
        assert model(input_ids=b.input_ids).logits.shape == (*b.input_ids.shape, V)


def test_routes_from_generate_layout():
    from gspo_cli.models.routing import routes_from_generate

    B, P, T, k = 2, 3, 6, 1
    # prefill: positions 0..2 of both rows, then 2 decode steps (positions 3, 4); none for 5
    pre = torch.tensor([[[0], [1], [2]], [[10], [11], [12]]]).reshape(B * P, k)
    steps = [[pre, torch.tensor([[3], [13]]), torch.tensor([[4], [14]])]]
    r = routes_from_generate(steps, B, P, T)
    assert r.shape == (1, B, T, k)
    assert r[0, :, :, 0].tolist() == [[0, 1, 2, 3, 4, 4], [10, 11, 12, 13, 14, 14]]
    with pytest.raises(RuntimeError, match="expected 1 prefill"):
        routes_from_generate(steps, B, P, T + 1)


def _hand_batch(tok, prompts: list[str], resp_lens: list[int], C: int) -> RolloutBatch:
    """Left-padded prompts, then right-padded random responses of the given lengths."""
    g = torch.Generator().manual_seed(0)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    P, B = max(map(len, ids)), len(prompts)
    input_ids = torch.full((B, P + C), tok.pad_token_id)
    attn = torch.zeros(B, P + C, dtype=torch.long)
    resp = torch.zeros(B, C)
    for b, (p, n) in enumerate(zip(ids, resp_lens)):
        input_ids[b, P - len(p) : P] = torch.tensor(p)
        input_ids[b, P : P + n] = torch.randint(4, len(tok), (n,), generator=g)
        attn[b, P - len(p) : P + n] = 1
        resp[b, :n] = 1
    return RolloutBatch(input_ids, attn, resp, P, [""] * B, torch.zeros(B, dtype=torch.bool))


def test_trimmed_minibatch_keeps_logprobs_and_routes(tiny_moe):
    """A mini-batch's forward runs only over the columns its rows use: the same log-probs
    (in float64, to 1e-10: helpers.in_float64) and experts as the full-width forward, on every
    response token."""
    from gspo_cli.models.routing import RoutingController, routes_to_BT

    model, tok, _ = tiny_moe
    model = copy.deepcopy(model)
    models_in_float64(model)
    routing = RoutingController(model)
    b = _hand_batch(tok, ["123+456=?\n", "1+2=?\n", "5=?\n", "31+4=?\n"], [12, 3, 7, 5], C=12)
    P = b.prompt_len
    assert P == 10
    sub = b.rows(torch.tensor([3, 1]))  # prompts of 7 and 6 tokens, responses of 5 and 3
    cut, lo, c = sub.trimmed()
    assert (lo, c) == (3, 5)  # 3 columns of left padding in both rows; 7 response columns unused
    assert cut.input_ids.shape == (2, 7 + 5) and cut.prompt_len == 7
    assert torch.equal(cut.response_ids, sub.response_ids[:, :5])
    assert torch.equal(cut.position_ids, sub.position_ids[:, 3:15])
    with torch.no_grad(), routing.recording() as full_rec:
        full = response_logprobs(model, sub, with_entropy=True)
    with torch.no_grad(), routing.recording() as cut_rec:
        small = response_logprobs(model, cut, with_entropy=True)
    mask = cut.response_mask > 0
    assert mask.sum() == 8
    assert small.logp.dtype == torch.float64
    assert (full.logp[:, :c] - small.logp).abs()[mask].max() < 1e-10
    assert (full.entropy[:, :c] - small.entropy).abs()[mask].max() < 1e-10
    full_routes = routes_to_BT(full_rec.routes, 2, P + 12)[:, :, lo : P + c]
    cut_routes = routes_to_BT(cut_rec.routes, 2, P - lo + c)
    real = cut.attention_mask.bool()
    assert torch.equal(full_routes.sort(-1).values[:, real], cut_routes.sort(-1).values[:, real])
    # the sampler's tensors are cut with it; a batch with nothing to trim comes back as it is
    eng_routes = torch.arange(3 * 4 * 22 * 2).reshape(3, 4, 22, 2)
    b.engine_routes, b.engine_logp = eng_routes, torch.randn(4, 12)
    cut2, _, _ = b.rows(torch.tensor([3, 1])).trimmed()
    assert torch.equal(cut2.engine_routes, eng_routes[:, [3, 1], 3:15])
    assert torch.equal(cut2.engine_logp, b.engine_logp[[3, 1], :5])
    whole, lo0, c0 = b.trimmed()
    assert whole is b and (lo0, c0) == (0, 12)
