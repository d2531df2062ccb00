"""The benchmark's worker processes, seen from the orchestrator: start one (bench.py run with
`--worker KIND JSON`), read its tagged answers, and either step it in lockstep (`Worker`),
let it run to its single answer (`run_worker`) or run a block of back-to-back steps alone
(`run_block`). A worker that dies ends the benchmark with its stderr's tail.
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


class Worker:
    """A worker process; its stderr goes to a temporary file, shown if it fails."""

    def __init__(self, kind: str, cfg: dict):
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.kind, self.label = kind, f"{kind} {cfg.get('preset', '')}".strip()
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finish()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, str(BENCH_SCRIPT), "--worker", kind, json.dumps(cfg)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
        )

    def recv(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                self.err.seek(0)
                sys.stderr.write(self.err.read()[-8000:])
                raise SystemExit(f"bench: worker {self.label} failed (exit {self.proc.returncode})")
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG) :])

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def finish(self) -> dict:
        res = self.recv()
        self.proc.stdin.close()
        self.proc.wait()
        self.err.close()
        res["process_wall_s"] = time.perf_counter() - self.t0
        return res


def run_worker(kind: str, cfg: dict, log) -> dict:
    """A worker that runs to completion and answers once."""
    w = Worker(kind, cfg)
    res = w.finish()
    log(f"  {w.label:22s} done in {res['process_wall_s']:5.1f} s (load {loadavg():.2f})")
    return res


def run_block(kind: str, cfg: dict) -> dict:
    """A lockstep worker ("ours" or "trl") run in block mode: its `cfg["rounds"]` steps back to
    back, nothing else of the benchmark running. Returns {"setup_s", "records" (one per step,
    in order, each with `t_end`, perf_counter seconds at the step's end), "final" (the worker's
    last answer: peak RSS, threads), "load" (1-minute load average after the block)}; returns
    only once the process has exited (a staleness-1 worker has stopped its sampler)."""
    w = Worker(kind, {**cfg, "block": True})
    ready = w.recv()
    records = []
    while True:
        rec = w.recv()
        if rec.get("final"):
            break
        records.append(rec)
    w.proc.stdin.close()
    w.proc.wait()
    w.err.close()
    return {"setup_s": ready["setup_s"], "records": records, "final": rec, "load": loadavg()}
