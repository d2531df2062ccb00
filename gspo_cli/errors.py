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
