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
    assert TrainConfig(sinks=["mlflow", "trackio"]).sinks == ["mlflow", "trackio"]
    assert TrainConfig().sinks == []
    assert TrainConfig(sinks=["tensorboard", "wandb"]).sinks == ["tensorboard", "wandb"]
    with pytest.raises(ValidationError):
        TrainConfig(sinks=["csv"])


def test_mlflow_file_store_by_default(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_dir = tmp_path / "exp" / "gspo" / "seed1"
    run_dir.mkdir(parents=True)
    (sink,) = make_sinks(["mlflow"], run_dir, {"name": "exp", "train": {"steps": 3}})
    sink.log({"step": 1, "reward/mean": 0.25, "note": "text", "bad": float("inf")}, 1)
    sink.log({"step": 2, "reward/mean": 0.75}, 2)
    sink.close()
    store = tmp_path / "exp" / "mlruns"  # one store per experiment: arms and seeds side by side
    client = MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run(sink.run_id)
    assert run.info.run_name == "gspo-seed1" and run.info.status == "FINISHED"
    assert run.data.params == {"name": "exp", "train.steps": "3"}
    assert set(run.data.metrics) == {"reward/mean"}
    history = client.get_metric_history(sink.run_id, "reward/mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.75)]
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_trackio_local_database(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    import trackio.sqlite_storage as storage

    monkeypatch.setattr(storage, "TRACKIO_DIR", tmp_path / "trackio")
    monkeypatch.setenv("TRACKIO_PROJECT", "gspo-test")
    for var in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)
    run_dir = tmp_path / "exp" / "gspo" / "seed1"
    (sink,) = make_sinks(["trackio"], run_dir, {"name": "exp"})
    sink.log({"step": 1, "reward/mean": 0.25, "flag": True}, 1)
    sink.log({"step": 2, "reward/mean": 0.75}, 2)
    sink.close()
    logs = storage.SQLiteStorage.get_logs("gspo-test", "exp-gspo-seed1")
    assert [(r["step"], r["reward/mean"]) for r in logs] == [(1, 0.25), (2, 0.75)]
    assert all("flag" not in r for r in logs)
    assert (tmp_path / "trackio" / "gspo-test.db").is_file()


@pytest.mark.parametrize("name", ["mlflow", "trackio", "tensorboard"])
def test_missing_tracker_named_with_its_extra(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SpecError, match=rf"^train.sinks: {name} needs `pip install gspo-cli\[{name}\]`$"):
        make_sinks([name], tmp_path, {})


def test_missing_tracker_refused_before_any_model(tmp_path, monkeypatch):
    """`gspo train` with a sink whose package is missing: one line, exit 2, nothing built."""
    from typer.testing import CliRunner

    from gspo_cli.cli.app import app

    monkeypatch.setitem(sys.modules, "mlflow", None)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        f"name: t\noutput_dir: {tmp_path / 'out'}\nmodel: {{name: 'builtin:tiny-moe'}}\n"
        "train: {sinks: [mlflow]}\narms: [{name: a, preset: paper-gspo}]\n"
    )
    res = CliRunner().invoke(app, ["train", str(spec)])
    assert res.exit_code == 2, res.output
    assert "train.sinks: mlflow needs `pip install gspo-cli[mlflow]`" in res.output
    assert not (tmp_path / "out").exists()
