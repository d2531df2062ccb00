"""Honest plots (gspo_cli.analysis.figures.axes): each rule checked on the figure's own data."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from synthetic_runs import make_experiment, make_no_signal_experiment, write_run

from gspo_cli.analysis.figures.axes import FLOOR, choose_scale, floor_noise, no_signal, overlapping, score_limits
from gspo_cli.analysis.figures.plot import build_plot, make_figures
from gspo_cli.analysis.rundata.runs import group_runs, load_runs


def _ax(path, fid, **kw):
    fig = make_figures(build_plot(group_runs(load_runs([str(path)])), [fid], **kw))[fid]
    FigureCanvasAgg(fig).draw()  # tick labels and offsets exist only once drawn
    return fig.axes[0]


def _notes(ax) -> str:
    return " ".join(" ".join(t.get_text().split()) for t in ax.texts if t.get_gid() == "gspo-note")  # unwrapped


def _line(ax, arm):
    return next(ln for ln in ax.get_lines() if ln.get_label().startswith(arm + " "))


@pytest.fixture(scope="module")
def silent(tmp_path_factory):
    return make_no_signal_experiment(tmp_path_factory.mktemp("silent"))


@pytest.fixture(scope="module")
def normal(tmp_path_factory):
    return make_experiment(tmp_path_factory.mktemp("normal"))


def test_no_log_scale_on_all_zero_data(silent):
    ax = _ax(silent, "clip")
    assert ax.get_yscale() == "linear"
    assert np.array_equal(_line(ax, "gspo").get_ydata(), np.zeros(12))
    assert "all values are 0: linear axis" in _notes(ax)


def test_zeros_beside_positive_values_use_symlog(tmp_path):
    recs = lambda c: [{"step": t, "policy/clip_frac_token": c} for t in range(1, 6)]  # noqa: E731
    write_run(tmp_path, "grpo", 0, recs(0.0))
    write_run(tmp_path, "gspo", 0, recs(0.02))
    ax = _ax(tmp_path / "exp", "clip")
    assert ax.get_yscale() == "symlog"
    assert np.array_equal(_line(ax, "grpo").get_ydata(), np.zeros(5))  # at 0, not clipped off the axis


def test_float_noise_drawn_as_zero_and_flat(silent):
    ax = _ax(silent, "kl")
    ys = _line(ax, "grpo").get_ydata()
    assert np.array_equal(ys, np.zeros(12))  # 1e-14 x step: noise, not a slope
    lo, hi = ax.get_ylim()
    assert lo == pytest.approx(-0.05) and hi == pytest.approx(0.05)


def test_integer_step_ticks(tmp_path):
    write_run(tmp_path, "gspo", 0, [{"step": t, "reward/mean": 0.1 * t} for t in (1, 2, 3)])
    ax = _ax(tmp_path / "exp", "reward")
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


def test_no_offset_label(tmp_path):
    # 0.5 plus a climb of a few 1e-6: matplotlib would write "+5e-1" above the axis
    write_run(tmp_path, "gspo", 0, [{"step": t, "reward/mean": 0.5 + 1e-6 * t} for t in range(1, 11)])
    ax = _ax(tmp_path / "exp", "reward")
    assert ax.yaxis.get_major_formatter().get_offset() == ""
    assert ax.xaxis.get_major_formatter().get_offset() == ""
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(lab.startswith("0.5") for lab in labels)


def test_overlapping_arms_stay_visible(silent):
    ax = _ax(silent, "length")
    grpo, gspo = _line(ax, "grpo"), _line(ax, "gspo")
    assert np.array_equal(grpo.get_ydata(), gspo.get_ydata())
    assert grpo.get_marker() != gspo.get_marker() and "None" not in (grpo.get_marker(), gspo.get_marker())
    assert "on top of each other: grpo = gspo" in _notes(ax)
    legend_markers = [h.get_marker() for h in ax.get_legend().legend_handles]
    assert legend_markers[:2] == [grpo.get_marker(), gspo.get_marker()]


def test_no_reward_signal_note(silent, normal):
    for fid in ("reward", "clip", "length"):
        assert "no reward signal in grpo/seed0, gspo/seed0" in _notes(_ax(silent, fid))
    ax = _ax(normal, "reward")
    assert _notes(ax) == ""  # a run with signal: no note at all
    assert ax.get_yscale() == "linear"


def test_normal_clip_figure_keeps_its_log_scale(normal):
    assert _ax(normal, "clip").get_yscale() == "log"


def test_rules_by_hand():
    assert FLOOR == 1e-9
    assert floor_noise(np.array([1e-14, -5e-10, 2e-9, np.nan])).tolist()[:3] == [0.0, 0.0, 2e-9]
    assert [choose_scale(np.array(v)) for v in ([0, 0], [0, 1e-3], [1e-3, 1], [-1, 1])] == [
        "linear",
        "symlog",
        "log",
        "linear",
    ]
    x = np.arange(3.0)
    assert overlapping([("a", x, x), ("b", x, x + 1e-12), ("c", x, x + 1)]) == [["a", "b"]]
    assert no_signal(np.array([1.0, 1.0]), np.array([])) and not no_signal(np.array([1.0, 0.5]), np.array([]))
    assert no_signal(np.array([]), np.array([0.0, 0.0])) and not no_signal(np.array([]), np.array([]))


def test_score_limits_by_hand():
    ax = Figure().add_subplot()
    for values, top in (([0.06, 0.11], 0.15), ([0.2, 0.25], 0.3), ([0.9, 1.0], 1.02), ([0.0, 0.0], 0.05)):
        score_limits(ax, np.array(values))
        assert ax.get_ylim() == pytest.approx((0.0, top)), values
    score_limits(ax, np.array([np.nan]))  # nothing finite: left as it was
    assert ax.get_ylim() == pytest.approx((0.0, 0.05))


def test_a_log_axis_follows_the_lines_not_a_band_through_0(tmp_path):
    # two seeds 0.001 and 0.003: mean 0.002, 95% CI 0.002 ± 12.7 x 0.001 reaches below 0
    for seed, c in ((0, 0.001), (1, 0.003)):
        write_run(tmp_path, "grpo", seed, [{"step": t, "policy/clip_frac_token": c} for t in range(1, 6)])
    ax = _ax(tmp_path / "exp", "clip")
    assert ax.get_yscale() == "log"
    assert ax.get_ylim()[0] == pytest.approx(0.002 / 3)


@pytest.mark.parametrize(("fid", "key"), [("kl", "policy/kl_old_k3"), ("grad_norm", "policy/grad_norm")])
def test_a_band_never_dips_below_what_the_quantity_can_be(tmp_path, fid, key):
    # two seeds 0.001 and 0.003: the 95% CI (0.002 ± 0.0127) reaches far below 0; a KL or a norm cannot
    for seed, v in ((0, 0.001), (1, 0.003)):
        write_run(tmp_path, "grpo", seed, [{"step": t, key: v} for t in range(1, 6)])
    ax = _ax(tmp_path / "exp", fid)
    (band,) = ax.collections
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() == 0.0 and ys.max() == pytest.approx(0.002 + 12.706 * 0.001, rel=1e-3)  # t(1) x sd / sqrt(2)


def test_a_fraction_band_stays_within_0_and_1(tmp_path):
    for seed, v in ((0, 0.2), (1, 0.9)):
        write_run(tmp_path, "grpo", seed, [{"step": t, "moe/expert_change_frac": v} for t in range(1, 6)])
    ax = _ax(tmp_path / "exp", "expert_change")
    ys = np.concatenate([p.vertices[:, 1] for p in ax.collections[0].get_paths()])
    assert (ys.min(), ys.max()) == (0.0, 1.0)


def test_a_symlog_axis_of_a_nonnegative_quantity_has_no_negative_tick(tmp_path):
    write_run(tmp_path, "grpo", 0, [{"step": t, "policy/clip_frac_token": 0.0} for t in range(1, 6)])
    for seed, c in ((0, 0.01), (1, 0.03)):  # a band through 0
        write_run(tmp_path, "gspo", seed, [{"step": t, "policy/clip_frac_token": c} for t in range(1, 6)])
    ax = _ax(tmp_path / "exp", "clip")
    assert ax.get_yscale() == "symlog" and ax.get_ylim()[0] == 0.0
    lo, hi = ax.get_ylim()
    assert [t for t in ax.get_yticks() if lo <= t <= hi and t < 0] == []
