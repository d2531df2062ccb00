"""`gspo report` shows the spec's pre-registered comparison with the p `gspo compare` gives it, also
when no finding of the report uses it (arms named outside the paper's roles, a metric of its own)."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from tests.synthetic_runs import write_run

runner = CliRunner()

# final held-out avg@4 per seed: the arm gains 0.10, 0.14, 0.12 over the baseline
BASE = (0.20, 0.22, 0.21)
ARM = (0.30, 0.36, 0.33)


def _experiment(tmp_path, comparison: dict):
    for arm, finals in (("tokenwise", BASE), ("seqwise", ARM)):
        for k, final in enumerate(finals):
            recs = [
                {"step": t, "reward/mean": final, "time/step_s": 1.0, "time/elapsed_s": float(t)} for t in range(1, 11)
            ]
            evals = [
                {"step": s, "task": "arith", "n": 8, "samples": 4, "scores": {"avg@4": v}, "time_s": 0.1}
                for s, v in ((0, 0.2), (10, final))
            ]
            d = write_run(tmp_path, arm, k, recs, evals=evals)
            spec = yaml.safe_load((d / "spec.yaml").read_text())
            (d / "spec.yaml").write_text(yaml.safe_dump({**spec, "comparison": comparison}))
    return tmp_path / "exp"


def _compare_primary(exp) -> dict:
    res = runner.invoke(app, ["compare", str(exp), "-f", "json"])
    assert res.exit_code == 0, res.output
    rows = [d for d in json.loads(res.output)["differences"] if d["family"] == "primary"]
    assert len(rows) == 1
    return rows[0]


def test_the_report_shows_the_primary_with_compares_p(tmp_path):
    exp = _experiment(tmp_path, {"baseline": "tokenwise", "arm": "seqwise", "metric": None, "margin": 0.05})
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    text = (exp / "REPORT.md").read_text()
    section = text.split("## The pre-registered comparison")[1].split("## Findings")[0]
    assert "`seqwise` against `tokenwise`" in section and "margin 0.05" in section
    row = next(line for line in section.splitlines() if line.startswith("| seqwise | tokenwise |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    primary = _compare_primary(exp)
    assert primary["delta"] == pytest_approx(0.12)
    assert float(cells[3]) == pytest_approx(primary["delta"], rel=1e-2)
    assert float(cells[7]) == pytest_approx(primary["p_adjusted"], rel=1e-2)  # the same p, at 3 significant digits
    assert cells[6].split(" (")[0] == primary["verdict"] == "better"
    for w in primary["warnings"]:  # compare's warnings on the row are in the report too
        assert f"- Warning: {w}" in section
    assert "primary (1)" in row


def test_a_comparison_naming_a_missing_arm_says_so(tmp_path):
    exp = _experiment(tmp_path, {"baseline": "tokenwise", "arm": "nosuch", "metric": None, "margin": None})
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    section = (exp / "REPORT.md").read_text().split("## The pre-registered comparison")[1].split("## Findings")[0]
    assert "names nosuch, which these runs do not have: no test." in section


def test_no_comparison_section_no_primary_section(tmp_path):
    exp = _experiment(tmp_path, {})
    assert runner.invoke(app, ["report", str(exp)]).exit_code == 0
    assert "pre-registered comparison" not in (exp / "REPORT.md").read_text()


def pytest_approx(x, rel=1e-9):
    import pytest

    return pytest.approx(x, rel=rel, abs=1e-12)
