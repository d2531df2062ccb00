"""The run directory: the contract between train, eval, compare and plot.

    results/<experiment>/<arm>/seed<k>/
        spec.yaml        resolved spec of exactly this run (one arm, one seed)
        metrics.jsonl    one JSON object per step, append-only, flushed each step
        eval.jsonl       one JSON object per evaluation
        samples.jsonl    a few rollouts of every train.log_samples_every-th step (and step 1),
                         one JSON object each, append-only, flushed with the step's metrics:
                         step, arm, seed, group, index, prompt (decoded prompt tokens, chat
                         template included), completion, reward, correct, components,
                         advantage, length, truncated, clip_frac, clipped, masked_frac,
                         prompt_chars, completion_chars (code: detail, per-test verdicts).
                         At most 8 per logged step (the best and worst response of the
                         first 4 groups), texts cut at 2000 characters
                         (gspo_cli.train.samples; `gspo samples RUN` shows them)
        run.json         status, versions, git commit, host, times, wall time per phase
        checkpoints/step_XXXXXX/   written atomically (train.checkpoint): an HF model dir +
                         trainer_state.pt, or with FSDP per-rank shards in state/ + config,
                         tokenizer and trainer_state.pt
        model/           FSDP runs: the final checkpoint as an HF dir (train.export, export.json)

Readers must not need torch: compare and plot import this module only.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

from gspo_cli.errors import GspoError, SpecError
from gspo_cli.files import iter_lines, read_text

# What run.json's `status` holds (a collapse is recorded as "diverged", with its reason), and
# "in use": what `gspo train` / `gspo sweep` report for a run another process holds locked.
STATUSES = ("running", "completed", "failed", "diverged", "interrupted", "in use")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_path(output_dir: str | Path, experiment: str, arm: str, seed: int) -> Path:
    return Path(output_dir) / experiment / arm / f"seed{seed}"


def format_setting(value: Any) -> str:
    """A setting's value as run names (`gspo,clip_high=0.0002`) and group labels write it:
    floats in shortest form, lists and mappings as JSON, anything else as str."""
    if isinstance(value, float):
        return format(value, "g")
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`n` and the noun agreeing with it: plural(1, "problem") = "1 problem", plural(2, "process",
    "processes") = "2 processes" (default plural: noun + "s")."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_jsonl(path: Path, obj: dict[str, Any]) -> None:
    """Append one line and flush it to disk, so a crash loses at most the line being written."""
    line = json.dumps(obj, allow_nan=True) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records; a torn last line (crash mid-write) is skipped, not an error.
    A missing file has none; a file that cannot be read (not UTF-8, no permission) is a
    SpecError naming it."""
    if not path.exists():
        return []
    out = []
    for line in iter_lines(path):
        if not line.endswith("\n"):
            break  # torn final line
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep only records with step <= max_step (and drop a torn tail): what a resumed run
    rewinds to, so the continued file has no duplicated or missing steps."""
    if not path.is_file():
        return
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return res.stdout.strip() or None if res.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    import importlib.metadata as md

    for pkg in ("gspo-cli", "torch", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    spec_file = property(lambda self: self.path / "spec.yaml")
    metrics_file = property(lambda self: self.path / "metrics.jsonl")
    eval_file = property(lambda self: self.path / "eval.jsonl")
    samples_file = property(lambda self: self.path / "samples.jsonl")
    info_file = property(lambda self: self.path / "run.json")
    checkpoints = property(lambda self: self.path / "checkpoints")

    def exists(self) -> bool:
        return self.info_file.is_file()

    def info(self) -> dict[str, Any]:
        """run.json's fields; {} while there is none (or it is not JSON). A run.json that
        cannot be read (not UTF-8, a directory, no permission) is a SpecError naming it."""
        if not self.info_file.exists():
            return {}
        try:
            info = json.loads(read_text(self.info_file))
        except json.JSONDecodeError:
            return {}
        return info if isinstance(info, dict) else {}

    def status(self) -> str | None:
        return self.info().get("status")

    def update_info(self, **fields: Any) -> dict[str, Any]:
        info = {**self.info(), **fields}
        write_json_atomic(self.info_file, info)
        return info

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_file)

    def evals(self) -> list[dict[str, Any]]:
        return read_jsonl(self.eval_file)

    def log_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.metrics_file, record)

    def log_eval(self, record: dict[str, Any]) -> None:
        append_jsonl(self.eval_file, record)

    def samples(self) -> list[dict[str, Any]]:
        return read_jsonl(self.samples_file)

    def log_samples(self, records: list[dict[str, Any]]) -> None:
        """Append a step's sample lines with one flush (none: nothing is written)."""
        if not records:
            return
        text = "".join(json.dumps(r, allow_nan=True, ensure_ascii=False) + "\n" for r in records)
        with open(self.samples_file, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def checkpoint_dirs(self) -> list[Path]:
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.iterdir() if p.is_dir() and p.name.startswith("step_"))

    def hf_weights(self, ckpt: Path) -> Path:
        """Where transformers finds checkpoint `ckpt`'s weights: the checkpoint itself (a
        whole-model one is an HF directory), or for a sharded one (FSDP: per-rank
        torch.distributed.checkpoint files in state/) the run's exported `model/` when it holds
        that step; else a SpecError saying which export to run."""
        if not (ckpt / "state" / ".metadata").is_file():
            return ckpt
        exported = self.path / "model"
        try:
            step = json.loads((exported / "export.json").read_text()).get("step")
        except (OSError, ValueError):
            step = None
        if step is not None and ckpt.name == f"step_{int(step):06d}":
            return exported
        raise SpecError(
            f"{ckpt}: a sharded checkpoint (FSDP); export it for transformers first: "
            f"gspo export {self.path} --checkpoint {ckpt.name}"
        )

    def latest_checkpoint(self) -> Path | None:
        dirs = self.checkpoint_dirs()
        return dirs[-1] if dirs else None

    def reset(self) -> None:
        """Remove everything from an earlier attempt at this run."""
        if self.path.exists():
            shutil.rmtree(self.path)


class RunLockedError(GspoError):
    """Another live process is writing this run directory."""

    exit_code = 1


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold an exclusive lock on `run_dir` while training it.

    The lock is an flock on a file beside the run directory (the directory itself may be
    wiped and recreated): the kernel drops it when its holder dies, even by kill -9, so a
    stale lock from a crashed process never blocks a resume. The file records who holds it.
    """
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = run_dir.parent / f".{run_dir.name}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise RunLockedError(f"{run_dir}: in use by {holder}; wait for it or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def find_runs(paths: list[str | Path]) -> Iterator[RunDir]:
    """Every run directory (one holding run.json) at or under the given paths."""
    seen = set()
    for p in paths:
        p = Path(p)
        candidates = [p] if (p / "run.json").is_file() else sorted(q.parent for q in p.rglob("run.json"))
        for c in candidates:
            if c.resolve() not in seen:
                seen.add(c.resolve())
                yield RunDir(c)
