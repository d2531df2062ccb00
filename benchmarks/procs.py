"""The benchmark's worker processes, seen from the orchestrator: start one (bench.py run with
`--worker KIND JSON`), read its tagged answers, and either run it in turns (`Worker.turn`) or
let it run to its single answer (`run_worker`). A worker that dies ends the benchmark with its
stderr's tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import RESULT_TAG, ROOT, loadavg

# Workers are this script run with `--worker KIND JSON` (bench.py dispatches to them).
BENCH_SCRIPT = ROOT / "benchmarks" / "bench.py"


class WorkerError(SystemExit):
    """A worker process that died; `tail`: the end of its stderr. Uncaught, it ends the
    benchmark with that message (a SystemExit)."""

    def __init__(self, msg: str, tail: str):
        super().__init__(msg)
        self.tail = tail


class Worker:
    """A worker process; its stderr goes to a temporary file, shown if it fails. `python`: the
    interpreter (default: this one; the vLLM sides run in the vLLM virtualenv's); `cores`: the
    CPU cores it may run on (os.sched_setaffinity before it starts, so its threads and the
    processes it starts inherit them; None: this process's own)."""

    def __init__(self, kind: str, cfg: dict, python: str | None = None, cores: list[int] | None = None):
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.kind, self.label = kind, f"{kind} {cfg.get('preset', '')}".strip()
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finish()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [python or sys.executable, str(BENCH_SCRIPT), "--worker", kind, json.dumps(cfg)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )

    def recv(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.err.seek(0)
                tail = self.err.read()[-8000:]
                sys.stderr.write(tail)
                raise WorkerError(f"bench: worker {self.label} failed (exit {self.proc.returncode})", tail)
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG) :])

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def turn(self, steps: int, threads: int = 0) -> dict:
        """Run one turn ("turn STEPS THREADS") and return the worker's answer."""
        self.send(f"turn {steps} {threads}")
        return self.recv()

    def finish(self) -> dict:
        res = self.recv()
        self.proc.stdin.close()
        self.proc.wait()
        self.err.close()
        res["process_wall_s"] = time.perf_counter() - self.t0
        return res

    def stop(self) -> dict:
        """Send "done" and return the worker's final answer."""
        self.send("done")
        return self.finish()

    def kill(self) -> None:
        """End the process (after a failure elsewhere); its own children end with it or on EOF."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_worker(kind: str, cfg: dict, log) -> dict:
    """A worker that runs to completion and answers once."""
    w = Worker(kind, cfg)
    res = w.finish()
    log(f"  {w.label:22s} done in {res['process_wall_s']:5.1f} s (load {loadavg():.2f})")
    return res
