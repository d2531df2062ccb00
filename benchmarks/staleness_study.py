"""The staleness study's own tables (`make staleness`): each arm at each rollout.staleness and
anchor, from the run directories of experiments/staleness.yaml.

Per run, over the steps after its first k (the warm-up, whose batches are less stale): token and
sequence clip fractions, KL(pi_old || pi_theta) (k3; pi_old is the anchor: the sampler under
`behaviour`, the trainer's weights before the step under `proximal`), the log-ratio variance of
each mini-batch (mini-batch 0 before any update of the step: the lag's own drift under
`behaviour`), |log pi_prox - log pi_behav| (`proximal` only: what the lag moved the policy) and
the mean decoupled weight; the step time and the trainer's wait for the batch; the train reward
over the last 5 steps and the held-out score at the last evaluation. Then mean over seeds (with
the seeds' min and max where they differ in the text).

    python benchmarks/staleness_study.py results/staleness >> results/staleness/REPORT.md

Prints markdown.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

COLUMNS = [
    ("clip tok", "policy/clip_frac_token", "{:.2e}"),
    ("clip seq", "policy/clip_frac_seq", "{:.3f}"),
    ("KL old-new k3", "policy/kl_old_k3", "{:.2e}"),
    ("logvar mb0", "ratio/logvar_mb0", "{:.2e}"),
    ("logvar mb3", "ratio/logvar_mb3", "{:.2e}"),
    ("prox-behav gap nats", "rollout/logprob_diff_mean", "{:.3f}"),
    ("weight mean", "mismatch/weight_mean", "{:.3f}"),
]


def _runs(root: Path):
    for run in sorted(root.glob("*/seed*")):
        if not (run / "metrics.jsonl").exists():
            continue
        spec = yaml.safe_load((run / "spec.yaml").read_text())
        k = int(spec["rollout"].get("staleness") or 0)
        anchor = spec["arms"][0].get("anchor", "behaviour") if k else "-"
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines() if line.strip()]
        yield run.parent.name.split(",")[0], k, anchor, metrics, evals


def _first_score(record: dict):
    return next(iter(record["scores"].values()), None)


def _mean(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.fmean(values) if values else None


def main(argv=None) -> None:
    root = Path((argv or sys.argv[1:])[0])
    cells = defaultdict(list)
    for arm, k, anchor, metrics, evals in _runs(root):
        after = metrics[k:] or metrics
        row = {key: _mean(m.get(key) for m in after) for _, key, _ in COLUMNS}
        row["reward"] = _mean(m["reward/mean"] for m in metrics[-5:])
        row["eval"] = _first_score(evals[-1]) if evals else None
        row["eval0"] = _first_score(evals[0]) if evals else None
        row["step_s"] = statistics.median(m["time/step_s"] for m in after)
        row["wait_s"] = statistics.median(m.get("perf/rollout_wait_s", 0.0) for m in after)
        row["lag"] = statistics.median(m.get("rollout/staleness_mean", 0.0) for m in after)
        row["steps"] = len(metrics)
        cells[(arm, k, anchor)].append(row)
    print("\n## By staleness and anchor\n")
    print(
        "Means over seeds of each run's means over its steps after the first k (warm-up); reward: the last 5 "
        "steps; held-out: the first evaluation set's first score at the last evaluation (step 0's in brackets); "
        "step s and wait s: medians (wait: the trainer waiting for the worker's batch).\n"
    )
    head = ["arm", "staleness", "anchor", "seeds", "lag", "reward", "held-out"] + [c[0] for c in COLUMNS]
    print("| " + " | ".join(head + ["step s", "wait s"]) + " |")
    print("|" + "---|" * 3 + "---:|" * (len(head) - 3 + 2))
    for (arm, k, anchor), rows in sorted(cells.items(), key=lambda x: (x[0][1], x[0][2], x[0][0])):

        def cell(key, fmt="{:.3f}", rows=rows):
            v = _mean(r[key] for r in rows)
            return "-" if v is None else fmt.format(v)

        out = [arm, str(k), anchor, str(len(rows)), cell("lag", "{:.0f}"), cell("reward")]
        out.append(f"{cell('eval')} ({cell('eval0')})")
        out += [cell(key, fmt) for _, key, fmt in COLUMNS]
        out += [cell("step_s", "{:.2f}"), cell("wait_s", "{:.2f}")]
        print("| " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
