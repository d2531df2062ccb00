"""The run directory: the contract between train, eval, compare and plot.

    results/<experiment>/<arm>/seed<k>/
        spec.yaml        resolved spec of exactly this run (one arm, one seed)
        metrics.jsonl    one JSON object per step, append-only, flushed each step
        eval.jsonl       one JSON object per evaluation set and evaluation step: step, task, set
                         (named sets), n, samples (K), scores, time_s, and problems, one
                         record per held-out problem as three lists in the order evaluated:
                         {"id": [...], "correct": [correct samples of K, int], "reward":
                         [mean reward over its K samples, 4 decimals]} (runs of behaviour
                         version 1 have no problems key). Each evaluation samples from draws
                         fixed by (run seed, step, set) (gspo_cli.eval.seeding)
        samples.jsonl    a few rollouts of every train.log_samples_every-th step (and step 1),
                         one JSON object each, append-only, flushed with the step's metrics:
                         step, arm, seed, group, index, prompt (decoded prompt tokens, chat
                         template included), completion, reward, correct, components,
                         advantage, length, truncated, clip_frac, clipped, masked_frac,
                         prompt_chars, completion_chars (code: detail, per-test verdicts;
                         task.environment: turns [{role: model|tool, content}], tools {turns,
                         tool_calls, tool_errors, tool_timeouts}).
                         At most 8 per logged step (the best and worst response of the
                         first 4 groups), texts cut at 2000 characters
                         (gspo_cli.train.samples; `gspo samples RUN` shows them)
        run.json         status, versions, git commit, host, times, wall time per phase
        checkpoints/step_XXXXXX/   written atomically (train.checkpoint): an HF model dir +
                         trainer_state.pt, or with FSDP per-rank shards in state/ + config,
                         tokenizer and trainer_state.pt
        model/           FSDP runs: the final checkpoint as an HF dir (train.export, export.json)
        tensorboard/, wandb/   the train.sinks that write into the run directory
        eval_summary.json, eval_problems.jsonl, eval_sets/<name>/   `gspo eval RUN`'s results

These (RUN_FILES, RUN_FOLDERS) and the temporary names they are written under are all that
gspo writes here, and so all it ever deletes (RunDir.reset, --force): a directory holding
anything else is refused, never emptied.

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

from gspo_cli.errors import GspoError, SpecError, redact
from gspo_cli.files import read_text

# Re-exported: the run directory's JSON files and identity checks, long imported from here.
from gspo_cli.jsonl import append_jsonl, read_jsonl, truncate_jsonl, write_json_atomic  # noqa: F401
from gspo_cli.run_identity import check_identity, identity_changes, reward_changes  # noqa: F401

# The behaviour version of the training code, recorded in run.json (`identity`). Bump it with
# any change that alters what training computes from the same spec and data (a loss, the
# sampler, the cold start's recipe, a default): a completed run of another version is not
# skipped and an unfinished one not resumed. The stored-spec check cannot tell, since it fills
# an old spec.yaml with today's defaults.
BEHAVIOUR_VERSION = 2

# What gspo writes in a run directory (see the layout above).
RUN_FILES = (
    "spec.yaml",
    "run.json",
    "metrics.jsonl",
    "eval.jsonl",
    "samples.jsonl",
    "eval_summary.json",
    "eval_problems.jsonl",
)
RUN_FOLDERS = ("checkpoints", "model", "eval_sets", "tensorboard", "wandb")


def is_run_entry(name: str) -> bool:
    """Whether `name`, an entry of a run directory, is one gspo writes: RUN_FILES and
    RUN_FOLDERS, and the names they are written under before an atomic rename
    (`.run.json.tmp`, `.tmp-model`, `.old-model`)."""
    if name in RUN_FILES or name in RUN_FOLDERS:
        return True
    if name.startswith(".") and name.endswith(".tmp") and name[1:-4] in RUN_FILES:
        return True
    return any(name.startswith(p) and name[len(p) :] in RUN_FOLDERS for p in (".tmp-", ".old-"))


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


def check_output_dir(path: str | Path, field: str = "output_dir") -> None:
    """SpecError (one line naming `field` and the path) when `path`, or the nearest of its
    parents that exists, is not a directory: no run could be written under it. Called before
    any model is built."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                what = "is a file" if p.is_file() else "exists and is not a directory"
                raise SpecError(f"{field}: {p} {what}; runs are written into a directory: name another one")
            return


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


def _redacted(value: Any) -> Any:
    """`value` with `errors.redact` applied to every string in it (dicts and lists walked)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


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
        """Merge `fields` into run.json, every text in them redacted (`errors.redact`: no API key)."""
        info = {**self.info(), **_redacted(fields)}
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

    def eval_set_change(self, name: str, source: str, fingerprint: str) -> str | None:
        """A line saying that evaluation set `name`, read now from `source` with content
        `fingerprint` (`tasks.base.problems_digest`), is not the set this run was scored on in
        training (run.json's identity); None when it is, or when the run recorded none."""
        try:
            recorded = self.info()["identity"]["data"]["eval"][name]["fingerprint"]
        except (KeyError, TypeError):
            return None  # a run.json from before identities: nothing to compare with
        if recorded == fingerprint:
            return None
        return (
            f"evaluation set {name}: {source} changed since {self.path} was trained; these scores are not "
            "comparable with the run's eval.jsonl"
        )

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

    def foreign_entries(self) -> list[str]:
        """Names in the run directory that gspo did not write (`is_run_entry`), sorted."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if not is_run_entry(p.name))

    def check_resettable(self) -> None:
        """SpecError (one line naming the directory) when `reset` would have to delete
        something gspo did not write: the path is not a directory, it holds other files, or it
        holds files of gspo's names but neither spec.yaml nor run.json (not a run gspo made)."""
        if (self.path.exists() or self.path.is_symlink()) and not self.path.is_dir():
            raise SpecError(
                f"{self.path}: exists and is not a directory; move it away or choose another output directory (-o)"
            )
        foreign = self.foreign_entries()
        if not foreign and self.path.is_dir() and any(self.path.iterdir()):
            # gspo train writes spec.yaml right after making the directory: without it (and
            # run.json) these files, whatever their names, are someone else's.
            if not (self.spec_file.is_file() or self.info_file.is_file()):
                names = sorted(p.name for p in self.path.iterdir())
                foreign = names
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise SpecError(
                f"{self.path}: holds files gspo did not write ({shown}); not deleting it: move them out "
                "or choose another output directory (-o)"
            )

    def reset(self) -> None:
        """Remove an earlier attempt at this run: the files gspo writes (`is_run_entry`), then
        the directory. SpecError, before anything is deleted, when it holds anything else."""
        if not self.path.exists():
            return
        self.check_resettable()
        for entry in self.path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()  # a link itself, never what it points to
        self.path.rmdir()


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
