"""Honest axes for `gspo plot`: the rules that keep a figure from showing what the data do not.

- FLOOR: a value with |x| < FLOOR (1e-9) is float noise (a KL of 1e-14 from two forwards that
  agree to the last bit) and is drawn as 0, so noise never becomes a slope.
- A flat series stays flat: when everything drawn on an axis spans less than FLOOR, the
  y-range is set around it instead of stretched over the noise.
- Log scale only where the data can be read on one: every drawn value > 0: log; zeros beside
  positive values: symlog (linear below the smallest positive value, so zeros sit at 0 and
  are not clipped away); nothing but zeros: linear, with a note saying so. A log axis's
  bottom follows the lines, not a band over seeds that reaches 0.
- Ticks: integer steps on a step axis; never an offset label (`1e-7 + 0.5`) on a linear axis.
- Arms drawn on top of each other (the same x's, equal values at each) get markers and a note
  naming them, so no arm is hidden under another.
- A run without reward signal (every group's rewards equal at every step: all advantages 0,
  nothing learned) is named in a note on every panel it appears in.
- Notes sit below the axes, never over a curve.
- A held-out score (in [0, 1]) is drawn from 0: one seed's evaluation noise (a few problems
  more or less) never fills the panel as if it were a trend.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator, ScalarFormatter

# no_signal: the one test of a run without reward signal, shared with compare, report and the trainer.
from gspo_cli.metrics import FLOAT_NOISE, no_signal  # noqa: F401

FLOOR = FLOAT_NOISE
OVERLAP_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
NOTE_WIDTH = 60  # characters per line of a note: inside a panel of the combined figure
SIGNAL_NOTE = "_no_signal"  # the label of the note naming runs without reward signal
NOTE_STYLE = {"fontsize": 7, "color": "0.25", "ha": "left", "va": "top"}


def floor_noise(values: np.ndarray) -> np.ndarray:
    """`values` with every |x| < FLOOR set to 0 (NaN stays NaN)."""
    v = np.asarray(values, dtype=float).copy()
    v[np.abs(v) < FLOOR] = 0.0
    return v


def same_curve(x1, y1, x2, y2) -> bool:
    """Whether two curves coincide: every x of the shorter one is an x of the other (two arms
    that share only their step-0 point, a held-out score against compute, do not coincide), and
    at every shared x their y values differ by less than FLOOR (after flooring)."""
    shared, i1, i2 = np.intersect1d(np.asarray(x1, float), np.asarray(x2, float), return_indices=True)
    if not len(shared) or len(shared) < min(len(np.unique(x1)), len(np.unique(x2))):
        return False
    a, b = floor_noise(np.asarray(y1)[i1]), floor_noise(np.asarray(y2)[i2])
    ok = np.isfinite(a) & np.isfinite(b)
    return bool(ok.any()) and bool(np.all(np.abs(a[ok] - b[ok]) < FLOOR))


def overlapping(curves: list[tuple[str, np.ndarray, np.ndarray]]) -> list[list[str]]:
    """Groups of names (2 or more) whose curves coincide, in input order."""
    out: list[list[str]] = []
    placed: set[str] = set()
    for i, (name, x, y) in enumerate(curves):
        if name in placed:
            continue
        same = [n for n, x2, y2 in curves[i + 1 :] if n not in placed and same_curve(x, y, x2, y2)]
        if same:
            out.append([name, *same])
            placed.update([name, *same])
    return out


def choose_scale(values: np.ndarray) -> str:
    """'log' when every finite value is > 0, 'symlog' when zeros sit beside positive values,
    else 'linear' (all zero, or any negative value)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v) or (v < 0).any() or not (v > 0).any():
        return "linear"
    return "log" if (v > 0).all() else "symlog"


def apply_scale(ax: Axes, values: np.ndarray) -> str:
    """Set a log-wanting axis's y scale by `choose_scale`; returns the scale set."""
    scale = choose_scale(values)
    if scale == "log":
        ax.set_yscale("log", nonpositive="clip")
    elif scale == "symlog":
        v = np.asarray(values, dtype=float)
        smallest = float(v[np.isfinite(v) & (v > 0)].min())
        ax.set_yscale("symlog", linthresh=smallest, linscale=0.5)
    return scale


def tidy_ticks(ax: Axes, integer_x: bool) -> None:
    """Integer x ticks for steps; no offset (or scientific) label on linear axes."""
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axis in (ax.xaxis, ax.yaxis):
        fmt = axis.get_major_formatter()
        if isinstance(fmt, ScalarFormatter):
            fmt.set_useOffset(False)


def keep_flat(ax: Axes, values: np.ndarray) -> None:
    """A y-range around values that span less than FLOOR, so a flat series looks flat
    (matplotlib would stretch 1e-12 of noise over the whole axis)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v) or ax.get_yscale() != "linear" or v.max() - v.min() >= FLOOR:
        return
    mid = float(v.mean())
    half = max(abs(mid) * 0.1, 0.05)
    ax.set_ylim(mid - half, mid + half)


def add_notes(ax: Axes, notes: list[str], below=None, label: str = "_note"):
    """Notes below the axes (under the x label, or under the artist `below`, left-aligned with
    the axes), each wrapped at NOTE_WIDTH characters: outside the data area, so no curve is
    hidden; constrained layout makes room for them. Returns the text artist (None without notes);
    `label` tells kinds of notes apart (SIGNAL_NOTE)."""
    if not notes:
        return None
    return ax.annotate(
        "\n".join(textwrap.fill(n, NOTE_WIDTH) for n in notes),
        xy=(0.0, 0.0),
        xycoords=("axes fraction", below or ax.xaxis.label),  # x: the axes' left edge; y: below
        xytext=(0, -4),
        textcoords="offset points",
        annotation_clip=False,
        gid="gspo-note",
        label=label,
        **NOTE_STYLE,
    )


def log_bottom(ax: Axes) -> None:
    """On a log axis, the bottom follows the lines (a third of the smallest positive value any
    line draws), not a band over seeds whose lower edge reaches 0 or below (a 95% CI of two seeds
    often does), which a log axis cannot show: such a band runs into the bottom edge. On a symlog
    axis (zeros beside positive values) the bottom is 0: its margin would add a negative tick
    (-1e-4) to a quantity that is never negative."""
    if ax.get_yscale() not in ("log", "symlog"):
        return
    ys = [np.asarray(ln.get_ydata(), dtype=float) for ln in ax.get_lines()]
    v = np.concatenate(ys) if ys else np.zeros(0)
    v = v[np.isfinite(v)]
    if ax.get_yscale() == "symlog":
        if len(v) and (v >= 0).all():
            ax.set_ylim(bottom=0.0)
        return
    v = v[v > 0]
    if len(v):
        ax.set_ylim(bottom=float(v.min()) / 3)


def score_limits(ax: Axes, values: np.ndarray) -> None:
    """y from 0 to a round top above `values` (scores, bands included): the top is the largest
    finite value plus 15%, rounded up to a multiple of 0.05, at most 1.02 (a score of 1 stays
    visible above the frame's edge). No finite value: the axis is left as it is."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return
    top = min(1.02, max(0.05, np.ceil(max(float(v.max()), 0.0) * 1.15 / 0.05 - 1e-9) * 0.05))
    ax.set_ylim(0.0, top)


def finish_axes(
    ax: Axes,
    title: str,
    xlabel: str,
    ylabel: str,
    extra=(),
    notes=(),
    integer_x: bool = False,
    *,
    silent: list[str] = (),
    legend_title: str | None = None,
) -> None:
    """Titles, grid, legend (outside the axes, on the right: `extra` handles after the lines')
    and the rules above: ticks, a flat range for flat data, markers and a note for lines drawn on
    top of each other (labels starting with "_" are not counted), a note naming the `silent`
    runs (without reward signal), and any `notes` of the panel's own, all below the axes."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, lw=0.5)
    tidy_ticks(ax, integer_x)
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    if lines:
        keep_flat(ax, np.concatenate([np.asarray(ln.get_ydata(), float) for ln in lines]))
    notes = list(notes)
    by_label = {ln.get_label(): ln for ln in lines}
    for same in overlapping([(ln.get_label(), ln.get_xdata(), ln.get_ydata()) for ln in lines]):
        for k, name in enumerate(same):  # each its own marker: every arm stays visible
            by_label[name].set(marker=OVERLAP_MARKERS[k % len(OVERLAP_MARKERS)], ms=5 - k % 3, mfc="none")
        notes.append("on top of each other: " + " = ".join(n.split(" (n=")[0] for n in same))
    own = add_notes(ax, notes)
    if silent:  # a note of its own: the combined figure says it once (plot.make_panel)
        shown = ", ".join(silent[:4]) + (f" and {len(silent) - 4} more" if len(silent) > 4 else "")
        text = f"no reward signal in {shown}: every group's rewards equal at every step (advantages 0)"
        add_notes(ax, [text], below=own, label=SIGNAL_NOTE)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(
        [*handles, *extra],
        [*labels, *(h.get_label() for h in extra)],
        fontsize=7,
        title=legend_title,
        title_fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        borderaxespad=0.0,
        frameon=False,
    )
