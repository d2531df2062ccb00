"""Multi-turn rollouts carry two masks: `response_mask` (every response-side token, the
environment's included) and `model_mask` (the model's own tokens). Every loss, denominator,
ratio and statistic takes the model's: tool output planted in a real step gets no gradient,
and GSPO's sequence ratio is the one of the model's tokens alone."""

import pytest
import torch
from helpers import TINY, rows_batch

from gspo_cli.algorithms import get_policy_loss
from gspo_cli.models import resolve_model_source
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.step import setup, train_step

TOOL_COLS = (3, 4, 5)  # response columns planted as tool output in every row


def test_model_mask_is_the_response_mask_for_single_turn_batches():
    b = rows_batch([3, 5])
    assert b.model_mask is b.response_mask  # the very same tensor: nothing changes bit for bit
    b.tool_mask = torch.tensor([[0, 1, 0, 0, 0], [0, 0, 1, 1, 0]], dtype=torch.float)
    assert b.model_mask.tolist() == [[1, 0, 1, 0, 0], [1, 1, 0, 0, 1]]
    assert b.response_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]  # unchanged
    sub, lo, c = b.rows(torch.tensor([0]), sampler=False).trimmed()
    assert c == 3 and sub.model_mask.tolist() == [[1, 0, 1]]


def _planted(generate, seen: list):
    """The engine's batches with response columns TOOL_COLS relabelled as environment tokens."""

    def wrapped(prompts):
        b = generate(prompts)
        cols = torch.zeros_like(b.response_mask)
        cols[:, list(TOOL_COLS)] = 1
        b.tool_mask = cols * b.response_mask
        b.tool_counts = [{"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}] * len(b.completions)
        seen.append(b)
        return b

    return wrapped


@pytest.mark.parametrize("arm", ["gspo", "grpo"])
def test_planted_tool_output_gets_no_gradient_and_no_place_in_the_ratio(tmp_path, arm):
    raw = {**TINY, "output_dir": str(tmp_path), "arms": [a for a in TINY["arms"] if a["name"] == arm]}
    spec = spec_from_dict(raw)
    task = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arms[0], 0, task, resolve_model_source(spec.model, task, log=lambda m: None))
    seen = []
    ctx.engine.generate = _planted(ctx.engine.generate, seen)
    calls, grads, real = [], [], ctx.loss_fn

    def spy(logp_BC, old_logp_BC, adv_B, mask_BC, **kw):
        logp_BC.register_hook(grads.append)
        loss, stats = real(logp_BC, old_logp_BC, adv_B, mask_BC, **kw)
        calls.append((logp_BC.detach().clone(), old_logp_BC, adv_B, mask_BC, kw, loss.detach(), stats))
        return loss, stats

    ctx.loss_fn = spy
    metrics = train_step(ctx, 1)
    assert len(calls) == 2 and len(grads) == 2  # two mini-batches
    b = seen[0]
    env, every = float(b.tool_mask.sum()), float(b.response_mask.sum())
    assert env > 0 and metrics["tools/env_token_frac"] == pytest.approx(env / every, rel=1e-5)
    assert metrics["response/length_mean"] == pytest.approx((every - env) / len(b.completions), rel=1e-5)
    assert metrics["tools/tool_calls_mean"] == 1.0 and metrics["tools/turns_mean"] == 2.0
    for (logp, old, adv, mask, kw, loss, stats), grad in zip(calls, grads):
        cols = list(TOOL_COLS)
        assert mask[:, cols].sum() == 0  # the loss never counts a tool token
        assert torch.equal(grad[:, cols], torch.zeros_like(grad[:, cols]))  # exactly 0
        assert grad[mask > 0].abs().sum() > 0  # the model's tokens do learn
        if arm == "gspo":
            # The same loss and ratio from the model's tokens alone, packed to the left.
            keep = mask > 0
            n = int(keep.sum(-1).max())
            packed = [torch.zeros(len(logp), n) for _ in range(3)]
            for i in range(len(logp)):
                k = int(keep[i].sum())
                packed[0][i, :k], packed[1][i, :k], packed[2][i, :k] = logp[i][keep[i]], old[i][keep[i]], 1.0
            ref_loss, ref_stats = get_policy_loss("gspo")(packed[0], packed[1], adv, packed[2], **kw)
            assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-7)
            s_i = ((logp - old) * keep).sum(-1) / keep.sum(-1)
            assert float(stats["seq_ratio_mean"]) == pytest.approx(float(s_i.exp().mean()), rel=1e-6)
            assert float(ref_stats["seq_ratio_mean"]) == pytest.approx(float(stats["seq_ratio_mean"]), rel=1e-6)


def test_the_cold_start_never_learns_to_write_tool_output():
    """The built-in cold start's supervised batch: labels -100 on the prompt, on padding and on
    every token of a solution's tool output (wrapper included); the model's own parts keep
    their ids as labels, tokenised apart as a rollout inserts them."""
    from gspo_cli.models.builtin import _sft_batch, build_tokenizer

    tok = build_tokenizer("")
    call, out, rest = "```python\nprint(6*7)\n```", "\n```output\n42\n```\n", "So 42."
    ids, labels, attn = _sft_batch(tok, ["Q: ", "Q: "], [call + out + rest + "</s>", "5</s>"])
    n_p, n_c, n_o = len(tok("Q: ").input_ids), len(call), len(out)  # one token per character
    row = labels[0].tolist()
    assert row[:n_p] == [-100] * n_p
    assert row[n_p : n_p + n_c] == ids[0, n_p : n_p + n_c].tolist()  # the call: trained
    assert row[n_p + n_c : n_p + n_c + n_o] == [-100] * n_o  # the tool output: not
    assert row[n_p + n_c + n_o :] == ids[0, n_p + n_c + n_o :].tolist() and -100 not in row[n_p + n_c + n_o :]
    assert (labels[1] != -100).sum() == 2 and attn[1].sum() == n_p + 2  # "5</s>" as before
