"""End to end on the built-in tiny MoE: a few real steps of every loss and of routing replay."""

import math

import pytest
import torch
import yaml
from helpers import TINY, models_in_float64
from safetensors.torch import load_file

from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import load_spec, spec_from_dict
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    spec = spec_from_dict({**TINY, "output_dir": str(out)})
    results = train_experiment(spec, reporter=quiet_reporter())
    return spec, results


def test_every_arm_completes_with_a_full_run_directory(trained):
    spec, results = trained
    assert [r.arm for r in results] == [a.name for a in spec.arms]
    for r in results:
        rd = RunDir(r.path)
        info = rd.info()
        assert info["status"] == "completed" and info["step"] == 2
        assert {"started_at", "ended_at", "versions", "host", "wall_s"} <= set(info)
        # The run's own spec reloads and names exactly this arm and seed.
        own = load_spec(rd.spec_file)
        assert [a.name for a in own.arms] == [r.arm] and own.seeds == [0]
        metrics = rd.metrics()
        assert [m["step"] for m in metrics] == [1, 2]
        for m in metrics:
            for k, v in m.items():
                assert isinstance(v, (int, float)) and math.isfinite(v), (r.arm, k, v)
        evals = rd.evals()
        assert [e["step"] for e in evals] == [0, 2] and "avg@1" in evals[-1]["scores"]
        ckpt = rd.latest_checkpoint()
        assert ckpt.name == "step_000002"
        assert (ckpt / "model.safetensors").is_file() and (ckpt / "trainer_state.pt").is_file()
        assert (ckpt / "tokenizer.json").is_file()


def test_parameters_changed_and_rewards_carried_signal(trained):
    spec, results = trained
    for r in results:
        rd = RunDir(r.path)
        start = load_file(f"{rd.info()['model_source']}/model.safetensors")
        end = load_file(rd.latest_checkpoint() / "model.safetensors")
        changed = [k for k in start if not torch.equal(start[k], end[k])]
        assert changed, f"{r.arm}: no parameter moved"
        assert any(m["reward/zero_var_group_frac"] < 1 for m in rd.metrics()), r.arm


def test_metrics_carry_the_losses_statistics(trained):
    _, results = trained
    by_arm = {r.arm: RunDir(r.path).metrics() for r in results}
    for arm, ms in by_arm.items():
        for key in (
            "policy/clip_frac_token",
            "policy/clip_frac_token_low",
            "policy/clip_frac_token_high",
            "policy/clip_frac_seq",
            "policy/ratio_mean",
            "policy/kl_old_k3",
            "policy/entropy",
            "policy/grad_norm",
            "moe/expert_change_frac",
            "time/rollout_s",
            "perf/tokens_per_s",
        ):
            assert key in ms[-1], (arm, key)
        assert all(0 <= m["policy/clip_frac_token"] <= 1 for m in ms)
    assert "policy/kl_ref_k3" in by_arm["grpo_kl"][-1]
    # Off-policy mini-batches: ratios move away from 1 after the first update.
    assert any(m["policy/ratio_max"] > 1 or m["policy/ratio_min"] < 1 for m in by_arm["grpo"])


def test_same_seed_same_run(tmp_path):
    raw = {**TINY, "output_dir": str(tmp_path / "a"), "arms": [TINY["arms"][2]]}
    train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    raw_b = {**raw, "output_dir": str(tmp_path / "b")}
    train_experiment(spec_from_dict(raw_b), reporter=quiet_reporter())

    def strip(ms):
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in ms]

    a = RunDir(tmp_path / "a/e2e/gspo/seed0").metrics()
    b = RunDir(tmp_path / "b/e2e/gspo/seed0").metrics()
    assert strip(a) == strip(b)


def test_completed_run_is_skipped_and_force_reruns(tmp_path):
    raw = {**TINY, "output_dir": str(tmp_path), "arms": [TINY["arms"][0]], "train": {"steps": 1}}
    spec = spec_from_dict(raw)
    train_experiment(spec, reporter=quiet_reporter())
    rd = RunDir(tmp_path / "e2e/grpo/seed0")
    first_start = rd.info()["started_at"]
    (rd.path / "marker").write_text("x")
    train_experiment(spec, reporter=quiet_reporter())
    assert (rd.path / "marker").exists() and rd.info()["started_at"] == first_start  # untouched
    # --force deletes what gspo wrote there, never anything else: a file of the user's refuses it.
    from gspo_cli.errors import SpecError

    with pytest.raises(SpecError, match=r"holds files gspo did not write \(marker\)"):
        train_experiment(spec, reporter=quiet_reporter(), force=True)
    assert (rd.path / "marker").exists() and rd.info()["started_at"] == first_start
    (rd.path / "marker").unlink()
    rd.log_metrics({"step": 2})  # gone after the rerun: the run starts afresh
    train_experiment(spec, reporter=quiet_reporter(), force=True)
    assert rd.status() == "completed" and len(rd.metrics()) == 1


def test_dense_model_trains_and_refuses_routing_replay(tmp_path):
    from gspo_cli.errors import SpecError

    model = {**TINY["model"], "name": "builtin:tiny-dense"}
    raw = {**TINY, "model": model, "output_dir": str(tmp_path), "arms": [TINY["arms"][2]], "train": {"steps": 1}}
    (res,) = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    ms = RunDir(res.path).metrics()
    assert res.status == "completed" and "moe/expert_change_frac" not in ms[0]
    bad = {**raw, "arms": [TINY["arms"][1]]}
    with pytest.raises(SpecError, match="routing_replay: r2 needs an MoE model"):
        train_experiment(spec_from_dict(bad), reporter=quiet_reporter())
    assert not (tmp_path / "e2e/grpo_rr/seed0").exists()  # refused before any run directory was made


def test_builtin_model_is_cached_by_its_settings():
    import time

    from gspo_cli.models import resolve_model_source
    from gspo_cli.spec import ModelConfig
    from gspo_cli.tasks import make_task

    task = make_task("arithmetic", TINY["task"]["params"])
    cfg = ModelConfig(**TINY["model"])
    first = resolve_model_source(cfg, task, log=lambda m: None)
    t = time.time()
    assert resolve_model_source(cfg, task, log=lambda m: None) == first
    assert time.time() - t < 1.0  # no second cold start
    other = ModelConfig(**{**TINY["model"], "cold_start": {**TINY["model"]["cold_start"], "steps": 5}})
    assert resolve_model_source(other, task, log=lambda m: None) != first


def test_cli_train_end_to_end(tmp_path):
    from typer.testing import CliRunner

    from gspo_cli.cli.app import app

    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(yaml.safe_dump({**TINY, "arms": [TINY["arms"][2]], "train": {"steps": 1}}))
    res = CliRunner().invoke(
        app, ["train", str(spec_file), "-o", str(tmp_path / "out"), "--set", "arms.gspo.clip_high=5e-4"]
    )
    assert res.exit_code == 0, res.output
    rd = RunDir(tmp_path / "out/e2e/gspo/seed0")
    assert rd.status() == "completed"
    assert load_spec(rd.spec_file).arms[0].clip_high == 5e-4
    assert "[gspo/seed0] step 1" in res.output


def test_sampler_logprobs_match_a_separate_pass(tmp_path, monkeypatch):
    """rollout.sampler_logprobs (default) and a separate old-log-prob pass train the same run:
    same samples and rewards, ratios and losses equal (the runs in float64: helpers.in_float64),
    one forward fewer per step; with routing replay too."""
    import gspo_cli.rollout.base as base_mod
    import gspo_cli.train.step as step_mod
    import gspo_cli.train.update as update_mod

    load, loaded = step_mod.load_model, []

    def load_in_float64(*args, **kwargs):
        lm = load(*args, **kwargs)
        models_in_float64(lm.model)
        loaded.append(lm.model.dtype)
        return lm

    monkeypatch.setattr(step_mod, "load_model", load_in_float64)

    calls = []
    real = base_mod.response_logprobs
    counted = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(update_mod, "response_logprobs", counted)  # the updates' forwards
    monkeypatch.setattr(base_mod, "response_logprobs", counted)  # pi_old's own pass (rollout/micro_batches.py)
    arms = [TINY["arms"][1], TINY["arms"][2]]
    runs, forwards = {}, {}
    for flag in (True, False):
        calls.clear()
        out = tmp_path / str(flag)
        raw = {
            **TINY,
            "output_dir": str(out),
            "arms": arms,
            "train": {"steps": 1},
            "rollout": {**TINY["rollout"], "sampler_logprobs": flag, "logprob_check_every": 0},
        }
        train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
        runs[flag] = {a["name"]: RunDir(out / f"e2e/{a['name']}/seed0").metrics()[0] for a in arms}
        forwards[flag] = len(calls)
    # 2 arms x 1 step x (2 mini-batch forwards + the old-log-prob pass unless from the sampler)
    assert forwards == {True: 4, False: 6}
    assert loaded == [torch.float64] * 4  # 2 arms x 2 runs
    for arm in ("grpo_rr", "gspo"):
        fast, slow = runs[True][arm], runs[False][arm]
        assert fast["reward/mean"] == slow["reward/mean"]
        assert fast["response/length_mean"] == slow["response/length_mean"]
        for key in ("policy/loss", "policy/ratio_mean", "policy/entropy"):
            assert fast[key] == pytest.approx(slow[key], rel=1e-9, abs=1e-12), (arm, key)
    assert "moe/expert_change_frac" in runs[True]["grpo_rr"]


def test_sampler_logprob_check_logs_the_gap(tmp_path):
    """On the sampler path a full trainer forward checks the sampler's log-probs at step 1 and
    every N steps: the gap is logged (fp32: float rounding only) and nowhere else."""
    raw = {
        **TINY,
        "output_dir": str(tmp_path),
        "arms": [TINY["arms"][2]],
        "train": {"steps": 3},
        "rollout": {**TINY["rollout"], "logprob_check_every": 2},
    }
    train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
    ms = RunDir(tmp_path / "e2e/gspo/seed0").metrics()
    checked = [m["step"] for m in ms if "rollout/logprob_diff_mean" in m]
    assert checked == [1, 2]
    for m in ms:
        if m["step"] in checked:
            assert 0 <= m["rollout/logprob_diff_mean"] <= m["rollout/logprob_diff_max"] < 1e-4
