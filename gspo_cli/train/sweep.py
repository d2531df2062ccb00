"""Sweeps: expand a spec's `sweep:` section x arms x seeds into a plan of named runs,
take a stable shard of it, and run it with N local processes.

Each planned run is an ordinary run: its arm is renamed to say its settings
(`gspo,clip_high=0.0002,group_size=4`), so `results/<experiment>/<that name>/seed<k>/` is a
normal run directory and compare/plot group by it like any arm. Planning loads no model
(validating the arms' algorithm names imports the registries, and with them torch).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir, format_setting, run_path
from gspo_cli.spec import ExperimentSpec
from gspo_cli.spec.loading import apply_override, dump_spec, read_spec_file, set_path, spec_from_dict
from gspo_cli.train.reporting import format_eval, format_step
from gspo_cli.train.sinks import check_sinks


@dataclass(frozen=True)
class PlannedRun:
    name: str  # the run's arm name: base arm + its sweep settings
    base_arm: str
    seed: int
    settings: tuple[tuple[str, Any], ...]  # the sweep point, in grid order
    spec: ExperimentSpec  # exactly this run: one (renamed) arm, one seed
    path: Path

    def status(self) -> str:
        return RunDir(self.path).status() or "planned"


def _short_keys(keys: list[str]) -> dict[str, str]:
    """The last path component names a setting, unless two keys share it."""
    last = {k: k.replace("[*]", "").replace("[", ".").replace("]", "").split(".")[-1] for k in keys}
    clash = {v for v in last.values() if list(last.values()).count(v) > 1}
    return {k: (k.replace("[*]", "").replace("[", ".").replace("]", "") if last[k] in clash else last[k]) for k in keys}


def sweep_points(grid: dict[str, list[Any]], sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the grid, times each explicit set (or once, if none)."""
    keys = list(grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))] or [{}]
    return [{**c, **s} for c in combos for s in (sets or [{}])]


def _apply_point(raw: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    n_arms = len(raw.get("arms") or [])
    for key, value in point.items():
        if "[*]" in key:
            for i in range(n_arms):
                raw = set_path(raw, key.replace("[*]", f"[{i}]"), value, label="sweep")
        else:
            raw = set_path(raw, key, value, label="sweep")
    return raw


def plan(spec_path: str | Path, overrides: list[str] | None = None) -> list[PlannedRun]:
    """Every run the sweep asks for, in a stable order: seed by seed (the spec's seed order), each
    seed's runs by (point, arm), so a sweep stopped early leaves whole seeds, paired across arms."""
    raw = read_spec_file(spec_path)
    for assignment in overrides or []:
        raw = apply_override(raw, assignment)
    base = spec_from_dict(raw)  # validates the whole file, sweep section included
    check_sinks(base.train.sinks)  # a missing tracker package refuses the sweep before any run
    sweep = base.sweep
    points = sweep_points(sweep.grid, sweep.sets) if sweep else [{}]
    short = _short_keys(list(dict.fromkeys(k for p in points for k in p)))
    raw = {k: v for k, v in raw.items() if k != "sweep"}
    out: list[PlannedRun] = []
    names: set[str] = set()
    for point in points:
        try:
            variant = spec_from_dict(_apply_point(raw, point))
        except SpecError as err:
            where = ", ".join(f"{k}={format_setting(v)}" for k, v in point.items())
            raise SpecError(f"sweep point {where}: {err}") from None
        suffix = "".join(f",{short[k]}={format_setting(v)}" for k, v in point.items())
        for arm in variant.arms:
            name = f"{arm.name}{suffix}"
            if name in names:
                raise SpecError(f"sweep: two points give the same run name {name!r}")
            names.add(name)
            renamed = arm.model_copy(update={"name": name})
            for seed in variant.seeds:
                # a renamed arm is no longer one the comparison names: its run keeps no comparison
                update = {"arms": [renamed], "seeds": [seed], "sweep": None, **({"comparison": None} if suffix else {})}
                run = variant.model_copy(update=update)
                out.append(
                    PlannedRun(
                        name=name,
                        base_arm=arm.name,
                        seed=seed,
                        settings=tuple(point.items()),
                        spec=run,
                        path=run_path(run.output_dir, run.name, name, seed),
                    )
                )
    first = {seed: i for i, seed in reversed(list(enumerate(r.seed for r in out)))}
    return sorted(out, key=lambda r: first[r.seed])


def shard(runs: list[PlannedRun], index: int, count: int) -> list[PlannedRun]:
    """Shard `index` of `count` (0-based): round-robin over the stable plan order, so the
    shards of a job array partition the plan exactly and stay balanced."""
    if count < 1 or not 0 <= index < count:
        raise SpecError(f"--shard: need 0 <= I < N, got {index}/{count}")
    return runs[index::count]


def shard_from_env(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(index, count) from a job array's environment (SLURM, or our own GSPO_SHARD=I/N)."""
    env = os.environ if env is None else env
    if "GSPO_SHARD" in env:
        return parse_shard(env["GSPO_SHARD"])
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        return int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
    return None


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SpecError(f"--shard: expected I/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise SpecError(f"--shard: need 0 <= I < N, got {text}")
    return i, n


# ---------------------------------------------------------------------------------------
# Running a plan with N local processes


def prebuild_models(runs: list[PlannedRun], log) -> int:
    """Cold-start the built-in models the runs need once, here, with every core, before any
    job starts: otherwise N jobs would race to build the same model, each on its share of
    the cores. Each is built on the task exactly as its runs will see it, evaluation problems
    excluded (`plan_data`), so the runs find it in the cache. Returns how many distinct
    built-in models were checked. A bad model name or evaluation set (SpecError) refuses the
    whole sweep before anything starts; a model that fails to build (RunError) is left for
    its runs to report."""
    from gspo_cli.errors import RunError
    from gspo_cli.eval.sets import plan_data
    from gspo_cli.models import resolve_model_source
    from gspo_cli.tasks import make_task

    seen = set()
    for r in runs:
        m, t = r.spec.model, r.spec.task
        key = (m.model_dump_json(), t.model_dump_json())
        if not m.name.startswith("builtin:") or key in seen:
            continue
        seen.add(key)
        task = make_task(t.name, t.params)
        plan_data(r.spec, task)  # removes the evaluation problems from `task`, as each run does
        try:
            resolve_model_source(m, task, log=log)
        except RunError:
            pass
    return len(seen)


def check_run_dirs(runs: list[PlannedRun], force: bool) -> None:
    """Refuse, before any model is built, what each run's trainer would refuse once its model
    is: a completed run of another spec, or an unfinished one with a checkpoint to resume
    (`resume.decide_start`, SpecError naming the directory and the differing fields)."""
    from gspo_cli.distributed import DistInfo
    from gspo_cli.train.resume import decide_start

    for r in runs:
        decide_start(RunDir(r.path), r.spec, force, DistInfo())


def run_plan(runs: list[PlannedRun], *, jobs: int, force: bool, log, stop=None) -> list[dict[str, Any]]:
    """Train each planned run in its own `gspo train` process, `jobs` at a time, each with
    its share of the cores. Completed runs are skipped, interrupted ones resume (the
    trainer's own rules), but a run directory of another spec refuses the whole plan before
    anything is built or started (SpecError), as `gspo train` does. Returns one record per run
    with its exit code and wall time.

    `log` gets each run's progress (every tenth step) and evaluation scores as they are
    written to its run directory. Each process's output goes to a log file in a temporary
    directory, said at the start; it is removed when every run completed, else the logs of the
    runs that did not are kept there (and said). A first SIGINT/SIGTERM starts no more runs and
    lets the running ones checkpoint and stop (they get the terminal's SIGINT, or a SIGTERM
    from here); a second SIGINT raises `HardInterrupt`."""
    from gspo_cli.train.watch import stop_on_signals

    # `stop`: a caller's own StopFlag (a command that trains round after round keeps one for all)
    signals = contextlib.nullcontext(stop) if stop is not None else stop_on_signals()

    threads = max(1, (os.cpu_count() or 1) // max(jobs, 1))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # torch sizes its thread pool from this
    todo = [r for r in runs if force or r.status() != "completed"]
    check_run_dirs(runs, force)  # a completed run is skipped only with this spec and identity (decide_start)
    records = [_record(r, "completed", 0, 0.0, skipped=True) for r in runs if r not in todo]
    for r in records:
        log(f"[{r['run']}/seed{r['seed']}] already completed; skipping")
    if not todo:
        return records
    prebuild_models(todo, log)
    logs = Path(tempfile.mkdtemp(prefix="gspo-sweep-"))
    log(f"each run's output goes to {logs}/<run>.log (removed once every run has completed)")
    pending, active, kept, stopping = list(todo), {}, [], False
    try:
        with signals as stop:
            while pending or active:
                while pending and len(active) < jobs and not stop:
                    r = pending.pop(0)
                    stem = _file_stem(r, len(records) + len(active))
                    spec_file = logs / f"{stem}.yaml"
                    spec_file.write_text(dump_spec(r.spec))
                    cmd = [sys.executable, "-m", "gspo_cli", "train", str(spec_file), "--quiet"]
                    log_file = open(logs / f"{stem}.log", "w")
                    proc = subprocess.Popen(
                        cmd + (["--force"] if force else []), env=env, stdout=log_file, stderr=subprocess.STDOUT
                    )
                    active[proc] = (r, time.time(), log_file, RunProgress(r))
                    log(f"[{r.name}/seed{r.seed}] started (pid {proc.pid}, {threads} thread(s))")
                if stop and not stopping:
                    stopping = True
                    log(f"stopping ({stop.signal_name}): {len(pending)} run(s) not started")
                    records += [_record(r, "not started", 4, 0.0) for r in pending]
                    pending = []
                    for proc in active:  # a signal sent to this process alone reaches the runs too
                        proc.send_signal(signal.SIGTERM)
                time.sleep(0.2)
                for proc, (r, t0, log_file, progress) in list(active.items()):
                    for line in progress.lines():
                        log(line)
                    if proc.poll() is None:
                        continue
                    del active[proc]
                    log_file.close()
                    # labelled by its run.json: a run that completed and was then signalled is completed
                    status = RunDir(r.path).status() or "failed"
                    code = {"completed": 0, "diverged": 3}.get(status, proc.returncode)
                    records.append(_record(r, status, code, time.time() - t0))
                    tail = Path(log_file.name).read_text().strip().splitlines()[-1:] if code else []
                    if code:  # what went wrong and where to read more, in the summary too
                        records[-1].update(reason=tail[0] if tail else None, log=log_file.name)
                    log(
                        f"[{r.name}/seed{r.seed}] {records[-1]['status']} (exit {code}) in "
                        f"{records[-1]['wall_s']}s" + (f": {tail[0]}" if tail else "")
                    )
                    if code:
                        kept.append(Path(log_file.name))
    except BaseException:
        log(f"logs of the runs kept in {logs}")
        raise
    _tidy_logs(logs, kept, log)
    return records


def _record(r: PlannedRun, status: str, code: int | None, wall_s: float, skipped: bool = False) -> dict[str, Any]:
    return {
        "run": r.name,
        "seed": r.seed,
        "path": str(r.path),
        "status": status,
        "exit": code,
        "wall_s": round(wall_s, 1),
        "skipped": skipped,
        "reason": None,  # a run that exited non-zero: its log's last line
        "log": None,  # ... and its log, kept
    }


def _file_stem(r: PlannedRun, index: int) -> str:
    """A file name for run `r`'s spec and log: its name and seed, readable and short enough."""
    name = "".join(c if c.isalnum() or c in ",=.-_" else "_" for c in r.name)[:150]
    return f"{index:03d}-{name}-seed{r.seed}"


def _tidy_logs(logs: Path, kept: list[Path], log) -> None:
    """Remove the log directory when every run completed; else keep only the logs of those
    that did not (and say where they are)."""
    if not kept:
        shutil.rmtree(logs, ignore_errors=True)
        return
    for f in logs.iterdir():
        if f not in kept:
            f.unlink(missing_ok=True)
    log(f"logs of the {len(kept)} run(s) that did not complete kept in {logs}: " + ", ".join(f.name for f in kept))


class RunProgress:
    """What one run's process appends to its metrics.jsonl and eval.jsonl, as lines for the
    sweep's log: every tenth step (and the last) and every evaluation. Reads only the bytes
    added since the last look; a file that shrank (a resume rewinding it, a --force restart)
    is followed from its new end."""

    def __init__(self, run: PlannedRun):
        self.rd = RunDir(run.path)
        self.label = f"[{run.name}/seed{run.seed}]"
        self.total = run.spec.train.steps
        self.every = max(1, self.total // 10)
        self.offsets = {f: _size(f) for f in (self.rd.metrics_file, self.rd.eval_file)}

    def _new(self, path: Path) -> list[dict]:
        size, seen = _size(path), self.offsets[path]
        if size <= seen:
            self.offsets[path] = size
            return []
        try:
            with open(path, "rb") as f:
                f.seek(seen)
                chunk = f.read(size - seen)
        except OSError:
            return []
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next look
        self.offsets[path] = seen + len(whole)
        out = []
        for line in whole.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def lines(self) -> list[str]:
        """New lines in the order they happened: step k's line, then step k's evaluations."""
        out: list[tuple[tuple[int, int], str]] = []
        for m in self._new(self.rd.metrics_file):
            step = m.get("step", 0)
            if step % self.every == 0 or step == self.total:
                try:
                    out.append(((step, 0), f"{self.label} step {step}/{self.total}  {format_step(m)}"))
                except (KeyError, TypeError, ValueError):
                    out.append(((step, 0), f"{self.label} step {step}/{self.total}"))
        for record in self._new(self.rd.eval_file):
            try:
                out.append(((record["step"], 1), f"{self.label} {format_eval(record)}"))
            except (KeyError, TypeError, ValueError):
                continue
        return [line for _, line in sorted(out, key=lambda x: x[0])]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
