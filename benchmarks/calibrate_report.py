"""results/calibration/REPORT.md from the numbers benchmarks/calibrate.py measured."""

from __future__ import annotations

import math
import os
import time

from gspo_cli.analysis.stats import seeds_needed

SIZES = (0.02, 0.05, 0.10)


def _f(x, fmt: str = "+.4f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def _need(delta: float, sd: float) -> str:
    n = seeds_needed(delta, sd) if math.isfinite(sd) else None
    return "more than 1000" if n is None else str(n)


def _row_table(rows: dict, label: str) -> list[str]:
    out = [
        f"| {label} | metric | difference | 95% CI | verdict | SD of per-seed differences |",
        "|---|---|---|---|---|---|",
    ]
    for metric, (verdict, delta, lo, hi, sd) in rows.items():
        out.append(f"| | {metric} | {_f(delta)} | [{_f(lo)}, {_f(hi)}] | {verdict} | {_f(sd, '.4f')} |")
    return out


def _family(fam: str, r: dict, k: int, rate_line) -> list[str]:
    L = [
        f"### {fam.upper()}: {fam}_a vs {fam}_b",
        "",
        f"{r['pairs']} pairs completed (2 x {r['pairs']} runs); pseudo-experiments of {k} pairs.",
        "",
    ]
    if "disjoint_family" not in r:
        return L + ["Too few pairs completed for a pseudo-experiment.", ""]
    L += [
        "| verdicts counted | false better/worse | rate | 95% CI | how |",
        "|---|---|---|---|---|",
        rate_line("held-out final avg@4", r["disjoint_primary"]),
        rate_line("family (held-out + reward, Holm)", r["disjoint_family"]),
        rate_line("held-out final avg@4", r["overlap_primary"]),
        rate_line("train reward (last 10 steps)", r["overlap_reward"]),
        rate_line("family (held-out + reward, Holm)", r["overlap_family"]),
        "",
        "Each disjoint pseudo-experiment (difference [95% CI] verdict):",
        "",
        "| # | held-out final avg@4 | train reward (last 10 steps) |",
        "|---|---|---|",
    ]
    for i, rows in enumerate(r["disjoint_rows"]):
        cells = [f"{_f(x[1])} [{_f(x[2])}, {_f(x[3])}] {x[0]}" for x in rows.values()]
        L.append(f"| {i} | " + " | ".join(cells) + " |")
    L += ["", f"All {r['pairs']} pairs as one experiment:", "", *_row_table(r["aa_all"], f"{fam}_a - {fam}_b"), ""]
    return L


def _summary(res: dict, primary: str) -> list[str]:
    out = []
    for fam, r in res["families"].items():
        if "overlap_family" in r:
            p, f = r["overlap_primary"], r["overlap_family"]
            out.append(
                f"- {fam.upper()} A/A, {r['pairs']} pairs: false `better`/`worse` on the held-out score "
                f"{_f(100 * p.rate, '.1f')}% [{_f(100 * p.ci[0], '.1f')}, {_f(100 * p.ci[1], '.1f')}], "
                f"on the family of two rows {_f(100 * f.rate, '.1f')}% "
                f"[{_f(100 * f.ci[0], '.1f')}, {_f(100 * f.ci[1], '.1f')}] "
                f"(overlapping draws); {r['disjoint_family'].hits} of {r['disjoint_family'].n} disjoint experiments."
            )
    for h, hr in res["handicaps"].items():
        if hr["rows"] and primary in hr["rows"]:
            verdict, delta, lo, hi, _ = hr["rows"][primary]
            plan = hr["plan"]
            out.append(
                f"- {h}: planned {plan.get('train', '?')} seeds from the pilot; on {len(hr['seeds'])} seeds "
                f"the held-out difference is {_f(delta)} [{_f(lo)}, {_f(hi)}], `{verdict}`"
                + (" (found)." if verdict == "worse" else " (not found).")
            )
    return out


def render(res: dict, *, primary: str, rate_line) -> str:
    k = res["k"]
    runs = res["runs"]
    L = [
        "# Calibration: compare's verdicts on real runs",
        "",
        f"Written by `make calibrate` (benchmarks/calibrate.py) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        + (
            f": {runs['n']} runs, trained two at a time at nice 10 on {os.cpu_count()} cores "
            f"over {runs['span_min']:.0f} min, median {runs['median_wall_s']:.0f} s a run"
            if runs["n"]
            else ""
        )
        + ". Spec: experiments/calibration.yaml (the quickstart's model, task, rollout and optimizer, 10 steps, "
        "held-out set of 128 problems x 4 samples scored at step 0 and step 10).",
        "",
        "## Design",
        "",
        "- **A/A.** The quickstart's GSPO arm under two names, `gspo_a` on seeds 0..N-1 and `gspo_b` on seeds "
        "N..2N-1 (N = " + str(res["pairs_planned"]) + "), and its GRPO arm likewise (`grpo_a`, `grpo_b`). Two names "
        "at equal seed would give identical runs (the seed, not the arm's name, drives the problem stream and "
        "every sample: common random numbers), so their paired difference would be exactly 0 and no verdict "
        "could ever be wrong; disjoint seeds make the two names two independent draws of the same arm. Every run "
        "starts from the same cached cold-start model (it has its own seed) and is scored on the same held-out "
        "problems, as in a real comparison. A pseudo-experiment takes K pairs (`_a` seed i, `_b` seed N+i), "
        "renumbers both sides 0..K-1 and asks the statistics engine what `gspo compare --baseline` asks: the "
        "held-out final avg@4 from problem records (seeds t + problem bootstrap) and the final train reward "
        "(mean of the last 10 steps, paired t), Holm over the two rows. Any `better`/`worse` is a false positive.",
        "- **Disjoint** pseudo-experiments share no run: independent, so the count is binomial and its "
        "Clopper-Pearson interval exact. **Overlapping** ones draw 2K distinct runs at random from the pooled "
        "2N runs of a family (K a side): every choice counts the same (a U-statistic, a steadier point estimate); "
        "its interval is the rate ± 1.96 delete-one-run jackknife standard errors (approximate).",
        "- **Known handicaps.** gspo_a with its learning rate raised from the tuned 5e-5: `gspo_a,lr=0.0004` "
        "(8x: strong) and `gspo_a,lr=0.0001` (2x: mild); on these testbeds 1e-4 to 2e-4 already made the train "
        "reward fall within 6-13 steps (docs/results.md). Each against gspo_a at the same seeds (paired as a real "
        "comparison pairs them): a pilot of 3 seeds, the seeds the engine says are needed for the pilot's "
        "held-out difference (80% power; at least 3), then those seeds (capped) and the "
        "verdict on all of them.",
        "",
        "## Summary",
        "",
        *_summary(res, primary),
        "",
        "## A/A: false-positive rate (stated: 5%)",
        "",
    ]
    for fam, r in res["families"].items():
        L += _family(fam, r, k, rate_line)
    if "pooled_disjoint_family" in res:
        L += [
            "### Both families, disjoint pseudo-experiments",
            "",
            "| verdicts counted | false better/worse | rate | 95% CI | how |",
            "|---|---|---|---|---|",
            rate_line("held-out final avg@4", res["pooled_disjoint_primary"]),
            rate_line("family (held-out + reward, Holm)", res["pooled_disjoint_family"]),
            "",
        ]
    L += ["## Known handicaps", ""]
    for h, hr in res["handicaps"].items():
        plan = hr["plan"]
        L += [f"### {h}", ""]
        if "delta" in plan:
            lo, hi = plan["ci"]
            need = plan["needed"] if plan["needed"] is not None else "more than 1000"
            L.append(
                f"Pilot ({len(plan['pilot_seeds'])} seeds): held-out difference {_f(plan['delta'])} "
                f"[{_f(lo)}, {_f(hi)}], SD of the per-seed differences {_f(plan['sd'], '.4f')}, verdict "
                f"`{plan['verdict']}`; seeds needed (80% power): {need}; planned: {plan['train']} seeds."
            )
        else:
            L.append("The pilot did not complete.")
        if hr["rows"]:
            L += ["", f"Seeds trained: {hr['seeds']}.", "", *_row_table(hr["rows"], f"{h} - gspo_a")]
        L.append("")
    L += ["## Seeds a difference needs on this testbed", ""]
    L += [
        "Paired seeds per arm for 80% power at the 5% level (the engine's plan: noncentral t on the SD of the "
        "per-seed differences of the held-out final avg@4, 128 problems x 4 samples):",
        "",
        "| SD from | SD | " + " | ".join(f"difference {d:g}" for d in SIZES) + " |",
        "|---|---|" + "---|" * len(SIZES),
    ]
    sources = [(f"{fam.upper()} A/A pairs (different seeds)", r.get("aa_all")) for fam, r in res["families"].items()]
    sources += [(f"{h} pairs (equal seeds)", hr["rows"]) for h, hr in res["handicaps"].items()]
    for label, rows in sources:
        if rows and primary in rows:
            sd = rows[primary][4]
            L.append(f"| {label} | {_f(sd, '.4f')} | " + " | ".join(_need(d, sd) for d in SIZES) + " |")
    return "\n".join(L) + "\n"


def figure(res: dict, primary: str, path) -> bool:
    """A forest plot of the held-out differences with their 95% CIs: every disjoint A/A
    pseudo-experiment (zero is the truth) and every handicap on all its seeds. False without data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for fam, r in res["families"].items():
        for i, exp in enumerate(r.get("disjoint_rows", [])):
            rows.append((f"{fam.upper()} A/A #{i}", exp[primary], "tab:blue"))
    for h, hr in res["handicaps"].items():
        if hr["rows"]:
            rows.append((f"{h.split(',', 1)[1]} ({len(hr['seeds'])} seeds)", hr["rows"][primary], "tab:red"))
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(6, 0.3 * len(rows) + 1.2))
    for y, (_, (_, delta, lo, hi, _), color) in enumerate(rows):
        ax.plot([lo, hi], [y, y], color=color, lw=2)
        ax.plot([delta], [y], "o", color=color)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("held-out final avg@4 difference, 95% CI")
    ax.set_title("A/A pseudo-experiments (3 pairs) and handicaps vs gspo_a", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
