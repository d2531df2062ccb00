"""The `gspo` command line: parse, load the spec, call one core function, render.

Errors a user can cause end in one line on stderr and exit code 2 (bad usage or spec) or
1 (a run failed); bugs still raise with a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from gspo_cli.cli.analysis import compare, list_runs, plot, report
from gspo_cli.cli.eval import eval_
from gspo_cli.cli.export import export
from gspo_cli.cli.plan import plan
from gspo_cli.cli.plugins import plugins
from gspo_cli.cli.samples import samples
from gspo_cli.cli.schema import schema
from gspo_cli.cli.serve import vllm_server
from gspo_cli.cli.train import check, sweep, train
from gspo_cli.cli.tune import tune


def _conventional_metavars() -> None:
    """Help shows what a value looks like, as click does (`--last INTEGER`, `--out PATH`, flags
    bare), not Typer 0.29's type labels (`<bool>` beside every flag, `<list[str]>`); an explicit
    metavar still wins, and an argument's name (`PATH...`) says what it takes."""
    from typer.core import TyperArgument, TyperOption

    names = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "bool": "BOOLEAN", "Path": "PATH", "path": "PATH"}

    def option_metavar(self, ctx):
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        label = self.display_type(ctx).strip("<>")  # "int", "list[str]", "a|b", "path"
        label = label.removeprefix("list[").removesuffix("]")  # a repeated option: one value each time
        return names.get(label, label.upper() if "|" not in label else f"[{label}]")

    TyperOption.display_type_rich = option_metavar
    TyperArgument.display_type_rich = lambda self, ctx: None


_conventional_metavars()
app = typer.Typer(
    name="gspo",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    # Markdown: a docstring's paragraphs are reflowed to the terminal's width, so the source can wrap
    # them at any column (rich mode would keep every line break of the source).
    rich_markup_mode="markdown",
)


def _print_version(value: bool) -> None:
    if not value:
        return
    from gspo_cli.runs import versions

    # Read from the installed packages' metadata: importing torch to ask it would take seconds.
    v = versions()
    typer.echo(
        f"gspo-cli {v.get('gspo-cli', 'unknown')} (torch {v.get('torch', 'not installed')}, "
        f"transformers {v.get('transformers', 'not installed')}, python {v['python']})"
    )
    raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="print the gspo-cli, torch and transformers versions and exit",
        ),
    ] = False,
) -> None:
    """Compare GRPO and GSPO for RL post-training: train, evaluate, compare, plot.

    Example: `gspo train experiments/quickstart.yaml`
    """


app.command()(train)
app.command()(check)
app.command()(sweep)
app.command()(tune)
app.command(name="eval")(eval_)
app.command()(plan)
app.command()(export)
app.command(name="vllm-server")(vllm_server)
# The commands that read run directories only: no torch import.
app.command(name="list")(list_runs)
app.command()(compare)
app.command()(plot)
app.command()(report)
app.command()(schema)
app.command()(samples)
app.command()(plugins)  # imports gspo_cli.rewards and gspo_cli.tasks (no torch) and the installed plugins


def main() -> None:
    _sleeping_openmp_waits_on_one_core()
    try:
        app()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if _in_process_group():  # torch is imported already: a torchrun worker
            from gspo_cli.distributed import leave_process_group

            leave_process_group(code)
        raise


def _sleeping_openmp_waits_on_one_core() -> None:
    """On fewer cores than the built-in cold start's 2 torch threads (`taskset -c 0`, a 1-CPU
    container), have OpenMP's idle threads sleep instead of spin: spinning, the second thread
    takes the one core from the first at every parallel region (a cold start 20-45x slower);
    sleeping changes no number. Read once, when torch loads, so before any torch import; a
    value the user set is kept."""
    if "OMP_WAIT_POLICY" in os.environ or not hasattr(os, "sched_getaffinity"):
        return
    if len(os.sched_getaffinity(0)) < 2:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")  # never imports torch: the analysis side stays torch-free
    return dist is not None and dist.is_available() and dist.is_initialized()


if __name__ == "__main__":
    main()
