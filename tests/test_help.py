"""Help that reads: every command's --help at 80 columns, with no sentence broken by a line
break of the source, no word cut in two, nothing past the 80th column, and one example.

A line break that survives at a 400-column terminal is a hard break written in the source (a
docstring or help string); Rich only wraps at the width it is given. A hard break inside a
sentence (the line before ends without punctuation and the line after starts lowercase) is the
defect: at 80 columns it shows as a short line in the middle of a paragraph.
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from gspo_cli.cli.app import app

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
BOX = "│╭╮╰╯─┃"


def render(args: list[str], width: int) -> str:
    res = CliRunner().invoke(
        app, [*args, "--help"], prog_name="gspo", terminal_width=width, env={"COLUMNS": str(width), "NO_COLOR": "1"}
    )
    assert res.exit_code == 0, res.output
    return res.output


def hard_breaks_mid_sentence(text: str) -> list[str]:
    """Pairs of lines of one paragraph (or one option's help) where the first ends without
    terminal punctuation and the second starts lowercase. `text` is rendered wide enough that
    Rich wrapped nothing, so every such pair is a line break taken from the source."""
    found = []
    prev = None  # (text, inside a panel)
    for raw in text.splitlines():
        inside = raw.lstrip().startswith("│")
        body = raw.strip().strip(BOX).rstrip()
        if not body.strip() or raw.strip().startswith(("╭", "╰")):
            prev = None
            continue
        indent = len(body) - len(body.lstrip())
        text_ = body.strip()
        # In a panel a continuation is indented to the help column; a new row starts at the edge.
        continues = prev is not None and prev[1] == inside and (not inside or indent > 2)
        if continues and not re.search(r"[.:;!?]$", prev[0]) and text_[:1].islower():
            found.append(f"{prev[0]!r} / {text_!r}")
        prev = (text_, inside)
    return found


def words(text: str) -> set[str]:
    return {w for w in re.split(rf"[\s{BOX}]+", text) if w}


@pytest.mark.parametrize("command", [[], *[[c] for c in COMMANDS]], ids=lambda c: " ".join(c) or "gspo")
def test_help_reads_at_80_columns(command):
    narrow, wide = render(command, 80), render(command, 400)
    assert hard_breaks_mid_sentence(wide) == []
    too_long = [line for line in narrow.splitlines() if len(line) > 80]
    assert too_long == []
    assert words(narrow) <= words(wide), f"words cut at 80 columns: {sorted(words(narrow) - words(wide))}"


def source_texts(command: str) -> list[str]:
    """The docstring and every parameter's help of a command, as written in the source."""
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_loses_no_text(command):
    """Help is rendered as Markdown: a `<name>` outside backticks would vanish as an HTML tag, a
    `*` would turn into emphasis. Every word of the source must reach the screen."""
    shown = " ".join(render([command], 400).replace("│", " ").split())
    lost = [
        w
        for text in source_texts(command)
        for w in text.replace("`", "").split()
        if w not in shown and w.strip(".,;:()") not in shown
    ]
    assert lost == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shows_one_example(command):
    text = render([command], 400)
    examples = [line for line in text.splitlines() if re.search(r"\bExamples?:", line)]
    assert len(examples) == 1, text
    assert f"gspo {command}" in examples[0]


def test_the_check_catches_a_sentence_broken_by_the_source():
    """The defect this file guards against, as `gspo train --help` showed it before: a docstring
    paragraph with hard line breaks, rendered in Typer's rich mode, breaks after 'another spec'."""
    demo = typer.Typer(rich_markup_mode="rich")

    @demo.command()
    def run() -> None:
        """Train every arm.

        Runs already completed with the same spec are skipped (a completed run of another spec
        is refused: --force or another -o); a run with a checkpoint resumes from it.
        """

    @demo.command()
    def other() -> None:  # a second command, so `run` is a subcommand as in gspo
        """Nothing."""

    res = CliRunner().invoke(demo, ["run", "--help"], terminal_width=400, env={"COLUMNS": "400"})
    assert hard_breaks_mid_sentence(res.output) == [
        "'Runs already completed with the same spec are skipped (a completed run of another spec' / "
        "'is refused: --force or another -o); a run with a checkpoint resumes from it.'"
    ]
