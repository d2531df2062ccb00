"""When a comparison measures nothing, and why: runs without reward signal (every group's rewards
equal at every step, so every advantage is 0: `gspo_cli.metrics.no_signal`, the plot's test),
and arms that take the same gradient (`gspo_cli.spec.same_gradient`, the spec's load warning's
test). `gspo compare` prints these as notes; the report's `testable` section turns its findings
into "not testable" with the same reasons."""

from __future__ import annotations

from gspo_cli.analysis.rundata.runs import Group, Run
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


__all__ = ["NO_SIGNAL", "groups_same_gradient", "no_signal_note", "same_gradient_notes"]
