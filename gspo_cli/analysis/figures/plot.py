"""`gspo plot`: publication-ready figures regenerated from run directories alone.

One line per group (arm, by default): the mean over seeds, each seed smoothed first, the
unsmoothed mean faint behind, a band over seeds where at least two have the point (the numbers:
`curves`). An arm keeps its colour in every figure of one call. The combined figure
(`panel.<fmt>`) holds the figures a paper shows that the runs have data for, with one legend
below them. What the axes may show, and where legends and notes go (never over a curve), is
decided in `axes`. Figures are built on `matplotlib.figure.Figure` (Agg, no pyplot state, no
LaTeX) and saved with fixed metadata, so the same files give the same bytes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gspo_cli.analysis.figures.axes import (
    FLOOR,
    SIGNAL_NOTE,
    add_notes,
    apply_scale,
    finish_axes,
    floor_noise,
    log_bottom,
    no_signal,
    score_limits,
)
from gspo_cli.analysis.figures.catalog import FIGURES, PANEL_FIGURES, PROFILES, FigureSpec, reward_figure
from gspo_cli.analysis.figures.curves import (
    BANDS,
    SMOOTH_AUTO,
    Curve,
    eval_curve,
    metric_curve,
    resolve_smooth,
    seed_curve,
)
from gspo_cli.analysis.figures.fit import fit_draws
from gspo_cli.analysis.figures.survival import survival_draws
from gspo_cli.analysis.rundata.compute import ALIASES, AXES, axis_name
from gspo_cli.analysis.rundata.runs import Group, Run, group_runs, load_runs, reward_names
from gspo_cli.errors import SpecError
from gspo_cli.metrics import bounds, describe

FORMATS = ("png", "svg", "pdf")
PAIRED_HOW = "gspo plot --baseline ARM"  # writes differences.png
EXTRA_FIGURES = ("survival", "fit")  # survival: drawn by default where a run collapses; fit: on request
X_AXES = {**AXES, **{alias: AXES[axis] for alias, axis in ALIASES.items()}}  # a figure may fix its x: `time`
DPI = 150
RAW_STYLE = {"lw": 0.7, "alpha": 0.3}  # the unsmoothed mean behind a smoothed curve
# Fixed salt and no dates: the same runs must give byte-identical files.
_RC = {"svg.hashsalt": "gspo-cli", "text.usetex": False, "font.family": "DejaVu Sans", "font.size": 9}
_METADATA = {"png": {}, "svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}


def _profile_buckets(groups: list[Group], prefix: str) -> list[str]:
    """The bucket suffixes any run logs under `prefix`, in numeric order."""
    found = {c[len(prefix) :] for g in groups for r in g.runs for c in r.metrics.columns if c.startswith(prefix)}
    return sorted(found, key=lambda b: [int(t) if t.isdigit() else float("inf") for t in b.split("_")])


def profile_panel(fid: str, groups: list[Group], colours: dict, band: str = "ci") -> Panel | None:
    """Mean over seeds (± 95% CI) of each run's mean over steps, per bucket of the family."""
    prefix, title, xlabel = PROFILES[fid]
    buckets = _profile_buckets(groups, prefix)
    if not buckets:
        return None
    pos = pd.Series(np.arange(len(buckets), dtype=float))
    curves = []
    for g in groups:
        ys = {}
        for i, run in enumerate(g.runs):
            vals = [run.series(prefix + b).dropna().mean() if prefix + b in run.metrics else np.nan for b in buckets]
            ys[i] = pd.Series(vals, index=pos.index, dtype=float)
        curves.append((g, seed_curve(ys, {i: pos for i in ys}, band)))

    def draw(ax: Axes) -> None:
        means = [floor_noise(c.mean) for _, c in curves if c is not None]
        scale = apply_scale(ax, np.concatenate(means) if means else np.zeros(0))
        for g, c in curves:
            if c is not None:
                _draw_curve(ax, c, colours[g.name], _label(g), marker="o", key=prefix + buckets[0])
        log_bottom(ax)
        if scale == "linear":
            add_notes(ax, ["all values are 0 or negative: linear axis"])
        ax.set_xticks(pos.to_numpy(), [b.replace("_inf", "+").replace("_", "-") for b in buckets])
        _finish(ax, title, xlabel, "var log(π_θ/π_old), mean over steps", groups, band=band)

    return Panel(fid, draw)


@dataclass
class Panel:
    name: str  # file stem
    draw: Callable[[Axes], None]
    own_legend: bool = False  # has line-style entries of its own (dashed parts)
    in_panel: bool = True  # drawn in the combined figure (PANEL_FIGURES, or every --metrics one)


@dataclass
class Plot:
    panels: list[Panel]
    skipped: list[str] = field(default_factory=list)
    smooth: float = 0.0  # the EMA weight used (--smooth auto resolved)
    band: str = "ci"
    labels: list[str] = field(default_factory=list)  # the groups' legend labels, in order


def group_colours(groups: list[Group]) -> dict[str, tuple]:
    """One colour per group, by position in the sorted group list: stable across figures."""
    cmap = matplotlib.colormaps["tab10" if len(groups) <= 10 else "tab20"]
    return {g.name: cmap(i % cmap.N) for i, g in enumerate(groups)}


# --------------------------------------------------------------------------- drawing


def _draw_curve(
    ax: Axes, c: Curve, colour, label: str, ls: str = "-", band: bool = True, marker=None, key: str | None = None
) -> None:
    """The mean line and its band, every |value| below the noise floor drawn as 0 (axes.FLOOR), the
    band clipped to what metric `key` can be (metrics.bounds: a KL's band never dips below 0)."""
    ax.plot(c.x, floor_noise(c.mean), color=colour, ls=ls, label=label, lw=1.4, marker=marker, ms=3, zorder=3)
    ok = np.isfinite(c.lo) & np.isfinite(c.hi)
    low, high = bounds(key) if key is not None else (None, None)
    c = (
        Curve(c.x, c.mean, np.clip(c.lo, low, high), np.clip(c.hi, low, high), c.n)
        if (low, high) != (None, None)
        else c
    )
    lo = floor_noise(c.lo)
    if ax.get_yscale() == "log":  # a lower edge at or below 0 runs into the bottom (axes.log_bottom)
        lo = np.where(lo > 0, lo, FLOOR)
    if band and ok.any():
        ax.fill_between(c.x, lo, floor_noise(c.hi), where=ok, color=colour, alpha=0.2, lw=0)


def _draw_raw(ax: Axes, c: Curve, colour, name: str) -> None:
    """The unsmoothed mean over seeds, faint behind the smoothed one (label `_raw ...`: no legend
    entry, not counted by the axes rules)."""
    ax.plot(c.x, floor_noise(c.mean), color=colour, label=f"_raw {name}", zorder=2, **RAW_STYLE)


def _raw_handle() -> Line2D:
    return Line2D([], [], color="0.35", label="unsmoothed mean", **RAW_STYLE)


def _ylabel(spec: FigureSpec, smooth: float) -> str:
    unit = describe(spec.key)[1] if spec.key != "eval" else "score"
    label = spec.ylabel if unit in spec.ylabel else f"{spec.ylabel} [{unit}]"
    return label + (f", EMA {smooth:g}" if smooth > 0 and spec.key != "eval" else "")


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str, groups: list[Group], *args, band: str = "ci", **kw) -> None:
    """axes.finish_axes (`args`: extra, notes, integer_x) with the groups' runs without reward
    signal and the band's legend title."""
    silent = [f"{r.arm}/seed{r.seed}" for g in groups for r in g.runs if _no_signal(r)]
    finish_axes(ax, title, xlabel, ylabel, *args, silent=silent, legend_title=legend_title(groups, band), **kw)


def legend_title(groups: list[Group], band: str) -> str | None:
    """What the band is, when some group has several seeds (else there is no band)."""
    return f"{BANDS[band]} over seeds" if any(len(g.runs) > 1 for g in groups) and band != "none" else None


def _no_signal(run: Run) -> bool:
    return no_signal(run.series("reward/zero_var_group_frac").to_numpy(), run.series("reward/std").to_numpy())


def _label(group: Group) -> str:
    return f"{group.name} (n={len(group.runs)})"


def metric_panel(
    fid: str,
    groups: list[Group],
    colours: dict,
    x: str,
    smooth: float,
    band: str = "ci",
    spec: FigureSpec | None = None,
) -> Panel | None:
    """A curve per group of `spec`'s metric (default FIGURES[fid]), in the file `fid`; None when
    no run logs it."""
    spec = spec or FIGURES[fid]
    x = spec.x or x
    curves = [(g, metric_curve(g, spec.key, x, smooth, band)) for g in groups]
    if all(c is None for _, c in curves):
        return None
    raw = [(g, metric_curve(g, spec.key, x, 0.0, "none")) for g in groups] if smooth > 0 else []
    dashed = [[(g, metric_curve(g, key, x, smooth, band)) for g in groups] for key, _, _ in spec.dashed]

    def draw(ax: Axes) -> None:
        notes = []
        if spec.log:  # log only where the data allow it (axes.choose_scale); zeros stay at 0
            means = [floor_noise(c.mean) for row in [curves, raw, *dashed] for _, c in row if c is not None]
            if apply_scale(ax, np.concatenate(means)) == "linear":
                notes.append("all values are 0: linear axis")
        for g, c in raw:
            if c is not None:
                _draw_raw(ax, c, colours[g.name], g.name)
        for g, c in curves:
            if c is not None:
                _draw_curve(ax, c, colours[g.name], _label(g), key=spec.key)
        for (_, ls, _), row in zip(spec.dashed, dashed, strict=True):
            for g, c in row:
                if c is not None:
                    _draw_curve(ax, c, colours[g.name], "_" + g.name, ls=ls, band=False)
        log_bottom(ax)
        styles = [Line2D([], [], color="0.3", ls=ls, label=name) for _, ls, name in spec.dashed]
        styles += [_raw_handle()] if raw else []
        _finish(ax, spec.title, X_AXES[x], _ylabel(spec, smooth), groups, styles, notes, x == "step", band=band)

    return Panel(fid, draw, own_legend=bool(spec.dashed))


def eval_panel(task: str, groups: list[Group], colours: dict, x: str, band: str = "ci") -> Panel | None:
    curves = [(g, eval_curve(g, task, x, band)) for g in groups]
    if all(c is None for _, c in curves):
        return None
    key = next((k for g in groups for r in g.runs for k in r.eval_scores.key[r.eval_scores.task == task]), "score")

    def draw(ax: Axes) -> None:
        for g, c in curves:
            if c is not None:
                _draw_curve(ax, c, colours[g.name], _label(g), marker="o")
        # Scores are in [0, 1]: the axis starts at 0 so that noise between evaluations of one
        # seed does not fill the panel (axes.score_limits).
        score_limits(ax, np.concatenate([np.r_[c.mean, c.hi] for _, c in curves if c is not None]))
        # Each arm's band is over its own seeds: two bands can overlap while the paired
        # difference (seed by seed) is clear. Say where that one is.
        drawn = [g for g, c in curves if c is not None]
        paired = (
            [f"bands per arm, unpaired: the paired differences (seed by seed) are in differences.png ({PAIRED_HOW})"]
            if len(drawn) > 1 and any(len(g.runs) > 1 for g in drawn) and band != "none"
            else []
        )
        _finish(ax, f"Held-out {task} ({key})", X_AXES[x], f"{key} [score]", groups, (), paired, x == "step", band=band)

    return Panel("eval_" + re.sub(r"[^A-Za-z0-9_.-]", "_", task), draw)


def build_plot(
    groups: list[Group], metrics: list[str] | None = None, x: str = "step", smooth: float | str = 0.0, band: str = "ci"
) -> Plot:
    """The panels to draw, in figure order; figures with no data in any run are skipped.

    `metrics` None: every figure, the combined figure holding those of PANEL_FIGURES; given: those
    figures, all of them in the combined one. `smooth`: an EMA weight in [0, 1) or "auto";
    `band`: one of BANDS. Bad values are SpecErrors naming the option."""
    x = axis_name(x)
    if band not in BANDS:
        raise SpecError(f"--band: unknown band {band!r} (known: {', '.join(BANDS)})")
    smooth = resolve_smooth(groups, smooth)
    for fid in metrics or []:
        if fid not in FIGURES and fid not in PROFILES and fid not in EXTRA_FIGURES:
            known = ", ".join([*FIGURES, *PROFILES, *EXTRA_FIGURES])
            raise SpecError(f"--metrics: unknown figure {fid!r} (known: {known})")
    colours = group_colours(groups)
    out = Plot([], smooth=smooth, band=band, labels=[_label(g) for g in groups])
    for fid in metrics or [*FIGURES, *PROFILES, "survival"]:
        if fid == "reward_time" and x == "wall" and not metrics:
            continue  # the reward figure already is reward vs time
        if fid in PROFILES:
            panels = [p] if (p := profile_panel(fid, groups, colours, band)) is not None else []
        elif fid == "rewards":  # one figure per named reward; none for a task's own verifier
            names = reward_names([r for g in groups for r in g.runs])
            found = [metric_panel(f"reward_{n}", groups, colours, x, smooth, band, reward_figure(n)) for n in names]
            panels = [p for p in found if p is not None]
        elif fid == "survival":  # Kaplan-Meier time to collapse, where some run collapses
            panels = [Panel(name, draw, in_panel=False) for name, draw in survival_draws(groups, colours)]
        elif fid == "fit":  # held-out score against x with the saturating fit: on request only
            panels = [Panel(name, draw) for name, draw in fit_draws(groups, colours, x, band)]
        elif fid == "eval":
            tasks = sorted({t for g in groups for r in g.runs for t in r.eval_scores.task})
            panels = [p for t in tasks if (p := eval_panel(t, groups, colours, x, band)) is not None]
        else:
            panels = [p] if (p := metric_panel(fid, groups, colours, x, smooth, band)) is not None else []
        for p in panels:
            p.in_panel = bool(metrics) or fid in PANEL_FIGURES
        out.panels += panels
        out.skipped += [] if panels or (fid == "survival" and not metrics) else [fid]
    if not out.panels:
        raise SpecError("nothing to plot: no run logs any of " + ", ".join(metrics or [*FIGURES, *PROFILES]))
    return out


# --------------------------------------------------------------------------- figures and files


def make_figures(plot: Plot) -> dict[str, Figure]:
    """One Figure per panel, keyed by file stem."""
    figs = {}
    with matplotlib.rc_context(_RC):
        for p in plot.panels:
            fig = Figure(figsize=(7.0, 4.0), dpi=DPI, layout="constrained")
            p.draw(fig.add_subplot())
            figs[p.name] = fig
    return figs


def panel_grid(n: int, ncols: int = 3) -> tuple[int, int]:
    """(rows, columns) of the combined figure: one row up to `ncols` panels, 2 x 2 for four."""
    cols = 2 if n == 4 else min(ncols, n)
    return -(-n // cols), cols


def _shared_legend(fig: Figure, entries: dict[str, object], arm_labels: list[str], ncols: int = 6) -> None:
    """One legend below the grid, read row by row: the arms first, the line styles (dashed parts,
    the faint unsmoothed mean) on a row of their own. A legend wider than the figure widens it."""
    arms = [label for label in entries if label in arm_labels]
    styles = [label for label in entries if label not in arm_labels]
    cols = max(1, min(ncols, max(len(arms), len(styles))))
    blank = Line2D([], [], alpha=0)
    grid: list[list[tuple[str, object]]] = []
    for part in (arms, styles):
        cells = [(label, entries[label]) for label in part]
        cells += [("", blank)] * (-len(cells) % cols)
        grid += [cells[i : i + cols] for i in range(0, len(cells), cols)]
    by_column = [grid[r][c] for c in range(cols) for r in range(len(grid))]  # matplotlib fills columns
    legend = fig.legend(
        [h for _, h in by_column],
        [label for label, _ in by_column],
        loc="outside lower center",
        ncols=cols,
        fontsize=8,
        frameon=False,
    )
    fig.draw_without_rendering()
    need = legend.get_window_extent().width / fig.dpi + 0.4
    if need > fig.get_figwidth():
        fig.set_figwidth(need)


def make_panel(plot: Plot, title: str = "", ncols: int = 3) -> Figure:
    """The panels marked `in_panel` (all if none is) on one grid, with one legend for all of
    them below the grid (_shared_legend); no legend inside or beside a panel. What the band is
    goes in `title` (panel_title)."""
    panels = [p for p in plot.panels if p.in_panel] or plot.panels
    rows, cols = panel_grid(len(panels), ncols)
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(4.6 * cols, 3.4 * rows + 0.5), dpi=DPI, layout="constrained")
        entries: dict[str, object] = {}
        for i, p in enumerate(panels):
            ax = fig.add_subplot(rows, cols, i + 1)
            p.draw(ax)
            legend = ax.get_legend()
            if legend is not None:
                for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
                    entries.setdefault(text.get_text(), handle)
                legend.remove()
        # The note naming runs without reward signal is the same under every panel: said once,
        # in the title.
        signal = [t for ax in fig.axes for t in ax.texts if t.get_label() == SIGNAL_NOTE]
        if len(signal) == len(fig.axes) and len({t.get_text() for t in signal}) == 1:
            title = "\n".join(filter(None, [title, " ".join(signal[0].get_text().split())]))
            for t in signal:
                t.remove()
        if title:
            fig.suptitle(title)
        if entries:
            _shared_legend(fig, entries, plot.labels)
    return fig


def save_figure(fig: Figure, path: Path, fmt: str, dpi: int = DPI) -> Path:
    with matplotlib.rc_context(_RC):
        fig.savefig(path, format=fmt, dpi=dpi, metadata=_METADATA[fmt])
    return path


def default_out(runs: list[Run]) -> Path:
    """<experiment dir>/plots, or the runs' common folder when they span several experiments."""
    return Path(os.path.commonpath([str(r.path.parent.parent.resolve()) for r in runs])) / "plots"


def panel_title(runs: list[Run], groups: list[Group], plot: Plot, group_by: str = "arm") -> str:
    """The combined figure's title: experiments, seeds per group, the band, smoothing."""
    seeds = sorted({len(g.runs) for g in groups})
    per = f"{seeds[0]} seed{'s' if seeds[0] > 1 else ''}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]} seeds"
    text = f"{', '.join(sorted({r.experiment for r in runs}))}: {per} per {group_by}"
    if (band := legend_title(groups, plot.band)) is not None:
        text += f", {band}"
    return text + (f"; each seed EMA {plot.smooth:g}, unsmoothed mean faint" if plot.smooth else "")


def plot_runs(
    paths: list[str],
    *,
    out: Path | None = None,
    fmt: str = "png",
    metrics: list[str] | None = None,
    x: str = "step",
    smooth: float | str = SMOOTH_AUTO,
    band: str = "ci",
    group_by: str = "arm",
    panel: bool = True,
    dpi: int = DPI,
) -> tuple[list[Path], list[str]]:
    """Write one file per figure plus (`panel`) `panel.<fmt>`; returns (files written, figures skipped)."""
    if fmt not in FORMATS:
        raise SpecError(f"--format: unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    runs = load_runs(paths)
    groups = group_runs(runs, group_by)
    plot = build_plot(groups, metrics, x, smooth, band)
    out = Path(out) if out is not None else default_out(runs)
    out.mkdir(parents=True, exist_ok=True)
    written = [save_figure(f, out / f"{name}.{fmt}", fmt, dpi) for name, f in make_figures(plot).items()]
    if not panel:
        return written, plot.skipped
    written.append(
        save_figure(make_panel(plot, panel_title(runs, groups, plot, group_by)), out / f"panel.{fmt}", fmt, dpi)
    )
    return written, plot.skipped
