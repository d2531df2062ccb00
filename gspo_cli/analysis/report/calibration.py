"""Calibration of compare's verdicts on real runs: A/A pseudo-experiments and a known handicap.

A pseudo-experiment takes k runs of arm A and k runs of arm B, renumbers each side's seeds 0..k-1
(so run i of A pairs with run i of B) and asks the statistics engine for compare's differences
(`differences.build_differences`, the held-out final score from problem records and the final
train reward, Holm over both). Between two names of one arm trained on disjoint seeds every
`better` / `worse` is a false positive; the rate is given with its Clopper-Pearson interval.

Two rates: over disjoint pseudo-experiments (no run in two of them: independent, so the binomial
interval is exact) and over many random, overlapping ones (every way of choosing runs counts the
same; a U-statistic: more precise as a point estimate, its interval from a delete-one-run jackknife).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np

from gspo_cli.analysis.rundata.runs import Group, Run
from gspo_cli.analysis.stats.calibration import FALSE, Rate, Verdicts, clopper_pearson, disjoint_blocks
from gspo_cli.analysis.tables.compare import build_columns
from gspo_cli.analysis.tables.differences import build_differences


def pseudo_experiment(arm: list[Run], base: list[Run], metrics: tuple[str, ...] = ("eval_final", "reward")) -> Verdicts:
    """compare's verdicts for arm vs base, run i of one side paired with run i of the other."""
    a = [replace(r, arm="arm", seed=i) for i, r in enumerate(arm)]
    b = [replace(r, arm="base", seed=i) for i, r in enumerate(base)]
    runs = a + b
    last = min(10, max(len(r.metrics) for r in runs)) or 10
    cols = build_columns(list(metrics), runs, last=last, threshold=None)
    table = build_differences([Group("arm", a), Group("base", b)], cols, baseline="base")
    return Verdicts({d.metric: (d.verdict, d.delta, *d.ci95, d.estimate.sd_pairs) for d in table.rows})


def disjoint_rate(a: list[Run], b: list[Run], k: int, metric: str | None = None) -> tuple[Rate, list[Verdicts]]:
    """A/A over disjoint pseudo-experiments: pair i is (a[i], b[i]); blocks of k pairs. `metric`:
    count that row only; None: any row of the family."""
    out = [
        pseudo_experiment([a[i] for i in blk], [b[i] for i in blk]) for blk in disjoint_blocks(min(len(a), len(b)), k)
    ]
    hits = sum(v.any_false() if metric is None else v.verdict(metric) in FALSE for v in out)
    return Rate(hits, len(out), clopper_pearson(hits, len(out)), "disjoint, Clopper-Pearson"), out


def overlapping_rate(pool: list[Run], k: int, draws: int, seed: int = 0, metrics: tuple = (None,)) -> dict:
    """A/A over `draws` random pseudo-experiments from one pool of runs of the same arm: 2k distinct
    runs, the first k one side. Per entry of `metrics` (a column id: that row; None: any row of the
    family) a Rate: a U-statistic, its interval the rate ± 1.96 jackknife SEs over runs (delete one
    run: the rate over the draws without it)."""
    rng = random.Random(seed)
    picks, found = [], []
    for _ in range(draws):
        idx = rng.sample(range(len(pool)), 2 * k)
        v = pseudo_experiment([pool[i] for i in idx[:k]], [pool[i] for i in idx[k:]])
        picks.append(set(idx))
        found.append([v.any_false() if m is None else v.verdict(m) in FALSE for m in metrics])
    n = len(pool)
    out = {}
    for j, m in enumerate(metrics):
        h = np.array([f[j] for f in found], dtype=float)
        p = float(h.mean())
        loo = np.array([h[[i not in s for s in picks]].mean() for i in range(n)])
        se = math.sqrt((n - 1) / n * float(((loo - loo.mean()) ** 2).sum()))
        ci = (max(0.0, p - 1.96 * se), min(1.0, p + 1.96 * se))
        out[m] = Rate(int(h.sum()), draws, ci, f"{draws} overlapping draws from {n} runs, jackknife over runs")
    return out


__all__ = ["disjoint_rate", "overlapping_rate", "pseudo_experiment"]
