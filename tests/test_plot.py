"""`gspo plot` on hand-written run directories: the data actually drawn, not just the files."""

from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from synthetic_runs import BATCH, GRPO_R, gspo_reward, length, make_experiment, make_no_signal_experiment, write_run
from typer.testing import CliRunner

from gspo_cli.analysis.figures.curves import auto_smooth
from gspo_cli.analysis.figures.plot import build_plot, make_figures, make_panel, plot_runs
from gspo_cli.analysis.rundata.runs import ema, group_runs, load_runs
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError

runner = CliRunner()
T2 = 4.302653  # t_{0.975}, 2 degrees of freedom
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


# --------------------------------------------------------------------------- the default figure


def _long_experiment(root, steps: int, seeds: int = 1, moe: bool = True):
    """Arms grpo and gspo, `seeds` seeds, `steps` steps: reward alternating 0.2 / 0.4 (seed k adds
    0.01 k), token clip fraction 0.001 / 0.1, response length 12, expert change 0.09 (when `moe`),
    held-out every 50 steps."""
    for arm, clip in (("grpo", 0.001), ("gspo", 0.1)):
        for k in range(seeds):
            recs = [
                {
                    "step": t,
                    "reward/mean": (0.2 if t % 2 else 0.4) + 0.01 * k,
                    "policy/clip_frac_token": clip,
                    "response/length_mean": 12.0,
                }
                | ({"moe/expert_change_frac": 0.09} if moe else {})
                for t in range(1, steps + 1)
            ]
            evals = [
                {"step": s, "task": "math", "n": 8, "samples": 4, "scores": {"avg@4": 0.08 + 0.0001 * s}}
                for s in range(0, steps + 1, 50)
            ]
            write_run(root, arm, k, recs, evals=evals)
    return group_runs(load_runs([str(root / "exp")]))


def _drawn(fig):
    FigureCanvasAgg(fig).draw()  # extents exist once drawn
    return fig


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_default_panel_holds_the_paper_figures_the_runs_have(tmp_path, groups):
    # MoE runs: reward, held-out, clip and expert change on a 2 x 2 grid; every other figure with
    # data (here the response length) still gets its own file.
    plot = build_plot(_long_experiment(tmp_path, 60))
    assert [p.name for p in plot.panels] == ["reward", "eval_math", "clip", "expert_change", "length"]
    fig = make_panel(plot)
    assert [ax.get_title() for ax in fig.axes] == [
        "Train reward",
        "Held-out math (avg@4)",
        "Clipped-token fraction (GSPO paper, Fig. 2)",
        "MoE expert change (π_old vs π_θ)",
    ]
    assert [ax.get_subplotspec().get_geometry()[:2] for ax in fig.axes] == [(2, 2)] * 4
    # No expert change logged (a dense model): the panel is skipped, not drawn empty.
    fig = make_panel(build_plot(groups))
    assert [ax.get_title() for ax in fig.axes] == [
        "Train reward",
        "Held-out arith (avg@4)",
        "Clipped-token fraction (GSPO paper, Fig. 2)",
    ]
    assert {"engine_route_diff", "mismatch", "kl"} <= set(plot.skipped) and "expert_change" in build_plot(
        groups
    ).skipped


def test_one_shared_legend_outside_every_axes(groups):
    fig = _drawn(make_panel(build_plot(groups, ["reward", "clip", "length", "eval"])))
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]  # column by column: 2 rows of 2
    assert labels[0::2] == ["grpo (n=3)", "gspo (n=3)"]  # the arms' row
    assert labels[1].startswith("low:") and labels[3].startswith("high:")  # the line styles' row
    box = legend.get_window_extent()
    assert not any(_overlaps(box, ax.get_window_extent()) for ax in fig.axes)
    # a single figure: the legend beside the axes, not over them
    fig = _drawn(make_figures(build_plot(groups, ["reward"]))["reward"])
    ax = fig.axes[0]
    assert not _overlaps(ax.get_legend().get_window_extent(), ax.get_window_extent())
    assert ax.get_legend().get_window_extent().x1 <= fig.bbox.x1 + 1  # and inside the file


def test_the_no_signal_note_sits_below_the_axes(tmp_path):
    exp = make_no_signal_experiment(tmp_path)
    groups = group_runs(load_runs([str(exp)]))
    fig = _drawn(make_figures(build_plot(groups, ["reward", "length"]))["length"])
    ax = fig.axes[0]
    notes = [t for t in ax.texts if t.get_gid() == "gspo-note"]  # "on top of each other", then the signal
    assert [" ".join(t.get_text().split())[:30] for t in notes] == [
        "on top of each other: grpo = g",
        "no reward signal in grpo/seed0",
    ]
    boxes = [t.get_window_extent() for t in notes]
    assert boxes[0].y1 < ax.get_window_extent().y0 and boxes[1].y1 <= boxes[0].y0 + 1  # stacked below
    assert boxes[1].y0 >= fig.bbox.y0 - 1  # inside the file
    # the combined figure says it once, in its title, not under each of its panels
    fig = _drawn(make_panel(build_plot(groups)))
    assert len(fig.axes) == 2  # reward and clip: no evaluations, no MoE
    assert not [t for ax in fig.axes for t in ax.texts if "no reward signal" in t.get_text()]
    assert fig.get_suptitle().splitlines()[-1].startswith("no reward signal in grpo/seed0, gspo/seed0:")
    title = fig._suptitle.get_window_extent()
    assert not any(_overlaps(title, a.get_window_extent()) for a in fig.axes)


def test_smoothed_curve_with_the_unsmoothed_mean_faint_behind(tmp_path):
    groups = _long_experiment(tmp_path, 20, seeds=2)
    ax = _figs(groups, ["reward"], smooth=0.5)["reward"].axes[0]
    raw, smoothed = _line(ax, "_raw gspo"), _line(ax, "gspo (n=2)")
    means = [(0.2 if t % 2 else 0.4) + 0.005 for t in range(1, 21)]
    assert np.allclose(raw.get_ydata(), means)  # the mean over seeds, unsmoothed
    assert np.allclose(smoothed.get_ydata(), ema(np.array(means), 0.5))  # EMA is linear: mean of EMAs
    assert raw.get_alpha() < 0.5 and raw.get_zorder() < smoothed.get_zorder()
    assert "unsmoothed mean" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [ln for ln in _figs(groups, ["reward"])["reward"].axes[0].get_lines() if "_raw" in ln.get_label()]


def test_auto_smoothing_follows_the_run_length(tmp_path):
    assert auto_smooth(_long_experiment(tmp_path / "a", 20, moe=False)) == 0.0
    assert auto_smooth(_long_experiment(tmp_path / "b", 100, moe=False)) == 0.75
    long = _long_experiment(tmp_path / "c", 250, moe=False)
    assert auto_smooth(long) == 0.9
    plot = build_plot(long, ["reward"], smooth="auto")
    assert plot.smooth == 0.9
    assert make_figures(plot)["reward"].axes[0].get_ylabel() == "mean reward, EMA 0.9"
    with pytest.raises(SpecError, match="--smooth: 'lots'"):
        build_plot(long, ["reward"], smooth="lots")


@pytest.mark.parametrize("band", ["std", "range", "none"])
def test_band_choices(groups, band):
    ax = _figs(groups, ["reward"], band=band)["reward"].axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    if band == "none":
        assert not bands and ax.get_legend().get_title().get_text() == ""
        return
    verts = bands[1].get_paths()[0].vertices  # gspo
    vals = [gspo_reward(k, 7) for k in range(3)]  # 0.5, 0.6, 0
    lo, hi = (min(vals), max(vals)) if band == "range" else (np.mean(vals) - np.std(vals, ddof=1),) * 2
    if band == "std":
        hi = np.mean(vals) + np.std(vals, ddof=1)
    ys = verts[np.isclose(verts[:, 0], 7), 1]
    assert np.isclose(ys, lo).any() and np.isclose(ys, hi).any()
    assert (
        ax.get_legend().get_title().get_text().startswith({"std": "mean ± 1 std", "range": "mean, band min-max"}[band])
    )


def test_no_band_for_a_lone_seed(tmp_path):
    groups = _long_experiment(tmp_path, 30)
    for name, fig in make_figures(build_plot(groups, ["reward", "eval", "clip"])).items():
        assert not [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)], name
        assert fig.axes[0].get_legend().get_title().get_text() == ""


def test_held_out_axis_starts_at_0(tmp_path, groups):
    # one seed whose held-out score moves 0.080 -> 0.085: drawn on [0, 0.1], not zoomed into the noise
    ax = _figs(_long_experiment(tmp_path, 50), ["eval"])["eval_math"].axes[0]
    assert ax.get_ylim() == pytest.approx((0.0, 0.1))
    # bands count: gspo at step 10 has 0.3, 0.4, 0.5 -> 0.4 + 4.303 x 0.1 / sqrt(3) = 0.648 -> 0.75
    ax = _figs(groups, ["eval"])["eval_arith"].axes[0]
    assert ax.get_ylim() == pytest.approx((0.0, 0.75))


def test_cli_help_names_the_options_and_bad_values_exit_2(exp, tmp_path):
    res = runner.invoke(app, ["plot", "--help"], env={"COLUMNS": "200"})
    for option in ("--metrics", "--smooth", "--band", "--x", "--panel", "--no-panel", "--group-by", "--format"):
        assert option in res.stdout, option
    for args in (["--smooth", "lots"], ["--band", "iqr"]):
        res = runner.invoke(app, ["plot", str(exp), "-o", str(tmp_path), *args])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    res = runner.invoke(app, ["plot", str(exp), "-o", str(tmp_path / "x"), "-m", "reward", "--no-panel"])
    assert res.exit_code == 0 and sorted(p.name for p in (tmp_path / "x").iterdir()) == ["reward.png"]
