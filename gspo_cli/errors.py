"""Errors a user can cause. The CLI turns them into one line and an exit code; bugs still raise."""

import re


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


# Secrets (a judge's API key) that no message or file may show, whole or in part: registered
# when read, replaced by MASK wherever `redact` runs (run.json, the reporters, the CLI's error line).
MASK = "***"
PIECE = 8  # a run of text holding this many consecutive characters of a secret is masked whole
_SECRETS: set[str] = set()


def register_secret(value: str) -> None:
    """Hide `value` in every message this process writes from now on (`redact`)."""
    if value:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """`text` with every registered secret replaced by MASK, and every run of characters other
    than spaces, quotes, brackets, commas and semicolons that holds PIECE or more consecutive
    characters of one masked whole (a server quoting a key it cut or half-masked, a message cut
    inside a key). Redact before cutting a message."""
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, MASK)
        pieces = {secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1)}
        if any(p in text for p in pieces):
            text = _RUN.sub(lambda m, pieces=pieces: MASK if any(p in m[0] for p in pieces) else m[0], text)
    return text


_RUN = re.compile(r"[^\s\"'`<>(){}\[\],;]+")
