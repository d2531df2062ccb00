"""The Ray executor: each run a Ray task (`num_cpus`/`num_gpus` from `executor.ray`) that trains
it with `gspo train` in a child process, on an existing cluster (`executor.ray.address`) or on a
local one started for the command and stopped after it.

Ray tasks belong to the command that submitted them: Ctrl-C cancels them (each run gets SIGTERM,
writes a checkpoint and stops) and the same command rerun resumes them from their run
directories. Each run's spec and output go to `<folder>/runs/` (default
`<output_dir>/<name>/.ray/`, which a multi-machine cluster must share, like the run directories).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from gspo_cli.errors import RunError, SpecError
from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import dump_spec
from gspo_cli.train.executors.base import file_stem, last_line, record, train_command, wait_for
from gspo_cli.train.executors.progress import RunProgress


def _ray():
    try:
        import ray
    except ImportError:
        raise SpecError(
            "--executor ray needs the ray package: pip install 'gspo-cli[ray]' (or pip install ray)"
        ) from None
    return ray


def _die_with_parent() -> None:
    # the run gets SIGTERM (checkpoint, stop) if its Ray worker dies: no orphaned trainer
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# The submitting command's variables a run's process gets on any worker: the model cache it filled
# before submitting (an existing cluster's workers have the environment of its `ray start`).
FORWARDED = ("GSPO_CACHE_DIR",)


def _token_auth_if_token() -> None:
    """Connect to an existing cluster with Ray's token authentication when this machine has a token
    and RAY_AUTH_MODE says nothing: `ray start --head` turns it on by default, and a driver without
    the mode set sends no token (Ray's own CLI does the same; a cluster without authentication
    accepts a driver that sends one). Before ray is imported: it reads the mode then."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


def train_run(spec_file: str, log_file: str, force: bool, threads: int, env: dict | None = None) -> tuple[int, str]:
    """A Ray task's body: `gspo train SPEC` in a child process, output appended to `log_file`, with
    the worker's environment plus `env`; returns (exit code, the log's last line). A cancelled task
    (KeyboardInterrupt) stops the run with SIGTERM, so it checkpoints, and waits for it."""
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads)}
    with open(log_file, "a") as out:
        proc = subprocess.Popen(
            train_command(spec_file, force), env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        try:
            code = wait_for(proc)
        except BaseException:  # cancelled (KeyboardInterrupt): the run checkpoints and stops
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            raise
    return code, last_line(Path(log_file))


class RayExecutor:
    """One Ray task per run, all submitted at once; Ray schedules them onto its CPUs and GPUs."""

    name = "ray"

    def __init__(self, config, root: Path | None = None):
        self.config = config
        self.folder = Path(root or ".").absolute() / ".ray"

    def run(self, runs: list, *, force: bool, log, stop=None) -> list[dict[str, Any]]:
        """Train `runs` as Ray tasks and wait for them, printing each run's progress and end;
        Ctrl-C cancels the tasks (the runs checkpoint and stop) and returns them with exit 4."""
        c = self.config
        if c.address is not None:
            _token_auth_if_token()
        ray = _ray()
        started_here = not ray.is_initialized()
        if started_here:
            local = c.address is None
            try:
                ray.init(
                    # "local": always a new cluster here, never one a `ray start` on this machine left
                    # behind (Ray would join it and refuse num_cpus)
                    address=c.address if not local else "local",
                    num_cpus=(os.cpu_count() or 1) if local else None,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except ConnectionError as err:  # no cluster there: the user's address, said in one line
                why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise RunError(
                    f"--executor ray: no Ray cluster answers at {c.address} ({why}); start one with "
                    "`ray start --head --port PORT` (with token authentication, Ray's default, its token must be "
                    "here too: ~/.ray/auth_token or RAY_AUTH_TOKEN), or leave executor.ray.address unset for a "
                    "local one"
                ) from None
            where = "a local cluster" if local else f"the cluster at {c.address}"
            log(f"ray: {where}, {ray.cluster_resources().get('CPU', 0):g} CPU(s)")
        files = self.folder / "runs"
        files.mkdir(parents=True, exist_ok=True)
        task = ray.remote(num_cpus=c.num_cpus, num_gpus=c.num_gpus, max_retries=0)(train_run)
        threads = max(1, int(c.num_cpus))
        forwarded = {k: os.environ[k] for k in FORWARDED if k in os.environ}
        refs: dict[Any, Any] = {}
        for i, r in enumerate(runs):
            stem = file_stem(r, i)
            spec_file, log_file = files / f"{stem}.yaml", files / f"{stem}.log"
            spec_file.write_text(dump_spec(r.spec))
            log_file.write_text("")
            refs[task.remote(str(spec_file), str(log_file), force, threads, forwarded)] = (r, log_file)
        log(f"ray: {len(refs)} task(s) submitted; each run's output in {files}")
        t0, ended, progress = time.time(), {}, {ref: RunProgress(r) for ref, (r, _) in refs.items()}
        try:
            while len(ended) < len(refs):
                done, _ = ray.wait([x for x in refs if x not in ended], num_returns=1, timeout=1.0)
                for view in progress.values():
                    for line in view.lines():
                        log(line)
                for ref in done:
                    ended[ref] = self._ended(ray, ref, *refs[ref], time.time() - t0, log)
                if stop and len(ended) < len(refs):  # a caller's flag took the signal: as Ctrl-C
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            waiting = [x for x in refs if x not in ended]
            log(f"stopping (Ctrl-C): cancelling {len(waiting)} task(s); their runs checkpoint and stop")
            for ref in waiting:
                ray.cancel(ref)
            for ref in waiting:
                try:
                    ray.get(ref, timeout=120)
                except Exception:  # cancelled: what it was doing is in its run directory
                    pass
            out = [ended[x] for x in refs if x in ended]
            return out + [record(refs[x][0], RunDir(refs[x][0].path).status() or "stopped", 4, 0.0) for x in waiting]
        finally:
            if started_here:
                ray.shutdown()
        return [ended[x] for x in refs]

    def _ended(self, ray, ref, r, log_file: Path, wall_s: float, log) -> dict[str, Any]:
        try:
            code, tail = ray.get(ref)
        except Exception as err:  # the task itself failed (worker died, out of memory)
            code, tail = 1, str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        status = RunDir(r.path).status() or "failed"
        line = f"[{r.name}/seed{r.seed}] {status} (exit {code}) in {wall_s:.1f}s"
        if code not in (0, 3):
            line += f"; log {log_file}" + (f": {tail}" if tail else "")
        log(line)
        return record(r, status, code, wall_s)
