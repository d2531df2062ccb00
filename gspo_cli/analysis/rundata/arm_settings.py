"""The arm settings a comparison shows beside its numbers, read from each run's spec.yaml: the
algorithm (loss, its parameters, clip, aggregation, advantage, filters, DAPO's behaviours, the
proximal anchor, rollout.staleness),
routing replay and mismatch correction. A spec written before a field existed shows its
default (dynamic_sampling.metric: shaped, what such runs decided signal from)."""

from __future__ import annotations

from collections.abc import Callable

from gspo_cli.analysis.rundata.runs import Run


def _replay(arm: dict) -> str:
    return str(arm.get("routing_replay", "off"))


def _mismatch(arm: dict) -> str:
    m = arm.get("mismatch") or {}
    mode, low, high = str(m.get("mode", "off")), m.get("low"), m.get("high")
    if mode == "off" or not all(isinstance(v, (int, float)) for v in (low, high)):
        return mode
    return f"{mode} [{low:g}, {high:g}]"


def _algorithm(arm: dict) -> str:
    """The loss and what defines it beyond the paper's GRPO/GSPO: its parameters, clip range,
    aggregation, advantage estimator, token filter, off-policy mask, overlong handling and
    dynamic sampling (defaults left out), e.g. `sapo tau_neg=1.05 tau_pos=1 · clip 0.2/0.27`."""
    parts = [str(arm.get("loss", "?"))]
    params = arm.get("loss_params") or {}
    parts[0] += "".join(
        f" {k}={v:g}" if isinstance(v, (int, float)) else f" {k}={v}" for k, v in sorted(params.items())
    )
    lo, hi = arm.get("clip_low"), arm.get("clip_high")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        dual = arm.get("clip_dual")
        parts.append(f"clip {lo:g}/{hi:g}" + (f" dual {dual:g}" if isinstance(dual, (int, float)) else ""))
    if arm.get("aggregation", "seq_mean_token_mean") != "seq_mean_token_mean":
        parts.append(str(arm["aggregation"]))
    if arm.get("advantage", "grpo") != "grpo":
        parts.append(f"adv {arm['advantage']}")
    if arm.get("multi_reward", "sum_then_normalize") != "sum_then_normalize":
        parts.append(arm["multi_reward"])  # GDPO: each reward normalised in its group before the sum
    top = (arm.get("token_filter") or {}).get("entropy_top")
    if top is not None:
        parts.append(f"entropy top {top:g}")
    if arm.get("off_policy_mask") is not None:
        parts.append(f"off-policy mask {arm['off_policy_mask']:g}")
    over = arm.get("overlong") or {}
    if over.get("filter"):
        parts.append("overlong filter")
    if over.get("buffer_frac"):
        parts.append(f"overlong penalty {over['buffer_frac']:g}")
    if arm.get("anchor", "behaviour") != "behaviour":
        parts.append(f"anchor {arm['anchor']}")  # which policy the ratio's denominator is
    dynamic = arm.get("dynamic_sampling") or {}
    if dynamic.get("max_rounds"):
        # before dynamic_sampling.metric existed, signal was decided from the shaped reward
        parts.append(f"dynamic sampling <= {dynamic['max_rounds']} by {dynamic.get('metric', 'shaped')}")
    return " · ".join(parts)


# Arm settings every comparison shows beside its numbers (from spec.yaml; a spec written
# before a field existed shows its default): id -> (header, value from the run's arm).
SETTINGS: dict[str, tuple[str, Callable[[dict], str]]] = {
    "algorithm": ("algorithm", _algorithm),
    "routing_replay": ("routing replay", _replay),
    "mismatch": ("mismatch", _mismatch),
}


def arm_settings(runs: list[Run]) -> dict[str, str]:
    """Each SETTINGS value of these runs' arms; values that differ between runs are joined by '/';
    a run without a spec.yaml (or without arms in it) shows '—'."""
    out = {}
    for sid, (_, fn) in SETTINGS.items():
        vals = dict.fromkeys(fn(r.arm_spec) + _stale(r, sid) if r.arm_spec else "—" for r in runs)
        out[sid] = "/".join(vals)
    return out


def _stale(run: Run, sid: str) -> str:
    """The algorithm's rollout.staleness (an experiment field, not the arm's): batches k versions old."""
    k = (run.spec.get("rollout") or {}).get("staleness") or 0
    return f" · staleness {k}" if sid == "algorithm" and k else ""
