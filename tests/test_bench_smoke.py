"""Every benchmark make target's script, run for real at its smallest, so that a change to a spec,
an experiment file or the code that breaks a benchmark fails the tests, not the next `make bench`.

`--smoke` (bench.py, staleness.py, reward_pool.py, plan_check.py): one round of one step, the
smallest sizes, random weights (no cold start). `make calibrate-report` (calibrate --report-only)
trains nothing: it reads completed runs, written here by hand at the paths experiments/
calibration.yaml plans. The figures are not measurements; each test checks the table its script
printed or wrote. Where TRL is not installed (`make test` does not install the bench extra),
bench --smoke runs our step in TRL's place; the test then says so (a warning in pytest's summary).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# Every Makefile target that runs a script of benchmarks/, and the test here (or elsewhere) that
# runs that script: test_every_benchmark_target_has_a_smoke_test keeps the list complete.
SMOKE_TESTS = {
    "bench.py": "test_bench_smoke",
    "staleness.py": "test_bench_staleness_smoke",
    "reward_pool.py": "test_bench_reward_pool_smoke",
    "plan_check.py": "test_plan_check_smoke",
    "calibrate.py": "test_calibrate_report_only_smoke",
    # elsewhere: the GPU scripts' CPU dry runs, and the staleness study's report tables
    "gpu_check.py": "tests/test_gpu_scripts.py",
    "gpu_paper_shape.py": "tests/test_gpu_scripts.py",
    "staleness_study.py": "test_staleness_study_tables",
}


def _run(args: list[str], cwd: Path = ROOT, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _table(text: str, header_start: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header line starts with `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _makefile_targets() -> dict[str, list[str]]:
    """{target: the lines of its recipe} of the Makefile (recipe lines start with a tab)."""
    targets: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("\t") and current:
            targets[current].append(line)
        elif m := re.match(r"^([A-Za-z0-9_.-]+):(?!=)", line):
            current = m.group(1)
            targets.setdefault(current, [])
        elif line and not line.startswith("#"):
            current = None
    return targets


def test_every_benchmark_target_has_a_smoke_test():
    scripts = {}
    for target, recipe in _makefile_targets().items():
        for line in recipe:
            for found in re.findall(r"benchmarks/(\w+\.py)|-m benchmarks\.(\w+)", line):
                scripts.setdefault(found[0] or found[1] + ".py", []).append(target)
    assert {"bench.py", "staleness.py", "reward_pool.py", "plan_check.py", "calibrate.py"} <= set(scripts)
    missing = {s: t for s, t in scripts.items() if s not in SMOKE_TESTS}
    assert not missing, f"benchmark scripts of make targets without a smoke test here: {missing}"
    here = globals()
    for script, test in SMOKE_TESTS.items():
        assert test in here or (ROOT / test).is_file(), f"{script}: {test} does not exist"
    # the targets the smoke tests stand for are still the Makefile's
    for target in ("bench", "bench-staleness", "bench-reward-pool", "plan-check", "calibrate-report"):
        assert target in _makefile_targets()


# --------------------------------------------------------------------------------------------
# The benchmark's spec, built from the quickstart


def test_benchmark_specs_drop_the_sections_that_name_the_replaced_arms():
    from benchmarks.common import base_raw, load_spec_and_task

    quick = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    assert quick["comparison"]["baseline"] in {a["name"] for a in quick["arms"]}  # what this guards
    sizes = dict(prompts=2, group=2, max_new=8, mini_batches=2, steps=1, preset="paper-gspo")
    raw = base_raw(**sizes)
    assert "comparison" not in raw and [a["name"] for a in raw["arms"]] == ["paper-gspo"]
    assert raw["model"] == quick["model"] and raw["task"] == quick["task"]  # the rest kept as it is
    load_spec_and_task(raw)
    # another section naming arms (tune's grids, by arm) is found the same way, not by its name
    tune = yaml.safe_load((ROOT / "experiments" / "tune_clip.yaml").read_text())
    assert "tune" in tune
    raw = base_raw(**sizes, spec_path=str(ROOT / "experiments" / "tune_clip.yaml"))
    assert "tune" not in raw and raw["task"] == tune["task"]
    load_spec_and_task(raw)
    # smoke: the same model, not cold-started
    assert base_raw(**sizes, smoke=True)["model"]["cold_start"]["steps"] == 0


def test_a_spec_problem_of_the_source_or_of_a_kept_section_is_raised(tmp_path):
    from benchmarks.common import base_raw
    from gspo_cli.errors import SpecError

    sizes = dict(prompts=2, group=2, max_new=8, mini_batches=2, steps=1, preset="paper-gspo")
    bad = yaml.safe_load((ROOT / "experiments" / "quickstart.yaml").read_text())
    bad["comparison"]["baseline"] = "nope"  # the source's own problem: not dropped silently
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError, match=r"bad\.yaml: comparison\.baseline: no arm named 'nope'"):
        base_raw(**sizes, spec_path=str(tmp_path / "bad.yaml"))
    # a problem the benchmark's sizes make in a section it keeps is raised, naming the source
    with pytest.raises(SpecError, match=r"quickstart\.yaml as the benchmark sets it up: arms\[0\]\.mini_batches"):
        base_raw(**{**sizes, "mini_batches": 3})


def test_a_spec_error_is_one_line_and_exit_2(tmp_path):
    bad = (ROOT / "experiments" / "quickstart.yaml").read_text().replace("lr: 5.0e-5", "lr: -1")
    (tmp_path / "bad.yaml").write_text(bad)
    res = _run(["benchmarks/bench.py", "--smoke", "--spec", str(tmp_path / "bad.yaml"), "--out", str(tmp_path)])
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"bench: spec error: {tmp_path / 'bad.yaml'}: optimizer.lr: Input should be greater than 0 (got -1)"
    ]
    assert "Traceback" not in res.stdout + res.stderr


def test_staleness_study_tables(tmp_path):
    """`make staleness`'s own tables (benchmarks/staleness_study.py) from run directories."""
    for name, k, anchor in (("grpo", 0, None), ("grpo,staleness=1,anchor=proximal", 1, "proximal")):
        d = tmp_path / name / "seed0"
        d.mkdir(parents=True)
        arm = {"name": name, **({"anchor": anchor} if anchor else {})}
        (d / "spec.yaml").write_text(yaml.safe_dump({"rollout": {"staleness": k}, "arms": [arm]}))
        recs = [{"step": t, "reward/mean": 0.1 * t, "time/step_s": 2.0, "rollout/staleness_mean": k} for t in (1, 2, 3)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "eval.jsonl").write_text(json.dumps({"step": 3, "scores": {"avg@4": 0.25}}) + "\n")
    rows = _table(_ok(_run(["benchmarks/staleness_study.py", str(tmp_path)])), "| arm | staleness |")
    assert [r[:5] for r in rows] == [["grpo", "0", "-", "1", "0"], ["grpo", "1", "proximal", "1", "1"]]
    assert [r[5] for r in rows] == ["0.200", "0.200"] and rows[1][6] == "0.250 (0.250)"


# --------------------------------------------------------------------------------------------
# The make targets' scripts at their smallest


@pytest.mark.slow
def test_bench_smoke(tmp_path):
    """`make bench`'s script, every stage: the paired comparisons (a) and (b) (TRL's side a stub
    where TRL is not installed), (c) or the one line saying why not, our arms, scaling, the
    quickstart's memory and the profiles."""
    trl = importlib.util.find_spec("trl") is not None
    out = _ok(_run(["benchmarks/bench.py", "--smoke", "--out", str(tmp_path)], timeout=500))
    report = (tmp_path / "bench.md").read_text()
    result = json.loads((tmp_path / "bench.json").read_text())
    assert report in out  # printed too
    assert "**Smoke run** (`--smoke`)" in report
    rows = {r[0][:3]: r for r in _table(report, "| comparison | ours s/step")}
    for key in ("(a)", "(b)"):
        ours, theirs, ratio = (float(rows[key][i].split()[0].strip("*x")) for i in (1, 2, 3))
        assert ours > 0 and theirs > 0
        # the table rounds s/step to 0.001 and the ratio (from the unrounded times) to 0.01: at a
        # smoke run's ~0.1 s a step the rounding alone moves ours / theirs by more than 0.01
        low, high = (ours - 5e-4) / (theirs + 5e-4), (ours + 5e-4) / max(theirs - 5e-4, 1e-9)
        assert low - 0.005 <= ratio <= high + 0.005, (key, ours, theirs, ratio)
    comps = result["paired"]["comparisons"]
    assert not comps["a"]["skipped"] and not comps["b"]["skipped"]
    if comps["c"]["skipped"]:  # no vLLM virtualenv here: one line, with the command that builds it
        lines = [line for line in out.splitlines() if line.startswith("comparison (c)")]
        assert len(lines) == 1 and "is skipped" in lines[0] and "`make vllm-venv`" in lines[0]
    # stages 2-5: our arms, the scaling variants, the quickstart, both profiles
    assert set(result["arms"]) == {"paper-grpo", "paper-grpo-rr", "paper-gspo"}
    assert all(a["n_steps"] == 1 and a["step_s"] > 0 for a in result["arms"].values())
    assert {"G=2", "G=4", "T=4", "T=5", "T=10"} == set(result["scaling"])
    assert result["quickstart_memory"]["max_rss_mb"] > 0
    assert [p["preset"] for p in result["profiles"]] == ["paper-gspo", "paper-grpo-rr"]
    assert (tmp_path / "profile_paper-gspo.txt").is_file()
    if trl:
        assert result["host"]["versions"]["trl"] and "TRL's side is a stub" not in report
    else:
        assert "TRL's side is a stub" in report and "TRL's side is a stub" in out
        warnings.warn(
            "TRL is not installed: bench --smoke ran our synchronous step in TRL's place (`make bench` installs it)",
            stacklevel=1,
        )


@pytest.mark.slow
def test_bench_staleness_smoke():
    """`make bench-staleness`: staleness 0 and 1, 3 steps each, the instant reward."""
    out = _ok(_run(["benchmarks/staleness.py", "--smoke"]))
    rows = _table(out, "| staleness | lag |")
    assert [r[0] for r in rows] == ["0", "1"]
    assert [r[1] for r in rows] == ["0", "1"]  # the lag measured: staleness 1 trains on last step's batch
    assert rows[0][3] == "1.00x" and all(float(r[2]) > 0 for r in rows)


@pytest.mark.slow
def test_bench_reward_pool_smoke():
    """`make bench-reward-pool`: one round of the four trainers, a pool of 2 workers."""
    out = _ok(_run(["benchmarks/reward_pool.py", "--smoke"]))
    rows = _table(out, "| reward | step s |")
    assert [r[0] for r in rows] == [
        "instant, in the trainer",
        "50 ms/row, in the trainer (serial)",
        "50 ms/row, pool of 2, rows sent after generation",
        "50 ms/row, pool of 2, rows sent as they stop (overlap)",
    ]
    serial = rows[1]
    assert float(serial[3]) >= 4 * 0.05 - 0.01  # 4 rows x 50 ms, scored in the trainer
    assert "pool: the pool adds at most 20% of the serial 0.2 s" in out


@pytest.mark.slow
def test_plan_check_smoke(tmp_path):
    """`make plan-check`: one small local MoE, one process, one step and a checkpoint."""
    out_md = tmp_path / "plan_check.md"
    _ok(_run(["benchmarks/plan_check.py", "--smoke", "--out", str(out_md)]))
    rows = _table(out_md.read_text(), "| model | parameters |")
    assert [r[5] for r in rows] == ["load", "rollout", "pi_old", "update", "checkpoint"]
    assert all(r[0] == "smoke-moe" and r[2] == "1" for r in rows)
    assert all(float(r[7].replace(",", "")) > 0 for r in rows)  # the plan's figure per phase
    saved = json.loads(out_md.with_suffix(".json").read_text())
    assert saved[0]["ranks"][0]["peaks_mb"].keys() == {"load", "rollout", "pi_old", "update", "checkpoint"}


def _calibration_runs(root: Path, pairs: int) -> None:
    """Completed runs, by hand, at the paths experiments/calibration.yaml plans (relative to
    `root`): the A/A pairs (<family>_a on seeds 0..pairs-1, <family>_b on pairs..2 pairs-1) and
    gspo_a's two handicaps on seeds 0..pairs-1, 10 steps each, a train reward and one held-out
    evaluation; the handicaps' scores 0.1 lower."""
    from gspo_cli.train import sweep as sw

    for r in sw.plan(ROOT / "experiments" / "calibration.yaml"):
        handicap = "," in r.name
        if handicap:
            wanted = r.name.startswith("gspo_a,") and r.seed < pairs
        else:
            wanted = r.seed < pairs if r.name.endswith("_a") else pairs <= r.seed < 2 * pairs
        if not wanted:
            continue
        d = root / r.path
        d.mkdir(parents=True)
        noise = ((r.seed * 7 + len(r.name)) % 5) / 100
        # a handicap 0.1 to 0.12 lower, by seed: a difference with a spread (one without has no test)
        score = 0.4 + noise - (0.1 + 0.01 * (r.seed % 3) if handicap else 0.0)
        (d / "spec.yaml").write_text(yaml.safe_dump(r.spec.to_dict()))
        (d / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": t, "reward/mean": score, "time/step_s": 1.0}) + "\n" for t in range(1, 11))
        )
        ev = {"step": 10, "task": "math", "n": 128, "samples": 4, "scores": {"avg@4": score}}
        (d / "eval.jsonl").write_text(json.dumps(ev) + "\n")
        info = {
            "status": "completed",
            "experiment": "calibration",
            "arm": r.name,
            "seed": r.seed,
            "step": 10,
            "total_steps": 10,
            "wall_s": 60.0,
            "started_at": "2026-12-07T06:00:00+00:00",
            "ended_at": "2026-12-07T06:01:00+00:00",
        }
        (d / "run.json").write_text(json.dumps(info))


@pytest.mark.slow
def test_calibrate_report_only_smoke(tmp_path):
    """`make calibrate-report`: the report from completed runs, training nothing."""
    _calibration_runs(tmp_path, pairs=3)
    out = tmp_path / "results" / "calibration"
    args = ["-m", "benchmarks.calibrate", "--report-only", "--pairs", "3", "--k", "3", "--handicap-max", "3"]
    res = _run([*args, "--draws", "20", "--out", str(out)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = (out / "REPORT.md").read_text()
    assert "3 pairs completed (2 x 3 runs)" in report  # both families
    assert report.count("3 pairs completed") == 2
    saved = json.loads((out / "calibration.json").read_text())
    assert saved["runs"]["n"] == 2 * 2 * 3 + 2 * 3  # A/A: 2 families x 2 arms x 3 seeds; 2 handicaps x 3
    handicaps = saved["handicaps"]
    assert set(handicaps) == {"gspo_a,lr=0.0004", "gspo_a,lr=0.0001"}
    for h in handicaps.values():  # 0.1-0.12 lower on every seed: each handicap found worse
        assert h["seeds"] == [0, 1, 2] and h["rows"]["eval_final:math"][0] == "worse"
    # no completed runs: says so in one line, exit 2, the report left alone
    empty = _run([*args, "--out", str(tmp_path / "none")], cwd=tmp_path / "results")
    assert empty.returncode == 2 and empty.stderr.startswith("--report-only: no completed A/A pair of calibration runs")
