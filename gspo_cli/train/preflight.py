"""Everything checked before a model is loaded, in one ordered list: `gspo train` runs it first
(`train_experiment`), `gspo check` runs it alone. A new check belongs in CHECKS, where its place
in the order is where it runs.

In order (each a named function below; the first problem ends the list with one line, exit 2
for a spec the user can fix, 1 for a server that does not answer):

 1. sinks: every tracker in train.sinks is known and its package installed.
 2. task: the task and its reward functions resolve (a misspelled reward, a bad task parameter).
 3. data: the evaluation sets are read and their problems removed from training, leaving some.
 4. prompt lengths: with a built-in model, every prompt leaves room for the response.
 5. processes: this world (torchrun's, or one process) supports the spec: staleness, the
    task's environment.
 6. LoRA: model.lora has peft and no combination LoRA cannot run.
 7. vLLM settings: rollout.vllm can run in this world (tensor parallel, launcher).
 8. vLLM server: the server of rollout.server.url answers (and returns routed experts for r3).
 9. divisibility: prompts per step and every arm's mini-batches divide over the processes.
10. shared directory: with several processes, output_dir is one filesystem for all of them
    (required for model.sharding: fsdp).
11. run directories: no selected run's directory holds another spec's run, a run made with other
    code, model or data, or files gspo did not write (unless --force, where that applies), and
    none to resume sits in an output_dir the processes do not share.

The spec itself (keys, types, presets, cross-field rules) is checked earlier, when it loads
(`spec.loading`); the selection (--arm, --seed) and output_dir by the command. Nothing here loads
model weights or starts a worker; a few checks read what training reads to decide: the task's
data files (2, 3), the model's tokenizer and config for the run identity (11), the vLLM server
over HTTP (8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.eval.sets import EvalSet, plan_data
from gspo_cli.models import lora
from gspo_cli.models.builtin import check_prompt_lengths
from gspo_cli.rewards import with_rewards
from gspo_cli.rollout.vllm_settings import check_vllm_settings
from gspo_cli.runs import RunDir, run_path
from gspo_cli.spec import ArmConfig, ExperimentSpec
from gspo_cli.tasks import Task, make_task
from gspo_cli.train.resume import decide_start, run_identity, run_spec
from gspo_cli.train.sinks import check_sinks
from gspo_cli.train.staleness import check_supported


@dataclass
class Preflight:
    """What the checks read and resolved, in the order they fill it; training goes on from here.

    `task` with its rewards and without the evaluation problems; `eval_sets` and `data` as
    `plan_data` returns them; `info` this process's place in the world; `unshared` why output_dir
    is not one filesystem for all processes (None: it is, or one process); `identity` the runs'
    identity (run.json), on the main process only."""

    spec: ExperimentSpec
    arms: list[ArmConfig]
    seeds: list[int]
    force: bool = False
    task: Task | None = None
    eval_sets: list[EvalSet] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    info: DistInfo = field(default_factory=DistInfo)
    unshared: str | None = None
    identity: dict | None = None


# A check takes the Preflight, raises a GspoError on a problem, and returns None when it checked,
# or a few words saying why it does not apply to this spec.
Check = Callable[[Preflight], "str | None"]


def sinks(p: Preflight) -> str | None:
    """Every tracker in train.sinks is known and its package installed."""
    check_sinks(p.spec.train.sinks)
    return None if p.spec.train.sinks else "no train.sinks"


def task(p: Preflight) -> str | None:
    """The task and its reward functions resolve (reads the task's data)."""
    p.task = with_rewards(make_task(p.spec.task.name, p.spec.task.params), p.spec.task.rewards, p.spec.model)
    return None


def data(p: Preflight) -> str | None:
    """The evaluation sets are read and their problems removed from training, leaving some."""
    # Before any model exists: a bad set costs nothing, and the cold start never sees an
    # evaluation problem.
    p.eval_sets, p.data = plan_data(p.spec, p.task)
    return None


def prompt_lengths(p: Preflight) -> str | None:
    """With a built-in model, every prompt leaves room for the response (one line now, not a
    failed allocation)."""
    if not p.spec.model.name.startswith("builtin:"):
        return "not a built-in model"
    positions = p.spec.model.builtin.max_positions
    check_prompt_lengths(p.task.train_pool or [], "task.params.source", positions, p.spec.rollout.max_new_tokens)
    for s in p.eval_sets:
        check_prompt_lengths(s.problems, f"evaluation set {s.name} ({s.source})", positions, s.max_tokens)
    return None


def processes(p: Preflight) -> str | None:
    """This world (torchrun's, or one process) supports the spec: staleness, the environment."""
    p.info = distributed.setup(p.spec.model.device)  # a world of one unless under torchrun
    check_supported(p.spec, p.info.world_size)
    return None


def lora_support(p: Preflight) -> str | None:
    """model.lora has peft installed and no combination LoRA cannot run."""
    lora.check_spec(p.spec, p.info.world_size)
    return None if p.spec.model.lora is not None else "no model.lora"


def _r3(p: Preflight) -> bool:
    return any(a.routing_replay == "r3" for a in p.arms)


def vllm_settings(p: Preflight) -> str | None:
    """rollout.vllm can run in this world: vLLM installed, tensor parallel and launcher."""
    if p.spec.rollout.engine != "vllm":
        return f"rollout.engine is {p.spec.rollout.engine}"
    check_vllm_settings(p.spec.rollout.vllm, _r3(p), p.info.world_size)
    return None


def vllm_server(p: Preflight) -> str | None:
    """The vLLM server answers (exit 1 if not) and returns routed experts for an r3 arm."""
    if p.spec.rollout.engine != "vllm-server":
        return f"rollout.engine is {p.spec.rollout.engine}"
    from gspo_cli.rollout.vllm_server import check_server

    check_server(p.spec.rollout.server.url, _r3(p))
    return None


def divisibility(p: Preflight) -> str | None:
    """Prompts per step and every arm's mini-batches divide over the processes."""
    if not p.info.enabled:
        return "one process"
    distributed.check_divisible(
        p.spec.rollout.prompts_per_step, p.spec.rollout.group_size, [a.mini_batches for a in p.arms], p.info
    )
    return None


def shared_directory(p: Preflight) -> str | None:
    """With several processes, output_dir is one filesystem for all (fsdp requires it; other
    runs train but cannot resume). Collective: rank 0 writes a token file there."""
    if not p.info.enabled:
        return "one process"
    p.unshared = distributed.shared_directory_problem(Path(p.spec.output_dir), p.info)
    if p.unshared and p.spec.model.sharding == "fsdp":
        raise SpecError(
            f"output_dir: {p.spec.output_dir} is not shared by all processes ({p.unshared}); with model.sharding: "
            "fsdp every rank writes its checkpoint shards there and a resume reads them all: put it on a shared "
            "filesystem"
        )
    return None


def run_directories(p: Preflight) -> str | None:
    """No selected run's directory holds another spec's run, one made with other code, model or
    data, or files gspo did not write, and none to resume is unshared (reads the model's
    tokenizer and config for the identity, as training does)."""
    p.identity = run_identity(p.spec, p.task, p.eval_sets) if p.info.is_main else None
    for arm in p.arms:
        for seed in p.seeds:
            path = run_path(p.spec.output_dir, p.spec.name, arm.name, seed)
            decide_start(RunDir(path), run_spec(p.spec, arm, seed), p.force, p.info, p.unshared, identity=p.identity)
    return None


CHECKS: list[tuple[str, Check]] = [
    ("sinks", sinks),
    ("task", task),
    ("data", data),
    ("prompt lengths", prompt_lengths),
    ("processes", processes),
    ("LoRA", lora_support),
    ("vLLM settings", vllm_settings),
    ("vLLM server", vllm_server),
    ("divisibility", divisibility),
    ("shared directory", shared_directory),
    ("run directories", run_directories),
]


def preflight(
    spec: ExperimentSpec,
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    *,
    force: bool = False,
    on_check: Callable[[str, str | None], None] | None = None,
) -> Preflight:
    """Run CHECKS in order for the selected arms (names; None: all) and seeds (None: the spec's);
    the first problem raises its GspoError. `on_check(name, skipped)` hears each check that passed:
    `skipped` None when it checked, else why it does not apply."""
    selected = [spec.arm(a) for a in arms] if arms else list(spec.arms)
    p = Preflight(spec, selected, list(seeds) if seeds else list(spec.seeds), force=force)
    for name, check in CHECKS:
        skipped = check(p)
        if on_check is not None:
            on_check(name, skipped)
    return p


def planned(spec: ExperimentSpec, world: int) -> Preflight:
    """The checks `gspo plan` makes for a world of `world` processes it does not start: what
    training would refuse there before loading a model. With a built-in model, its data and prompt
    lengths (task, data, prompt lengths: the task's data is read as training reads it); always, the
    processes check for that world (staleness, the task's environment) and divisibility. The first
    problem raises its GspoError."""
    p = Preflight(spec, list(spec.arms), list(spec.seeds))
    if spec.model.name.startswith("builtin:"):
        for check in (task, data, prompt_lengths):
            check(p)
    p.info = DistInfo(rank=0, world_size=world)
    check_supported(spec, world)
    divisibility(p)
    return p


__all__ = ["CHECKS", "Preflight", "planned", "preflight"]
