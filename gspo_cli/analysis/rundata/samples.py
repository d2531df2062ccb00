"""Reading a run's samples.jsonl (the rollouts training logged; gspo_cli.train.samples writes
them, gspo_cli.runs describes the fields) for `gspo samples`. Torch-free, like all of analysis/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir, find_runs

ORDERS = ("batch", "worst", "best")


def load_samples(path: str | Path) -> tuple[RunDir, list[dict[str, Any]]]:
    """The run directory at `path` and its sample lines in file order. SpecError (one line)
    when `path` is not one run directory (none, or several under it) or the run logged no
    samples."""
    runs = list(find_runs([path]))
    if not runs:
        raise SpecError(f"RUN: {path} is not a run directory (no run.json at or under it)")
    if len(runs) > 1:
        shown = ", ".join(str(r.path) for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
        raise SpecError(f"RUN: {path} holds {len(runs)} runs ({shown}); name one of them")
    rd = runs[0]
    records = [r for r in rd.samples() if isinstance(r, dict) and isinstance(r.get("step"), int)]
    if not records:
        raise SpecError(
            f"RUN: {rd.path} has no samples ({rd.samples_file.name} missing or empty: "
            "train.log_samples_every 0, a run stopped before its first logged step, or one from "
            "before samples were logged)"
        )
    return rd, records


def logged_steps(records: list[dict[str, Any]]) -> list[int]:
    """The steps that have samples, ascending."""
    return sorted({r["step"] for r in records})


def select_samples(
    records: list[dict[str, Any]], step: int | None = None, order: str = "batch", n: int | None = None
) -> list[dict[str, Any]]:
    """The samples of `step` (None: the latest logged step), in batch order or sorted by
    reward (`worst` first or `best` first; ties by advantage, then batch order), at most `n`
    (None: all). SpecError for a step with no samples (naming the steps that have them), an
    unknown order or n < 1."""
    if order not in ORDERS:
        raise SpecError(f"order: unknown {order!r} (known: {', '.join(ORDERS)})")
    if n is not None and n < 1:
        raise SpecError(f"-n: must be >= 1, got {n}")
    steps = logged_steps(records)
    step = steps[-1] if step is None else step
    if step not in steps:
        shown = ", ".join(map(str, steps[:10])) + (f", ... {steps[-1]}" if len(steps) > 10 else "")
        raise SpecError(f"--step: no samples at step {step} (steps with samples: {shown})")
    chosen = [r for r in records if r["step"] == step]
    if order != "batch":
        sign = 1 if order == "worst" else -1
        chosen.sort(key=lambda r: (sign * _num(r.get("reward")), sign * _num(r.get("advantage"))))
    return chosen[:n] if n is not None else chosen


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def verdict(r: dict[str, Any]) -> str:
    """One line about a sample: reward, advantage, length, clipping and masking, as
    `gspo samples` heads it (`--plain` prints it as is)."""
    parts = [f"reward {_num(r.get('reward')):g}" + (" (correct)" if r.get("correct") else "")]
    parts.append(f"advantage {_num(r.get('advantage')):+.3f}")
    parts.append(f"{r.get('length', '?')} tokens" + (", no stop token" if r.get("truncated") else ""))
    clip = _num(r.get("clip_frac"))
    parts.append(f"clipped {clip:.0%}" if clip > 0 else "not clipped")
    if r.get("masked_frac") is not None:
        parts.append(f"masked {_num(r['masked_frac']):.0%}")
    return ", ".join(parts)


def reward_parts(r: dict[str, Any]) -> str | None:
    """The row's value of each named reward (task.rewards, or the task's own parts), as
    `gspo samples` prints it under the verdict: `rewards: format 1, accuracy 0`; a reward that
    did not apply to the row is absent (`n/a`). None when the row logged none."""
    parts = r.get("components")
    if not isinstance(parts, dict) or not parts:
        return None
    return "rewards: " + ", ".join(f"{k} {v:g}" if _is_num(v) else f"{k} n/a" for k, v in parts.items())


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def title(r: dict[str, Any]) -> str:
    """Where the sample comes from: `step 10, gspo/seed0, group 2, response 9`."""
    where = f"{r.get('arm', '?')}/seed{r.get('seed', '?')}"
    return f"step {r['step']}, {where}, group {r.get('group', '?')}, response {r.get('index', '?')}"


def cut_note(r: dict[str, Any], key: str) -> str:
    """'' or ` [cut: 2000 of 5123 characters shown]` when the text was shortened at write time."""
    full = r.get(f"{key}_chars")
    shown = len(r.get(key) or "")
    if isinstance(full, int) and full > shown - 1 and full != shown:
        return f" [cut: {shown - 1} of {full} characters shown]"
    return ""


def sections(r: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """What a sample's response shows, as (heading, text, is_tool_output): its completion, or,
    for a multi-turn rollout (`turns` in samples.jsonl), each turn in order, the tool's apart."""
    turns = r.get("turns")
    if not isinstance(turns, list) or not turns:
        return [("completion" + cut_note(r, "completion"), r.get("completion", ""), False)]
    tools = r.get("tools") or {}
    out = []
    for i, t in enumerate(turns):
        tool = t.get("role") == "tool"
        out.append((f"{'tool output' if tool else 'model'} (turn {i + 1})", t.get("content", ""), tool))
    if tools.get("tool_errors"):
        out[-1] = (out[-1][0] + f"; {tools['tool_errors']} tool error(s) in this rollout", out[-1][1], out[-1][2])
    return out
