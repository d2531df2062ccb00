"""The differences behind `gspo report`'s findings, as one family.

Every difference a finding shows is computed by the statistics engine (`gspo_cli.analysis.stats`,
through `differences.estimate`: paired over the seeds both arms have, Welch when none pair, the
held-out score from problem records where the runs have them), and Holm's correction runs over all
of them at once, so "significant" in the report means significant after the correction. Each one
not resolved says what would resolve it (seeds needed, or what to add).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gspo_cli.analysis.rundata.runs import Group, Run
from gspo_cli.analysis.stats import TESTED, Difference, Estimate, decide
from gspo_cli.analysis.tables.compare import Column, compare_runs
from gspo_cli.analysis.tables.differences import (
    build_differences,
    estimate,
    family_metrics,
    metric_direction,
    primary_key,
    spec_comparison,
    text_rows,
)
from gspo_cli.errors import SpecError

Key = tuple[str, str, str]  # (role a, role b, column id): the difference a - b


@dataclass(frozen=True)
class FindingDiff:
    """One difference of a finding: a - b with its interval, adjusted p and verdict."""

    diff: Difference | None  # None when a role is missing

    @property
    def delta(self) -> float:
        return self.diff.delta if self.diff is not None else math.nan

    @property
    def significant(self) -> int:
        """+1 / -1 when a - b is significantly above / below 0 after Holm, 0 otherwise."""
        d = self.diff
        if d is None or d.verdict not in TESTED:
            return 0
        return 1 if d.delta > 0 else -1

    def text(self, fmt: str = "+.3f") -> str:
        d = self.diff
        if d is None or not math.isfinite(d.delta):
            return "n/a"
        lo, hi = d.ci95
        ci = f" [{lo:{fmt}}, {hi:{fmt}}]" if math.isfinite(lo) else " (no CI)"
        p = f", adj. p {d.p_adjusted:.2g}" if math.isfinite(d.p_adjusted) else ""
        p += f", {d.family} family of {d.family_size}" if d.family else ""
        p += "".join(f"; warning: {w}" for w in d.warnings)
        if self.significant:
            return f"{d.delta:{fmt}}{ci} (significant; {d.method}{p})"
        why = d.resolution()
        return f"{d.delta:{fmt}}{ci} (not resolved; {d.method}{p}" + (f"; {why}" if why else "") + ")"


def finding_family(
    roles: dict[str, Group],
    keys: list[Key],
    values: dict[str, Callable[[Run], float]],
    columns: list[Column],
    tests: dict[str, tuple[int, Callable[[Group, Group], Estimate]]] | None = None,
    primary: Key | None = None,
) -> dict[Key, FindingDiff]:
    """The differences `keys` between roles, Holm over those whose roles exist. `values` maps a
    key's third part to a per-run value when it is not one of compare's `columns` (e.g. the
    off-policy log-ratio variance); `tests` to (direction, a test of two groups) when the
    difference is not one of per-run values (the log-rank test of time to collapse). `primary`: the
    spec comparison's key, tested alone at the full alpha as `compare` tests it (the same p); the
    other findings are one family. The spec's comparison.margin gives the equivalence tests, as in
    `compare` (none for a test of its own, such as the log-rank: its O − E has no unit of the metric)."""
    cols, tests = {c.id: c for c in columns}, tests or {}
    margin = spec_comparison(list(roles.values())).get("margin")
    items, present = [], []
    for a, b, col in keys:
        if a not in roles or b not in roles or (col not in cols and col not in values and col not in tests):
            continue
        if col in tests:
            direction, test = tests[col]
            items.append((a, b, col, direction, test(roles[a], roles[b])))
        else:
            column = cols.get(col) or Column(col, col, "", values[col])
            items.append((a, b, col, metric_direction(col), estimate(roles[a], roles[b], column)))
        present.append((a, b, col))
    first = [i for i, k in enumerate(present) if k == primary]
    rest = [i for i in range(len(present)) if i not in first]
    out = {}
    for idx, name in ((first, "primary"), (rest, "findings" if not first else "secondary")):
        margins = [None if present[i][2] in tests else margin for i in idx]
        rows = decide([items[i] for i in idx], margin=margins, family=name) if idx else []
        out |= {present[i]: FindingDiff(d) for i, d in zip(idx, rows)}
    return {k: out.get(k, FindingDiff(None)) for k in keys}


FAMILY_RULE = """\
- Every difference below (arm − arm) is computed the same way: paired over the seeds both arms
  have (the t interval on per-seed differences, n − 1 degrees of freedom), Welch's interval when
  no seeds pair, and for the held-out score, where every run has problem records, seeds t +
  problem bootstrap. The spec's comparison (its arm against its baseline on its metric), when it
  is one of them, is the primary: tested alone at the full alpha, with the p `gspo compare` gives
  it. It is **significant** when its p-value, adjusted by Holm's step-down over its family (the
  primary alone, or every other difference in the findings), is below 0.05, and, where the
  per-seed differences have an outlier or two modes, the exact sign-flip test agrees; a zero-width
  interval (every seed gave the same difference) is never significant. "Not resolved" gives the
  point estimate, the 95% interval, and what would resolve it (the seeds a paired design would
  need at the observed difference and spread, with 80% power: a plan from a small pilot, not a
  promise).
"""


def primary_lines(paths: list[str], command: str) -> list[str]:
    """A "## The pre-registered comparison" section: the spec's `comparison` (its arm against its
    baseline on its metric) exactly as `gspo compare` computes it by default (same columns, same
    window, tested alone at the full alpha: the same p), whether or not a finding uses it. Empty
    without a comparison section naming both arms."""
    comp = compare_runs(paths)
    section = spec_comparison(comp.groups)
    arm, base = section.get("arm"), section.get("baseline")
    if not arm or not base:
        return []
    head = ["## The pre-registered comparison", ""]
    names = [g.name for g in comp.groups]
    if arm not in names or base not in names:
        missing = ", ".join(n for n in (arm, base) if n not in names)
        return [*head, f"The spec's comparison names {missing}, which these runs do not have: no test.", ""]
    key = primary_key(section, base, comp.columns)
    if key is None:
        return [*head, f"The spec's comparison.metric {section.get('metric')!r} is not a column these runs have.", ""]
    try:
        table = build_differences(
            [g for g in comp.groups if g.name in (arm, base)],
            comp.columns,
            baseline=base,
            margin=section.get("margin"),
            metrics=family_metrics(comp.columns, explicit=False, spec_metric=section.get("metric")),
            primary=key,
            effect=section.get("effect"),
        )
    except SpecError as e:
        return [*head, f"Not computed: {e}", ""]
    header, rows = text_rows(table)
    d, row = next((d, r) for d, r in zip(table.rows, rows) if (d.arm, d.baseline, d.metric) == key)
    margin, effect = section.get("margin"), section.get("effect")
    fixed = f"margin {margin:g}" if margin is not None else "no margin (no equivalence verdict)"
    fixed += f", smallest effect of interest {effect:g}" if effect is not None else ""
    return [
        *head,
        f"The spec's `comparison`: `{arm}` against `{base}` on {table.labels.get(key[2], key[2])}, {fixed}; "
        f"tested alone at the full alpha, as `{command}` computes it (the same p).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        "| " + " | ".join(c.replace("|", "/") for c in row) + " |",
        "",
        *[f"- Warning: {w}" for w in d.warnings],
        *([""] if d.warnings else []),
    ]


__all__ = ["FAMILY_RULE", "FindingDiff", "Key", "finding_family", "primary_lines"]
