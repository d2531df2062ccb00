"""Errors a user can cause. The CLI turns them into one line and an exit code; bugs still raise."""


class GspoError(Exception):
    """A failure the user can act on; `exit_code` is what the CLI returns."""

    exit_code = 1


class SpecError(GspoError):
    """Bad spec, override, path or argument: usage error."""

    exit_code = 2


class RunError(GspoError):
    """A run could not be carried out (missing model, failed checkpoint, ...)."""

    exit_code = 1


class DivergedError(GspoError):
    """Training produced NaN/Inf (or collapsed); the run is marked `diverged`."""

    exit_code = 3


class InterruptedRun(GspoError):
    """SIGINT/SIGTERM: the run stopped cleanly after a checkpoint and can be resumed."""

    exit_code = 4


class HardInterrupt(KeyboardInterrupt):
    """A second SIGINT while a run was already stopping: no checkpoint this time (exit 130).
    Any other KeyboardInterrupt came before a run started (the cold start, a model load):
    nothing was written that a rerun would not redo (exit 4, as for a clean stop)."""


EXIT_CODES = {
    0: "done",
    1: "a run failed",
    2: "bad usage, spec, path or model",
    3: "a run diverged",
    4: "interrupted (resumable)",
    130: "hard interrupt (a second Ctrl-C)",
}


def router_scale_problem(scale: float, model_name: str) -> str:
    """optimizer.router_lr_scale on a model without routers: refused at spec load for the
    built-in dense model (config.py), once built for hub and local ones (optim.py)."""
    return f"optimizer.router_lr_scale: {scale} needs an MoE model; {model_name} has no routers"
