"""The SLURM executor: the runs of one round as one job array, submitted with submitit, each
array task training one run with `gspo train` on a node.

The run directories stay the source of truth for what is done; beside them (`<folder>`, by
default `<output_dir>/<name>/.slurm/`) the executor keeps `jobs.json`, the job id of every run it
submitted, so that the same command rerun (after Ctrl-C, or from a new login session) waits for
the jobs still queued or running instead of submitting them again, and `--cancel` cancels them.
Each run's spec and the output of its `gspo train` go to `<folder>/runs/`; submitit's own files
(the pickled job, its stdout and stderr) to `<folder>/<job id>/`.

A run of several processes (`executor.slurm.nodes` x `tasks_per_node`) trains under torchrun, as
`gspo train` does by hand: the job has one SLURM task per node, and each starts `torchrun
--nproc-per-node <tasks_per_node>` (with `--standalone` on one node; on several, node rank, the
job's first node as master and a port drawn from the job id).

Shortly before a job's time limit SLURM sends it SIGUSR2 (sbatch --signal); submitit then calls
`TrainJob.checkpoint`, which stops the run with SIGTERM (the trainer writes a checkpoint and
exits) and has the job requeued; the requeued job's `gspo train` resumes from the checkpoint. A
job cancelled or requeued by hand (scancel, scontrol requeue) gets SIGTERM from SLURM itself: the
run checkpoints and stops the same way, and a requeued job resumes it (never again with --force:
a job that runs a second time finds its log and resumes).

Job states come from `squeue` (and `sacct` for jobs squeue no longer shows); a job neither knows
is judged by its run directory alone.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gspo_cli.errors import RunError, SpecError
from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import dump_spec
from gspo_cli.train.executors.base import file_stem, last_line, record, train_command, wait_for
from gspo_cli.train.executors.progress import RunProgress

# SLURM job states (squeue/sacct long names) in which the job is not over yet.
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD", "SUSPENDED"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
# Ended without the run's fault: the run can resume from its checkpoint when the command is rerun.
STOPPED = {"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "DEADLINE", "BOOT_FAIL"}
BOOK = "jobs.json"
SETTLE_S = 15.0  # how long an unfinished run's job must stay not live before the run counts as ended


def _submitit():
    try:
        import submitit
    except ImportError:
        raise SpecError(
            "--executor slurm needs the submitit package: pip install 'gspo-cli[slurm]' (or pip install submitit)"
        ) from None
    return submitit


def launch_command(
    spec_file, force: bool, *, nodes: int, per_node: int, node_rank: int = 0, head: str = "", job_id: str = ""
) -> list[str]:
    """The command one SLURM task of a run starts: `gspo train SPEC` for a run of one process, else
    torchrun starting `per_node` processes of `gspo train SPEC` on this node (`node_rank` of
    `nodes`): `--standalone` on one node (torchrun finds a free port, so two runs sharing a node
    never meet); on several, the static rendezvous at `head` (the job's first node) on a port drawn
    from `job_id`, the same on every node of the job."""
    train = train_command(spec_file, force)
    if nodes == 1 and per_node == 1:
        return train
    where = ["--standalone"]
    if nodes > 1:
        port = 20000 + int("".join(c for c in job_id if c.isdigit()) or "0") % 20000
        where = ["--node-rank", str(node_rank), "--master-addr", head, "--master-port", str(port)]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(per_node),
        *where, *train[1:],
    ]  # fmt: skip


class TrainJob:
    """What one task of an array job runs (one task per node of the run): `gspo train SPEC` in a
    child process, or torchrun starting `per_node` of them (`launch_command`), output appended to
    `log_file` (node k > 0: its own `.node<k>` file), each process with its share of the task's CPUs
    as torch threads. Raises (the job fails) when the run does not end completed or diverged, with
    the log's last line."""

    def __init__(self, spec_file: str, log_file: str, force: bool, nodes: int = 1, per_node: int = 1):
        self.spec_file, self.log_file, self.force = spec_file, log_file, force
        self.nodes, self.per_node = nodes, per_node
        self.proc: subprocess.Popen | None = None

    def __getstate__(self):  # pickled by submitit (and again on requeue): never the child process
        return {**self.__dict__, "proc": None}

    def __call__(self) -> int:
        import submitit

        job = submitit.JobEnvironment()
        node = job.node if self.nodes > 1 else 0
        log_file = Path(self.log_file if node == 0 else f"{self.log_file}.node{node}")
        # a job SLURM runs again (scontrol requeue, a node failure) runs this same pickled call: it
        # finds its log and resumes the run instead of forcing a restart from step 0
        force = self.force and not log_file.exists()
        cpus = int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cpus // self.per_node))}  # torchrun keeps it
        command = launch_command(
            self.spec_file,
            force,
            nodes=self.nodes,
            per_node=self.per_node,
            node_rank=node,
            head=job.hostnames[0],
            job_id=os.environ.get("SLURM_JOB_ID", ""),
        )
        with open(log_file, "a") as out:
            self.proc = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_ignore_time_limit_signal
            )
            code = wait_for(self.proc)
        self.force = False  # a requeued job resumes, whatever the first submission asked
        if code not in (0, 3):  # 3: diverged, a finished run
            raise RuntimeError(f"gspo train exited {code}: {last_line(log_file)}")
        return code

    def checkpoint(self):
        """Called by submitit on the time-limit signal: the run checkpoints and stops; the job is
        requeued with this same callable, whose `gspo train` resumes."""
        import submitit

        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            wait_for(proc)
        self.force = False
        return submitit.helpers.DelayedSubmission(self)


def _ignore_time_limit_signal() -> None:
    # SIGUSR2 is submitit's (the job's Python checkpoints and requeues): the run must not die of it.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def sbatch_options(lines: list[str]) -> dict[str, Any]:
    """`executor.slurm.sbatch` items ("--qos=low", "--exclusive", "#SBATCH --mail-type END") as
    submitit's additional_parameters; SpecError naming an item that is no sbatch option."""
    out: dict[str, Any] = {}
    for item in lines:
        words = shlex.split(item.removeprefix("#SBATCH").strip())
        if not words or not words[0].startswith("--") or len(words) > 2:
            raise SpecError(f"executor.slurm.sbatch: {item!r} is not one long sbatch option (e.g. --qos=low)")
        key, _, value = words[0][2:].partition("=")
        value = value or (words[1] if len(words) == 2 else True)
        out[key.replace("-", "_")] = value
    return out


def job_states(ids: list[str]) -> dict[str, str]:
    """Job id ("123_4" for an array task) -> SLURM state ("PENDING", "RUNNING", "COMPLETED",
    "CANCELLED", ...), from squeue, then sacct for those squeue no longer shows. A job neither
    shows is left out. RunError when squeue cannot be run at all."""
    if not ids:
        return {}
    out: dict[str, str] = {}
    bases = sorted({i.split("_")[0] for i in ids})
    for base in bases:  # one call per array: squeue refuses a whole list for one unknown id
        try:
            r = subprocess.run(
                ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", base],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except FileNotFoundError:
            raise RunError("--executor slurm: no squeue here; run the command where SLURM's client tools are") from None
        except subprocess.TimeoutExpired:
            continue
        for line in r.stdout.splitlines():
            job, _, state = line.partition("|")
            out[job.strip()] = state.strip().split()[0] if state.strip() else "UNKNOWN"
    missing = [i for i in ids if i not in out]
    if missing:
        try:
            r = subprocess.run(
                ["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(missing)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if r.returncode == 0:
                for line in r.stdout.splitlines():
                    job, _, state = line.partition("|")
                    if job in missing and state:
                        out[job] = state.split()[0]
        except (FileNotFoundError, subprocess.TimeoutExpired):
            pass
    return out


class JobBook:
    """`<folder>/jobs.json`: run directory -> the job that trains it (id, its log, when submitted).
    Written after every submission, so a rerun finds what was submitted."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.file = folder / BOOK
        try:
            self.jobs: dict[str, dict[str, Any]] = json.loads(self.file.read_text())
        except (OSError, ValueError):
            self.jobs = {}

    def job(self, r) -> dict[str, Any] | None:
        return self.jobs.get(str(r.path))

    def write(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.jobs, indent=1, sort_keys=True))
        tmp.replace(self.file)


class SlurmExecutor:
    """One job array per call of `run` (a round), resources from `executor.slurm`."""

    name = "slurm"

    def __init__(self, config, root: Path | None):
        if config.folder is None and root is None:
            raise SpecError("--executor slurm: give executor.slurm.folder (where the job files go)")
        self.config = config
        self.folder = Path(config.folder or Path(root) / ".slurm").absolute()

    # -- submitting

    def _parameters(self) -> dict[str, Any]:
        c = self.config
        p: dict[str, Any] = {
            "job_name": "gspo",
            "time": c.time_min,
            "cpus_per_task": c.cpus_per_run,
            # one task per node, which starts the node's tasks_per_node processes (torchrun)
            "nodes": c.nodes,
            "ntasks_per_node": 1,
            "stderr_to_stdout": True,
            # SIGUSR2 this many seconds before the limit: time for the run's checkpoint
            "signal_delay_s": min(120, max(30, c.time_min * 60 // 10)),
        }
        if c.partition:
            p["partition"] = c.partition
        if c.account:
            p["account"] = c.account
        if c.gpus_per_run:
            p["gpus_per_node"] = c.gpus_per_run
        if c.mem_gb:
            p["mem"] = f"{int(c.mem_gb * 1024)}M"
        if c.max_running:
            p["array_parallelism"] = c.max_running
        extra = sbatch_options(c.sbatch)
        if extra:
            p["additional_parameters"] = extra
        return p

    def _submit(self, runs: list, book: JobBook, force: bool, log) -> None:
        submitit = _submitit()
        files = self.folder / "runs"
        files.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=self.folder / "%j", max_num_timeout=20)
        try:
            executor.update_parameters(**self._parameters())
        except ValueError as err:
            raise SpecError(f"executor.slurm: {str(err).splitlines()[0]}") from None
        calls = []
        first = len(list(files.glob("*.yaml")))  # every submission its own files: a log means a job ran before
        for r in runs:
            stem = file_stem(r, first + len(calls))
            spec_file, log_file = files / f"{stem}.yaml", files / f"{stem}.log"
            spec_file.write_text(dump_spec(r.spec))
            log_file.unlink(missing_ok=True)
            call = TrainJob(str(spec_file), str(log_file), force, self.config.nodes, self.config.tasks_per_node)
            calls.append((r, call, log_file))
        try:
            with executor.batch():
                jobs = [executor.submit(call) for _, call, _ in calls]
        except Exception as err:  # sbatch refused (partition, account, limits): its message
            raise RunError(f"--executor slurm: sbatch refused the job array: {str(err).strip()[-400:]}") from None
        now = time.time()
        for (r, _, log_file), job in zip(calls, jobs):
            book.jobs[str(r.path)] = {"job": str(job.job_id), "log": str(log_file), "submitted": now}
        book.write()
        array = str(jobs[0].job_id).split("_")[0] if jobs else "-"
        log(f"submitted job array {array} ({len(jobs)} run(s)); job files and logs in {self.folder}")

    def run(self, runs: list, *, force: bool, log, stop=None) -> list[dict[str, Any]]:
        """Submit the runs that no queued or running job of an earlier submission trains, as one
        job array, then wait for all of them, printing each change of the round's state and the
        runs' progress. Ctrl-C stops the waiting (the jobs go on) and says what is still queued."""
        book = JobBook(self.folder)
        known = {str(r.path): (book.job(r) or {}).get("job") for r in runs}
        states = job_states([j for j in known.values() if j])
        live = [r for r in runs if states.get(known[str(r.path)] or "") in WAITING | RUNNING]
        if live:
            log(
                f"{len(live)} run(s) already queued or running from an earlier submission: "
                + ", ".join(f"{r.name}/seed{r.seed} (job {known[str(r.path)]})" for r in live)
            )
        new = [r for r in runs if r not in live]
        if new:
            self._submit(new, book, force and not live, log)
        return self._wait(runs, book, log, stop)

    # -- waiting

    def _wait(self, runs: list, book: JobBook, log, stop=None) -> list[dict[str, Any]]:
        t0 = time.time()
        progress = {str(r.path): RunProgress(r) for r in runs}
        seen: dict[str, str] = {}
        ended: dict[str, dict[str, Any]] = {}
        gone: dict[str, float] = {}  # run -> when its job was first seen not live
        summary = ""
        try:
            while len(ended) < len(runs):
                ids = {str(r.path): book.job(r)["job"] for r in runs}
                states = job_states(list(ids.values()))
                for r in runs:
                    key, job = str(r.path), ids[str(r.path)]
                    for line in progress[key].lines():
                        log(line)
                    if key in ended:
                        continue
                    state = states.get(job, "GONE")
                    if seen.get(key) != state and state != "GONE":
                        seen[key] = state
                        log(f"[{r.name}/seed{r.seed}] job {job} {state.lower()}")
                    if state in WAITING | RUNNING:
                        gone.pop(key, None)
                        continue
                    # An unfinished run's job that is not live is over only once it stays so for
                    # SETTLE_S: a job requeueing itself at its time limit passes through TIMEOUT or
                    # PREEMPTED, or leaves squeue for a moment, before it is pending again.
                    since = gone.setdefault(key, time.time())
                    if RunDir(r.path).status() != "completed" and time.time() - since < SETTLE_S:
                        continue
                    ended[key] = self._ended(r, job, state, time.time() - t0, book, log)
                counts = _counts([seen.get(str(r.path), "GONE") for r in runs], ended)
                if counts != summary:
                    summary = counts
                    log(f"slurm: {counts}")
                if len(ended) < len(runs):
                    time.sleep(self.config.poll_s)
                if stop:  # a caller's flag took the signal: stop waiting as Ctrl-C does
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            waiting = [r for r in runs if str(r.path) not in ended]
            log(
                f"stopped waiting (Ctrl-C): {len(waiting)} job(s) still queued or running on SLURM, and they go on: "
                + ", ".join(f"{r.name}/seed{r.seed} (job {book.job(r)['job']})" for r in waiting)
                + ". Rerun the same command to wait for them, or add --cancel to cancel them."
            )
            return list(ended.values()) + [record(r, "queued", 4, time.time() - t0) for r in waiting]
        return [ended[str(r.path)] for r in runs]

    def _ended(self, r, job: str, state: str, wall_s: float, book: JobBook, log) -> dict[str, Any]:
        status = RunDir(r.path).status() or "failed"
        if status == "completed":
            code = 0
        elif status == "diverged":
            code = 3
        elif state in STOPPED:
            code = 4  # resumable: the rerun submits it again and it resumes from its checkpoint
        else:
            code = 1
        line = f"[{r.name}/seed{r.seed}] {status} (job {job} {state.lower()})"
        if code in (1, 4):
            entry = book.job(r) or {}
            tail = last_line(Path(entry.get("log", ""))) or self._job_log_tail(job)
            line += f"; log {entry.get('log')}" + (f": {tail}" if tail else "")
        log(line)
        return record(r, status, code, wall_s)

    def _job_log_tail(self, job: str) -> str:
        """The last line of submitit's own log of `job` (when the run's log has none: the job
        failed before `gspo train` started)."""
        base, _, task = job.partition("_")
        for path in sorted((self.folder / job).glob("*_log.out")) + sorted((self.folder / base).glob("*_log.out")):
            tail = last_line(path)
            if tail:
                return tail
        return ""

    # -- cancelling

    def cancel(self, log) -> list[str]:
        """scancel every recorded job that is still queued or running; returns their ids."""
        ids = [e["job"] for e in JobBook(self.folder).jobs.values()]
        states = job_states(ids)
        live = [j for j in ids if states.get(j) in WAITING | RUNNING]
        if live:
            r = subprocess.run(["scancel", *live], capture_output=True, text=True)
            if r.returncode:
                raise RunError(f"scancel failed: {r.stderr.strip() or r.returncode}")
        log(f"cancelled {len(live)} job(s)" + (": " + ", ".join(live) if live else " (none queued or running)"))
        return live


def _counts(states: list[str], ended: dict[str, dict[str, Any]]) -> str:
    pending = sum(s in WAITING for s in states)
    running = sum(s in RUNNING for s in states)
    done = sum(e["exit"] in (0, 3) for e in ended.values())
    failed = len(ended) - done
    return f"{pending} pending, {running} running, {done} done, {failed} failed or stopped"
