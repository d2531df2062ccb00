"""What the benchmark's orchestrator and its worker processes share: paths, the benchmark's
spec, thread and load helpers, and the worker protocol (tagged JSON lines on stdout,
"step"/"done" commands on stdin).

Nothing here measures or renders; `gspo_cli` and yaml are imported inside the functions
that need them, so the renderer can import the constants without the training stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "quickstart.yaml"
# Untracked (results/* is git-ignored): `make bench` never rewrites a tracked file.
DEFAULT_OUT = ROOT / "results" / "bench"
RESULT_TAG = "BENCH_RESULT "
SHARED_LOAD = 2.5  # 1-minute load average above which the box counts as shared (2 cores)
# What a smoke run (bench.py --smoke) says when TRL is missing: TRL's side is then a stub.
TRL_STUB_NOTE = (
    "TRL is not installed beside this interpreter, so TRL's side is a stub: our synchronous step runs "
    "in its place and its ratios compare ours with ours (`make bench` installs TRL, the bench extra)"
)


# ---------------------------------------------------------------------------------------
# The benchmark's spec


def base_raw(
    *,
    prompts: int,
    group: int,
    max_new: int,
    mini_batches: int,
    steps: int,
    preset: str,
    staleness: int = 0,
    engine: str = "hf",
    spec_path: str | None = None,
    compile: bool = False,
    smoke: bool = False,
) -> dict:
    """The quickstart spec (model, task, optimizer; `spec_path`: another spec's) with the
    benchmark's rollout sizes and one arm; `staleness` is rollout.staleness (1: a worker
    process samples one step ahead), `engine` rollout.engine ("hf" or "vllm"), `compile`
    train.compile (the update's forward and backward compiled at bucketed widths), `smoke` the
    model without its cold start (random weights: --smoke runs check that the code runs, in
    seconds). Sections of the spec that name its own arms are dropped (`fit_to_arms`)."""
    import yaml

    from gspo_cli.errors import SpecError

    source = str(spec_path or QUICKSTART.relative_to(ROOT))
    raw = yaml.safe_load(Path(spec_path or QUICKSTART).read_text())
    try:
        _validate(raw)  # the source as written: a problem here is its own
    except SpecError as err:
        raise SpecError(f"{source}: {one_line(err)}") from None
    raw["rollout"].update(
        prompts_per_step=prompts,
        group_size=group,
        max_new_tokens=max_new,
        temperature=1.0,
        staleness=staleness,
        engine=engine,
    )
    raw["train"].update(steps=steps, eval_every=0, checkpoint_every=0, compile=compile)
    if smoke:  # random weights: a smoke run checks the code path, not what a trained model does
        raw["model"]["cold_start"] = {**(raw["model"].get("cold_start") or {}), "steps": 0}
    raw["arms"] = [{"name": preset, "preset": preset, "mini_batches": mini_batches, "epochs": 1}]
    return fit_to_arms(raw, source)


def fit_to_arms(raw: dict, source: str) -> dict:
    """`raw` (a spec read from file `source`, its arms replaced by the benchmark's, its sizes
    changed) without the optional sections that no longer fit: those that named the source's
    arms, `comparison` today (its baseline and arm) and `tune` (its grids by arm), and any such
    section added later, found by validating, not by name. Each optional top-level section (one
    an experiment may leave out: an `ExperimentSpec` field defaulting to None) with a problem is
    dropped; a problem in any other section is raised, as a SpecError naming `source`."""
    from gspo_cli.errors import SpecError
    from gspo_cli.spec.experiment import ExperimentSpec

    try:
        _validate(raw)
        return raw
    except SpecError as err:
        problems = str(err).splitlines()
    optional = {k for k, f in ExperimentSpec.model_fields.items() if not f.is_required() and f.default is None}
    section = {line: re.match(r"[A-Za-z_]*", line).group() for line in problems}
    kept = [line for line in problems if section[line] not in optional & set(raw)]
    if kept:  # the problems of the sections the benchmark keeps (the others would be dropped)
        raise SpecError(f"{source} as the benchmark sets it up: {'; '.join(kept)}")
    fitted = {k: v for k, v in raw.items() if k not in section.values()}
    try:
        _validate(fitted)
    except SpecError as err:
        raise SpecError(f"{source} as the benchmark sets it up: {one_line(err)}") from None
    return fitted


def _validate(raw: dict) -> None:
    from gspo_cli.spec.loading import spec_from_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec_from_dict(raw)


def one_line(err: BaseException) -> str:
    """An error's message on one line: a spec error lists one problem per line."""
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())


@contextlib.contextmanager
def spec_errors_in_one_line(prog: str):
    """A SpecError raised inside ends the process with one line on stderr, `PROG: spec error:
    ...`, and exit status 2 (a usage error, as the gspo command's), not a traceback."""
    from gspo_cli.errors import SpecError

    try:
        yield
    except SpecError as err:
        print(f"{prog}: spec error: {one_line(err)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def load_spec_and_task(raw: dict):
    """(Spec, Task) of a raw spec dict; the spec's warnings are silenced (they would interleave
    with the workers' tagged output)."""
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = spec_from_dict(raw)
    return spec, make_task(spec.task.name, spec.task.params)


def model_source(spec, task) -> str:
    """The model directory (the built-in model is cold-started on first use, then cached)."""
    from gspo_cli.models import resolve_model_source

    return resolve_model_source(spec.model, task, log=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))


# ---------------------------------------------------------------------------------------
# The process and the box


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def pick_threads(arg: str, load: float) -> tuple[int, str]:
    """(threads, why); 0 means torch's default. `arg` is --threads: a number, "default" or
    "auto"; a non-numeric other value raises ValueError (argparse has already accepted it).
    On a busy box, torch's default of one thread per core stalls: a thread waiting at an
    OpenMP barrier spins while its partner is descheduled, and single steps took 20-40 s
    instead of ~1 s here (2 cores, load ~4)."""
    cores = os.cpu_count() or 1
    if arg == "default":
        return 0, "torch's default"
    if arg == "auto":
        if load > cores / 2:
            return 1, (
                f"1 (auto: the box was busy at start, load {load:.2f} on {cores} cores; with a thread per "
                "core, OpenMP spin-waits stall a loaded box)"
            )
        return 0, "torch's default (auto: idle box)"
    return int(arg), f"{int(arg)} (--threads)"


def thread_env(threads: int) -> dict:
    """This process's environment, with OMP_NUM_THREADS set when `threads` is not 0 (torch's default)."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else dict(os.environ)


def loadavg() -> float:
    """The 1-minute load average; NaN where /proc/loadavg cannot be read."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def median(xs):
    """The median of the values that are not None; None when there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------
# The worker protocol. Each worker runs in its own process and answers on stdout with tagged
# JSON lines. The ours/TRL workers run in turns: after set-up they wait on stdin for
# "turn N THREADS", run N RL steps back to back with THREADS torch threads (0: leave them),
# report the turn and wait again, so the orchestrator can interleave the sides turn by turn
# while the idle ones sleep; "done" ends them.


def emit(obj: dict) -> None:
    print(RESULT_TAG + json.dumps(obj), flush=True)


def wait_for_turn() -> tuple[int, int] | None:
    """(steps, threads) on "turn N THREADS", None on "done"; anything else (EOF: the orchestrator
    died) ends the process."""
    cmd = sys.stdin.readline().split()
    if cmd == ["done"]:
        return None
    if len(cmd) == 3 and cmd[0] == "turn":
        return int(cmd[1]), int(cmd[2])
    raise SystemExit(f"bench worker: unexpected command {cmd!r}")


def compiles() -> int:
    """Graphs torch.compile has traced in this process so far (0 when it never ran): a turn in
    which this grew paid for compiling (or loading compiled code from the cache)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


def set_threads(n: int) -> None:
    """torch threads (0: leave torch's count as it is)."""
    import torch

    if n:
        torch.set_num_threads(n)
