"""The sequential decision of `gspo sweep --until-decided` (the experiment's until_decided.json),
shown by `gspo compare` and `gspo report` beside the fixed-design row of the same runs: which look
stopped it, at how many seeds, the boundary it had to cross, its repeated interval and the estimate
it was on. Reads the file only; the decision itself is `gspo_cli.train.until_decided`'s."""

from __future__ import annotations

import json
import math
from pathlib import Path

from gspo_cli.analysis.rundata.runs import Group

DECISION_FILE = "until_decided.json"


def sequential_decisions(groups: list[Group]) -> list[dict]:
    """Each until_decided.json of the experiments the groups' runs belong to (<experiment>/<arm>/
    seed<k>: the file sits in <experiment>), with its path under "file"; unreadable files skipped."""
    dirs = sorted({r.path.parent.parent for g in groups for r in g.runs})
    out = []
    for d in dirs:
        path = Path(d) / DECISION_FILE
        try:
            doc = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and doc.get("looks"):
            out.append({**doc, "file": str(path)})
    return out


def _num(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "?"


def decision_line(doc: dict) -> str:
    """One sentence: the decision, its look, boundary, repeated interval and estimate."""
    last = doc["looks"][-1]
    boundary = last.get("boundary")
    where = (
        f"boundary |t| >= {_num(boundary, '.3g')}"
        if isinstance(boundary, (int, float))
        else "boundary not recorded (a decision written before boundaries were)"
    )
    method = f"; estimate: {last['method']}" if last.get("method") else ""
    design = doc.get("design_from")
    return (
        f"Sequential decision (gspo sweep --until-decided, {doc['file']}): {doc['arm']} − {doc['baseline']} on "
        f"{doc.get('metric', '?')}, look {len(doc['looks'])} of at most {len(doc.get('schedule') or [])} at "
        f"{last['n']} seeds, {where}, 95% repeated CI [{_num(last['ci_low'], '+.4f')}, "
        f"{_num(last['ci_high'], '+.4f')}]{method}: {doc.get('verdict', last['verdict'])}"
        + (f" (design from the {design})" if design else "")
        + ". Its interval spends 5% over all its looks; the fixed-design row is one look at the same runs."
    )


__all__ = ["DECISION_FILE", "decision_line", "sequential_decisions"]
