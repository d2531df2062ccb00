"""Optional metric sinks beside metrics.jsonl: TensorBoard, Weights & Biases, MLflow, trackio.

metrics.jsonl stays the source of truth (compare and plot read only it); sinks are views
for people who live in those tools. All are optional extras, imported only when a spec
asks for them, so a missing package is a spec error before training (`check_sinks`, called
before any model is built), never a crash mid-run.

Offline first: training never waits on the network. Every sink writes local files unless
the user's own environment points it elsewhere: TensorBoard event files in the run
directory; W&B offline (WANDB_MODE); MLflow a file store `<experiment dir>/mlruns` (unless
MLFLOW_TRACKING_URI names another, then logged asynchronously); trackio its local SQLite
database (TRACKIO_DIR; a Space only when TRACKIO_SPACE_ID asks for one).

    sinks = make_sinks(spec.train.sinks, run_dir, spec_dict)
    for step ...: for s in sinks: s.log(record, step)
    finally: for s in sinks: s.close()
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from gspo_cli.errors import SpecError
from gspo_cli.spec.training import SINK_PACKAGES

SINKS = tuple(SINK_PACKAGES)


class Sink(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics record, without the step itself; NaN/inf are dropped
    (TensorBoard draws them as gaps at best, and W&B refuses some)."""
    out = {}
    for k, v in metrics.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


class TensorBoardSink:
    """Scalars as TensorBoard event files under <run_dir>/tensorboard/.

    Uses the `tensorboard` package's own event writer (what torch.utils.tensorboard wraps),
    so this module needs no torch either.
    """

    def __init__(self, logdir: Path):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(logdir), flush_secs=10)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in _scalars(metrics).items()]
        if values:
            self._writer.add_event(
                self._event(wall_time=time.time(), step=int(step), summary=self._summary(value=values))
            )

    def close(self) -> None:
        self._writer.close()  # flushes


class WandbSink:
    """A W&B run named <arm>-seed<k>, grouped by experiment; offline unless WANDB_MODE says
    otherwise (training must never depend on the network; `wandb sync` uploads later)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "gspo-cli"),
            group=str(config.get("name", run_dir.parent.parent.name)),
            name=f"{run_dir.parent.name}-{run_dir.name}",
            config=config,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(_scalars(metrics), step=int(step))

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """An MLflow run named <arm>-seed<k> in the MLflow experiment named like ours.

    The store is MLFLOW_TRACKING_URI when set, else the file store <experiment dir>/mlruns
    (`mlflow ui --backend-store-uri file:<that dir>`), shared by the experiment's runs so
    they sit side by side. Metrics are logged asynchronously: a remote server that is slow
    or gone delays nothing but the final flush. (The file store is written synchronously: its
    async writers race to create the same metric file.)"""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self._async = bool(uri) and not uri.startswith("file:") and "://" in uri
        if not uri:
            # MLflow 3 keeps the file store in maintenance mode and refuses it unless allowed;
            # it is the one store that needs no server and no extra package.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir.parent.parent / "mlruns").resolve().as_uri()
        self._client = MlflowClient(tracking_uri=uri)
        name = str(config.get("name", run_dir.parent.parent.name))
        found = self._client.get_experiment_by_name(name)
        exp_id = found.experiment_id if found else self._client.create_experiment(name)
        run = self._client.create_run(
            exp_id, run_name=f"{run_dir.parent.name}-{run_dir.name}", tags={"gspo.run_dir": str(run_dir)}
        )
        self.run_id = run.info.run_id
        self._pending: list = []
        from mlflow.entities import Param

        flat = _flatten(config)  # MLflow params are flat strings of at most 6000 characters
        params = [Param(k, str(v)[:6000]) for k, v in flat.items()]
        for i in range(0, len(params), 100):  # the store takes at most 100 params per batch
            self._client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, int(step)) for k, v in _scalars(metrics).items()]
        if batch:
            op = self._client.log_batch(self.run_id, metrics=batch, synchronous=not self._async)
            if op is not None:
                self._pending.append(op)

    def close(self) -> None:
        for op in self._pending:
            op.wait()
        self._client.set_terminated(self.run_id)


class TrackioSink:
    """A trackio run named <arm>-seed<k>, grouped by experiment, in trackio's local database
    (project TRACKIO_PROJECT or gspo-cli; `trackio show` opens the dashboard). No Space is
    created unless TRACKIO_SPACE_ID says so; trackio's banner lines are kept off our output."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        import trackio

        with contextlib.redirect_stdout(io.StringIO()):
            self._run = trackio.init(
                project=os.environ.get("TRACKIO_PROJECT", "gspo-cli"),
                name=f"{run_dir.parent.parent.name}-{run_dir.parent.name}-{run_dir.name}",
                group=str(config.get("name", run_dir.parent.parent.name)),
                config=config,
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(_scalars(metrics), step=int(step))

    def close(self) -> None:
        import trackio

        with contextlib.redirect_stdout(io.StringIO()):
            if trackio.context_vars.current_run.get() is self._run:
                trackio.finish()  # also forgets it, so trackio's exit hook does not finish it twice
            else:
                self._run.finish()


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_sinks(names: list[str]) -> None:
    """SpecError (one line, naming the extra to install) for an unknown sink or one whose
    package is missing. Call it at spec load, before any model is built."""
    for name in names:
        if name not in SINK_PACKAGES:
            raise SpecError(f"train.sinks: unknown sink {name!r} (known: {', '.join(SINKS)})")
        module, extra = SINK_PACKAGES[name]
        if not _installed(module):
            raise SpecError(f"train.sinks: {name} needs `pip install gspo-cli[{extra}]`")


def _installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (mlflow takes seconds)."""
    import importlib.util
    import sys

    if module in sys.modules:  # already imported, or blocked (None) as tests do
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_BUILDERS = {
    "tensorboard": lambda run_dir, config: TensorBoardSink(run_dir / "tensorboard"),
    "wandb": WandbSink,
    "mlflow": MlflowSink,
    "trackio": TrackioSink,
}


def make_sinks(names: list[str], run_dir: Path, config: dict[str, Any]) -> list[Sink]:
    """The sinks named in the spec, ready to log. SpecError for an unknown name or a missing
    package, checked for every name before any sink is opened (nothing to clean up)."""
    check_sinks(names)
    run_dir = Path(run_dir)
    return [_BUILDERS[name](run_dir, config) for name in dict.fromkeys(names)]
