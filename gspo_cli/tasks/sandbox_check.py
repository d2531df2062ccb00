"""`python -m gspo_cli.tasks.sandbox_check`: which sandbox level judged code gets here.

Prints one line (the level, what it isolates, the interpreter) and exits 0, or prints why
no level works, or why the level `GSPO_SANDBOX_ISOLATION` names does not, and exits 1."""

from __future__ import annotations

import sys

from gspo_cli.errors import GspoError
from gspo_cli.tasks.sandbox import detect_isolation
from gspo_cli.tasks.sandbox_setup import summary


def main() -> int:
    try:
        print(summary(detect_isolation()))
    except GspoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
