"""`gspo sweep --until-decided`: train the comparison's two arms a round of seeds at a time and
stop as soon as the sequential rule (`analysis.stats.sequential`) decides the spec's `comparison`,
or at max_seeds.

The design is fixed before the first look: `comparison.max_seeds` and `comparison.round_seeds` in
the spec (or --max-seeds / --round-seeds when the spec leaves them out; a flag that contradicts the
spec is refused). A round adds `round_seeds` new seeds to both arms (default 1): the experiment's
own `seeds` come first (the first look, at least 2), then the next unused integers. A rerun whose
design differs from the one recorded in until_decided.json is refused: a stopping rule changed
after looking is a deviation, not a rerun.

After each round the look decides on the same estimate `gspo compare` shows for those runs: for
the held-out score with problem records in every run, the seeds x problems model (seeds t +
problem bootstrap, its Satterthwaite degrees of freedom); otherwise the paired t over seeds. The
look's boundary is the paired t's (`t_boundaries`), carried to that estimate at the same nominal
level, and never narrower than compare's fixed-design interval. Every round's runs are ordinary
runs, so the command resumes like every sweep: completed runs are skipped, and the looks before
them are replayed from their files to the same verdicts. Training is handed in (`train`), so this
module reads run directories only (no torch).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gspo_cli.analysis.rundata.runs import load_run
from gspo_cli.analysis.stats import Estimate, problem_difference
from gspo_cli.analysis.stats.sequential import Design, Look, look_schedule, sequential_looks
from gspo_cli.analysis.tables.differences import problem_records
from gspo_cli.errors import RunError, SpecError
from gspo_cli.metrics import direction
from gspo_cli.runs import RunDir, run_path
from gspo_cli.spec import ExperimentSpec

METHOD = (
    "group-sequential t test, Lan-DeMets alpha spending with an O'Brien-Fleming-like function, boundaries "
    "for the paired t from its simulated null law at the planned looks, applied to the estimate gspo compare "
    "shows (5% two-sided over all looks; equivalence: the 90% repeated interval within +-margin)"
)
DECISION_FILE = "until_decided.json"
DESIGN_KEYS = ("baseline", "arm", "margin", "max_seeds", "round_seeds", "schedule")
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
    design_from: str = "spec"  # where max_seeds and round_seeds came from: "spec" or "command line"

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


def plan_design(spec: ExperimentSpec, max_seeds: int | None, round_seeds: int | None) -> tuple[int, int, str]:
    """(max_seeds, round_seeds, where they came from) for `spec`'s comparison: the spec's, or the
    flags where the spec leaves them out. SpecError without a comparison, without max_seeds, or
    with a flag that contradicts the spec (the stopping rule is fixed in the spec, in advance)."""
    c = spec.comparison
    if c is None:
        raise SpecError("--until-decided: the spec has no comparison section (comparison: {baseline: ARM, arm: ARM})")
    for flag, given, fixed, key in (
        ("--max-seeds", max_seeds, c.max_seeds, "max_seeds"),
        ("--round-seeds", round_seeds, c.round_seeds, "round_seeds"),
    ):
        if given is not None and fixed is not None and given != fixed:
            raise SpecError(
                f"{flag} {given}: the spec's comparison fixes {key}: {fixed} (the stopping rule is set before the "
                "first look; change the spec before training, not between looks)"
            )
    top = c.max_seeds if c.max_seeds is not None else max_seeds
    if top is None:
        raise SpecError(
            "--until-decided: give comparison.max_seeds in the spec (or --max-seeds N), the most seeds per arm"
        )
    step = c.round_seeds if c.round_seeds is not None else (round_seeds or 1)
    return top, step, "spec" if c.max_seeds is not None else "command line"


def schedule_of(spec: ExperimentSpec, max_seeds: int, round_seeds: int) -> list[int]:
    """The looks (paired seeds at each); SpecError when impossible."""
    try:
        return look_schedule(len(spec.seeds), round_seeds, max_seeds)
    except ValueError as err:
        raise SpecError(f"--max-seeds: {err} (the spec's seeds make the first look)") from None


def planned_looks(spec: ExperimentSpec, max_seeds: int, round_seeds: int) -> list[dict]:
    """The looks and their boundaries, as `--until-decided --dry-run` prints them: seeds, the
    paired t's boundary for the 95% repeated interval and its two-sided nominal level, and the
    boundary of the 90% one (equivalence)."""
    from scipy import stats

    schedule = schedule_of(spec, max_seeds, round_seeds)
    design = Design.of(schedule, max_seeds)
    return [
        {
            "look": k + 1,
            "seeds": n,
            "boundary": float(design.critical[k]),
            "nominal_p": float(2 * stats.t.sf(design.critical[k], n - 1)),
            "boundary_equivalence": float(design.critical_eq[k]),
        }
        for k, n in enumerate(schedule)
    ]


def check_design(spec: ExperimentSpec, decision: Decision) -> None:
    """SpecError when the experiment's until_decided.json was made with another design (arms,
    margin, max_seeds, round_seeds, looks): rerunning with another stopping rule after looking
    would overwrite the record of the first."""
    path = Path(spec.output_dir) / spec.name / DECISION_FILE
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    new = decision.to_dict()
    changed = [f"{k} {old.get(k)!r} there, {new[k]!r} now" for k in DESIGN_KEYS if k in old and old[k] != new[k]]
    if changed:
        raise SpecError(
            f"--until-decided: {path} records a decision under another design ({'; '.join(changed)}); changing the "
            "stopping rule after looking is a deviation: restore the design, or give the experiment another name "
            "to start a new one"
        )


def held_out_records(path: Path):
    """The problem records of the run's last held-out evaluation (the one `final_value` reads),
    or None (no records: a run written before them, or no evaluation)."""
    rd = RunDir(path)
    if rd.status() not in FINISHED:
        return None
    run = load_run(rd)
    held = [e for e in run.evals if "step" in e and "set" not in e]
    if not held:
        named = [e for e in run.evals if "step" in e]
        held = [e for e in named if named and e.get("set") == named[0].get("set")]
    if not held:
        return None
    last = held[-1]
    return problem_records(run, str(last.get("set") or last.get("task", "eval")))


def look_estimate(spec: ExperimentSpec, seeds: list[int]) -> Estimate | None:
    """The estimate `gspo compare` shows for the held-out score of these seeds' runs: the seeds x
    problems model when every run has problem records; None otherwise (the paired t over seeds,
    which compare shows too)."""
    c = spec.comparison
    recs = {
        side: {s: held_out_records(run_path(spec.output_dir, spec.name, name, s)) for s in seeds}
        for side, name in (("arm", c.arm), ("base", c.baseline))
    }
    if any(v is None for side in recs.values() for v in side.values()):
        return None
    return problem_difference(recs["arm"], recs["base"])


def decide_until(
    spec: ExperimentSpec,
    max_seeds: int | None,
    round_seeds: int | None,
    train: Callable[[list[int]], None],
    log: Callable[[str], None] = lambda m: None,
    after_look: Callable[[Decision], None] = lambda d: None,
) -> Decision:
    """Train `train(seeds)` (both arms of `spec.comparison`, those seeds; completed runs skipped)
    look by look until the comparison is decided or max_seeds is reached (`plan_design`: the
    spec's design, or the flags where it leaves them out). SpecError without a comparison, with an
    impossible schedule, or with another design than until_decided.json records; RunError when a
    round leaves a seed without a final value for both arms (a failed run: rerun to resume).
    `after_look` gets the decision so far after every look (the command writes it, so that a
    session that dies between rounds leaves its looks behind)."""
    max_seeds, round_seeds, source = plan_design(spec, max_seeds, round_seeds)
    c = spec.comparison
    schedule = schedule_of(spec, max_seeds, round_seeds)
    seeds = seed_order(spec.seeds, max_seeds)
    design = Design.of(schedule, max_seeds)
    metric = c.metric
    higher = metric is None or direction(metric) >= 0  # the direction compare's verdicts use
    decision = Decision(
        c.baseline, c.arm, metric or "held-out score", higher, c.margin, max_seeds, round_seeds, schedule
    )
    decision.design_from = source
    check_design(spec, decision)
    estimates: list[Estimate | None] = []
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
        estimates.append(look_estimate(spec, seeds[:n]) if metric is None else None)
        decision.looks = sequential_looks(diffs, design, c.margin, estimates)
        last = decision.looks[-1]
        log(
            f"look {len(decision.looks)}/{len(schedule)}: {n} paired seeds, difference {last.delta:+.4f}, "
            f"boundary |t| >= {last.boundary:.3g}, 95% repeated CI [{last.ci_low:+.4f}, {last.ci_high:+.4f}] "
            f"({last.method}): {last.verdict}"
        )
        after_look(decision)
        if last.verdict != "continue":
            break
    return decision


def write_decision(spec: ExperimentSpec, decision: Decision) -> Path:
    """<output_dir>/<experiment>/until_decided.json: the decision, for compare and report."""
    path = Path(spec.output_dir) / spec.name / DECISION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(decision.to_dict(), indent=1) + "\n")
    return path
