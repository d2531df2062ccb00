"""Which reward a report's findings rest on, when the runs' specs list reward functions
(task.rewards): the train reward is their weighted sum (`reward/mean`), and the held-out
score's correctness (avg@K, pass@k) is the reward marked `correct: true`, or, without one,
evaluations report reward means only. Runs scored by their task's own verifier say nothing."""

from __future__ import annotations

from gspo_cli.analysis.rundata.runs import Run
from gspo_cli.spec.task import stored_reward_label


def weighted_sum(run: Run) -> str:
    """The run's task.rewards as the sum RL optimises, e.g. `0.2 x format + 1 x accuracy`."""
    terms = []
    for r in (run.spec.get("task") or {}).get("rewards") or []:
        label = stored_reward_label(r) if isinstance(r, dict) else None
        if label is not None:
            terms.append(f"{float(r.get('weight', 1.0)):g} x {label}")
    return " + ".join(terms).replace("+ -", "- ")


def reward_lines(runs: list[Run]) -> list[str]:
    """Markdown bullets naming the reward of the findings; [] when no run has named rewards."""
    named = [r for r in runs if r.reward_names]
    if not named:
        return []
    sums = sorted({weighted_sum(r) for r in named})
    judges = sorted({r.correct_reward or "" for r in named})
    lines = [f"- Reward (task.rewards): the findings' train reward is `reward/mean` = {' / '.join(sums)}"]
    if judges == [""]:
        lines.append(
            "- No reward is marked `correct: true`: evaluations report reward means (`reward_mean`, "
            "`reward_<name>`) and no pass@k; the held-out score is the first one they report"
        )
    else:
        shown = ", ".join(f"`{j}`" for j in judges if j) + (" (some runs: none)" if "" in judges else "")
        lines.append(f"- Held-out correctness (avg@K, pass@k): reward {shown} (`correct: true`, correct when >= 1)")
    return lines
