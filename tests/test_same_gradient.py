"""Arms that take the same gradient (gspo_cli.spec.same_gradient): the list of losses checked
against the registry, the load warning, and `gspo report` / `gspo compare` on run directories of
the paper's GRPO and GSPO presets with one mini-batch (cannot differ) and four (can)."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from gspo_cli.algorithms import POLICY_LOSSES, aggregate, get_policy_loss
from gspo_cli.cli.app import app
from gspo_cli.spec import OnPolicyWarning
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.spec.same_gradient import VANILLA_AT_RATIO_ONE, off_policy_reasons, same_gradient

runner = CliRunner()
RAW = {
    "name": "paper",
    "rollout": {"prompts_per_step": 4, "group_size": 2},
    "arms": [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}],
}


def raw(mini_batches: int | None = None, rollout: dict | None = None, **arm_changes) -> dict:
    out = copy.deepcopy(RAW)
    out["rollout"].update(rollout or {})
    for arm in out["arms"]:
        if mini_batches is not None:
            arm["mini_batches"] = mini_batches
        arm.update(arm_changes)
    return out


def _on_policy_grad(name: str, aggregation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss's gradient at pi = pi_old, the vanilla policy gradient) under one aggregation."""
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(6, 5, generator=g, dtype=torch.float64) * 3
    mask = (torch.arange(5)[None, :] < torch.tensor([1, 5, 3, 4, 2, 5])[:, None]).double()
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    leaf = logp.clone().requires_grad_(True)
    loss, _ = get_policy_loss(name)(leaf, logp, adv, mask, clip_low=0.2, clip_high=0.28, aggregation=aggregation)
    loss.backward()
    ref = logp.clone().requires_grad_(True)
    aggregate(-adv[:, None] * ref, mask, aggregation).backward()
    return leaf.grad, ref.grad


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_the_losses_said_to_match_give_the_vanilla_gradient_at_ratio_one(aggregation):
    assert VANILLA_AT_RATIO_ONE <= set(POLICY_LOSSES)
    for name in sorted(POLICY_LOSSES):
        got, want = _on_policy_grad(name, aggregation)
        same = torch.allclose(got, want, rtol=0, atol=1e-12)
        # A loss in the list must match; one left out must really differ (luspo scales by
        # length, clip_cov detaches its selected tokens), else it belongs in the list.
        assert same == (name in VANILLA_AT_RATIO_ONE), name


def test_off_policy_reasons_read_every_source_of_a_ratio_other_than_one():
    assert off_policy_reasons({}, {}) == []  # an old spec's missing keys read as the defaults
    arm = {"mini_batches": 4, "epochs": 2, "mismatch": {"mode": "seq_tis"}}
    assert off_policy_reasons(arm, {"staleness": 1}) == [
        "4 mini-batches",
        "2 epochs",
        "staleness 1",
        "mismatch correction seq_tis",
    ]
    assert off_policy_reasons({}, {"engine": "vllm", "use_engine_logprobs": True}) == [
        "pi_old from the engine's log-probs"
    ]


def test_the_pair_differs_in_anything_but_loss_and_clip():
    with pytest.warns(OnPolicyWarning):
        spec = spec_from_dict(raw(1)).to_dict()
    grpo, gspo = spec["arms"]
    assert "same gradient" in same_gradient(spec, grpo, spec, gspo)
    for key, value in [("aggregation", "token_mean"), ("kl_coef", 0.01), ("advantage", "mean_only")]:
        assert same_gradient(spec, grpo, spec, {**gspo, key: value}) is None, key
    other = copy.deepcopy(spec)
    other["rollout"]["temperature"] = 0.7
    assert same_gradient(spec, grpo, other, gspo) is None
    assert same_gradient(spec, grpo, spec, {**gspo, "loss": "luspo"}) is None


def test_load_warning_names_the_pair_and_reads_staleness_and_corrections():
    with pytest.warns(OnPolicyWarning) as got:
        spec = spec_from_dict(raw(1))
    text = str(got[0].message)
    assert text.startswith("arms ['grpo', 'gspo'] update on-policy (one mini-batch, one epoch, staleness 0, ")
    assert "'grpo' and 'gspo' take the same gradient" in text and "seed noise" in text
    assert spec.on_policy_arms() == ["grpo", "gspo"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", OnPolicyWarning)
        # Old code: one mini-batch and one epoch was "on-policy" whatever the staleness.
        assert spec_from_dict(raw(1, rollout={"staleness": 1})).on_policy_arms() == []
        assert spec_from_dict(raw(1, mismatch={"mode": "seq_tis"})).on_policy_arms() == []
        assert spec_from_dict(raw()).on_policy_arms() == []  # the presets' 4 mini-batches


# ----------------------------------------------------------------------------- report and compare


def write_runs(root: Path, mini_batches: int, *, seeds=(0, 1), signal: bool = True) -> Path:
    """root/paper/{grpo,gspo}/seed{k} with the resolved spec of the paper presets; GSPO's reward
    clearly above GRPO's and its clip fraction 100x, so a report that tests would say "holds"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OnPolicyWarning)
        spec = spec_from_dict(raw(mini_batches)).to_dict()
    for arm, reward, clip in (("grpo", 0.3, 0.001), ("gspo", 0.6, 0.1)):
        for k in seeds:
            d = root / "paper" / arm / f"seed{k}"
            d.mkdir(parents=True)
            (d / "spec.yaml").write_text(yaml.safe_dump({**spec, "seeds": [k]}))
            recs = [
                {
                    "step": t,
                    # seeds differ by arm too: a difference with no spread gets no verdict
                    "reward/mean": (reward + 0.01 * k * (2 if arm == "gspo" else 1)) if signal else 0.0,
                    "reward/std": 0.4 if signal else 0.0,
                    "reward/zero_var_group_frac": 0.5 if signal else 1.0,
                    "policy/clip_frac_token": clip if signal else 0.0,
                    "policy/clip_frac_seq": clip if signal else 0.0,
                    "moe/expert_change_frac": 0.1 if signal else 0.0,
                    "time/step_s": 1.0,
                    "time/elapsed_s": float(t),
                }
                for t in range(1, 7)
            ]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            info = {"status": "completed", "experiment": "paper", "arm": arm, "seed": k, "step": 6, "total_steps": 6}
            (d / "run.json").write_text(json.dumps(info))
    return root / "paper"


def _report(exp: Path) -> str:
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    return (exp / "REPORT.md").read_text()


def test_report_and_compare_say_on_policy_arms_cannot_differ(tmp_path):
    exp = write_runs(tmp_path, mini_batches=1)
    text = _report(exp)
    for k in (1, 2, 3, 5):
        assert f"**{k}.** not testable: GRPO (`grpo`) and GSPO (`gspo`) take the same gradient: both update " in text
    findings = text.split("## Findings")[1].split("Verdict rules")[0]
    assert "learns more per step" not in findings and "clipping part" not in findings
    res = runner.invoke(app, ["compare", str(exp)])
    assert res.exit_code == 0, res.output
    assert "grpo and gspo cannot differ, they take the same gradient: both update on-policy" in " ".join(
        res.output.split()
    )


def test_report_and_compare_on_four_mini_batches_give_verdicts(tmp_path):
    exp = write_runs(tmp_path, mini_batches=4)
    text = _report(exp)
    assert "same gradient" not in text
    assert "**1. GSPO learns more per step than GRPO — holds.**" in text
    assert "clipping part holds" in text
    res = runner.invoke(app, ["compare", str(exp)])
    assert res.exit_code == 0 and "cannot differ" not in res.output


def test_report_and_compare_on_runs_without_signal(tmp_path):
    exp = write_runs(tmp_path, mini_batches=4, signal=False)
    text = _report(exp)
    findings = text.split("## Findings")[1].split("Verdict rules")[0]
    for k in (1, 2, 3, 4, 5):
        assert f"**{k}.** not testable: no learning signal: every group's rewards were equal" in findings, k
    assert "infx" not in text and "lower at this scale" not in text
    res = runner.invoke(app, ["compare", str(exp)])
    assert res.exit_code == 0, res.output
    assert "every run: no learning signal" in " ".join(res.output.split())


def test_report_and_compare_on_a_six_step_run_say_six(tmp_path):
    exp = write_runs(tmp_path, mini_batches=4)
    text = _report(exp)
    assert "first 6 steps" in text and "first 25" not in text and "last 25" not in text
    res = runner.invoke(app, ["compare", str(exp)])
    assert "reward (last 6)" in res.output and "last 10" not in res.output
