"""A run's progress as lines for a study's log, read from its run directory as it trains
(whichever executor trains it: the run directory is where progress is written)."""

from __future__ import annotations

import json
from pathlib import Path

from gspo_cli.runs import RunDir
from gspo_cli.train.reporting import format_eval, format_step


class RunProgress:
    """What one run's process appends to its metrics.jsonl and eval.jsonl, as lines for the
    sweep's log: every tenth step (and the last) and every evaluation. Reads only the bytes
    added since the last look; a file that shrank (a resume rewinding it, a --force restart)
    is followed from its new end."""

    def __init__(self, run):
        self.rd = RunDir(run.path)
        self.label = f"[{run.name}/seed{run.seed}]"
        self.total = run.spec.train.steps
        self.every = max(1, self.total // 10)
        self.offsets = {f: _size(f) for f in (self.rd.metrics_file, self.rd.eval_file)}

    def _new(self, path: Path) -> list[dict]:
        size, seen = _size(path), self.offsets[path]
        if size <= seen:
            self.offsets[path] = size
            return []
        try:
            with open(path, "rb") as f:
                f.seek(seen)
                chunk = f.read(size - seen)
        except OSError:
            return []
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next look
        self.offsets[path] = seen + len(whole)
        out = []
        for line in whole.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def lines(self) -> list[str]:
        """New lines in the order they happened: step k's line, then step k's evaluations."""
        out: list[tuple[tuple[int, int], str]] = []
        for m in self._new(self.rd.metrics_file):
            step = m.get("step", 0)
            if step % self.every == 0 or step == self.total:
                try:
                    out.append(((step, 0), f"{self.label} step {step}/{self.total}  {format_step(m)}"))
                except (KeyError, TypeError, ValueError):
                    out.append(((step, 0), f"{self.label} step {step}/{self.total}"))
        for record in self._new(self.rd.eval_file):
            try:
                out.append(((record["step"], 1), f"{self.label} {format_eval(record)}"))
            except (KeyError, TypeError, ValueError):
                continue
        return [line for _, line in sorted(out, key=lambda x: x[0])]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
