"""`gspo report`: the GSPO paper's findings (five), checked on an experiment's run directories.

The report is built from the same numbers `gspo compare` prints and the same figures `gspo
plot` draws; it adds, for each finding, differences between two arms from the statistics engine
(paired over seeds, Holm over every difference in the findings: `report.differences`) and a
verdict by rules fixed in advance (RULES below, printed in the report).
Arms are recognised by their settings, not their names: GRPO is `loss: grpo` without routing
replay, GRPO+RR the same with it (r2 or r3), GSPO `loss: gspo`, GSPO-token `loss: gspo_token`;
an arm with a mismatch correction is none of the paper's arms (the paper has none): it is
shown in the table, not used in the findings.
Each section is its own module beside this one (collapse, compute, ratio, rewards, testable, tools).
Like compare and plot, it reads files only and imports no torch.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np

from gspo_cli.analysis.figures.plot import plot_runs
from gspo_cli.analysis.report.collapse import (
    SURVIVAL_KEYS,
    collapse_lines,
    learning_lines,
    survival_lines,
    survival_test_line,
)
from gspo_cli.analysis.report.compute import REPORT_AXIS, compute_lines
from gspo_cli.analysis.report.differences import FAMILY_RULE, finding_family, primary_lines
from gspo_cli.analysis.report.plan import plan_lines
from gspo_cli.analysis.report.ratio import STABILITY_RULE, diagnostic_lines, offpolicy_logvar, stability_finding
from gspo_cli.analysis.report.rewards import reward_lines
from gspo_cli.analysis.report.testable import expert_change_untestable, findings_untestable, not_testable
from gspo_cli.analysis.report.tools import has_tools, tool_lines
from gspo_cli.analysis.rundata.runs import Group, Run, group_runs, load_runs
from gspo_cli.analysis.stats.stability import any_collapse, survival_estimate
from gspo_cli.analysis.tables.compare import Comparison, compare_runs, render
from gspo_cli.analysis.tables.differences import primary_metric, spec_comparison
from gspo_cli.analysis.tables.sequential import decision_line, sequential_decisions
from gspo_cli.errors import SpecError
from gspo_cli.files import write_report_file

ROLES = ("grpo", "grpo_rr", "gspo", "gspo_token")
ROLE_NAMES = {"grpo": "GRPO", "grpo_rr": "GRPO + routing replay", "gspo": "GSPO", "gspo_token": "GSPO-token"}
TABLE_METRICS = [
    "steps",
    "reward",
    "reward/mean",
    "eval_final",
    "eval_best",
    "rewards",
    "clip",
    "clip_seq",
    "expert_change",
    "kl",
    "step_time",
    "wall",
]
FIGURES = ["reward", "reward_time", "rewards", "eval", "clip", "expert_change", "engine_route_diff", "mismatch"]
FIGURES += ["logvar_length", "logvar_minibatch", "tools", "env_tokens", "survival"]  # tools: task.environment
FIGURE_DPI = 100  # small enough to commit beside the report
# Expert change per update the paper reports for its 48-layer MoE (section 5.3): ~10%.
PAPER_EXPERT_CHANGE = 0.10

RULES = (
    """\
Verdict rules (fixed before the runs; n = seeds per arm):
"""
    + FAMILY_RULE
    + """\
- Finding 1 (GSPO learns more per step than GRPO) holds if GSPO − GRPO is significantly > 0 for
  the final train reward or the final held-out score, and significantly < 0 for neither; it is
  reversed if GRPO is significantly better on one and GSPO on neither.
- Finding 2 (GSPO clips far more tokens than GRPO, yet learns better): the clipping part holds if
  GSPO's mean token clip fraction is at least 10x GRPO's (the paper: about 100x); "yet learns
  better" is finding 1's verdict.
- Finding 3 (GRPO needs routing replay on a MoE, GSPO does not) holds if GRPO+RR − GRPO is
  significantly > 0 on the final train reward (or some GRPO seeds diverge and no GRPO+RR seed
  does), and GSPO − GRPO+RR is not significantly < 0.
- Finding 4 (about 10% of the experts chosen for a rollout change after each update): holds if
  the mean expert change fraction (pi_old vs pi_theta, after each mini-batch, same tokens) is
  between 5% and 20%; otherwise the measured value is given against the paper's ~10%.
"""
)


def _paper_shaped(arm: dict) -> bool:
    """Whether an arm is one of the GSPO paper's algorithms: no other variant's aggregation,
    advantage, loss parameters, token filter, off-policy mask, overlong handling or dynamic
    sampling (a DAPO arm's loss is `grpo` too, but it is not the paper's GRPO)."""
    over = arm.get("overlong") or {}
    return (
        arm.get("aggregation", "seq_mean_token_mean") == "seq_mean_token_mean"
        and arm.get("advantage", "grpo") == "grpo"
        and not arm.get("loss_params")
        and (arm.get("token_filter") or {}).get("entropy_top") is None
        and arm.get("off_policy_mask") is None
        and not over.get("filter")
        and not over.get("buffer_frac")
        and not (arm.get("dynamic_sampling") or {}).get("max_rounds")
    )


def arm_role(run: Run) -> str | None:
    arm = run.arm_spec
    loss = arm.get("loss")
    if str((arm.get("mismatch") or {}).get("mode", "off")) != "off" or not _paper_shaped(arm):
        return None
    replay = str(arm.get("routing_replay", "off")) not in ("off", "False", "None")
    if loss == "grpo":
        return "grpo_rr" if replay else "grpo"
    if loss in ("gspo", "gspo_token") and not replay:
        return loss
    return None


def _roles(groups: list[Group]) -> dict[str, Group]:
    found: dict[str, Group] = {}
    for g in groups:
        roles = {arm_role(r) for r in g.runs}
        if len(roles) == 1 and (role := roles.pop()) is not None and role not in found:
            found[role] = g
    return found


def _values(group: Group, comp: Comparison, col: str) -> list[float]:
    """The per-seed values behind one compare cell (recomputed with the column's function)."""
    column = next(c for c in comp.columns if c.id == col)
    return [column.value(r) for r in group.runs]


def _mean(vals: list[float]) -> float:
    v = [x for x in vals if math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def _times(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.0f}x" if x >= 10 else f"{x:.2g}x"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if math.isfinite(x) else "n/a"


def _primary(roles: dict[str, Group], groups: list[Group], comp: Comparison):
    """The spec comparison's (role, role, column) when both its arms have a role here."""
    section = spec_comparison(groups)
    by_name = {g.name: role for role, g in roles.items()}
    metric = primary_metric(comp.columns, section.get("metric"))
    arm, base = by_name.get(section.get("arm")), by_name.get(section.get("baseline"))
    return (arm, base, metric) if arm and base and metric else None


def build_report(exp_dir: Path, *, out: Path, last: int = 25, smooth: float = 0.9) -> str:
    """Write figures next to `out` and return the report's Markdown text."""
    paths = [str(exp_dir)]
    runs = load_runs(paths)
    last = max(1, min(last, max(len(r.metrics) for r in runs)))  # "first 25 steps" of a 6-step run: 6
    groups = group_runs(runs, "arm")
    comp = compare_runs(paths, metrics=TABLE_METRICS, last=last)
    roles = _roles(groups)
    fig_dir = out.parent / "figures"
    figures = FIGURES if has_tools(runs) else [f for f in FIGURES if f not in ("tools", "env_tokens")]
    written, _ = plot_runs(paths, out=fig_dir, metrics=figures, smooth=smooth, panel=False, dpi=FIGURE_DPI)
    rel = lambda p: os.path.relpath(p, out.parent)  # noqa: E731
    eval_col = next((c.id for c in comp.columns if c.id.startswith("eval_final:")), None)
    eval_label = next((c.label.removesuffix(" final") for c in comp.columns if c.id == eval_col), "held-out score")

    def vals(role: str, col: str) -> list[float]:
        return _values(roles[role], comp, col) if role in roles else []

    keys = [("gspo", "grpo", "reward"), ("gspo", "grpo", "reward/mean"), ("grpo_rr", "grpo", "reward")]
    keys += [("gspo", "grpo_rr", "reward"), ("grpo", "grpo_rr", "logvar"), ("grpo", "gspo", "logvar")]
    keys += [("gspo", "grpo", eval_col), ("grpo_rr", "grpo", eval_col)] if eval_col else []
    eval_task = eval_col.split(":", 1)[1] if eval_col else None
    keys += SURVIVAL_KEYS if any_collapse(list(roles.values()), eval_task) else []
    tests = {"collapse": (-1, lambda a, b: survival_estimate(a, b, eval_task))}
    family = (
        {}
        if findings_untestable(roles)
        else finding_family(
            roles, keys, {"logvar": offpolicy_logvar}, comp.columns, tests, primary=_primary(roles, groups, comp)
        )
    )
    diff = lambda a, b, col: family[(a, b, col)]  # noqa: E731

    exp = sorted({r.experiment for r in runs})
    seeds = sorted({r.seed for r in runs})
    lines = [f"# {', '.join(exp)}: the GSPO paper's findings at tiny scale", ""]
    lines += plan_lines(out.parent, runs) + _setup_lines(runs, seeds)
    lines += _regime_lines(runs, last)
    lines += [
        "## Results",
        "",
        f"Mean ± 95% CI over seeds. Reward (last {last}): train reward over the last {last} steps; "
        "`reward/mean`: train reward averaged over all steps (area under the curve); clip columns, "
        "expert change, KL and s/step: means over all steps.",
        "",
    ]
    lines += render(comp, "markdown").rstrip("\n").splitlines()
    lines += [""]
    lines += _ratio_lines(roles, comp)
    lines += diagnostic_lines(groups)
    lines += tool_lines(paths, runs, last)  # [] without task.environment
    lines += primary_lines(paths, f"gspo compare {exp_dir.as_posix()}") + ["## Findings", ""]
    # Without signal, or with arms that take the same gradient, 1-3 and 5 compare seed noise.
    untestable = findings_untestable(roles)
    lines += not_testable((1, 2, 3), untestable) if untestable else _findings(roles, diff, vals, eval_col, eval_label)
    lines += _expert_finding(roles, vals, runs)
    lines += (
        not_testable((5,), untestable) if untestable else stability_finding(roles, lambda a, b: diff(a, b, "logvar"))
    )
    lines += [f"- {decision_line(d)}" for d in sequential_decisions(groups)]  # beside finding 1's row
    lines += ["", RULES + STABILITY_RULE]
    lines += learning_lines(groups, eval_task, eval_label, last)
    lines += collapse_lines(groups, eval_task, eval_label)
    tested = [k for k in SURVIVAL_KEYS if family.get(k) and family[k].diff is not None]
    lines += survival_lines(groups, eval_task, eval_label, [survival_test_line(family[k], roles, k) for k in tested])
    compute = compute_lines(groups, eval_task, eval_label)
    lines += compute
    fit = bool(compute) and not compute[2].startswith("Not computed")  # the fit's figure, on the same axis
    written += (
        plot_runs(paths, out=fig_dir, metrics=["fit"], x=REPORT_AXIS, panel=False, dpi=FIGURE_DPI)[0] if fit else []
    )
    lines += ["## Figures", ""]
    for p in written:
        lines += [f"![{p.stem}]({rel(p)})", ""]
    cmd_dir = exp_dir.as_posix()
    lines += [
        "## Regenerate",
        "",
        "Everything above comes from the run directories:",
        "",
        "```",
        f"gspo report {cmd_dir}                      # this file and figures/",
        f"gspo compare {cmd_dir} --last {last} -m {','.join(TABLE_METRICS)}",
        f"gspo plot {cmd_dir} --smooth {smooth:g} -m {','.join(figures)}   # at 150 dpi, + panel",
        *([f"gspo plot {cmd_dir} --x {REPORT_AXIS} -m fit --no-panel"] if fit else []),
        "```",
        "",
    ]
    return "\n".join(lines)


def _experts(b: dict) -> str:
    return f"{b.get('num_experts')} experts (top-{b.get('experts_per_token')})"


def _setup_lines(runs: list[Run], seeds: list[int]) -> list[str]:
    spec = runs[0].spec
    m, t, r, tr = spec.get("model", {}), spec.get("task", {}), spec.get("rollout", {}), spec.get("train", {})
    b = m.get("builtin", {})
    arm = (spec.get("arms") or [{}])[0]
    walls = [float(x.info.get("wall_s") or (x.series("time/elapsed_s").dropna().iloc[-1:].sum())) for x in runs]
    n_eval = next((e.get("n") for x in runs for e in x.evals if e.get("n")), t.get("eval_size"))
    lines = [
        "## Setup",
        "",
        f"- Model: `{m.get('name')}`"
        + (
            f", {b.get('num_layers')} layers, hidden {b.get('hidden_size')}, "
            + (_experts(b) if not str(m.get("name")).endswith("-dense") else "dense (no experts)")
            if str(m.get("name", "")).startswith("builtin:")
            else ""
        ),
        f"- Task: `{t.get('name')}` {t.get('params')}, {n_eval} held-out problems, "
        f"avg@{tr.get('eval_samples')} every {tr.get('eval_every')} steps",
        f"- Per step: {r.get('prompts_per_step')} prompts x {r.get('group_size')} samples, up to "
        f"{r.get('max_new_tokens')} new tokens, temperature {r.get('temperature')}; "
        f"{arm.get('mini_batches')} mini-batches per rollout batch (off-policy after the first); "
        f"{lr_text(spec.get('optimizer', {}))}; {tr.get('steps')} steps",
        f"- Seeds: {', '.join(map(str, seeds))}; runs: {len(runs)}; summed run wall time "
        f"{sum(walls) / 60:.1f} min (runs in parallel overlap)",
        *reward_lines(runs),
        "",
    ]
    return lines


def lr_text(opt: dict) -> str:
    """The learning rate and its schedule as the spec gives them: "lr 5e-05", "lr 5e-05,
    10 warm-up steps, linear decay to 0 x lr"."""
    out = f"lr {opt.get('lr')}"
    if opt.get("warmup_steps"):
        out += f", {opt['warmup_steps']} warm-up steps"
    if opt.get("decay", "constant") != "constant":
        out += f", {opt['decay']} decay to {opt.get('min_lr_ratio', 0.0):g} x lr"
    return out


def _regime_lines(runs: list[Run], last: int) -> list[str]:
    """Whether the question is meaningful here: rewards neither saturated nor zero, groups that
    carry a learning signal, and mini-batches that are really off-policy."""

    def pooled(key: str, head: bool) -> float:
        vals = []
        for r in runs:
            s = r.series(key).dropna()
            if len(s):
                vals.append(float((s.iloc[:last] if head else s).mean()))
        return float(np.mean(vals)) if vals else math.nan

    ev0 = [float(x.score) for r in runs for x in r.eval_scores.itertuples() if x.step == 0]
    items = [
        ("train reward over the first %d steps (all runs)" % last, pooled("reward/mean", True), ".3f"),
        ("held-out score at step 0", float(np.mean(ev0)) if ev0 else math.nan, ".3f"),
        (
            "share of groups with no reward variance (no signal), whole runs",
            pooled("reward/zero_var_group_frac", False),
            ".3f",
        ),
        ("KL(pi_old || pi_theta) per mini-batch, k3, whole runs", pooled("policy/kl_old_k3", False), ".2e"),
        ("share of sequences clipped (any arm's rule), whole runs", pooled("policy/clip_frac_seq", False), ".3f"),
    ]
    out = ["Regime (means over every run; is the comparison meaningful here?):", ""]
    out += [f"- {name}: {v:{fmt}}" for name, v, fmt in items if math.isfinite(v)]
    return out + [""]


def _ratio_lines(roles: dict[str, Group], comp: Comparison) -> list[str]:
    if "grpo" not in roles or len(roles) < 2:
        return []
    base = _mean(_values(roles["grpo"], comp, "clip"))
    out = ["Token clip fraction relative to GRPO's (ratio of seed means):", ""]
    for role in ROLES:
        if role in roles and role != "grpo":
            v = _mean(_values(roles[role], comp, "clip"))
            out.append(
                f"- {ROLE_NAMES[role]} (`{roles[role].name}`): {v:.4g} / {base:.4g} = "
                + (_times(v / base) if base > 0 else "n/a")
            )
    return out + [""]


def _findings(roles, diff, vals, eval_col, eval_label) -> list[str]:
    """Findings 1-3, the comparisons of arms."""
    out: list[str] = []
    has = lambda *rs: all(r in roles for r in rs)  # noqa: E731

    # 1. efficiency
    if has("gspo", "grpo"):
        d_rew, d_auc = diff("gspo", "grpo", "reward"), diff("gspo", "grpo", "reward/mean")
        d_ev = diff("gspo", "grpo", eval_col) if eval_col else None
        signs = [d_rew.significant] + ([d_ev.significant] if d_ev else [])
        verdict = (
            "holds"
            if 1 in signs and -1 not in signs
            else "reversed (GRPO better)"
            if -1 in signs and 1 not in signs
            else "not resolved"
        )
        out += [
            f"**1. GSPO learns more per step than GRPO — {verdict}.** GSPO − GRPO: final train reward "
            f"{d_rew.text()}; mean train reward over the run {d_auc.text()}"
            + (f"; final {eval_label} {d_ev.text()}" if d_ev else "")
            + ".",
            "",
        ]
        v1 = verdict
    else:
        out += ["**1.** not testable: needs a GRPO and a GSPO arm.", ""]
        v1 = "not testable"

    # 2. clipping
    if has("gspo", "grpo"):
        g, s = _mean(vals("grpo", "clip")), _mean(vals("gspo", "clip"))
        ratio = s / g if g > 0 else math.inf
        part = "holds" if ratio >= 10 else "does not hold"
        out += [
            f"**2. GSPO clips far more tokens than GRPO, yet learns better — clipping part {part}; "
            f"\"learns better\": {v1}.** Mean token clip fraction GSPO {s:.4g} vs GRPO {g:.4g}: "
            f"{_times(ratio)} (paper: about two orders of magnitude).",
            "",
        ]
    else:
        out += ["**2.** not testable: needs a GRPO and a GSPO arm.", ""]

    # 3. routing replay
    if has("grpo", "grpo_rr", "gspo"):
        d_rr = diff("grpo_rr", "grpo", "reward")
        d_g = diff("gspo", "grpo_rr", "reward")
        bad = {"diverged", "failed"}
        div = {role: sum(r.status in bad for r in roles[role].runs) for role in ("grpo", "grpo_rr")}
        needs = d_rr.significant == 1 or (div["grpo"] > 0 and div["grpo_rr"] == 0)
        verdict = "holds" if needs and d_g.significant != -1 else "does not hold at this scale"
        d_ev = diff("grpo_rr", "grpo", eval_col) if eval_col else None
        out += [
            f"**3. GRPO needs routing replay on a MoE, GSPO does not — {verdict}.** GRPO+RR − GRPO: final "
            f"train reward {d_rr.text()}"
            + (f", final {eval_label} {d_ev.text()}" if d_ev else "")
            + f"; GSPO (no replay) − GRPO+RR: final train reward {d_g.text()}. Diverged/failed runs: GRPO "
            f"{div['grpo']}/{len(roles['grpo'].runs)}, GRPO+RR {div['grpo_rr']}/{len(roles['grpo_rr'].runs)}.",
            "",
        ]
    else:
        out += ["**3.** not testable: needs GRPO, GRPO+RR and GSPO arms.", ""]
    return out


def _expert_finding(roles, vals, runs) -> list[str]:
    """Finding 4, the expert change per update (any of the paper's arms)."""
    out: list[str] = []
    per_role = {role: _mean(vals(role, "expert_change")) for role in ROLES if role in roles}
    per_role = {k: v for k, v in per_role.items() if math.isfinite(v)}
    if per_role and (why := expert_change_untestable(roles)):
        out += [f"**4.** not testable: {why}.", ""]
    elif per_role:
        overall = float(np.mean(list(per_role.values())))
        layers = (runs[0].spec.get("model", {}).get("builtin", {}) or {}).get("num_layers")
        verdict = (
            "holds"
            if 0.05 <= overall <= 0.20
            else ("lower at this scale" if overall < 0.05 else "higher at this scale")
        )
        per = ", ".join(f"{ROLE_NAMES[k]} {_pct(v)}" for k, v in per_role.items())
        out += [
            f"**4. About 10% of the routed experts change after each update — {verdict}.** Mean expert "
            f"change fraction {_pct(overall)} ({per})"
            + (f" on {layers} layers" if layers else "")
            + f"; the paper: ~{PAPER_EXPERT_CHANGE:.0%} on 48 layers.",
            "",
        ]
    else:
        out += ["**4.** not testable: no run logs `moe/expert_change_frac` (a dense model?).", ""]
    return out


def write_report(exp_dir: str | Path, out: str | Path | None = None, *, last: int = 25, smooth: float = 0.9) -> Path:
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        what = "not a directory (give an experiment directory, e.g. results/paper_tiny)" if exp_dir.exists() else None
        raise SpecError(f"{exp_dir}: {what or 'no such directory'}")
    out = Path(out) if out is not None else exp_dir / "REPORT.md"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        text = build_report(exp_dir, out=out, last=last, smooth=smooth)
        if (kept := write_report_file(out, text)) is not None:
            warnings.warn(
                f"{out}: written by hand or edited since gspo wrote it: your copy is kept as {kept}", stacklevel=2
            )
    except OSError as err:
        raise SpecError(f"--out: cannot write the report beside {out}: {err.strerror or err}") from None
    return out


__all__ = ["RULES", "arm_role", "build_report", "write_report"]
