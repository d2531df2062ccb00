"""`gspo plot -m fit`: per evaluation set, each arm's held-out score against the plot's x axis (a
compute axis: `--x tokens`, samples, wall, or step) as seed means with their band, and its
saturating fit R(C) (stats.saturation, as the report fits it) dashed over it; an arm whose fit is not
identified is named in a note with the reason, and no curve is drawn for it."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from gspo_cli.analysis.figures.axes import finish_axes, score_limits
from gspo_cli.analysis.figures.curves import eval_curve
from gspo_cli.analysis.rundata.compute import AXES, eval_points
from gspo_cli.analysis.rundata.runs import Group
from gspo_cli.analysis.stats.saturation import Fit, arm_fit


def fit_curve(group: Group, task: str, axis: str) -> tuple[Fit, np.ndarray]:
    """The fit (identified as in the report, so with its bootstrap) and the x to draw it on: 0 to
    the largest compute."""
    fit = arm_fit(group, task, axis)
    top = max((float(x[-1]) for r in group.runs if len(x := eval_points(r, task, axis)[0])), default=0.0)
    return fit, np.linspace(0.0, top, 200)


def fit_draws(groups: list[Group], colours: dict, x: str, band: str) -> list[tuple[str, Callable[[Axes], None]]]:
    """(file stem, draw) per evaluation set some group has evaluations of."""
    tasks = sorted({t for g in groups for r in g.runs for t in r.eval_scores.task})
    return [(f"fit_{re.sub(r'[^A-Za-z0-9_.-]', '_', t)}", _draw(groups, colours, t, x, band)) for t in tasks]


def _draw(groups: list[Group], colours: dict, task: str, x: str, band: str) -> Callable[[Axes], None]:
    def draw(ax: Axes) -> None:
        notes, tops, fitted = [], [], False
        for g in groups:
            c = eval_curve(g, task, x, band)
            if c is None:
                continue
            colour = colours[g.name]
            ax.plot(c.x, c.mean, "o", color=colour, ms=3.5, label=f"{g.name} (n={len(g.runs)})", zorder=3)
            ok = np.isfinite(c.lo) & np.isfinite(c.hi)
            if ok.any():
                ax.vlines(c.x[ok], c.lo[ok], c.hi[ok], color=colour, alpha=0.35, lw=1)
            fit, xs = fit_curve(g, task, x)
            if fit.identified:
                ax.plot(xs, fit.predict(xs), "--", color=colour, lw=1.3, label="_fit " + g.name)
                ax.axhline(fit.a, color=colour, lw=0.6, ls=":", label="_asymptote " + g.name)
                fitted = True
            else:
                notes.append(f"{g.name}: no fit, {fit.reason}")
            tops.append(np.r_[c.mean, c.hi])
        if tops:
            score_limits(ax, np.concatenate(tops))
        styles = [  # in the legend only when some fit is drawn
            Line2D([], [], color="0.3", ls="--", label="saturating fit"),
            Line2D([], [], color="0.3", ls=":", lw=0.6, label="asymptote A (extrapolated)"),
        ][: 2 * fitted]
        title = f"Held-out {task} against compute"
        finish_axes(ax, title, AXES[x], "score (seed mean)", styles, notes, x == "step")

    return draw


__all__ = ["fit_draws"]
