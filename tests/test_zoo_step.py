"""The zoo's trainer-side pieces without a model: which tokens leave the loss's count
(mismatch.rejected, overlong filter), spec refusals and parameters, presets, dynamic
sampling's batch merge, DAPO's shaped rewards, the global load-balancing loss and the
staleness-aware labels."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from helpers import rows_batch
from typer.testing import CliRunner

from gspo_cli.algorithms import entropy_top_mask, get_mismatch_correction, grpo_loss
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.metrics import describe
from gspo_cli.models.aux_loss import global_load_balancing_loss
from gspo_cli.rollout import RolloutBatch
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks.base import Score
from gspo_cli.train.sampling import concat_batches, shaped_rewards
from gspo_cli.train.stats import StepStats
from gspo_cli.train.token_weights import token_weights


def base(**arm):
    return {
        "name": "z",
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 10, "sampler_logprobs": True},
        "arms": [{"name": "a", **arm}],
    }


def spec_lines(raw) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(raw)
    return str(info.value).splitlines()


def batch(engine_logp=None, truncated=(False, False), lengths=(2, 2)):
    return rows_batch(lengths, truncated, engine_logp=engine_logp)


# ----------------------------------------------------------------------------- rejected tokens


@pytest.mark.parametrize("rejected,expected", [("drop", -1.0), ("zero", -0.5)])
def test_rejected_responses_leave_the_loss_count_by_default(rejected, expected):
    """1 of 2 responses rejected by seq_mask, on-policy, A = 1: the rejection-sampling form
    (verl; our default) gives -1.0, keeping the rejected response in the count gives -0.5 (what
    today's code always gave)."""
    arm = spec_from_dict(
        base(preset="paper-grpo", mini_batches=2, mismatch={"mode": "seq_mask", "rejected": rejected})
    ).arms[0]
    trainer_BC = torch.full((2, 2), -1.0)
    b = batch(engine_logp=torch.tensor([[-1.0, -1.0], [-3.0, -3.0]]))  # response 1: ratio e^4 > 2
    stats = StepStats()
    weights, loss_mask = token_weights(arm, stats, get_mismatch_correction("seq_mask"), trainer_BC, None, b)
    assert weights.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    loss, _ = grpo_loss(
        trainer_BC, trainer_BC, torch.ones(2), loss_mask, clip_low=0.2, clip_high=0.2, weights_BC=weights
    )
    assert loss.item() == pytest.approx(expected)
    assert stats.reduce(__import__("gspo_cli").distributed.DistInfo())["mismatch/masked_seq_frac"] == 0.5


def test_overlong_filter_drops_truncated_responses_from_the_count():
    arm = spec_from_dict(base(preset="dapo", mini_batches=2)).arms[0]
    weights, loss_mask = token_weights(arm, StepStats(), None, torch.zeros(2, 2), None, batch(truncated=(False, True)))
    assert weights is None and loss_mask.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_entropy_filter_weights_only_the_top_tokens():
    arm = spec_from_dict(base(preset="paper-grpo", mini_batches=2, token_filter={"entropy_top": 0.25})).arms[0]
    entropy = torch.tensor([[0.1, 0.2], [0.3, 0.9]])
    weights, loss_mask = token_weights(arm, StepStats(), None, torch.zeros(2, 2), entropy, batch())
    assert weights.tolist() == [[0.0, 0.0], [0.0, 1.0]] and loss_mask.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_entropy_filter_takes_its_threshold_over_every_process():
    """`gather` stands for the other process (distributed.gather_values): it holds 4 tokens of
    entropy 5, so the top half of the 8 is all of its tokens and none of this one's (a threshold
    of this process's 4 alone kept 2). A process without trained tokens gathers too."""
    other = torch.full((4,), 5.0)
    seen = []

    def gather(local):
        seen.append(local.numel())
        return torch.cat([local, other])

    entropy, mask = torch.tensor([[0.1, 0.2], [0.3, 0.9]]), torch.ones(2, 2)
    assert entropy_top_mask(entropy, mask, 0.5).sum() == 2
    assert entropy_top_mask(entropy, mask, 0.5, gather).sum() == 0
    assert entropy_top_mask(entropy, torch.zeros(2, 2), 0.5, gather).sum() == 0
    assert seen == [4, 0]


# ----------------------------------------------------------------------------- spec


def test_presets_fill_each_variant():
    raw = base()
    raw["arms"] = [
        {"name": n, "preset": n, "mini_batches": 2}
        for n in ("dapo", "dr-grpo", "cispo", "sapo", "gmpo", "luspo", "clip-cov", "kl-cov")
    ]
    arms = {a.name: a for a in spec_from_dict(raw).arms}
    assert (arms["dapo"].clip_low, arms["dapo"].clip_high, arms["dapo"].aggregation) == (0.2, 0.28, "token_mean")
    assert arms["dapo"].overlong.filter and arms["dapo"].overlong.buffer_frac == 0.2
    assert arms["dapo"].dynamic_sampling.max_rounds == 3
    assert (arms["dr-grpo"].advantage, arms["dr-grpo"].aggregation) == ("mean_only", "seq_mean_token_sum_norm")
    assert (arms["cispo"].loss, arms["cispo"].clip_low, arms["cispo"].clip_high) == ("cispo", 1.0, 4.0)
    assert arms["sapo"].loss_params == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert (arms["gmpo"].clip_low, arms["gmpo"].clip_high) == (0.4, 0.4)
    assert (arms["luspo"].loss, arms["luspo"].clip_low, arms["luspo"].clip_high) == ("luspo", 2e-3, 2.5e-3)
    assert arms["kl-cov"].loss_params == {"cov_ratio": 2e-3, "kl_coef": 1.0}


def test_an_arm_extends_its_presets_sections_key_by_key():
    arm = spec_from_dict(base(preset="sapo", mini_batches=2, loss_params={"tau_neg": 2.0})).arms[0]
    assert arm.loss_params == {"tau_pos": 1.0, "tau_neg": 2.0}


def test_refusals_one_line_each():
    assert spec_lines(base(preset="paper-grpo", loss_params={"tau_pos": 1.0})) == [
        "arms[0].loss_params.tau_pos: a parameter of sapo, not of grpo (grpo takes no parameters)"
    ]
    (line,) = spec_lines(base(preset="paper-grpo", loss="sapo2"))
    assert line.startswith("arms[0].loss: unknown policy loss 'sapo2' (did you mean 'sapo'?); registered: grpo, gspo")
    assert "cispo" in line and "kl_cov" in line
    for mode in ("token_tis", "token_mask"):
        (line,) = spec_lines(base(preset="paper-gspo", mismatch={"mode": mode}))
        assert line.startswith(f"arms[0].mismatch.mode: {mode} weights single tokens and gspo couples")
        assert line.endswith("use seq_tis, seq_mask or geo_mask, or loss gspo_token")
    for loss in ("luspo", "gmpo"):
        (line,) = spec_lines(base(preset="paper-gspo", loss=loss, token_filter={"entropy_top": 0.2}))
        assert line.startswith("arms[0].token_filter.entropy_top: ")
    ok = spec_from_dict(base(preset="paper-gspo", mismatch={"mode": "geo_mask"}, off_policy_mask=0.1))
    assert ok.arms[0].off_policy_mask == 0.1
    assert spec_from_dict(base(preset="paper-gspo-token", mismatch={"mode": "token_mask"})).arms[0].loss == "gspo_token"
    raw = base(preset="dapo")
    raw["rollout"]["staleness"] = 1
    raw["rollout"]["sampler_logprobs"] = False
    assert any(line.startswith("arms[0].dynamic_sampling.max_rounds: ") for line in spec_lines(raw))


def test_cli_refuses_another_loss_parameter_in_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(base(preset="paper-grpo", loss_params={"tau_pos": 1.0})))
    res = CliRunner().invoke(app, ["train", str(p)])
    assert res.exit_code == 2
    assert "arms[0].loss_params.tau_pos: a parameter of sapo, not of grpo" in res.output
    assert "Traceback" not in res.output


# ----------------------------------------------------------------------------- DAPO rollout side


def test_shaped_rewards_add_the_soft_overlong_punishment():
    arm = spec_from_dict(base(preset="dapo", mini_batches=2)).arms[0]  # buffer 0.2 x 10 = 2 tokens
    b = batch(lengths=(8, 9, 10, 3))
    scores = [Score(reward=1.0, correct=True)] * 4
    assert shaped_rewards(arm, 10, b, scores).tolist() == [1.0, 0.5, 0.0, 1.0]


def test_concat_batches_pads_prompts_left_and_responses_right():
    a = batch(lengths=(1,), truncated=(False,))
    b = RolloutBatch(
        input_ids=torch.tensor([[5, 6, 7, 8]]),
        attention_mask=torch.ones(1, 4, dtype=torch.long),
        response_mask=torch.tensor([[1.0, 1.0]]),
        prompt_len=2,
        completions=["x"],
        truncated=torch.tensor([True]),
    )
    m = concat_batches([a, b], pad_id=0)
    assert m.prompt_len == 2 and m.input_ids.tolist() == [[0, 1, 1, 0], [5, 6, 7, 8]]
    assert m.attention_mask.tolist() == [[0, 1, 1, 0], [1, 1, 1, 1]]
    assert m.response_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]] and m.truncated.tolist() == [False, True]
    assert m.position_ids[0, 1].item() == 0  # the left pad keeps the first real token at position 0


# ----------------------------------------------------------------------------- aux loss, labels


def test_global_load_balancing_loss_matches_transformers_and_adds_up_over_halves():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from gspo_cli.distributed import DistInfo

    torch.manual_seed(0)
    B, T, E, k, L = 4, 3, 4, 2, 2
    logits = tuple(torch.randn(B * T, E, dtype=torch.float64) for _ in range(L))
    attn = torch.ones(B, T)
    attn[0, 0] = 0
    hf = load_balancing_loss_func(logits, E, k, attn)
    loss, value = global_load_balancing_loss(logits, attn, E, k, DistInfo())
    assert loss.item() == pytest.approx(hf.item(), rel=1e-6) and value.item() == pytest.approx(hf.item(), rel=1e-6)
    halves = [
        load_balancing_loss_func(tuple(x.reshape(B, T, E)[rows].reshape(-1, E) for x in logits), E, k, attn[rows])
        for rows in (slice(0, 2), slice(2, 4))
    ]
    assert abs((halves[0] + halves[1]).item() / 2 - hf.item()) > 1e-3  # the rank-local mean is not the whole


def test_load_balancing_loss_by_hand_and_masked_rows_do_not_count():
    """E=2, top-1, one layer. Rows with probabilities (.75, .25), (.25, .75), (.75, .25): picks
    f = (2/3, 1/3), mean probabilities P = (7/12, 5/12), loss = 2 (2/3 7/12 + 1/3 5/12) = 19/18.
    A fourth row with mask 0 (any logits) changes nothing; the gradient reaches the logits only
    through P: d loss / d p_e of a row = E f_e / R."""
    from gspo_cli.distributed import DistInfo

    ln3 = math.log(3.0)
    logits = torch.tensor([[ln3, 0.0], [0.0, ln3], [ln3, 0.0], [0.0, 9.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, value = global_load_balancing_loss((logits,), mask, 2, 1, DistInfo())
    assert loss.item() == pytest.approx(19 / 18, rel=1e-6) and value.item() == pytest.approx(19 / 18, rel=1e-6)
    loss.backward()
    # d/dz of softmax-weighted sum: row 0 p = (.75, .25), c = E f / R = (4/9, 2/9): dz_0 = p_0 p_1 (c_0 - c_1)
    assert logits.grad[0, 0].item() == pytest.approx(0.75 * 0.25 * (4 / 9 - 2 / 9), rel=1e-6)
    assert logits.grad[3].abs().max().item() == 0.0


def test_staleness_aware_labels():
    text, _ = describe("ratio/logvar_mb0")
    assert "staleness k and the behaviour anchor" in text and "k updates behind" in text
    assert "with the proximal anchor pi_old is the trainer's weights before the step" in text
    assert "with staleness k the trainer is k updates ahead" in describe("moe/engine_route_diff_frac")[0]
    assert not math.isnan(len(describe("policy/dropped_token_frac")[0]))


@pytest.mark.slow
def test_every_variant_trains_two_steps_end_to_end(tmp_path):
    """Each variant's preset (and the filters) through the real trainer on the tiny MoE: runs
    complete and log their own metrics."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import TINY

    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    presets = ("dapo", "dr-grpo", "cispo", "sapo", "gmpo", "luspo", "clip-cov", "kl-cov")
    arms = [{"name": p, "preset": p, "mini_batches": 2} for p in presets]
    arms.append(
        {
            "name": "filters",
            "preset": "paper-gspo-token",
            "mini_batches": 2,
            "token_filter": {"entropy_top": 0.2},
            "off_policy_mask": 0.5,
            "mismatch": {"mode": "token_mask", "low": 0.999, "high": 1.001},
        }
    )
    raw = {**TINY, "output_dir": str(tmp_path), "arms": arms, "rollout": {**TINY["rollout"], "sampler_logprobs": True}}
    results = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    assert [r.status for r in results] == ["completed"] * len(arms)
    last = {}
    for a in arms:
        lines = (tmp_path / "e2e" / a["name"] / "seed0" / "metrics.jsonl").read_text().splitlines()
        last[a["name"]] = json.loads(lines[-1])
    assert last["dapo"]["rollout/sampled_groups"] >= 4
    assert "policy/cov_selected_frac" in last["clip-cov"]  # 0 when no token's cov falls in (1, 5)
    assert 0 < last["kl-cov"]["policy/cov_selected_frac"] < 1  # at least one token per mini-batch
    assert 0 < last["filters"]["policy/dropped_token_frac"] < 1  # ~80% filtered, the rest kept


def test_a_model_without_router_logits_under_torchrun_fails_in_one_line():
    from types import SimpleNamespace

    from gspo_cli.distributed import DistInfo
    from gspo_cli.errors import RunError
    from gspo_cli.models.aux_loss import router_aux_loss

    cfg = SimpleNamespace(num_experts=4, num_experts_per_tok=2)
    own = torch.tensor(1.25)
    assert router_aux_loss(own, None, torch.ones(1, 3), cfg, DistInfo())[1].item() == 1.25  # one process: its own
    with pytest.raises(RunError, match=r"^model.router_aux_loss_coef: the model returns no router_logits") as err:
        router_aux_loss(own, None, torch.ones(1, 3), cfg, DistInfo(rank=0, world_size=2))
    assert "\n" not in str(err.value)


def test_a_run_with_the_load_balancing_loss_samples_evaluates_and_logs_it(tmp_path):
    """router_aux_loss_coef > 0 turns on the model's router_logits output; the hf engine's
    generation (rollouts and the step-0 evaluation) must not compute transformers' aux loss
    over one decode step against the whole mask (it failed: "size of tensor a (16) must match
    ... b (144)"). The update logs the loss: E x sum f_e P_e >= 1 with equality only when balanced."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import TINY

    from gspo_cli.models import resolve_model_source
    from gspo_cli.tasks import make_task
    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    # prompts of different lengths (the failure needs left padding)
    task = {"name": "math", "params": {"source": "synthetic", "num_operands": 2, "max_operand": 50}, "eval_size": 8}
    builtin = spec_from_dict({**TINY, "task": task})
    local = resolve_model_source(builtin.model, make_task(builtin.task.name, builtin.task.params), log=lambda m: None)
    raw = {  # the built-in model's directory, loaded as a user's local Hugging Face model
        **TINY,
        "task": task,
        "output_dir": str(tmp_path),
        "model": {"name": str(local), "router_aux_loss_coef": 0.01},
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 2}],
    }
    results = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    assert [r.status for r in results] == ["completed"]
    run = tmp_path / "e2e" / "gspo" / "seed0"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(m["moe/aux_loss"] >= 1.0 - 1e-6 for m in metrics)
    assert (run / "eval.jsonl").read_text().strip()
