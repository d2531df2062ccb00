"""Whether a run directory holds the run a spec would make now: what made a recorded run another
run (behaviour version, training and evaluation data, reward and environment files, model), in
words, and the one-line refusal to skip or resume it (`check_identity`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError


def identity_changes(stored: Any, current: dict[str, Any]) -> list[str]:
    """What made the run recorded with `stored` (run.json's `identity`) another run than one
    with `current` (`train.resume.run_identity`), in words; [] when nothing did. A run.json
    without an identity (written before gspo recorded one) counts as another behaviour version."""
    if not isinstance(stored, dict):
        return [f"an older gspo (no behaviour version recorded; this one is {current['behaviour_version']})"]
    out = []
    if stored.get("behaviour_version") != current["behaviour_version"]:
        out.append(
            f"behaviour version {stored.get('behaviour_version')} of the training code "
            f"(this gspo is {current['behaviour_version']})"
        )
    data = stored.get("data") if isinstance(stored.get("data"), dict) else {}
    train = current["data"]["train"]
    new_data = (data.get("train") or {}).get("fingerprint") != train["fingerprint"]
    if new_data:
        out.append(f"other training data ({train['source']} changed)")
    for name, s in current["data"]["eval"].items():
        if ((data.get("eval") or {}).get(name) or {}).get("fingerprint") != s["fingerprint"]:
            out.append(f"another evaluation set {name} ({s['source']} changed)")
    out += reward_changes(stored, current)
    envs = {**(stored.get("environment") or {}), **(current.get("environment") or {})}  # task.environment FILE.py
    if (stored.get("environment") or {}) != (current.get("environment") or {}):
        out.append(f"another environment ({', '.join(envs)} changed)")
    old, new = str(stored.get("model")), current["model"]
    if old != new:
        if not new.startswith("builtin:"):
            out.append(f"another model ({old}, now {new})")
        elif not new_data:  # a built-in model is cold-started on the training data: said above
            out.append("another built-in model (its cold start's settings, recipe or numerics changed)")
    return out


def reward_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The reward files (task.rewards FILE.py:NAME) of `current` whose content differs from
    the one `stored` recorded, in words."""
    before = stored.get("rewards") if isinstance(stored.get("rewards"), dict) else {}
    return [
        f"another reward file ({p} changed)" for p, d in (current.get("rewards") or {}).items() if before.get(p) != d
    ]


def check_identity(run_dir: Path, stored: Any, current: dict[str, Any], state: str) -> None:
    """SpecError (exit 2, one line) when the `state` ("completed", "unfinished") run in
    `run_dir` was made with other code, model or data than `current` (`identity_changes`)."""
    changes = identity_changes(stored, current)
    if changes:
        raise SpecError(
            f"{run_dir}: this {state} run was made with {'; '.join(changes)}; this gspo would not make "
            "the same run of this spec: choose another output directory (-o) or use --force to retrain it"
        )
