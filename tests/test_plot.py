"""`gspo plot` on hand-written run directories: the data actually drawn, not just the files."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from synthetic_runs import BATCH, GRPO_R, gspo_reward, length, make_experiment
from typer.testing import CliRunner

from gspo_cli.analysis.plot import build_plot, make_figures, make_panel, plot_runs
from gspo_cli.analysis.rundata import group_runs, load_runs
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError

runner = CliRunner()
T2 = 4.303  # t_{0.975}, 2 degrees of freedom
STEPS = np.arange(1, 21)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return make_experiment(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def groups(exp):
    return group_runs(load_runs([str(exp)]))


def _figs(groups, metrics, **kw):
    return make_figures(build_plot(groups, metrics, **kw))


def _line(ax, label):
    return next(line for line in ax.get_lines() if line.get_label() == label)


def test_reward_lines_are_seed_means(groups):
    ax = _figs(groups, ["reward"])["reward"].axes[0]
    gspo = _line(ax, "gspo (n=3)")
    expected = [np.mean([gspo_reward(k, t) for k in range(3)]) for t in STEPS]
    assert np.array_equal(gspo.get_xdata(), STEPS)
    assert np.allclose(gspo.get_ydata(), expected)
    # grpo seed 1 stopped at step 12: later points average the two seeds that have them.
    grpo = _line(ax, "grpo (n=3)")
    assert np.allclose(grpo.get_ydata()[:12], np.mean(GRPO_R))
    assert np.allclose(grpo.get_ydata()[12:], (GRPO_R[0] + GRPO_R[2]) / 2)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["grpo (n=3)", "gspo (n=3)"]
    assert ax.get_xlabel() == "step (rollout batches)" and ax.get_ylabel() == "mean reward"
    assert ax.get_title() == "Train reward"


def test_band_is_the_t_interval(groups):
    ax = _figs(groups, ["reward"])["reward"].axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # one per arm, in group order (grpo, gspo)
    verts = bands[1].get_paths()[0].vertices
    for t in (3, 6, 7, 20):  # 6 and 7: some seeds still at 0, a wide band
        vals = [gspo_reward(k, t) for k in range(3)]
        half = T2 * np.std(vals, ddof=1) / math.sqrt(3)
        ys = verts[np.isclose(verts[:, 0], t), 1]
        assert np.isclose(ys, np.mean(vals) - half).any() and np.isclose(ys, np.mean(vals) + half).any()


def test_clip_figure_log_scale_and_dashed_low_high(groups):
    ax = _figs(groups, ["clip"])["clip"].axes[0]
    assert ax.get_yscale() == "log"
    assert np.allclose(_line(ax, "gspo (n=3)").get_ydata(), 0.2)
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == 2 and np.allclose(dashed[1].get_ydata(), 0.1)  # gspo low = clip / 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["grpo (n=3)", "gspo (n=3)"] and labels[2].startswith("low")


def test_colours_stable_across_figures(groups):
    figs = _figs(groups, ["reward", "clip", "length"])
    colours = {name: _line(f.axes[0], "gspo (n=3)").get_color() for name, f in figs.items()}
    assert len(set(map(str, colours.values()))) == 1
    assert _line(figs["reward"].axes[0], "grpo (n=3)").get_color() != colours["reward"]


def test_eval_per_task(groups):
    figs = _figs(groups, ["eval"])
    ax = figs["eval_arith"].axes[0]
    gspo = _line(ax, "gspo (n=3)")
    assert np.array_equal(gspo.get_xdata(), [0, 10, 20])
    assert np.allclose(gspo.get_ydata(), [0.1, 0.4, 0.3])
    assert "grpo (n=3)" not in [line.get_label() for line in ax.get_lines()]  # grpo has no evals


def test_x_time_and_tokens(groups):
    ax = _figs(groups, ["length"], x="time")["length"].axes[0]
    assert np.allclose(_line(ax, "gspo (n=3)").get_xdata(), 2.0 * STEPS)
    assert ax.get_xlabel() == "training wall time [s]"
    ax = _figs(groups, ["reward"], x="tokens")["reward"].axes[0]
    tokens = np.mean([np.cumsum([length(k, t) * BATCH for t in STEPS]) for k in range(3)], axis=0)
    assert np.allclose(_line(ax, "gspo (n=3)").get_xdata(), tokens)


def test_smoothing_applies_per_seed_before_the_mean(groups):
    ax = _figs(groups, ["reward"], smooth=0.5)["reward"].axes[0]
    # grpo seeds are constant, so the debiased EMA leaves them unchanged.
    assert np.allclose(_line(ax, "grpo (n=3)").get_ydata()[:12], np.mean(GRPO_R))
    assert ax.get_ylabel() == "mean reward, EMA 0.5"


def test_missing_metric_skipped_and_unknown_refused(groups):
    plot = build_plot(groups, ["reward", "kl"])
    assert [p.name for p in plot.panels] == ["reward"] and plot.skipped == ["kl"]
    with pytest.raises(SpecError, match="unknown figure 'bogus'"):
        build_plot(groups, ["bogus"])
    with pytest.raises(SpecError, match="--x"):
        build_plot(groups, ["reward"], x="tokenz")
    assert len(make_panel(build_plot(groups, ["reward", "clip", "length", "eval"])).axes) == 4


def test_png_byte_identical_and_default_out(exp, tmp_path):
    first, _ = plot_runs([str(exp)], metrics=["reward", "clip"])
    assert first[0] == exp.resolve() / "plots" / "reward.png"
    again, _ = plot_runs([str(exp)], out=tmp_path, metrics=["reward", "clip"])
    assert [p.name for p in again] == ["reward.png", "clip.png", "panel.png"]
    for a, b in zip(first, again, strict=True):
        assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("fmt", ["svg", "pdf"])
def test_cli_vector_formats(exp, tmp_path, fmt):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        res = runner.invoke(app, ["plot", str(exp), "-f", fmt, "-m", "reward", "--out", str(out)])
        assert res.exit_code == 0, res.output
    assert sorted(p.name for p in outs[0].iterdir()) == [f"panel.{fmt}", f"reward.{fmt}"]
    assert (outs[0] / f"reward.{fmt}").read_bytes() == (outs[1] / f"reward.{fmt}").read_bytes()


def test_cli_no_runs_and_bad_options_exit_2(exp, tmp_path):
    for args in (
        ["plot", str(tmp_path)],
        ["plot", str(exp), "-m", "nope"],
        ["plot", str(exp), "-f", "gif"],
        ["plot", str(exp), "--smooth", "1.5"],
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        assert len(res.stderr.strip().splitlines()) == 1
