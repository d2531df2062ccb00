"""When a comparison measures nothing, and why: runs without reward signal (every group's rewards
equal at every step, so every advantage is 0: `gspo_cli.metrics.no_signal`, the plot's test),
and arms that take the same gradient (`gspo_cli.spec.same_gradient`, the spec's load warning's
test). `gspo report` turns its findings into "not testable" with these reasons; `gspo compare`
prints them as notes."""

from __future__ import annotations

from gspo_cli.analysis.rundata import Group, Run
from gspo_cli.spec.same_gradient import same_gradient

NO_SIGNAL = (
    "no learning signal: every group's rewards were equal at every step, so every advantage was 0 "
    "and nothing was learned from the rewards"
)


def groups_same_gradient(a: Group, b: Group) -> str | None:
    """Why every run of `a` takes the same gradient as every run of `b` (`same_gradient`'s
    clause), or None when some pair can differ (or a run has no spec.yaml)."""
    whys = {
        same_gradient(ra.spec, ra.arm_spec, rb.spec, rb.arm_spec) if ra.arm_spec and rb.arm_spec else None
        for ra in a.runs
        for rb in b.runs
    }
    return whys.pop() if len(whys) == 1 and None not in whys else None


def same_gradient_notes(groups: list[Group]) -> list[str]:
    """One note per pair of groups that take the same gradient."""
    notes = []
    for i, a in enumerate(groups):
        for b in groups[i + 1 :]:
            if (why := groups_same_gradient(a, b)) is not None:
                notes.append(
                    f"{a.name} and {b.name} cannot differ, they take the same gradient: {why}. "
                    "Any difference between them is seed noise."
                )
    return notes


def no_signal_note(runs: list[Run]) -> str | None:
    """A note naming the runs without reward signal, None when every run had some."""
    silent = [r.label for r in runs if r.no_signal]
    if not silent:
        return None
    who = "every run" if len(silent) == len(runs) else ", ".join(silent)
    return f"{who}: {NO_SIGNAL}; the numbers measure no learning."


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
