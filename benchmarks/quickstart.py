"""The quickstart's measurements for `make bench`: its peak memory (a short `gspo train`) and,
with `--quickstart-full`, the wall time of what `make run` does from an empty model cache.

Both run the `gspo` command under `/usr/bin/time -v` for the maximum RSS; a failing command
ends the benchmark with its output's tail and a one-line message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import QUICKSTART, ROOT, SHARED_LOAD, loadavg, pick_threads, thread_env

# --smoke: the quickstart at its smallest (random weights, tiny batches, a 2-problem final evaluation)
SMOKE_SETS = (
    "model.cold_start.steps=0",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "task.eval_size=2",
    "train.eval_samples=1",
)


def quickstart_memory(steps: int, log, threads: int = 0, smoke: bool = False) -> dict:
    """Peak RSS (and wall time) of `gspo train experiments/quickstart.yaml --set train.steps=N`,
    with OMP_NUM_THREADS=threads (0: torch's default); `smoke`: with SMOKE_SETS too."""
    gspo = Path(sys.executable).parent / "gspo"
    load0 = loadavg()
    sets = [f"train.steps={steps}", *(SMOKE_SETS if smoke else ())]
    with tempfile.TemporaryDirectory(prefix="gspo-bench-qs-") as out:
        cmd = ["/usr/bin/time", "-v", str(gspo), "train", str(QUICKSTART), *(x for v in sets for x in ("--set", v))]
        res = _timed_command(
            [*cmd, "-o", out],
            log,
            label=f"quickstart train, {steps} steps" + (" (smoke sizes)" if smoke else " (cached cold start)"),
            env=thread_env(threads),
        )
    return {**res, "steps": steps, "load_start": load0, "threads": threads}


def _timed_command(cmd: list[str], log, label: str, env=None) -> dict:
    """Run `cmd` in the repository root: {command, wall_s, max_rss_mb (None without
    /usr/bin/time's report), loadavg_after}; a non-zero exit ends the benchmark (SystemExit)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"bench: {' '.join(cmd)} failed (exit {proc.returncode})")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    res = {
        "command": " ".join(cmd[2:]) if cmd[0].endswith("time") else " ".join(cmd),
        "wall_s": wall,
        "max_rss_mb": int(rss.group(1)) / 1024 if rss else None,
        "loadavg_after": loadavg(),
    }
    log(f"  {label}: {wall:.1f} s, max RSS {res['max_rss_mb'] or float('nan'):.0f} MB")
    return res


def quickstart_full(log, threads_arg: str) -> dict:
    """What `make run` does after setup, from an empty model cache (cold start included);
    `threads_arg` is --threads. The result is what bench.py writes to quickstart.json."""
    gspo = str(Path(sys.executable).parent / "gspo")
    load0 = loadavg()
    threads, why = pick_threads(threads_arg, load0)
    log(f"quickstart from an empty model cache; load average {load0:.2f}; torch threads: {why}")
    with tempfile.TemporaryDirectory(prefix="gspo-bench-qsfull-") as tmp:
        env = {**thread_env(threads), "GSPO_CACHE_DIR": str(Path(tmp) / "cache")}
        out = Path(tmp) / "results"
        t = time.perf_counter()
        # As `make run`: the two arms side by side (the sweep splits the cores between them).
        train = _timed_command(
            ["/usr/bin/time", "-v", gspo, "sweep", str(QUICKSTART), "--jobs", "2", "--set", f"output_dir={out}"],
            log,
            label="quickstart sweep --jobs 2, full, cold cache",
            env=env,
        )
        _timed_command([gspo, "compare", str(out / "quickstart")], log, label="compare", env=env)
        _timed_command([gspo, "plot", str(out / "quickstart")], log, label="plot", env=env)
        total = time.perf_counter() - t
        cold = json.loads(next((Path(tmp) / "cache" / "models").glob("*/cold_start.json")).read_text())
    load1 = loadavg()
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "train": train,
        "total_s": total,
        "cold_start_s": cold.get("seconds"),
        "load": {"start": load0, "end": load1},
        "threads": why,
        "cores": os.cpu_count(),
        "shared": max(load0, load1) > SHARED_LOAD,
    }
