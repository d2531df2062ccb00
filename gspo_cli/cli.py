"""The `gspo` command line: parse, load the spec, call one core function, render.

Errors a user can cause end in one line on stderr and exit code 2 (bad usage or spec) or
1 (a run failed); bugs still raise with a traceback.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from gspo_cli.errors import GspoError

app = typer.Typer(
    name="gspo",
    help="Compare GRPO and GSPO for RL post-training: train, evaluate, compare, plot.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)
err_console = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Compare GRPO and GSPO for RL post-training: train, evaluate, compare, plot."""


def _fail(err: GspoError) -> None:
    for i, line in enumerate(str(err).splitlines() or [type(err).__name__]):
        err_console.print(("error: " if i == 0 else "       ") + line, markup=False, highlight=False)
    raise typer.Exit(err.exit_code)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    err_console.print(f"warning: {message}", markup=False, highlight=False)


@app.command()
def train(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="experiment spec (YAML)")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", "-s", metavar="KEY.PATH=VALUE",
                                                      help="override a spec field (repeatable), e.g. arms.gspo.clip_high=5e-4")] = None,
    arm: Annotated[Optional[list[str]], typer.Option("--arm", help="train only this arm (repeatable)")] = None,
    seed: Annotated[Optional[list[int]], typer.Option("--seed", help="train only this seed (repeatable)")] = None,
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="write runs here instead of the spec's output_dir")] = None,
    force: Annotated[bool, typer.Option("--force", help="rerun runs that already completed")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only errors and the final summary")] = False,
) -> None:
    """Train every arm x seed of an experiment; each run gets its own run directory."""
    from gspo_cli.config import load_spec
    from gspo_cli.progress import make_reporter, render_summary
    from gspo_cli.train import train_experiment

    warnings.showwarning = _show_warning
    try:
        overrides = list(set_ or [])
        if output_dir is not None:
            overrides.append(f"output_dir={output_dir}")
        spec = load_spec(spec_path, overrides)
        reporter = make_reporter(quiet=quiet)
        with reporter:
            results = train_experiment(spec, arms=arm, seeds=seed, reporter=reporter, force=force)
    except GspoError as err:
        _fail(err)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130)
    render_summary(results)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
