"""`gspo plugins`: the rewards and tasks a spec may name, built-in and from installed packages."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from gspo_cli.cli.common import _print_table, err_console


def plugins(as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False) -> None:
    """List the rewards (`task.rewards[].function`) and tasks (`task.name`) a spec may name: the
    built-in ones and those installed packages register under the entry-point groups
    gspo_cli.rewards and gspo_cli.tasks, with where each comes from.

    Every plugin is imported to check it. One that fails to import, or whose name a built-in or
    another package has, is listed with the reason, said again in one line on stderr, and the
    exit code is 1.

    Example: `gspo plugins`
    """
    from gspo_cli.rewards import registered

    rows = registered()
    if as_json:
        typer.echo(json.dumps([asdict(r) for r in rows]))
    else:
        _print_table(
            ["kind", "name", "from", "object", "status"],
            [[r.kind, r.name, r.origin, r.target, r.problem or "ok"] for r in rows],
        )
    bad = [r for r in rows if r.problem]
    for r in bad:
        line = f"error: plugin {r.kind} {r.name!r} ({r.origin}, {r.target}) {r.problem}"
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(1)
