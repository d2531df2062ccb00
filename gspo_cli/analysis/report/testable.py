"""Which of the report's findings cannot be tested, and why: every run without reward signal, or
GRPO and GSPO taking the same gradient (the reasons and their wording: `analysis.tables.notes`,
which `gspo compare` prints as notes)."""

from __future__ import annotations

from gspo_cli.analysis.rundata.runs import Group
from gspo_cli.analysis.tables.notes import NO_SIGNAL, groups_same_gradient


def findings_untestable(roles: dict[str, Group]) -> str | None:
    """Why the report's comparative findings (1, 2, 3 and 5) cannot be tested on these arms, or
    None: every run of the paper's arms had no reward signal, or GRPO and GSPO take the same
    gradient."""
    runs = [r for g in roles.values() for r in g.runs]
    if runs and all(r.no_signal for r in runs):
        return f"{NO_SIGNAL} (in every run)"
    if "grpo" in roles and "gspo" in roles:
        grpo, gspo = roles["grpo"], roles["gspo"]
        if (why := groups_same_gradient(grpo, gspo)) is not None:
            return (
                f"GRPO (`{grpo.name}`) and GSPO (`{gspo.name}`) take the same gradient: {why}. "
                "The arms cannot differ; any difference between them is seed noise"
            )
    return None


def not_testable(findings: tuple[int, ...], why: str) -> list[str]:
    """The report's Markdown lines saying these findings are not testable, and why."""
    return [line for k in findings for line in (f"**{k}.** not testable: {why}.", "")]


def expert_change_untestable(roles: dict[str, Group]) -> str | None:
    """Why finding 4 (expert change per update) cannot be tested: no run had reward signal, so
    no update moved the policy by the rewards."""
    runs = [r for g in roles.values() for r in g.runs]
    return f"{NO_SIGNAL} (in every run)" if runs and all(r.no_signal for r in runs) else None
