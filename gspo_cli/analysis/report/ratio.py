"""The report's ratio diagnostic: token log-ratio variance by response length and by
mini-batch, per arm (the GSPO paper's argument for sequence-level ratios), and the
stability finding built on it. Values come from the run directories' `ratio/logvar_*`
metrics (gspo_cli.train.stats.record_logratio_var)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from gspo_cli.analysis.rundata.runs import Group, Run

LEN_PREFIX, MB_PREFIX = "ratio/logvar_len_", "ratio/logvar_mb"
ROLE_NAMES = {"grpo": "GRPO", "grpo_rr": "GRPO + routing replay", "gspo": "GSPO", "gspo_token": "GSPO-token"}

STABILITY_RULE = """\
- Finding 5 (without routing replay GRPO's token ratios are noisier, so it trains less stably
  than GSPO and GRPO+RR): holds if GRPO's off-policy token log-ratio variance (mini-batches after
  the first, mean over steps) is significantly greater than both GRPO+RR's and GSPO's, or if some
  GRPO seeds diverge and no GRPO+RR or GSPO seed does. Growth with response length is given
  per arm as the variance of the longest populated length bucket over the shortest's.
"""


def _buckets(runs: list[Run], prefix: str) -> list[str]:
    found = {c[len(prefix) :] for r in runs for c in r.metrics.columns if c.startswith(prefix)}
    return sorted(found, key=lambda b: [int(t) if t.isdigit() else math.inf for t in b.split("_")])


def run_mean(run: Run, key: str) -> float:
    """The run's mean over logged steps of one metric (NaN if it never logs it)."""
    s = run.series(key).dropna()
    return float(s.mean()) if len(s) else math.nan


def offpolicy_logvar(run: Run) -> float:
    """Mean over steps of the token log-ratio variance pooled over mini-batches 1.. (the off-policy
    ones); mini-batches weigh equally."""
    keys = [c for c in run.metrics.columns if c.startswith(MB_PREFIX) and c != MB_PREFIX + "0"]
    if not keys:
        return math.nan
    per_step = run.metrics[keys].astype(float).mean(axis=1, skipna=True).dropna()
    return float(per_step.mean()) if len(per_step) else math.nan


def run_staleness(run: Run) -> int:
    """The run's rollout.staleness (0 for specs from before the field)."""
    return int(((run.spec or {}).get("rollout") or {}).get("staleness") or 0)


def _seed_mean(group: Group, fn: Callable[[Run], float]) -> float:
    vals = [v for v in (fn(r) for r in group.runs) if math.isfinite(v)]
    return float(np.mean(vals)) if vals else math.nan


def diagnostic_lines(groups: list[Group]) -> list[str]:
    """Two Markdown tables (arms x length buckets, arms x mini-batch index) of seed means of
    run means; empty when no run logs the diagnostic."""
    runs = [r for g in groups for r in g.runs]
    lens, mbs = _buckets(runs, LEN_PREFIX), _buckets(runs, MB_PREFIX)
    if not lens and not mbs:
        return []
    stale = sorted({r.arm for r in runs if run_staleness(r) > 0})
    mb0 = (
        "0 is the first; it is on-policy only at rollout.staleness 0, and these arms sample one update behind "
        f"(staleness 1: {', '.join(stale)}), so their mini-batch 0 already includes one update's drift"
        if stale
        else "0 is on-policy"
    )
    out = [
        "## Ratio diagnostic",
        "",
        "Variance of token log(π_θ/π_old) over response tokens (nats², mean over steps, then over seeds): "
        f"by response length and by mini-batch index within the step ({mb0}; later mini-batches "
        "are further off-policy). GSPO's argument: token-level ratios carry noise that grows with length "
        "and with staleness.",
        "",
    ]
    for prefix, buckets, head in ((LEN_PREFIX, lens, "length"), (MB_PREFIX, mbs, "mini-batch")):
        if not buckets:
            continue
        labels = [b.replace("_inf", "+").replace("_", "-") for b in buckets]
        out += [f"| arm | {' | '.join(f'{head} {x}' for x in labels)} |", "|---" * (len(buckets) + 1) + "|"]
        for g in groups:
            cells = [_seed_mean(g, lambda r, k=prefix + b: run_mean(r, k)) for b in buckets]
            out.append(f"| {g.name} | " + " | ".join(f"{v:.3g}" if math.isfinite(v) else "–" for v in cells) + " |")
        out.append("")
    return out


def stability_finding(roles: dict[str, Group], diff_fn: Callable) -> list[str]:
    """Finding 5 by STABILITY_RULE. `diff_fn(a, b)`: the report's difference of roles a - b in the
    off-policy log-ratio variance (`report.differences.FindingDiff`)."""
    need = ("grpo", "grpo_rr", "gspo")
    if not all(r in roles for r in need):
        return ["**5.** not testable: needs GRPO, GRPO+RR and GSPO arms.", ""]
    vals = {role: [offpolicy_logvar(r) for r in roles[role].runs] for role in need}
    if not any(math.isfinite(v) for vs in vals.values() for v in vs):
        return ["**5.** not testable: no run logs `ratio/logvar_mb*` (runs from an older version).", ""]
    d_rr, d_gs = diff_fn("grpo", "grpo_rr"), diff_fn("grpo", "gspo")
    bad = {"diverged", "failed"}
    div = {role: sum(r.status in bad for r in roles[role].runs) for role in need}
    holds = (d_rr.significant == 1 and d_gs.significant == 1) or (
        div["grpo"] > 0 and div["grpo_rr"] == 0 and div["gspo"] == 0
    )
    growth = []
    for role in need:
        runs = roles[role].runs
        lens = _buckets(runs, LEN_PREFIX)
        if len(lens) >= 2:
            lo = _seed_mean(roles[role], lambda r, k=LEN_PREFIX + lens[0]: run_mean(r, k))
            hi = _seed_mean(roles[role], lambda r, k=LEN_PREFIX + lens[-1]: run_mean(r, k))
            if lo > 0 and math.isfinite(hi):
                growth.append(f"{ROLE_NAMES[role]} {hi / lo:.2g}x")
    means = ", ".join(f"{ROLE_NAMES[k]} {np.nanmean(v):.3g}" for k, v in vals.items())
    return [
        f"**5. Without routing replay GRPO's token ratios are noisier and it trains less stably — "
        f"{'holds' if holds else 'does not hold'}.** Off-policy token log-ratio variance (nats²): {means}; "
        f"GRPO − GRPO+RR {d_rr.text('+.3g')}, GRPO − GSPO {d_gs.text('+.3g')}. Diverged/failed runs: "
        + ", ".join(f"{ROLE_NAMES[k]} {div[k]}/{len(roles[k].runs)}" for k in need)
        + "."
        + (f" Longest over shortest length bucket: {', '.join(growth)}." if growth else ""),
        "",
    ]
