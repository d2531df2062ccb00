"""The `gspo` commands that read run directories only: list, compare, plot, report.

None imports torch; each renders what gspo_cli.analysis computes (its tables, figures and report).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from gspo_cli.cli.common import _fail, _print_table, _show_warning, check_margin, err_console
from gspo_cli.errors import GspoError, SpecError


def list_runs(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH...", help="run or experiment directories")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON on stdout")] = False,
) -> None:
    """Show the runs under PATH with status, step, last reward and wall time.

    Example: `gspo list results/quickstart`
    """
    from gspo_cli.analysis.rundata.runs import CorruptRun, run_info
    from gspo_cli.runs import find_runs

    rows = []
    warnings.showwarning = _show_warning  # a run left out (corrupt run.json...) is one line
    try:
        for rd in find_runs(paths):
            try:
                info = run_info(rd)
            except CorruptRun as err:  # listed, never as a status of None: the line says what is wrong
                warnings.warn(str(err).replace("; run left out", ""), stacklevel=1)
                info = {"status": "unreadable run.json"}
            metrics = rd.metrics()
            last = metrics[-1] if metrics else {}
            rows.append(
                {
                    "path": str(rd.path),
                    "status": info.get("status"),
                    "step": info.get("step", 0),
                    "total_steps": info.get("total_steps"),
                    "reward_last": last.get("reward/mean"),
                    "wall_s": info.get("wall_s"),
                    # A run still going has no wall_s yet: its training seconds so far.
                    "elapsed_s": last.get("time/elapsed_s"),
                }
            )
    except GspoError as err:
        _fail(err)
    if not rows:
        _fail(SpecError(f"no run directories (with run.json) under {', '.join(map(str, paths))}"))
    if as_json:
        typer.echo(json.dumps(rows))
        return
    _print_table(
        ["path", "status", "step", "reward (last)", "wall s"],
        [
            [
                r["path"],
                r["status"],
                f"{r['step']}/{r['total_steps']}",
                "" if r["reward_last"] is None else f"{r['reward_last']:.3f}",
                _wall_text(r),
            ]
            for r in rows
        ],
    )


def _wall_text(row: dict) -> str:
    """The run's wall seconds; for one without (still running, or killed), its training seconds
    so far, marked so."""
    if row["wall_s"] is not None:
        return f"{row['wall_s']:g}"
    if isinstance(row["elapsed_s"], (int, float)):
        return f"{row['elapsed_s']:.0f}" + (" so far" if row["status"] == "running" else "")
    return ""


def _split_list(values: list[str] | None) -> list[str] | None:
    """--metrics a,b --metrics c -> [a, b, c]; None when not given."""
    out = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    return out or None


def compare(
    paths: Annotated[
        list[str], typer.Argument(metavar="PATH...", help="run directories, experiment directories or (quoted) globs")
    ],
    group_by: Annotated[
        str,
        typer.Option(
            "--group-by",
            "-g",
            help="arm (default), experiment, or a spec field: clip_high, arms.0.loss, rollout.group_size",
        ),
    ] = "arm",
    metrics: Annotated[
        Optional[list[str]],
        typer.Option(
            "--metrics",
            "-m",
            help="columns, comma-separated or repeated: steps, reward, "
            "accuracy, eval, threshold, clip, clip_low, clip_high, expert_change, kl, "
            "entropy, length, grad_norm, step_time, wall, or a metric key",
        ),
    ] = None,
    last: Annotated[
        int, typer.Option("--last", help="final train reward = mean of the last N steps (also the threshold window)")
    ] = 10,
    threshold: Annotated[
        Optional[float], typer.Option("--threshold", help="add steps and time to reach this train reward")
    ] = None,
    budget: Annotated[
        Optional[str],
        typer.Option(
            "--budget",
            metavar="AXIS",
            help="add each held-out score at equal compute: the largest every run reached on AXIS "
            "(tokens, samples, wall or step), interpolated between evaluations; e.g. --budget tokens",
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="table, markdown, csv or json (csv: the arms table, as always, unless --baseline or --differences "
            "is given on the command line: then the differences table)",
        ),
    ] = "table",
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="write to this file instead of stdout")] = None,
    baseline: Annotated[
        Optional[str],
        typer.Option(
            "--baseline",
            "-b",
            help="add each arm's difference from this arm (paired over seeds), with a verdict; default: the "
            "spec's comparison.baseline (in table, markdown and json; csv keeps the arms table unless "
            "--differences); `none`: no differences in any format; e.g. --baseline grpo",
        ),
    ] = None,
    margin: Annotated[
        Optional[float],
        typer.Option(
            "--margin",
            help="equivalence margin: `equivalent` when the 90% CI lies inside ±M; default: the spec's "
            "comparison.margin, else no equivalence verdict; e.g. --margin 0.02",
        ),
    ] = None,
    differences: Annotated[
        bool,
        typer.Option(
            "--differences",
            help="write the differences from the spec's comparison.baseline (or --baseline); the way to get them "
            "as csv without naming the baseline; e.g. gspo compare results/quickstart --differences -f csv",
        ),
    ] = False,
    effect: Annotated[
        Optional[float],
        typer.Option(
            "--effect",
            help="smallest effect of interest, in the metric's units: seeds needed are planned to find it; "
            "default: the spec's comparison.effect, else the margin, else the observed difference; e.g. --effect 0.03",
        ),
    ] = None,
    pairs: Annotated[
        bool,
        typer.Option(
            "--pairs",
            help="differences for every pair of arms (one family), not only vs a baseline; e.g. "
            "gspo compare results/zoo --pairs",
        ),
    ] = False,
    robust: Annotated[
        bool,
        typer.Option(
            "--robust",
            help="add probability of improvement and the interquartile mean (IQM) over seeds; e.g. "
            "--baseline grpo --robust",
        ),
    ] = False,
) -> None:
    """Put runs side by side: one row per arm (or group), mean ± 95% CI over seeds.

    Reads run directories only (never a model); running or dead runs count with what is on disk.

    With --baseline: a differences table (difference, CI, method, verdict better/worse/equivalent/not
    resolved, adjusted p, seeds needed, family), paired over seeds, from problem records where runs have
    them. The spec's comparison (arm vs baseline on its metric) is the primary, tested alone at the full
    alpha; the other outcomes are the secondary family (Holm); diagnostics get intervals, no verdict.

    With --baseline, arms whose runs collapse (held-out score below half its step 0) are also
    compared by time to collapse: a log-rank row in the secondary family.

    A spec's comparison.baseline adds the differences to table, markdown and json (json keeps the arms
    and adds `differences`); csv stays the arms table unless --baseline or --differences is given.
    --baseline none turns the spec's default off in every format.

    Examples: `gspo compare results/quickstart --baseline grpo --margin 0.02 -f markdown`, `gspo compare
    results/quickstart --baseline grpo --budget tokens`
    """
    from gspo_cli.analysis.tables import compare as cmp
    from gspo_cli.analysis.tables import differences as dif
    from gspo_cli.analysis.tables import sequential as seq

    warnings.showwarning = _show_warning  # a run left out (corrupt run.json...) is one line
    try:
        if fmt not in cmp.FORMATS:
            raise SpecError(f"--format: unknown format {fmt!r} (known: {', '.join(cmp.FORMATS)})")
        result = cmp.compare_runs(
            paths, group_by=group_by, metrics=_split_list(metrics), last=last, threshold=threshold, budget=budget
        )
        table = None
        section = dif.spec_comparison(result.groups)
        off = baseline is not None and baseline.lower() == "none"
        base = None if off else (baseline or section.get("baseline"))
        # A script's `-f csv` got the arms table before specs had a comparison section: only an
        # explicit request switches csv to the differences.
        asked = baseline is not None or differences or pairs or fmt != "csv"
        if not off and asked and (base is not None or pairs):
            metric = section.get("metric")
            table = dif.build_differences(
                result.groups,
                result.columns,
                baseline=base,
                margin=check_margin(margin, "--margin")
                if margin is not None
                else check_margin(section.get("margin"), "comparison.margin"),
                pairs=pairs,
                metrics=dif.family_metrics(result.columns, explicit=bool(metrics), spec_metric=metric),
                robust=robust,
                primary=None if pairs else dif.primary_key(section, base, result.columns),
                effect=effect if effect is not None else section.get("effect"),
            )
            if not pairs and base == section.get("baseline") and metric is not None:
                if dif.primary_key(section, base, result.columns) is None:
                    table.notes.insert(
                        0,
                        f"The spec's comparison.metric {metric!r} is not a column shown here (see --metrics): "
                        "no primary; every tested row is in one family.",
                    )
            table.sequential = seq.sequential_decisions(result.groups)
            table.notes += [seq.decision_line(d) for d in table.sequential]
        elif differences and base is None and not off:
            raise SpecError("--differences: no baseline; give --baseline ARM or a spec comparison section")
    except GspoError as err:
        _fail(err)
    if out is None and fmt == "table":
        console = Console()
        console.print(cmp.rich_table(result))
        for note in result.notes:
            console.print(note, style="dim", markup=False, highlight=False)
        if table is not None:
            console.print(dif.rich_table(table))
            for note in table.notes:
                console.print(note, style="dim", markup=False, highlight=False)
        return
    text = cmp.render(result, fmt) if table is None else dif.render_with_differences(result, table, fmt)
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        err_console.print(f"wrote {out}", markup=False, highlight=False)


def plot(
    paths: Annotated[
        list[str], typer.Argument(metavar="PATH...", help="run directories, experiment directories or (quoted) globs")
    ],
    out: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="output folder (default: `<experiment dir>/plots`)")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="file format: png, svg or pdf")] = "png",
    metrics: Annotated[
        Optional[list[str]],
        typer.Option(
            "--metrics",
            "-m",
            metavar="FIGURES",
            help="which figures, comma-separated or repeated (default: every figure the runs have data "
            "for, and the panel figure with reward, eval, clip, expert_change, engine_route_diff, mismatch): "
            "reward, reward_time, eval, clip, expert_change, engine_route_diff, mismatch, mismatch_dropped, "
            "kl, entropy, length, grad_norm, logvar_length, logvar_minibatch, survival (time to collapse, "
            "Kaplan-Meier; by default where a run collapses), fit (held-out score against --x with the "
            "saturating fit; on request); e.g. -m eval,fit --x tokens",
        ),
    ] = None,
    x: Annotated[
        str,
        typer.Option(
            "--x",
            help="x axis of every curve: step, tokens (response tokens sampled), samples (responses sampled) "
            "or wall (training seconds; `time` too); e.g. --x tokens",
        ),
    ] = "step",
    smooth: Annotated[
        str,
        typer.Option(
            "--smooth",
            metavar="WEIGHT|auto",
            help="EMA weight in [0, 1) applied to each seed before the mean over seeds, the unsmoothed "
            "mean drawn faint behind; 0: off; auto: a window of 1/25 of the longest run (0.9 at 250 "
            "steps, none up to 25)",
        ),
    ] = "auto",
    band: Annotated[
        str,
        typer.Option(
            "--band",
            help="shaded band over seeds, where an arm has several: ci (95% confidence interval, "
            "t-distribution), std (± one standard deviation), range (min to max) or none",
        ),
    ] = "ci",
    group_by: Annotated[str, typer.Option("--group-by", "-g", help="one line per: as for `compare`")] = "arm",
    panel: Annotated[
        bool,
        typer.Option(
            "--panel/--no-panel", help="also write the panel figure (panel.png, .svg or .pdf): the figures on one grid"
        ),
    ] = True,
    baseline: Annotated[
        Optional[str],
        typer.Option(
            "--baseline",
            "-b",
            help="also write differences.png: each arm's difference from this arm with its 95% CI, as `compare "
            "--baseline` computes it (default: the spec's comparison.baseline); e.g. --baseline grpo",
        ),
    ] = None,
    margin: Annotated[
        Optional[float],
        typer.Option("--margin", help="draw the ±M equivalence band on differences.png; e.g. --margin 0.02"),
    ] = None,
    effect: Annotated[
        Optional[float],
        typer.Option(
            "--effect",
            help="smallest effect of interest: differences.png labels each unresolved row with the seeds that "
            "would find it (as compare --effect; default: the spec's comparison.effect, else the margin); "
            "e.g. --effect 0.03",
        ),
    ] = None,
) -> None:
    """Draw reward, held-out score, clip-fraction, expert-change and other curves from run
    directories, one file per figure plus the panel a paper shows.

    The panel (panel.png) holds reward, held-out score, clipped tokens and expert change, those
    the runs have data for, with one legend below them. One line per arm: the mean over seeds,
    smoothed, the unsmoothed mean faint behind, with a band over seeds where there are several.

    Example: `gspo plot results/quickstart` (its panel.png is docs/quickstart.png)
    """
    from gspo_cli.analysis.figures.plot import plot_runs

    warnings.showwarning = _show_warning  # a run left out (corrupt run.json...) is one line
    try:
        check_margin(margin, "--margin")
        written, skipped = plot_runs(
            paths,
            out=out,
            fmt=fmt,
            metrics=_split_list(metrics),
            x=x,
            smooth=smooth,
            band=band,
            group_by=group_by,
            panel=panel,
        )
        from gspo_cli.analysis.figures.differences import write_differences_figure

        diff = write_differences_figure(
            paths, baseline=baseline, margin=margin, effect=effect, out=out, fmt=fmt, group_by=group_by
        )
        written += [diff] if diff is not None else []
    except GspoError as err:
        _fail(err)
    for name in skipped:
        err_console.print(f"skipped {name}: no run logs it", markup=False, highlight=False)
    for path in written:
        typer.echo(str(path))


def report(
    experiment: Annotated[Path, typer.Argument(help="an experiment directory, e.g. results/paper_tiny")],
    out: Annotated[
        Optional[Path],
        typer.Option(
            "--out", "-o", help="Markdown file (default: `<experiment>/REPORT.md`); figures go to figures/ beside it"
        ),
    ] = None,
    last: Annotated[int, typer.Option("--last", help="final train reward = mean of the last N steps")] = 25,
    smooth: Annotated[float, typer.Option("--smooth", help="EMA weight for the training curves")] = 0.9,
) -> None:
    """The GSPO paper's five findings checked on an experiment's runs: compare's table, plot's
    figures, and per finding the differences between arms (paired over seeds, Holm over every
    difference in the findings, each unresolved one with what would resolve it) and a verdict, or
    "not testable" and why (no reward signal, or arms that take the same gradient).

    Then each arm's time to collapse (Kaplan-Meier, log-rank in the same Holm family) and its
    held-out score against response tokens (at an equal budget; a saturating fit where identified).

    A REPORT.md written by hand, or edited since gspo wrote it, is never overwritten: it is kept
    beside the new one as REPORT.edited.md (the command says so).

    Example: `gspo report results/paper_tiny` (its runs come from `make reproduce-tiny`)
    """
    from gspo_cli.analysis.report.build import write_report

    warnings.showwarning = _show_warning  # a run left out (corrupt run.json...) is one line
    try:
        path = write_report(experiment, out, last=last, smooth=smooth)
    except GspoError as err:
        _fail(err)
    typer.echo(str(path))
