"""Where a run starts: skipped (completed with this spec and identity: code version, model,
data), resumed from its last complete checkpoint (weights, optimizer, scheduler and RNG state;
metrics rewound to that step), or afresh; agreed by all ranks. Ranks other than 0 see the run
directory read-only."""

from __future__ import annotations

import hashlib
import shutil
import warnings
from pathlib import Path

import torch

from gspo_cli import distributed
from gspo_cli.distributed import DistInfo
from gspo_cli.environments import environment_file
from gspo_cli.errors import SpecError
from gspo_cli.eval.sets import EvalSet, plan_data
from gspo_cli.files import files_digest
from gspo_cli.hub import hub_revision
from gspo_cli.models.builtin import BUILTIN_KINDS, cache_key
from gspo_cli.rewards import RewardedTask, file_fingerprints, with_rewards
from gspo_cli.runs import BEHAVIOUR_VERSION, RunDir, check_identity, reward_changes, truncate_jsonl
from gspo_cli.spec import ArmConfig, ExperimentSpec, ModelConfig
from gspo_cli.spec.comparison import names_arm
from gspo_cli.spec.loading import check_stored_spec
from gspo_cli.tasks import Task, make_task
from gspo_cli.tasks.base import problems_digest
from gspo_cli.train.checkpoint import load_trainer_state, valid_checkpoints
from gspo_cli.train.staleness import CHECKPOINT_KEY
from gspo_cli.train.step import Ctx


class ReadOnlyRunDir(RunDir):
    """What ranks other than 0 see: reads go to disk, writes go nowhere."""

    def update_info(self, **fields):
        return {**self.info(), **fields}

    def log_metrics(self, record):
        pass

    def log_eval(self, record):
        pass

    def log_samples(self, records):
        pass

    def reset(self):
        pass


def run_identity(spec: ExperimentSpec, task: Task, eval_sets: list[EvalSet]) -> dict:
    """What besides the spec makes a run what it is (run.json `identity`): the training code's
    BEHAVIOUR_VERSION, the model's digest (`model_digest`) and a content fingerprint of the
    training data and of every evaluation set. `task` and `eval_sets` as `plan_data` left them
    (evaluation problems excluded from training)."""
    return {
        "behaviour_version": BEHAVIOUR_VERSION,
        "model": model_digest(spec.model, task),
        "data": {
            "train": {
                "source": str(spec.task.params.get("source", "synthetic")),
                "fingerprint": task.content_fingerprint(),
            },
            "eval": {s.name: {"source": s.source, "fingerprint": problems_digest(s.problems)} for s in eval_sets},
        },
        **({"rewards": reward_files(task, eval_sets)} if _rewarded(task, eval_sets) else {}),
        **({"environment": env} if (env := environment_fingerprint(spec.task.environment)) else {}),
    }


def environment_fingerprint(name: str | None) -> dict[str, str]:
    """{absolute path: 16 hex digits of sha256} of a FILE.py environment (task.environment), else {}."""
    path = environment_file(name)
    return {path: hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]} if path else {}


def _rewarded(task: Task, eval_sets: list[EvalSet]) -> list[RewardedTask]:
    return [t for t in (task, *(s.task for s in eval_sets)) if isinstance(t, RewardedTask)]


def reward_files(task: Task, eval_sets: list[EvalSet]) -> dict[str, str]:
    """`file_fingerprints` of every reward file the run calls: training's and its evaluation sets'."""
    return {path: d for t in _rewarded(task, eval_sets) for path, d in file_fingerprints(t.rewards).items()}


def model_digest(cfg: ModelConfig, task: Task) -> str:
    """The model a run starts from, as a digest that changes when its weights would: a built-in
    model's cache key (recipe, size, cold start, data, numerics), a local directory's sha256 of
    its files, a hub id with the revision in the local hub cache when there is one."""
    if cfg.name.startswith("builtin:"):
        kind = cfg.name.split(":", 1)[1]
        return f"{cfg.name}:{cache_key(kind, cfg.builtin, cfg.cold_start, task)}" if kind in BUILTIN_KINDS else cfg.name
    path = Path(cfg.name).expanduser()
    if path.is_dir():
        return "dir:" + files_digest(sorted(f for f in path.iterdir() if f.is_file()))
    revision = hub_revision(cfg.name)
    return f"hub:{cfg.name}" + (f"@{revision}" if revision else "")


def run_spec(spec: ExperimentSpec, arm: ArmConfig, seed: int) -> ExperimentSpec:
    """The spec of exactly one run: this arm, this seed (itself runnable: a comparison that does not
    name this arm is dropped, as a one-arm spec could not keep it)."""
    update: dict = {"arms": [arm], "seeds": [seed], "sweep": None}
    if not names_arm(spec.comparison, arm.name):
        update["comparison"] = None
    return spec.model_copy(update=update)


def decide_start(
    rd: RunDir,
    own_spec: ExperimentSpec,
    force: bool,
    info: DistInfo,
    unshared: str | None = None,
    identity: dict | None = None,
):
    """'skip', or the checkpoint to resume from (None: from scratch), agreed by all ranks.

    A completed run is skipped only if its spec.yaml is this spec and its run.json identity
    (behaviour version, model digest, data fingerprints) is `identity` (`run_identity`, made
    from `own_spec` when None); a completed or unfinished run of another spec or identity is a
    SpecError (exit 2) unless `force` (then it starts afresh). Starting afresh in a directory
    that holds files gspo did not write is a SpecError whatever `force` says."""
    decision: tuple = ("fresh", None)
    if info.is_main:
        try:
            if rd.status() == "completed" and not force:
                check_stored_spec(rd.path, own_spec, "completed")
                check_identity(rd.path, rd.info().get("identity"), identity or spec_identity(own_spec), "completed")
                decision = ("skip", None)
            else:
                ckpt = None if force else resumable_checkpoint(rd, own_spec, identity)
                decision = ("resume", str(ckpt)) if ckpt else ("fresh", None)
                if ckpt is None:
                    rd.check_resettable()  # never delete what gspo did not write
                if ckpt and unshared:
                    raise SpecError(
                        f"output_dir: resuming {rd.path} needs every rank to read {ckpt.name}, but the run "
                        f"directory is not shared ({unshared}): put output_dir on a shared filesystem"
                    )
        except SpecError as err:
            decision = ("error", str(err))
    decision = distributed.broadcast_object(decision, info)
    if decision[0] == "error":
        raise SpecError(decision[1])
    if decision[0] == "resume":  # this rank's own path to it (output_dir may be relative, or mounted elsewhere)
        decision = ("resume", str(rd.checkpoints / Path(decision[1]).name))
    return decision


def resumable_checkpoint(rd: RunDir, own_spec: ExperimentSpec, identity: dict | None = None):
    """The latest complete checkpoint of an unfinished run with the same spec and identity
    (`decide_start`), else None; SpecError when its spec or identity differs."""
    if not rd.exists():
        return None
    ckpts = valid_checkpoints(rd)
    if not ckpts:
        return None
    check_stored_spec(rd.path, own_spec, "unfinished")
    stored, current = rd.info().get("identity"), identity or spec_identity(own_spec)
    if isinstance(stored, dict) and (changed := reward_changes(stored, current)):
        # A fixed reward function resumes its run: said, not refused (the checkpoints are intact).
        warnings.warn(f"{rd.path}: resuming with {'; '.join(changed)}", stacklevel=2)
        current = {**current, "rewards": stored.get("rewards")}
    check_identity(rd.path, stored, current, "unfinished")
    return ckpts[-1]


def spec_identity(spec: ExperimentSpec) -> dict:
    """`run_identity` of a one-run spec, its task and evaluation sets read afresh."""
    task = with_rewards(make_task(spec.task.name, spec.task.params), spec.task.rewards)
    sets, _ = plan_data(spec, task)
    return run_identity(spec, task, sets)


def restore(ctx: Ctx, rd: RunDir, ckpt) -> tuple[int, dict | None]:
    """Load checkpoint `ckpt` into `ctx` (every rank together), rewind metrics and evaluations
    to its step and drop later checkpoints; (its step, the pre-sampled batches of a stale
    run or None)."""
    state = load_trainer_state(
        ckpt, ctx.model, ctx.optimizer, ctx.scheduler, rng=ctx.rng, shuffle=ctx.shuffle, info=ctx.dist
    )
    step = int(state["step"])
    ctx.train_time = float(state.get("train_time", 0.0))
    ctx.skipped = int(state.get("skipped", 0))
    if ctx.dist.rank:  # the checkpoint holds rank 0's sampling RNG; others derive their own
        torch.manual_seed(distributed.rank_seed(step, ctx.dist.rank))
    if ctx.dist.is_main:
        truncate_jsonl(rd.metrics_file, step)
        truncate_jsonl(rd.eval_file, step)
        truncate_jsonl(rd.samples_file, step)
        for later in rd.checkpoint_dirs():  # checkpoints past the one we resume from are orphans
            if later.name > ckpt.name:
                shutil.rmtree(later, ignore_errors=True)
    return step, state.get(CHECKPOINT_KEY)
