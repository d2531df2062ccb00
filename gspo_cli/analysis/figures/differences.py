"""`gspo plot --baseline ARM`: the differences figure, each arm's difference from the baseline with
its 95% interval (a forest plot), zero marked, and with a margin the ±margin band of the equivalence
test and the 90% interval it judges equivalence on (thick, over the thin 95% one).

One panel per metric (held-out score, train reward), one row per arm; the marker says the verdict
(filled: better or worse in its family, hollow: equivalent or not resolved), the label the method
and the family.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from gspo_cli.analysis.figures.plot import DPI, default_out, save_figure
from gspo_cli.analysis.tables.compare import compare_runs
from gspo_cli.analysis.tables.differences import (
    DifferenceTable,
    build_differences,
    family_metrics,
    primary_key,
    spec_comparison,
)

_COLOURS = {"better": "#1a7f37", "worse": "#cf222e", "equivalent": "#0969da"}


def differences_figure(table: DifferenceTable) -> Figure:
    """The forest plot of `table` (one panel per metric)."""
    metrics = list(dict.fromkeys(d.metric for d in table.rows))
    rows_per = max(sum(d.metric == m for d in table.rows) for m in metrics)
    fig = Figure(figsize=(8.5, 0.9 + (0.45 * rows_per + 0.8) * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics):
        rows = [d for d in table.rows if d.metric == metric]
        margin = rows[0].margin
        if margin is not None and margin > 0:
            ax.axvspan(-margin, margin, color="#0969da", alpha=0.12, lw=0, label=f"±{margin:g} (equivalence margin)")
        ax.axvline(0.0, color="0.3", lw=0.8)
        for y, d in enumerate(reversed(rows)):
            lo, hi = d.ci95
            colour = _COLOURS.get(d.verdict, "0.35")
            if math.isfinite(lo):
                ax.plot([lo, hi], [y, y], color=colour, lw=1 if margin else 2, solid_capstyle="butt", gid="ci95")
            lo90, hi90 = d.estimate.ci(0.90) if margin else (math.nan, math.nan)
            if math.isfinite(lo90):  # the interval the equivalence test reads against the margin
                ax.plot([lo90, hi90], [y, y], color=colour, lw=4, solid_capstyle="butt", gid="ci90")
            if math.isfinite(d.delta):
                filled = d.verdict in ("better", "worse", "higher", "lower")
                ax.plot(d.delta, y, "o", ms=7, color=colour, mfc=colour if filled else "white", mew=1.5)
            ax.annotate(
                (f"{d.verdict}, adj. p {d.p_adjusted:.2g}" if math.isfinite(d.p_adjusted) else d.verdict)
                + (f" ({d.family}, {d.family_size})" if d.family and d.family != "diagnostics" else "")
                + (f"; {d.seeds_needed} seeds for {d.effect:g}" if d.seeds_needed and d.effect else "")
                + (" — see warning" if d.warnings else ""),
                (1.01, y),
                xycoords=("axes fraction", "data"),
                va="center",
                fontsize=8,
                color=colour,
            )
        ax.set_yticks(range(len(rows)), [f"{d.arm} − {d.baseline}\n{d.method}" for d in reversed(rows)], fontsize=7)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_title(table.labels.get(metric, metric), fontsize=9)
        ax.set_xlabel(
            "difference from the baseline (thin: 95% CI; thick: 90% CI, read against the margin for equivalence)"
            if margin
            else "difference from the baseline (95% CI)"
        )
        if margin:
            ax.legend(loc="lower right", fontsize=7, frameon=False)
    return fig


def write_differences_figure(
    paths: list[str],
    *,
    baseline: str | None,
    margin: float | None = None,
    effect: float | None = None,
    out: Path | None = None,
    fmt: str = "png",
    group_by: str = "arm",
    dpi: int = DPI,
) -> Path | None:
    """differences.<fmt> in `out` (default: the plots folder) for the baseline given or the spec's
    comparison section; None when neither names one."""
    comp = compare_runs(paths, group_by=group_by, metrics=["eval_final", "reward"])
    section = spec_comparison(comp.groups)
    baseline = baseline or section.get("baseline")
    if baseline is None:
        return None
    margin = margin if margin is not None else section.get("margin")
    table = build_differences(
        comp.groups,
        comp.columns,
        baseline=baseline,
        margin=margin,
        metrics=family_metrics(comp.columns, explicit=False, spec_metric=section.get("metric")),
        primary=primary_key(section, baseline, comp.columns),
        effect=effect if effect is not None else section.get("effect"),
    )
    if not table.rows:
        return None
    out = Path(out) if out is not None else default_out([r for g in comp.groups for r in g.runs])
    out.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"font.family": "DejaVu Sans", "font.size": 9}):
        fig = differences_figure(table)
    return save_figure(fig, out / f"differences.{fmt}", fmt, dpi)


__all__ = ["differences_figure", "write_differences_figure"]
