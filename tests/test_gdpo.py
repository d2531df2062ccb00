"""Several rewards combined on purpose. `multi_reward: normalize_then_sum`
(GDPO; TRL's multi_objective_aggregation) against hand-computed advantages, and dynamic
sampling deciding signal from one named reward (`dynamic_sampling.metric: reward:<name>`)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import rows_batch

from gspo_cli.algorithms import grpo_advantages, mean_only_advantages, overlong_penalty
from gspo_cli.algorithms.multi_reward import group_normalized, normalize_then_sum, signal_groups_where_applies
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.spec.loading import load_spec, spec_from_dict
from gspo_cli.tasks.base import Score
from gspo_cli.train.sampling import advantages, dynamic_sampling, shaped_rewards, signal

NAN = float("nan")
TWO = [{"function": "math_accuracy", "name": "acc"}, {"function": "math_accuracy", "name": "length", "weight": 0.5}]


def spec_of(rewards=TWO, group_size=4, max_new_tokens=10, **arm):
    raw = {
        "name": "r",
        "task": {"name": "arithmetic", "rewards": rewards},
        "rollout": {"prompts_per_step": 2, "group_size": group_size, "max_new_tokens": max_new_tokens},
        "arms": [{"name": "a", "preset": "paper-grpo", **arm}],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spec_from_dict(raw)


def ctx_of(spec):
    return SimpleNamespace(
        spec=spec,
        arm=spec.arms[0],
        adv_fn=grpo_advantages if spec.arms[0].advantage == "grpo" else mean_only_advantages,
        dist=DistInfo(),
        engine=SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0)),
    )


def scores_of(acc, length, weights=(1.0, 0.5)):
    """Scores as RewardedTask.score_rollout writes them: components hold the rewards that apply."""
    out = []
    for a, n in zip(acc, length):
        applied = {k: v for k, v in (("acc", a), ("length", n)) if v is not None}
        total = weights[0] * applied.get("acc", 0.0) + weights[1] * applied.get("length", 0.0)
        out.append(Score(reward=total, correct=a == 1.0, components=applied, rewarded=bool(applied)))
    return out


# Two groups of 4. acc is 0/1, length in the hundreds; None: the reward does not apply.
ACC = [1.0, 0.0, 0.0, None, None, 1.0, 1.0, 1.0]
LENGTH = [300.0, 100.0, 200.0, 400.0, None, 250.0, None, None]


def values(acc=ACC, length=LENGTH):
    return torch.tensor([[NAN if v is None else v for v in acc], [NAN if v is None else v for v in length]])


def hand_advantages(eps=0.0):
    """By hand. Group 0: acc applies to rows 0-2 (1, 0, 0): mean 1/3, unbiased std 1/sqrt(3),
    deviations (2/3, -1/3, -1/3), row 3 none. length (300, 100, 200, 400): mean 250, deviations
    (50, -150, -50, 150), std sqrt(50000/3). Group 1: acc equal where it applies (0), length
    applies to one row only (0); row 4 no reward applies to. S = acc + 0.5 x length, each over
    (its group std + eps); A = S over (the batch std + eps), over the 7 scored rows (row 4 left
    out), the batch mean 0 by construction."""
    acc = [d / (1 / math.sqrt(3) + eps) for d in (2 / 3, -1 / 3, -1 / 3, 0.0)]
    length = [d / (math.sqrt(50000 / 3) + eps) for d in (50.0, -150.0, -50.0, 150.0)]
    s = [a + 0.5 * n for a, n in zip(acc, length)] + [0.0] * 4
    std = math.sqrt(sum(x * x for x in s) / (7 - 1))
    return [x / (std + eps) for x in s]


# ----------------------------------------------------------------------------- the formula


def test_each_reward_is_normalised_within_its_group_over_the_rows_it_applies_to():
    norm = group_normalized(values(), 4, eps=0.0)
    r3, q = math.sqrt(3), math.sqrt(0.15)
    assert norm[0].tolist() == pytest.approx([2 / r3, -1 / r3, -1 / r3, 0, 0, 0, 0, 0], abs=1e-6)
    assert norm[1].tolist() == pytest.approx([q, -3 * q, -q, 3 * q, 0, 0, 0, 0], abs=1e-6)
    # a reward that applies to every row of a group: exactly grpo's advantage
    full = torch.tensor([[3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]])
    assert group_normalized(full, 4)[0].tolist() == pytest.approx(grpo_advantages(full[0], 4).tolist(), abs=1e-6)


def test_normalize_then_sum_by_hand_with_none_rows_and_a_zero_std_group():
    adv = normalize_then_sum(values(), [1.0, 0.5], 4, eps=0.0)
    assert adv.tolist() == pytest.approx(hand_advantages(), abs=1e-6)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # exact zeros: no signal, no float noise
    # the arm's adv_eps is added to the batch std
    assert normalize_then_sum(values(), [1.0, 0.5], 4, eps=0.1).tolist() == pytest.approx(
        hand_advantages(eps=0.1), abs=1e-6
    )


def test_a_reward_s_scale_does_not_matter_its_weight_does():
    """GDPO's point: length in the hundreds does not drown accuracy. Scaling it by 1000 changes
    nothing; under the weighted sum it decides the advantages alone."""
    scaled = values(length=[None if v is None else 1000 * v for v in LENGTH])
    assert normalize_then_sum(scaled, [1.0, 0.5], 4).tolist() == pytest.approx(
        normalize_then_sum(values(), [1.0, 0.5], 4).tolist(), abs=1e-5
    )
    summed = torch.tensor([[1.0, 0.0, 0.0, 0.0], [300.0, 100.0, 200.0, 400.0]]) * torch.tensor([[1.0], [-0.01]])
    by_sum = grpo_advantages(summed.sum(0), 4)
    assert by_sum.argmax() == 1  # the short wrong answer beats the right one: length decides
    gdpo = normalize_then_sum(torch.tensor([[1.0, 0.0, 0.0, 0.0], [300.0, 100.0, 200.0, 400.0]]), [1.0, -0.01], 4)
    assert gdpo.argmax() == 0  # the right answer, whatever its length's scale
    # a weight scales its term: the length weight 0 leaves accuracy alone, up to the batch std
    acc_only = normalize_then_sum(values(), [1.0, 0.0], 4, eps=0.0)
    r3 = math.sqrt(3)
    std = math.sqrt((4 / 3 + 1 / 3 + 1 / 3) / 6)
    assert acc_only.tolist() == pytest.approx([2 / r3 / std, -1 / r3 / std, -1 / r3 / std, 0, 0, 0, 0, 0], abs=1e-6)


def test_the_overlong_penalty_is_centred_in_its_group_not_scaled():
    """Group 0: acc (1, 0) gives +-1/sqrt2; penalty (0, -0.002) centred: +-0.001, not blown up
    to +-1/sqrt2 by its own std. Group 1: equal penalties (-1, -1) centre to 0: no signal."""
    v = torch.tensor([[1.0, 0.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    adv = normalize_then_sum(v, [1.0, 1.0], 2, eps=0.0, penalty_B=torch.tensor([0.0, -0.002, -1.0, -1.0]))
    s = 1 / math.sqrt(2) + 0.001
    std = math.sqrt(2 * s * s / 3)
    assert adv.tolist() == pytest.approx([s / std, -s / std, 0.0, 0.0], abs=1e-6)
    only_penalty = normalize_then_sum(
        torch.ones(2, 4), [1.0, 1.0], 2, eps=0.0, penalty_B=torch.tensor([-0.5, 0.0, -1.0, -1.0])
    )
    std = math.sqrt(2 * 0.25**2 / 3)
    assert only_penalty.tolist() == pytest.approx([-0.25 / std, 0.25 / std, 0.0, 0.0], abs=1e-6)


def test_no_signal_anywhere_gives_zeros_never_nan():
    flat = torch.tensor([[1.0, 1.0, 0.0, 0.0], [NAN, 7.0, NAN, NAN]])
    assert normalize_then_sum(flat, [1.0, 1.0], 2).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert normalize_then_sum(torch.full((2, 4), NAN), [1.0, 1.0], 2).tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="2 rewards but 1 weights"):
        normalize_then_sum(flat, [1.0], 2)


def test_matches_trl_normalize_then_sum_where_every_group_compares():
    """TRL's formula (grpo_trainer.py, multi_objective_aggregation normalize_then_sum), written out:
    nanmean/nanstd per reward and group, (r - mean) / (std + eps), weighted nansum, then
    (S - nanmean S) / (nanstd S + eps) over the batch, unscorable rows NaN then 0."""
    v, w, eps = values(), torch.tensor([1.0, 0.5]), 1e-4
    v[1, 5] = NAN  # TRL gives NaN to a reward's group of one row as well; ours gives 0: same sum
    g = v.T.reshape(2, 4, 2)  # (Q, G, K)
    mean = torch.nanmean(g, 1, keepdim=True)
    n = (~torch.isnan(g)).sum(1, keepdim=True)
    std = torch.sqrt(torch.nansum((g - mean) ** 2, 1, keepdim=True) / (n - 1))
    s = (((g - mean) / (std + eps)).reshape(8, 2) * w).nansum(1)
    unscorable = torch.isnan(v).all(0)
    s[unscorable] = NAN
    ok = ~torch.isnan(s)
    trl = torch.nan_to_num((s - s[ok].mean()) / (s[ok].std() + eps), nan=0.0)
    assert normalize_then_sum(v, [1.0, 0.5], 4, eps=eps).tolist() == pytest.approx(trl.tolist(), abs=1e-5)


def test_the_batch_std_is_the_global_batch_s_under_torchrun():
    """Two ranks, whole groups each: with `reduce` summing both ranks' sums, each rank's share
    equals the single-process batch's advantages."""
    v = torch.cat([values(), values(acc=[0.0, 1.0, 1.0, 1.0, 1.0, 0.0, None, 1.0])], dim=1)
    whole = normalize_then_sum(v, [1.0, 0.5], 4)
    seen = {}

    def keep(name):
        def reduce(t):
            seen[name] = t
            return t

        return reduce

    normalize_then_sum(v[:, :8], [1.0, 0.5], 4, reduce=keep(0))
    normalize_then_sum(v[:, 8:], [1.0, 0.5], 4, reduce=keep(1))
    rank0 = normalize_then_sum(v[:, :8], [1.0, 0.5], 4, reduce=lambda t: t + seen[1])
    rank1 = normalize_then_sum(v[:, 8:], [1.0, 0.5], 4, reduce=lambda t: t + seen[0])
    assert torch.cat([rank0, rank1]).tolist() == pytest.approx(whole.tolist(), abs=1e-6)


# ----------------------------------------------------------------------------- in the step


def test_the_default_is_todays_advantage_bit_for_bit():
    spec = spec_of(overlong={"buffer_frac": 0.5}, max_new_tokens=10)
    assert spec.arms[0].multi_reward == "sum_then_normalize"
    batch = rows_batch([3, 10, 8, 6, 2, 2, 9, 7])
    scores = scores_of(ACC, [1.0 if n is None else n for n in LENGTH])  # a reward applies to every row
    rewards_B = shaped_rewards(spec.arms[0], 10, batch, scores)
    before = torch.tensor([s.reward for s in scores]) + overlong_penalty(batch.response_mask.sum(-1), 10, 5, 1.0)
    assert torch.equal(rewards_B, before)
    assert torch.equal(advantages(ctx_of(spec), batch, rewards_B, scores), grpo_advantages(rewards_B, 4, eps=1e-6))
    mean_only = spec_of(advantage="mean_only")
    assert torch.equal(
        advantages(ctx_of(mean_only), batch, rewards_B, scores), mean_only_advantages(rewards_B, 4, eps=1e-6)
    )


def test_a_row_no_reward_applies_to_gets_zero_and_stays_out_of_its_group_by_default():
    """A reward returning [2, 0, 2, None] (TRL leaves the None row out of the group): mean 4/3 and
    unbiased std sqrt(((2/3)^2 + (4/3)^2 + (2/3)^2) / 2) = sqrt(4/3) over the three scored rows,
    so (2/3, -4/3, 2/3) / sqrt(4/3) = (0.577, -1.155, 0.577), and 0 for the None row. The second
    group is scored everywhere: the estimator's own advantages."""
    spec = spec_of()
    assert spec.arms[0].multi_reward == "sum_then_normalize"
    scores = scores_of([2.0, 0.0, 2.0, None, 1.0, 0.0, 0.0, 3.0], [None] * 8)
    assert [s.reward for s in scores[:4]] == [2.0, 0.0, 2.0, 0.0] and not scores[3].rewarded
    batch = rows_batch([3] * 8)
    rewards_B = shaped_rewards(spec.arms[0], 10, batch, scores)
    got = advantages(ctx_of(spec), batch, rewards_B, scores)
    r = math.sqrt(4 / 3)
    assert got[:4].tolist() == pytest.approx([2 / 3 / r, -4 / 3 / r, 2 / 3 / r, 0.0], abs=1e-5)
    assert got[:4].tolist() == pytest.approx([0.577, -1.155, 0.577, 0.0], abs=1e-3)
    assert got[3].item() == 0.0
    assert torch.equal(got[4:], grpo_advantages(rewards_B[4:], 4, eps=1e-6))
    mean_only = spec_of(advantage="mean_only")
    got = advantages(ctx_of(mean_only), batch, rewards_B, scores)
    assert got[:4].tolist() == pytest.approx([2 / 3, -4 / 3, 2 / 3, 0.0], abs=1e-6)
    # one scored row left in a group: nothing to compare it with
    scores = scores_of([None, 5.0, None, None, 1.0, 0.0, 0.0, 3.0], [None] * 8)
    got = advantages(ctx_of(spec), batch, shaped_rewards(spec.arms[0], 10, batch, scores), scores)
    assert got[:4].tolist() == [0.0] * 4


def test_the_step_reads_each_reward_its_weight_and_the_overlong_penalty():
    spec = spec_of(multi_reward="normalize_then_sum")
    batch = rows_batch([3] * 8)
    scores = scores_of(ACC, LENGTH)
    got = advantages(ctx_of(spec), batch, shaped_rewards(spec.arms[0], 10, batch, scores), scores)
    assert got.tolist() == pytest.approx(hand_advantages(eps=1e-6), abs=1e-6)
    # the overlong penalty joins as a group-centred term: rows 0 and 1 (lengths 10, 9 of
    # max 10, buffer 5) are penalised -1 and -0.8
    spec = spec_of(multi_reward="normalize_then_sum", overlong={"buffer_frac": 0.5})
    batch = rows_batch([10, 9, 3, 3, 3, 3, 3, 3])
    got = advantages(ctx_of(spec), batch, shaped_rewards(spec.arms[0], 10, batch, scores), scores)
    penalty = torch.tensor([-1.0, -0.8, 0, 0, 0, 0, 0, 0])
    assert got.tolist() == pytest.approx(
        normalize_then_sum(values(), [1.0, 0.5], 4, eps=1e-6, penalty_B=penalty).tolist(), abs=1e-6
    )
    r3, q = math.sqrt(3), math.sqrt(0.15)
    s = [2 / r3 + 0.5 * q - 0.55, -1 / r3 - 1.5 * q - 0.35, -1 / r3 - 0.5 * q + 0.45, 1.5 * q + 0.45, 0, 0, 0, 0]
    std = math.sqrt(sum(x * x for x in s) / 6)
    assert got.tolist() == pytest.approx([x / (std + 1e-6) for x in s], abs=1e-5)


# ----------------------------------------------------------------------------- dynamic sampling


def test_signal_from_a_named_reward_counts_the_rows_it_applies_to():
    # group 0: length differs; group 1: length applies to one row only; group 2: equal
    # where it applies (acc differs there, which this metric does not ask about)
    length = torch.tensor([1.0, 2.0, NAN, NAN, NAN, 3.0, NAN, NAN, 4.0, 4.0, NAN, 4.0])
    assert signal_groups_where_applies(length, 4).tolist() == [True, False, False]
    spec = spec_of(dynamic_sampling={"max_rounds": 1, "metric": "reward:length"})
    acc = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    scores = scores_of(acc, [100.0, 100.0, None, 100.0, 300.0, None, None, 200.0])
    arm = spec.arms[0]
    assert signal(arm, 10, rows_batch([2] * 8), scores, 4).tolist() == [False, True]
    by_verdict = spec_of([{**TWO[0], "correct": True}, TWO[1]], dynamic_sampling={"max_rounds": 1}).arms[0]
    assert signal(by_verdict, 10, rows_batch([2] * 8), scores, 4).tolist() == [False, True]
    by_acc = spec_of(dynamic_sampling={"max_rounds": 1, "metric": "reward:acc"}).arms[0]
    assert signal(by_acc, 10, rows_batch([2] * 8), scores_of([1.0, 0.0, None, None], [1.0] * 4), 4).tolist() == [True]


def test_dynamic_sampling_by_a_named_reward_samples_again_until_it_differs():
    """The first round's group differs in correctness but not in length: by reward:length it
    carries no signal, so one more round is drawn and its group (lengths differ) is trained."""
    spec = spec_of(dynamic_sampling={"max_rounds": 2, "metric": "reward:length"})
    first = scores_of([1.0, 0.0, 1.0, 0.0], [100.0, 100.0, 100.0, None])
    second = scores_of([0.0, 0.0, 0.0, 0.0], [100.0, 200.0, None, None])
    calls = []

    def sample():
        calls.append(1)
        return None, rows_batch([4] * 4), second

    ctx = ctx_of(spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"prompts_per_step": 1})}))
    _, scores, counts = dynamic_sampling(ctx, [None], rows_batch([4] * 4), first, sample)
    assert counts == {"rounds": 1, "signal": 1, "groups": 1, "sampled": 2}
    assert [s.components.get("length") for s in scores] == [100.0, 200.0, None, None]
    assert len(calls) == 1


# ----------------------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("rewards", "arm", "message"),
    [
        (
            [],
            {"multi_reward": "normalize_then_sum"},
            "arms[0].multi_reward: normalize_then_sum normalises each of 2 or more task.rewards in its group; "
            "the task scores with its own verifier",
        ),
        (
            TWO[:1],
            {"multi_reward": "normalize_then_sum"},
            "task.rewards has 1 (one reward gives grpo's advantages times one batch-wide factor): "
            "use sum_then_normalize",
        ),
        (
            TWO,
            {"multi_reward": "normalize_then_sum", "advantage": "mean_only"},
            "it needs advantage: grpo (got mean_only)",
        ),
        (TWO, {"multi_reward": "gdpo"}, "arms[0].multi_reward: Input should be 'sum_then_normalize'"),
        (
            TWO,
            {"dynamic_sampling": {"metric": "reward:accuracy"}},
            "arms[0].dynamic_sampling.metric: no reward named 'accuracy' (task.rewards names: acc, length)",
        ),
        ([], {"dynamic_sampling": {"metric": "reward:acc"}}, "no reward named 'acc' (the task has no task.rewards)"),
        (
            TWO,
            {"preset": "dapo"},  # dynamic sampling by `correct`, the default, with no reward deciding it
            "arms[0].dynamic_sampling.metric: correct needs a reward of task.rewards marked correct: true, and none "
            "is (every group would lack signal): mark the one that decides correctness, or set metric: reward "
            "(their weighted sum) or reward:<name> (one of acc, length)",
        ),
        (
            TWO,
            {"dynamic_sampling": {"metric": "reward:"}},
            "expected correct, reward, shaped or reward:<name> (a task.rewards name); got 'reward:'",
        ),
    ],
)
def test_the_spec_refuses_what_cannot_work_in_one_line(rewards, arm, message):
    with pytest.raises(SpecError) as err:
        spec_of(rewards=rewards, **arm)
    text = str(err.value)
    assert message in text and len(text.splitlines()) == 1, text


def test_the_spec_accepts_two_rewards_and_a_named_signal():
    spec = spec_of(multi_reward="normalize_then_sum", dynamic_sampling={"max_rounds": 1, "metric": "reward:length"})
    assert spec.arms[0].multi_reward == "normalize_then_sum"
    assert spec.arms[0].dynamic_sampling.metric == "reward:length"
    assert spec_of(rewards=[]).arms[0].dynamic_sampling.metric == "correct"
    # By `correct` once a reward decides it, or with the task's own verdict (no task.rewards)
    judged = [{**TWO[0], "correct": True}, TWO[1]]
    assert spec_of(rewards=judged, preset="dapo").arms[0].dynamic_sampling.max_rounds > 0
    assert spec_of(rewards=[], preset="dapo").arms[0].dynamic_sampling.metric == "correct"


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_gspo_train_with_two_rewards_normalised_apart(tmp_path, monkeypatch):
    """experiments/own_rewards.yaml, tiny, with accuracy (0/1), format (0/1) and a length reward
    in the hundreds, each normalised in its group, the overlong penalty on and dynamic sampling
    by the format reward: the step's metrics are logged and finite."""
    from typer.testing import CliRunner

    from gspo_cli.cli.app import app
    from gspo_cli.runs import RunDir

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the example's paths are relative to the root
    (tmp_path / "length.py").write_text(
        "def length(completion_ids, **kwargs):\n    return [100.0 * len(ids) for ids in completion_ids]\n"
    )
    rewards = (
        '[{"function": "experiments/own_rewards/rewards.py:format_reward", "weight": 0.2}, '
        '{"function": "experiments/own_rewards/rewards.py:accuracy_reward", "correct": true}, '
        f'{{"function": "{tmp_path / "length.py"}:length", "weight": -0.5}}]'
    )
    sets = [
        "train.steps=2", "model.cold_start.steps=10", "rollout.max_new_tokens=8", "rollout.prompts_per_step=2",
        "rollout.group_size=4", "task.eval_size=2", "train.eval_samples=1", "train.eval_every=0",
        f"task.rewards={rewards}", "arms.gspo.multi_reward=normalize_then_sum", "arms.gspo.overlong.buffer_frac=0.5",
        'arms.gspo.dynamic_sampling={"max_rounds": 1, "metric": "reward:format_reward"}',
        "train.log_samples_every=1",
    ]  # fmt: skip
    args = ["train", "experiments/own_rewards.yaml", "-o", str(tmp_path / "out"), "--arm", "gspo"]
    res = CliRunner().invoke(app, [*args, *(x for s in sets for x in ("--set", s))])
    assert res.exit_code == 0, res.output
    rd = RunDir(tmp_path / "out/own_rewards/gspo/seed0")
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in (
            "reward/format_reward",
            "reward/length",
            "policy/loss",
            "rollout/dynamic_rounds",
            "policy/grad_norm",
        ):
            assert key in m and math.isfinite(m[key]), (key, m)
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float))
    assert load_spec(rd.spec_file).arms[0].multi_reward == "normalize_then_sum"
    advantages_logged = [r["advantage"] for r in rd.samples()]
    assert advantages_logged and all(math.isfinite(a) for a in advantages_logged)


def test_compare_names_normalize_then_sum_in_the_algorithm_column():
    """Two arms differing only in multi_reward must not look identical in compare/report."""
    from gspo_cli.analysis.rundata.arm_settings import SETTINGS

    algorithm = SETTINGS["algorithm"][1]
    plain = {"loss": "gspo", "advantage": "grpo"}
    gdpo = {**plain, "multi_reward": "normalize_then_sum"}
    assert "normalize_then_sum" in algorithm(gdpo)
    assert "normalize_then_sum" not in algorithm(plain)
    assert algorithm(plain) == algorithm({**plain, "multi_reward": "sum_then_normalize"})
