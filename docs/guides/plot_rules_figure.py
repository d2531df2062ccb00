"""Draws docs/guides/no_signal_vs_normal.png: `gspo plot`'s reward panel for a run with reward
signal (left) and for one without (right), both from the hand-written run directories of
tests/synthetic_runs.py (no training involved). Run from the repository root:

    python docs/guides/plot_rules_figure.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from synthetic_runs import make_experiment, make_no_signal_experiment  # noqa: E402

from gspo_cli.analysis.figures.plot import _RC, build_plot, save_figure  # noqa: E402
from gspo_cli.analysis.rundata.runs import group_runs, load_runs  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        normal = make_experiment(Path(tmp) / "normal")
        silent = make_no_signal_experiment(Path(tmp) / "silent")
        with matplotlib.rc_context(_RC):
            fig = Figure(figsize=(10, 3.6), dpi=100, layout="constrained")
            for i, (exp, fid) in enumerate(((normal, "reward"), (silent, "reward"))):
                (panel,) = build_plot(group_runs(load_runs([str(exp)])), [fid]).panels
                ax = fig.add_subplot(1, 2, i + 1)
                panel.draw(ax)
                ax.set_title(("Run with reward signal" if i == 0 else "Run without reward signal") + ": train reward")
        save_figure(fig, Path(__file__).with_name("no_signal_vs_normal.png"), "png", dpi=100)


if __name__ == "__main__":
    main()
