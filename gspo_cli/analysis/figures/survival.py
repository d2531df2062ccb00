"""`gspo plot`'s `survival` figure: per evaluation set, each arm's Kaplan-Meier curve of time to
collapse (`stats.stability`) as a step function with its 95% Greenwood band (log-log), censored
runs marked where they were last seen intact. Drawn where some rated run collapses."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from matplotlib.axes import Axes

from gspo_cli.analysis.figures.axes import finish_axes
from gspo_cli.analysis.rundata.runs import Group
from gspo_cli.analysis.stats.stability import COLLAPSE_FRACTION, any_collapse, arm_curve, arm_times


def survival_draws(groups: list[Group], colours: dict) -> list[tuple[str, Callable[[Axes], None]]]:
    """(file stem, draw) per evaluation set on which some rated run collapses."""
    tasks = sorted({t for g in groups for r in g.runs for t in r.eval_scores.task})
    return [
        (f"survival_{re.sub(r'[^A-Za-z0-9_.-]', '_', t)}", _draw(groups, colours, t))
        for t in tasks
        if any_collapse(groups, t)
    ]


def _draw(groups: list[Group], colours: dict, task: str) -> Callable[[Axes], None]:
    def draw(ax: Axes) -> None:
        for g in groups:
            km = arm_curve(g, task)
            if km is None:
                continue
            times, events, _ = arm_times(g, task)
            x = np.r_[0.0, km.times]
            colour = colours[g.name]
            ax.step(x, np.r_[1.0, km.survival], where="post", color=colour, lw=1.4, label=f"{g.name} (n={len(times)})")
            lo, hi = np.r_[1.0, km.low], np.r_[1.0, km.high]
            for i in range(len(x) - 1):  # the band of each step, from its time to the next
                if np.isfinite(lo[i]) and np.isfinite(hi[i]) and hi[i] > lo[i]:
                    ax.fill_between(x[i : i + 2], lo[i], hi[i], color=colour, alpha=0.2, lw=0)
            cens = np.unique(times[~events])
            ax.plot(cens, [km.at(t) for t in cens], "|", color=colour, ms=9, mew=1.5, label="_censored " + g.name)
        ax.set_ylim(-0.02, 1.05)
        notes = [
            f"collapse: held-out score below {COLLAPSE_FRACTION:g} x the run's step-0 score; "
            "| censored: last seen intact; band: 95% Greenwood (log-log)"
        ]
        finish_axes(ax, f"Time to collapse ({task})", "step", "runs not yet collapsed (Kaplan-Meier)", (), notes, True)

    return draw


__all__ = ["survival_draws"]
