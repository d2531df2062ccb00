"""The local executor: each run in its own `gspo train` process on this machine, `jobs` at a
time, each with its share of the cores."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import dump_spec
from gspo_cli.train.executors.base import file_stem, record, train_command
from gspo_cli.train.executors.progress import RunProgress


class LocalExecutor:
    """`jobs` runs at once, each in its own process with cpu_count // jobs torch threads."""

    name = "local"

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, jobs)

    def run(self, runs: list, *, force: bool, log, stop=None) -> list[dict[str, Any]]:
        """Train `runs` (planned runs still to train); one record per run, in the order they ended.

        `log` gets each run's progress (every tenth step) and evaluation scores as they are
        written to its run directory. Each process's output goes to a log file in a temporary
        directory, said at the start; it is removed when every run completed, else the logs of
        the runs that did not are kept there (and said). A first SIGINT/SIGTERM starts no more
        runs and lets the running ones checkpoint and stop (they get the terminal's SIGINT, or a
        SIGTERM from here); a second SIGINT raises `HardInterrupt`. `stop`: a caller's own
        StopFlag, which then owns the signals (one flag for every round of a study)."""
        from gspo_cli.train.watch import stop_on_signals

        signals = contextlib.nullcontext(stop) if stop is not None else stop_on_signals()
        jobs = self.jobs
        threads = max(1, (os.cpu_count() or 1) // jobs)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # torch sizes its thread pool from this
        records: list[dict[str, Any]] = []
        logs = Path(tempfile.mkdtemp(prefix="gspo-sweep-"))
        log(f"each run's output goes to {logs}/<run>.log (removed once every run has completed)")
        pending, active, kept, stopping = list(runs), {}, [], False
        try:
            with signals as stop:
                while pending or active:
                    while pending and len(active) < jobs and not stop:
                        r = pending.pop(0)
                        stem = file_stem(r, len(records) + len(active))
                        spec_file = logs / f"{stem}.yaml"
                        spec_file.write_text(dump_spec(r.spec))
                        log_file = open(logs / f"{stem}.log", "w")
                        proc = subprocess.Popen(
                            train_command(spec_file, force), env=env, stdout=log_file, stderr=subprocess.STDOUT
                        )
                        active[proc] = (r, time.time(), log_file, RunProgress(r))
                        log(f"[{r.name}/seed{r.seed}] started (pid {proc.pid}, {threads} thread(s))")
                    if stop and not stopping:
                        stopping = True
                        log(f"stopping ({stop.signal_name}): {len(pending)} run(s) not started")
                        records += [record(r, "not started", 4, 0.0) for r in pending]
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
                        records.append(record(r, status, code, time.time() - t0))
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
