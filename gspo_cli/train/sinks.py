"""Optional metric sinks beside metrics.jsonl: TensorBoard event files and Weights & Biases.

metrics.jsonl stays the source of truth (compare and plot read only it); sinks are views
for people who live in those tools. Both are optional extras, imported only when a spec
asks for them, so a missing package is a spec error before training, never a crash mid-run.

    sinks = make_sinks(spec.train.sinks, run_dir, spec_dict)
    for step ...: for s in sinks: s.log(record, step)
    finally: for s in sinks: s.close()
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from gspo_cli.errors import SpecError

SINKS = ("tensorboard", "wandb")


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


def _require(module: str, extra: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise SpecError(f"train.sinks: {extra} needs `pip install gspo-cli[{extra}]`") from None


def make_sinks(names: list[str], run_dir: Path, config: dict[str, Any]) -> list[Sink]:
    """The sinks named in the spec, ready to log. SpecError for an unknown name or a missing
    package, checked for every name before any sink is opened (nothing to clean up)."""
    for name in names:
        if name not in SINKS:
            raise SpecError(f"train.sinks: unknown sink {name!r} (known: {', '.join(SINKS)})")
        _require("tensorboard" if name == "tensorboard" else "wandb", name)
    run_dir = Path(run_dir)
    sinks: list[Sink] = []
    for name in dict.fromkeys(names):
        sinks.append(TensorBoardSink(run_dir / "tensorboard") if name == "tensorboard" else WandbSink(run_dir, config))
    return sinks
