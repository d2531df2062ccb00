"""`gspo schema`: the spec's JSON Schema (and the Markdown reference page), generated from the
pydantic models and the algorithm registries."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gspo_cli.cli.common import _fail
from gspo_cli.errors import SpecError


def schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="print the spec reference page (Markdown) instead of the JSON Schema")
    ] = False,
    write: Annotated[
        bool,
        typer.Option(
            "--write", help="write gspo-spec.schema.json and docs/reference/spec.md under --root instead of printing"
        ),
    ] = False,
    root: Annotated[
        Path, typer.Option("--root", help="the repository checkout --write writes into", file_okay=False)
    ] = Path("."),
) -> None:
    """Print the JSON Schema of an experiment spec: every field with its type, default,
    constraints and description, and the registered names that loss, aggregation, advantage
    and mismatch.mode accept.

    Editors validate and complete specs from it: put `# yaml-language-server: $schema=PATH`
    on a spec's first line. `make reference` regenerates the committed copy and the reference
    page.

    Example: `gspo schema > gspo-spec.schema.json`
    """
    from gspo_cli.spec.reference import REFERENCE_FILE, SCHEMA_FILE, reference_markdown, schema_text

    if not write:
        typer.echo(reference_markdown() if markdown else schema_text(), nl=False)
        return
    try:
        if not (root / "docs").is_dir():
            raise SpecError(f"--root {root}: not a gspo-cli checkout (no docs/ folder)")
    except SpecError as err:
        _fail(err)
    for name, text in ((SCHEMA_FILE, schema_text()), (REFERENCE_FILE, reference_markdown())):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {path}")
