"""The figures a study reads its verdicts from: the differences figure draws the interval the
equivalence test uses (90%) with the margin band, and the per-arm held-out figure, whose bands are
unpaired, points to the paired one."""

from __future__ import annotations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from synthetic_runs import make_problem_experiment

from gspo_cli.analysis.figures.differences import differences_figure
from gspo_cli.analysis.figures.plot import build_plot, make_figures
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.analysis.tables.compare import compare_runs
from gspo_cli.analysis.tables.differences import build_differences


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    arms = {"grpo": 0.0, "gspo": 0.01}
    return make_problem_experiment(tmp_path_factory.mktemp("p"), arms=arms, seeds=(0, 1, 2, 3), problems=60)


def _figure(exp, margin):
    comp = compare_runs([str(exp)], metrics=["eval_final"])
    table = build_differences(comp.groups, comp.columns, baseline="grpo", margin=margin)
    fig = differences_figure(table)
    FigureCanvasAgg(fig).draw()
    return table, fig.axes[0]


def test_with_a_margin_the_differences_figure_draws_the_90_interval_and_the_band(exp):
    table, ax = _figure(exp, 0.05)
    (row,) = table.rows
    (ci90,) = [ln for ln in ax.get_lines() if ln.get_gid() == "ci90"]
    (ci95,) = [ln for ln in ax.get_lines() if ln.get_gid() == "ci95"]
    assert list(ci90.get_xdata()) == pytest.approx(list(row.estimate.ci(0.90)))
    assert list(ci95.get_xdata()) == pytest.approx(list(row.ci95))
    assert ci90.get_linewidth() > ci95.get_linewidth()
    (band,) = ax.patches  # the ±margin band, named in the legend
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["±0.05 (equivalence margin)"]
    assert band.get_label() == "±0.05 (equivalence margin)"
    assert "thick: 90% CI, read against the margin for equivalence" in ax.get_xlabel()


def test_without_a_margin_only_the_95_interval(exp):
    _, ax = _figure(exp, None)
    assert [ln.get_gid() for ln in ax.get_lines() if ln.get_gid()] == ["ci95"]
    assert ax.get_xlabel() == "difference from the baseline (95% CI)"


def test_the_per_arm_held_out_figure_points_to_the_paired_one(exp):
    fig = make_figures(build_plot(group_runs(load_runs([str(exp)])), ["eval"]))["eval_arith"]
    FigureCanvasAgg(fig).draw()
    notes = " ".join(" ".join(t.get_text().split()) for t in fig.axes[0].texts)
    assert (
        "bands per arm, unpaired: the paired differences (seed by seed) are in differences.png "
        "(gspo plot --baseline ARM)" in notes
    )
