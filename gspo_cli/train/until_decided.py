"""`gspo sweep --until-decided`: train the comparison's two arms a round of seeds at a time and
stop as soon as the sequential rule (`analysis.sequential`) decides the spec's `comparison`, or
at --max-seeds.

A round adds `round_seeds` new seeds to both arms (default 1): the experiment's own `seeds` come
first (the first look, at least 2), then the next unused integers. After each round the paired
differences of the final held-out score (arm minus baseline, per seed both arms finished) are
looked at. Every round's runs are ordinary runs, so the command resumes like every sweep:
completed runs are skipped, and the looks before them are replayed from their files to the same
verdicts. Training is handed in (`train`), so this module reads run directories only (no torch).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gspo_cli.analysis.stats.sequential import Design, Look, look_schedule, sequential_looks
from gspo_cli.errors import RunError, SpecError
from gspo_cli.runs import RunDir, run_path
from gspo_cli.spec import ExperimentSpec

METHOD = (
    "group-sequential paired t test, Lan-DeMets alpha spending with an O'Brien-Fleming-like function "
    "(5% two-sided over all looks; equivalence: the 90% repeated interval within +-margin)"
)
LOWER_IS_BETTER = ("kl", "loss", "collapse")  # metric keys containing these: a decrease is better
FINISHED = ("completed", "diverged")


@dataclass
class Decision:
    """What --until-decided concluded: every look made, the verdict of the last, and the seeds."""

    baseline: str
    arm: str
    metric: str
    higher_is_better: bool
    margin: float | None
    max_seeds: int
    round_seeds: int
    schedule: list[int]
    seeds: list[int] = field(default_factory=list)  # the paired seeds of the last look, in order
    looks: list[Look] = field(default_factory=list)
    method: str = METHOD

    @property
    def verdict(self) -> str:
        return self.looks[-1].verdict if self.looks else "not resolved"

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict, "looks": [asdict(lk) for lk in self.looks]}

    def summary(self) -> str:
        if not self.looks:
            return "no look made yet"
        last = self.looks[-1]
        what = {
            "better": f"{self.arm} is better than {self.baseline}",
            "worse": f"{self.arm} is worse than {self.baseline}",
            "equivalent": f"{self.arm} and {self.baseline} are equivalent within +-{self.margin or 0:g}",
            "not resolved": f"{self.arm} vs {self.baseline}: not resolved at {self.max_seeds} seeds",
            "continue": f"{self.arm} vs {self.baseline}: undecided so far",
        }[last.verdict]
        direction = "higher" if self.higher_is_better else "lower"
        return (
            f"{what} on {self.metric} ({direction} is better): difference {last.delta:+.4f}, "
            f"95% repeated CI [{last.ci_low:+.4f}, {last.ci_high:+.4f}], {last.n} paired seeds, "
            f"look {len(self.looks)} of at most {len(self.schedule)}"
        )


def seed_order(spec_seeds: list[int], max_seeds: int) -> list[int]:
    """The seeds in the order they are added: the spec's, then the next unused integers."""
    out = list(dict.fromkeys(spec_seeds))[:max_seeds]
    nxt = max(out, default=-1) + 1
    while len(out) < max_seeds:
        out.append(nxt)
        nxt += 1
    return out


def final_value(path: Path, metric: str | None) -> tuple[float | None, str]:
    """A finished run's final value of `metric` and its name: None (the held-out score) is the
    first score (avg@K) of the last evaluation of the held-out split (else of the first named
    set); a score key of that evaluation; else a metrics.jsonl key, its last value. (None, name)
    when the run has not finished or has no such value."""
    rd = RunDir(path)
    if rd.status() not in FINISHED:
        return None, metric or "held-out score"
    evals = rd.evals()
    held = [e for e in evals if "set" not in e] or [e for e in evals if evals and e.get("set") == evals[0].get("set")]
    last = held[-1]["scores"] if held else {}
    if metric is None:
        key = next((k for k in last if k.startswith("avg@")), None)
        return (float(last[key]), key) if key else (None, "held-out score")
    if metric in last:
        return float(last[metric]), metric
    values = [m[metric] for m in rd.metrics() if isinstance(m.get(metric), (int, float))]
    return (float(values[-1]) if values else None), metric


def decide_until(
    spec: ExperimentSpec,
    max_seeds: int,
    round_seeds: int,
    train: Callable[[list[int]], None],
    log: Callable[[str], None] = lambda m: None,
) -> Decision:
    """Train `train(seeds)` (both arms of `spec.comparison`, those seeds; completed runs skipped)
    look by look until the comparison is decided or `max_seeds` is reached. SpecError without a
    comparison or with an impossible schedule; RunError when a round leaves a seed without a
    final value for both arms (a failed run: rerun to resume)."""
    c = spec.comparison
    if c is None:
        raise SpecError("--until-decided: the spec has no comparison section (comparison: {baseline: ARM, arm: ARM})")
    try:
        schedule = look_schedule(len(spec.seeds), round_seeds, max_seeds)
    except ValueError as err:
        raise SpecError(f"--max-seeds: {err} (the spec's seeds make the first look)") from None
    seeds = seed_order(spec.seeds, max_seeds)
    design = Design.of(schedule, max_seeds)
    metric = c.metric
    higher = metric is None or not any(w in metric.lower() for w in LOWER_IS_BETTER)
    decision = Decision(
        c.baseline, c.arm, metric or "held-out score", higher, c.margin, max_seeds, round_seeds, schedule
    )
    for n in schedule:
        train(seeds[:n])
        diffs, missing, name = [], [], decision.metric
        for s in seeds[:n]:
            base, name = final_value(run_path(spec.output_dir, spec.name, c.baseline, s), metric)
            arm, name = final_value(run_path(spec.output_dir, spec.name, c.arm, s), metric)
            if base is None or arm is None:
                missing.append(s)
            else:
                diffs.append((arm - base) if higher else (base - arm))
        decision.metric = name
        if missing:
            raise RunError(
                f"--until-decided: seed(s) {', '.join(map(str, missing))} have no final {name} for both "
                f"{c.baseline} and {c.arm} (a run failed or has no evaluation); rerun the same command to resume"
            )
        decision.seeds = seeds[:n]
        decision.looks = sequential_looks(diffs, design, c.margin)
        last = decision.looks[-1]
        log(
            f"look {len(decision.looks)}/{len(schedule)}: {n} paired seeds, difference {last.delta:+.4f}, "
            f"95% repeated CI [{last.ci_low:+.4f}, {last.ci_high:+.4f}]: {last.verdict}"
        )
        if last.verdict != "continue":
            break
    return decision


def write_decision(spec: ExperimentSpec, decision: Decision) -> Path:
    """<output_dir>/<experiment>/until_decided.json: the decision, for reports."""
    path = Path(spec.output_dir) / spec.name / "until_decided.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(decision.to_dict(), indent=1) + "\n")
    return path
