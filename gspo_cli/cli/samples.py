"""`gspo samples RUN`: the rollouts a run logged (samples.jsonl), in the terminal. No torch."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from gspo_cli.cli.common import _fail
from gspo_cli.errors import GspoError, SpecError


def samples(
    run: Annotated[str, typer.Argument(metavar="RUN", help="a run directory (`results/<experiment>/<arm>/seed<k>`)")],
    step: Annotated[Optional[int], typer.Option("--step", help="the logged step to show (default: the latest)")] = None,
    worst: Annotated[bool, typer.Option("--worst", help="lowest reward first")] = False,
    best: Annotated[bool, typer.Option("--best", help="highest reward first")] = False,
    n: Annotated[Optional[int], typer.Option("--limit", "-n", help="show at most N samples")] = None,
    plain: Annotated[bool, typer.Option("--plain", help="plain text, no colours or boxes")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the samples' JSON lines, as stored")] = False,
) -> None:
    """Show the prompts (as the model saw them), completions, rewards and advantages that
    training logged every train.log_samples_every steps, with whether each response was
    clipped or masked.

    Example: `gspo samples results/quickstart/gspo/seed0 --worst -n 4`
    """
    from gspo_cli.analysis.rundata.samples import load_samples, select_samples

    try:
        if worst and best:
            raise SpecError("--worst, --best: choose one")
        if plain and as_json:
            raise SpecError("--plain, --json: choose one")
        rd, records = load_samples(run)
        chosen = select_samples(records, step, "worst" if worst else "best" if best else "batch", n)
    except GspoError as err:
        _fail(err)
    if as_json:
        for r in chosen:
            typer.echo(json.dumps(r, ensure_ascii=False))
    elif plain:
        _print_plain(chosen)
    else:
        _print_rich(chosen)


def _print_plain(chosen: list[dict]) -> None:
    from gspo_cli.analysis.rundata.samples import cut_note, reward_parts, sections, title, verdict

    for r in chosen:
        typer.echo(f"=== {title(r)}")
        typer.echo(verdict(r))
        if (parts := reward_parts(r)) is not None:
            typer.echo(parts)
        typer.echo(f"--- prompt{cut_note(r, 'prompt')}")
        typer.echo(r.get("prompt", ""))
        for heading, text, tool in sections(r):  # a multi-turn rollout: each turn, the tool's marked
            typer.echo(f"--- {heading}")
            typer.echo("\n".join(f"| {line}" for line in text.splitlines()) if tool else text)
        typer.echo("")


def _width() -> int | None:
    """The panels' width: COLUMNS when set (a pipe or a job log included), else the terminal's,
    else (piped) 120."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if sys.stdout.isatty() else 120


def _print_rich(chosen: list[dict]) -> None:
    from rich.console import Group
    from rich.panel import Panel
    from rich.rule import Rule
    from rich.text import Text

    from gspo_cli.analysis.rundata.samples import cut_note, reward_parts, sections, title, verdict

    console = Console(soft_wrap=False, width=_width())
    for r in chosen:
        good = bool(r.get("correct"))
        body = Group(
            Text(verdict(r), style="bold green" if good else "bold red"),
            *([Text(parts)] if (parts := reward_parts(r)) is not None else []),
            Rule(Text("prompt" + cut_note(r, "prompt")), style="dim"),  # Text: "[cut: ...]" is no markup
            Text(r.get("prompt", ""), style="dim"),  # Text: model output is never read as markup
            *[
                part
                for heading, text, tool in sections(r)  # a multi-turn rollout: each turn, the tool's apart
                for part in (Rule(Text(heading), style="yellow" if tool else "dim"), Text(text, style="yellow" * tool))
            ],
        )
        console.print(Panel(body, title=Text(title(r)), title_align="left", border_style="green" if good else "red"))
