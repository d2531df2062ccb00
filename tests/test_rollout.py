"""The sampler must be the policy: no hidden top-k/top-p, left padding handled exactly."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from gspo_cli.config import BuiltinModelConfig
from gspo_cli.models.builtin import build_config, build_tokenizer
from gspo_cli.rollout import HFRolloutEngine, RolloutBatch, response_logprobs


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer("0123456789+-=?\n")
    size = BuiltinModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64,
                              moe_intermediate_size=32, num_experts=4, experts_per_token=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_config("tiny-dense", size, tok)).eval()
    return model, tok


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
    """Batched (left-padded) log-probs equal those of each sequence run alone."""
    model, tok = tiny
    eng = HFRolloutEngine(model, tok, max_new_tokens=6, temperature=0.7)
    torch.manual_seed(3)
    b = eng.generate(["1+2=?\n", "123+456-7=?\n"])
    batched = response_logprobs(model, b, temperature=0.7).logp
    for i in range(2):
        keep = b.attention_mask[i, : b.prompt_len].bool()
        ids = torch.cat([b.input_ids[i, : b.prompt_len][keep], b.response_ids[i]]).unsqueeze(0)
        P = int(keep.sum())
        single = RolloutBatch(input_ids=ids, attention_mask=torch.cat([torch.ones(1, P, dtype=torch.long),
                                                                          b.response_mask[i:i + 1].long()], 1),
                              response_mask=b.response_mask[i:i + 1], prompt_len=P, completions=[""],
                              truncated=b.truncated[i:i + 1])
        alone = response_logprobs(model, single, temperature=0.7).logp
        m = b.response_mask[i].bool()
        torch.testing.assert_close(batched[i][m], alone[0][m], atol=1e-5, rtol=1e-5)


def test_tokenizer_round_trips_text():
    tok = build_tokenizer("12+3=?\n\\boxed{15}")
    text = "12 + 3=?\n\\boxed{15}  tail~"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
