"""`make calibrate`: compare's verdicts measured on real runs; writes results/calibration/REPORT.md.

Runs experiments/calibration.yaml's arms through the sweep runner (each run its own process, two at a
time), in batches, until a wall-clock budget is spent, then writes the report from whatever
completed (rerun: completed runs are kept, the report is rewritten, a REPORT.md edited by hand is kept
beside it as REPORT.edited.md). `make calibrate-report` (`python -m benchmarks.calibrate --report-only`)
trains nothing and writes the report only from completed A/A pairs of calibration runs.

1. A/A: gspo_a on seeds 0..N-1 and gspo_b on seeds N..2N-1, pair i = (gspo_a seed i, gspo_b seed
   N+i), trained pair by pair. Pseudo-experiments of K pairs: disjoint blocks (independent; exact
   binomial interval) and random overlapping draws from the pooled 2N runs (jackknife interval).
2. Known handicaps: the spec's other sweep sets applied to gspo_a, each against gspo_a at the same
   seeds. A pilot of 3 seeds first; the engine's seeds needed for the pilot's difference (80%
   power) sets how many seeds to train (capped by --handicap-max); then the verdict on them all.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, loadavg
from gspo_cli.analysis.report import calibration as cal
from gspo_cli.analysis.rundata.runs import load_run
from gspo_cli.analysis.stats import seeds_needed
from gspo_cli.errors import SpecError
from gspo_cli.files import write_report_file
from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import check_stored_spec
from gspo_cli.train import sweep as sw

SPEC = ROOT / "experiments" / "calibration.yaml"
PRIMARY = "eval_final:math"
FAMILIES = ("gspo", "grpo")  # A/A: <family>_a on seeds 0..N-1, <family>_b on N..2N-1


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Trainer:
    """Trains planned runs (arm name, seed) in batches of `jobs`, until the deadline."""

    def __init__(self, spec: Path, jobs: int, deadline: float, out_dir: Path, stop=None, executor: str | None = None):
        from gspo_cli.spec.loading import load_spec

        self.by_key = {(r.name, r.seed): r for r in sw.plan(spec)}
        self.stop = stop  # one StopFlag for every batch: a signal between batches is not lost
        self.jobs, self.deadline, self.out_dir = jobs, deadline, out_dir
        self.executor = sw.executor_for(load_spec(spec), executor, jobs)  # a batch: one array on SLURM
        self.walls: list[float] = []
        self._done: dict[tuple[str, int], bool] = {}  # completed runs stay completed

    def done(self, name: str, seed: int) -> bool:
        """Completed, and trained by the calibration spec (a run of another spec at its path is not one)."""
        if (name, seed) not in self._done:
            run = self.by_key[(name, seed)]
            if run.status() != "completed":
                return False
            try:
                check_stored_spec(run.path, run.spec, "completed")
                self._done[(name, seed)] = True
            except SpecError:
                self._done[(name, seed)] = False
        return self._done[(name, seed)]

    def pairs_done(self, n: int) -> int:
        """Completed A/A pairs over both families."""
        return sum(self.done(f"{f}_a", i) and self.done(f"{f}_b", n + i) for f in FAMILIES for i in range(n))

    def train(self, keys: list[tuple[str, int]]) -> bool:
        """Train the runs not completed yet; False once the deadline or a signal stops it."""
        todo = [self.by_key[k] for k in keys if not self.done(*k)]
        for i in range(0, len(todo), self.jobs):
            if time.time() > self.deadline:
                _log("budget spent: no more runs started")
                return False
            if self.stop:
                _log(f"stopped by {self.stop.signal_name}: no more runs started")
                return False
            batch = todo[i : i + self.jobs]
            recs = sw.run_plan(
                batch, jobs=self.jobs, force=False, log=lambda m: None, executor=self.executor, stop=self.stop
            )
            for r in recs:
                self.walls.append(r["wall_s"])
                _log(f"{r['run']}/seed{r['seed']}: {r['status']} in {r['wall_s']} s (load {loadavg()})")
            if any(r["exit"] == 4 for r in recs):
                _log("stopped by a signal: no more runs started")
                return False
        return True

    def runs(self, name: str, seeds: list[int]):
        return [load_run(RunDir(self.by_key[(name, s)].path)) for s in seeds if self.done(name, s)]


def main(argv: list[str] | None = None) -> int:
    """Exit 0; 2 for --report-only without a completed pair; 4 when a signal stopped the training
    (the report is written from what completed)."""
    from gspo_cli.train.watch import stop_on_signals

    with stop_on_signals() as stop:
        code = _main(argv, stop)
    return 4 if stop and code == 0 else code


def _main(argv: list[str] | None, stop) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=12, help="A/A pairs N (gspo_a seeds 0..N-1, gspo_b N..2N-1)")
    p.add_argument("--k", type=int, default=3, help="pairs per pseudo-experiment")
    p.add_argument("--handicap-max", type=int, default=12, help="most seeds for the handicap arm")
    p.add_argument("--budget-min", type=float, default=70.0, help="wall-clock minutes after which no run starts")
    p.add_argument("--draws", type=int, default=400, help="overlapping A/A pseudo-experiments")
    p.add_argument("--jobs", type=int, default=2, help="runs per batch (at once, with the local executor)")
    p.add_argument("--executor", default=None, help="local, slurm or ray (default: the spec's, else local)")
    p.add_argument("--no-grpo", dest="grpo", action="store_false", help="skip the GRPO A/A (trained last)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "calibration")
    args = p.parse_args(argv)
    start = time.time()
    deadline = start + (0 if args.report_only else args.budget_min * 60)
    tr = Trainer(SPEC, args.jobs, deadline, args.out, stop, args.executor)
    if args.report_only and not tr.pairs_done(args.pairs):
        print(
            f"--report-only: no completed A/A pair of calibration runs under {args.out}; REPORT.md and "
            "calibration.json there are left as they are",
            file=sys.stderr,
        )
        return 2
    n = args.pairs
    base = "gspo_a"
    handicaps = [h for h in dict.fromkeys(name for name, _ in tr.by_key) if h.startswith(base + ",")]
    fams = {fam: [[(f"{fam}_a", i), (f"{fam}_b", n + i)] for i in range(n)] for fam in FAMILIES}
    plans: dict[str, dict] = {}
    # each handicap's pilot beside the first three GSPO pairs (its baseline runs), then the rest
    ok = tr.train([k for pr in fams["gspo"][:3] for k in pr] + [(h, s) for h in handicaps for s in range(3)])
    if ok:
        plans = {h: handicap_plan(tr, base, h, args.handicap_max) for h in handicaps}
        ok = tr.train([k for pr in fams["gspo"][3:] for k in pr])
    for h in handicaps:
        if ok:
            ok = tr.train([(h, s) for s in range(3, plans[h].get("train", 3))])
    if ok and args.grpo:
        ok = tr.train([k for pr in fams["grpo"] for k in pr])
    plans = {h: plans.get(h) or handicap_plan(tr, base, h, args.handicap_max) for h in handicaps}
    report = write_report(tr, args, base, plans, time.time() - start)
    _log(f"wrote {report}")
    return 0


def handicap_plan(tr: Trainer, base: str, handicap: str, cap: int) -> dict:
    """The engine's seeds needed from the pilot (paired at equal seeds), and how many to train."""
    seeds = [s for s in range(3) if tr.done(base, s) and tr.done(handicap, s)]
    if len(seeds) < 2:
        return {"pilot_seeds": seeds, "needed": None, "train": 3}
    v = cal.pseudo_experiment(tr.runs(handicap, seeds), tr.runs(base, seeds))
    verdict, delta, lo, hi, sd = v.rows[PRIMARY]
    need = seeds_needed(delta, sd)
    train = max(3, min(cap, need if need is not None else cap))
    return {
        "pilot_seeds": seeds,
        "delta": delta,
        "ci": (lo, hi),
        "sd": sd,
        "verdict": verdict,
        "needed": need,
        "train": train,
    }


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _rate_line(label: str, r: cal.Rate) -> str:
    return f"| {label} | {r.hits} / {r.n} | {_pct(r.rate)} | [{_pct(r.ci[0])}, {_pct(r.ci[1])}] | {r.how} |"


def aa_family(tr: Trainer, fam: str, args) -> dict:
    """The A/A numbers of one family: the completed pairs, disjoint and overlapping rates."""
    n = args.pairs
    a, b = f"{fam}_a", f"{fam}_b"
    paired = [(i, n + i) for i in range(n) if tr.done(a, i) and tr.done(b, n + i)]
    res: dict = {"pairs": len(paired)}
    if len(paired) < args.k:
        return res
    aa_a, aa_b = tr.runs(a, [i for i, _ in paired]), tr.runs(b, [j for _, j in paired])
    fam_rate, exps = cal.disjoint_rate(aa_a, aa_b, args.k)
    prim, _ = cal.disjoint_rate(aa_a, aa_b, args.k, metric=PRIMARY)
    over = cal.overlapping_rate(aa_a + aa_b, args.k, args.draws, metrics=(None, PRIMARY, "reward"))
    res.update(
        disjoint_family=fam_rate,
        disjoint_primary=prim,
        disjoint_rows=[v.rows for v in exps],
        overlap_family=over[None],
        overlap_primary=over[PRIMARY],
        overlap_reward=over["reward"],
        aa_all=cal.pseudo_experiment(aa_a, aa_b).rows,
    )
    return res


def run_times(tr: Trainer) -> dict:
    """From the completed runs' run.json: how many, the median run's wall seconds, and the span
    from the first start to the last end (every invocation of the study together)."""
    from datetime import datetime

    infos = [RunDir(r.path).info() for r in tr.by_key.values() if RunDir(r.path).status() == "completed"]
    if not infos:
        return {"n": 0}
    walls = sorted(float(i.get("wall_s") or 0) for i in infos)
    start = min(datetime.fromisoformat(i["started_at"]) for i in infos)
    end = max(datetime.fromisoformat(i["ended_at"]) for i in infos)
    return {"n": len(infos), "median_wall_s": walls[len(walls) // 2], "span_min": (end - start).total_seconds() / 60}


def write_report(tr: Trainer, args, base: str, plans: dict[str, dict], wall: float) -> Path:
    from benchmarks.calibrate_report import render

    res: dict = {"k": args.k, "pairs_planned": args.pairs, "wall_s": wall, "runs": run_times(tr)}
    res["families"] = {fam: aa_family(tr, fam, args) for fam in FAMILIES}
    done = [f for f in res["families"].values() if "disjoint_family" in f]
    if len(done) > 1:
        for key in ("disjoint_family", "disjoint_primary"):
            hits, n = sum(f[key].hits for f in done), sum(f[key].n for f in done)
            res["pooled_" + key] = cal.Rate(hits, n, cal.clopper_pearson(hits, n), "both families, Clopper-Pearson")
    res["handicaps"] = {}
    for h, plan in plans.items():
        seeds = [s for s in range(args.handicap_max) if tr.done(base, s) and tr.done(h, s)]
        rows = cal.pseudo_experiment(tr.runs(h, seeds), tr.runs(base, seeds)).rows if len(seeds) >= 2 else None
        res["handicaps"][h] = {"plan": plan, "seeds": seeds, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "REPORT.md"
    from benchmarks.calibrate_report import figure

    text = render(res, primary=PRIMARY, rate_line=_rate_line)
    if figure(res, PRIMARY, args.out / "figures" / "differences.png"):
        text += "\n![held-out differences with 95% CIs](figures/differences.png)\n"
    if (kept := write_report_file(report, text)) is not None:
        _log(f"{report}: edited by hand: your copy is kept as {kept}")
    (args.out / "calibration.json").write_text(json.dumps(_jsonable(res), indent=1))
    return report


def _jsonable(x):
    if isinstance(x, cal.Rate):
        return {"hits": x.hits, "n": x.n, "rate": x.rate, "ci": list(x.ci), "how": x.how}
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


if __name__ == "__main__":
    from benchmarks.common import spec_errors_in_one_line

    with spec_errors_in_one_line("calibrate"):
        sys.exit(main())
