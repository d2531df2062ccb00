"""Optional metric sinks: TensorBoard events read back, W&B through a stand-in module."""

from __future__ import annotations

import sys
import types

import pytest
from pydantic import ValidationError

from gspo_cli.errors import SpecError
from gspo_cli.spec import TrainConfig
from gspo_cli.train.sinks import make_sinks


def test_tensorboard_events_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (sink,) = make_sinks(["tensorboard"], tmp_path, {"name": "exp"})
    sink.log({"step": 1, "reward/mean": 0.25, "policy/clip_frac_token": 0.5, "note": "text", "bad": float("nan")}, 1)
    sink.log({"step": 2, "reward/mean": 0.75}, 2)
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["policy/clip_frac_token", "reward/mean"]
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.25), (2, 0.75)]


def test_wandb_offline_by_default(tmp_path, monkeypatch):
    calls = {}

    class FakeRun:
        def log(self, metrics, step):
            calls.setdefault("log", []).append((metrics, step))

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.update(init=kw) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run_dir = tmp_path / "exp" / "gspo" / "seed1"
    (sink,) = make_sinks(["wandb"], run_dir, {"name": "exp"})
    sink.log({"step": 3, "reward/mean": 0.5, "flag": True}, 3)
    sink.close()
    assert calls["init"]["mode"] == "offline" and calls["init"]["name"] == "gspo-seed1"
    assert calls["init"]["group"] == "exp" and calls["init"]["config"] == {"name": "exp"}
    assert calls["log"] == [({"reward/mean": 0.5}, 3)] and calls["finished"]


def test_missing_package_and_unknown_sink_are_spec_errors(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(SpecError, match=r"^train.sinks: wandb needs `pip install gspo-cli\[wandb\]`$"):
        make_sinks(["wandb"], tmp_path, {})
    with pytest.raises(SpecError, match="unknown sink 'csv'"):
        make_sinks(["csv"], tmp_path, {})
    assert not (tmp_path / "tensorboard").exists()


def test_train_config_field():
    assert TrainConfig().sinks == []
    assert TrainConfig(sinks=["tensorboard", "wandb"]).sinks == ["tensorboard", "wandb"]
    with pytest.raises(ValidationError):
        TrainConfig(sinks=["csv"])
