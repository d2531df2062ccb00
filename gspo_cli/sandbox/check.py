"""`python -m gspo_cli.sandbox.check`: which sandbox level judged code gets here.

Prints one line (the level, what it isolates, the interpreter) and exits 0, or prints why
no level works, or why the level `GSPO_SANDBOX_ISOLATION` names does not, and exits 1."""

from __future__ import annotations

import sys

from gspo_cli.errors import GspoError
from gspo_cli.sandbox.isolation import summary
from gspo_cli.sandbox.programs import detect_isolation


def main() -> int:
    try:
        print(summary(detect_isolation()))
    except GspoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
