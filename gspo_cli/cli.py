"""The `gspo` command line: parse, load the spec, call one core function, render.

Errors a user can cause end in one line on stderr and exit code 2 (bad usage or spec) or
1 (a run failed); bugs still raise with a traceback.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from gspo_cli.errors import GspoError, SpecError

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
        # soft_wrap: never break a problem over two lines (Rich wraps at 80 columns off a terminal).
        err_console.print(("error: " if i == 0 else "       ") + line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


def _unique(items: list | None) -> list | None:
    return list(dict.fromkeys(items)) if items else None


def _check_selection(spec, arms: list[str] | None, seeds: list[int] | None) -> None:
    """Refuse unknown --arm names and out-of-range --seed values before any model is built.

    A --seed need not be listed in the spec's `seeds`: running an extra seed of an existing
    experiment is a normal thing to do, and its run directory records the seed it used.
    """
    from gspo_cli.config import SEED_LIMIT

    for name in arms or []:
        spec.arm(name)  # SpecError naming the known arms
    for s in seeds or []:
        if not 0 <= s < SEED_LIMIT:
            raise SpecError(f"--seed: {s} is out of range (0 <= seed < {SEED_LIMIT})")


@app.command()
def train(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="experiment spec (YAML)")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", "-s", metavar="KEY.PATH=VALUE",
                                                      help="override a spec field (repeatable), e.g. arms.gspo.clip_high=5e-4")] = None,
    arm: Annotated[Optional[list[str]], typer.Option("--arm", help="train only this arm (repeatable)")] = None,
    seed: Annotated[Optional[list[int]], typer.Option("--seed", help="train only this seed (repeatable); "
                                                      "seeds not listed in the spec are allowed")] = None,
    output_dir: Annotated[Optional[Path], typer.Option("--output-dir", "-o", help="write runs here instead of the spec's output_dir")] = None,
    force: Annotated[bool, typer.Option("--force", help="rerun runs that already completed")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="only errors and the final summary")] = False,
) -> None:
    """Train every arm x seed of an experiment; each run gets its own run directory."""
    from gspo_cli.config import load_spec

    warnings.showwarning = _show_warning
    try:
        overrides = list(set_ or [])
        if output_dir is not None:
            # Quoted (JSON is YAML): a directory named `2024`, `null` or `a #1` stays a string.
            overrides.append(f"output_dir={json.dumps(str(output_dir))}")
        spec = load_spec(spec_path, overrides)
        arm, seed = _unique(arm), _unique(seed)
        _check_selection(spec, arm, seed)
        # Imported only now: torch and transformers take seconds, and usage errors should not wait.
        from gspo_cli.progress import make_reporter, render_summary
        from gspo_cli.train import train_experiment

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
