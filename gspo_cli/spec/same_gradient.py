"""When two arms take the same gradient, so that comparing them measures seed noise only.

On-policy (one mini-batch per rollout batch, one epoch, staleness 0, no mismatch correction,
pi_old not the vLLM engine's log-probs) pi_theta = pi_old at the one update, so every importance
ratio is 1 and nothing is clipped (with the hf engine's sampler log-probs, which differ from a full
forward by ~1e-5 nats at most, to that precision: far inside any clip range). At ratio 1 GRPO,
GSPO, GSPO-token, CISPO, SAPO, GMPO and KL-Cov all give the vanilla policy gradient under their
aggregation (docs/algorithms/zoo.md; tests/test_same_gradient.py checks every name below against
the registry), so two such arms
whose configurations agree in everything but the loss and its clip range take the same
gradient step for step.

One test, used by the spec's load warning (`ExperimentSpec.on_policy_warning`), `gspo report`
and `gspo compare`. It reads plain dicts (a spec's `to_dict()` or a run's stored spec.yaml),
so the torch-free analysis side can call it; a key missing from an older spec reads as the
field's default.
"""

from __future__ import annotations

from typing import Any

from gspo_cli.spec.arm import ArmConfig
from gspo_cli.spec.rollout import RolloutConfig

# Losses whose gradient at ratio 1 is the vanilla policy gradient -grad aggregate(A log pi)
# under the arm's own aggregation. Not here: luspo (scales each response by its length) and
# clip_cov (detaches its selected tokens even on-policy). A loss left out is never said to
# match another: the test errs towards "the arms can differ".
VANILLA_AT_RATIO_ONE = frozenset({"grpo", "gspo", "gspo_token", "cispo", "sapo", "gmpo", "kl_cov"})
# What may differ between two arms that take the same gradient: the loss, its parameters (at
# ratio 1 none of the losses above depends on them) and the clip range (nothing is clipped).
_ARM_KEYS_ASIDE = frozenset({"name", "preset", "loss", "loss_params", "clip_low", "clip_high", "clip_dual"})
# Spec keys that do not reach the gradient: naming, where runs go, which seeds, the sweep.
_SPEC_KEYS_ASIDE = frozenset({"name", "output_dir", "seeds", "arms", "sweep"})


def _default(model: type, key: str) -> Any:
    field = model.model_fields[key]
    value = field.default_factory() if field.default_factory is not None else field.default
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _get(d: dict | None, model: type, key: str) -> Any:
    d = d if isinstance(d, dict) else {}
    return d[key] if key in d else _default(model, key)


def off_policy_reasons(arm: dict, rollout: dict | None) -> list[str]:
    """Why an arm's importance ratios can differ from 1 (e.g. "4 mini-batches", "staleness 1");
    an empty list: the arm updates on-policy. `arm` and `rollout` are the spec's dicts."""
    reasons = []
    if (n := _get(arm, ArmConfig, "mini_batches")) != 1:
        reasons.append(f"{n} mini-batches")
    if (n := _get(arm, ArmConfig, "epochs")) != 1:
        reasons.append(f"{n} epochs")
    if n := _get(rollout, RolloutConfig, "staleness"):
        reasons.append(f"staleness {n}")
    mode = str((_get(arm, ArmConfig, "mismatch") or {}).get("mode", "off"))
    if mode != "off":
        reasons.append(f"mismatch correction {mode}")
    if _get(rollout, RolloutConfig, "use_engine_logprobs"):
        reasons.append("pi_old from the engine's log-probs")
    return reasons


ON_POLICY = "one mini-batch, one epoch, staleness 0, no mismatch correction"


def same_gradient(spec_a: dict, arm_a: dict, spec_b: dict, arm_b: dict) -> str | None:
    """Why arms `arm_a` (of spec `spec_a`) and `arm_b` (of `spec_b`) take the same gradient, as
    one clause, or None when they can differ. They take the same gradient when both update
    on-policy (`off_policy_reasons` empty), both losses give the vanilla policy gradient at
    ratio 1, and their configurations agree in everything else: the arm's fields but name,
    preset, loss, loss_params and clip range, and every section of the spec but name,
    output_dir, seeds, arms and sweep. Dicts as in a spec's `to_dict()` or a stored spec.yaml."""
    losses = [str(arm_a.get("loss")), str(arm_b.get("loss"))]
    if any(loss not in VANILLA_AT_RATIO_ONE for loss in losses):
        return None
    if off_policy_reasons(arm_a, spec_a.get("rollout")) or off_policy_reasons(arm_b, spec_b.get("rollout")):
        return None
    keys = (set(arm_a) | set(arm_b)) - _ARM_KEYS_ASIDE
    if any(_get(arm_a, ArmConfig, k) != _get(arm_b, ArmConfig, k) for k in keys if k in ArmConfig.model_fields):
        return None
    if any(arm_a.get(k) != arm_b.get(k) for k in keys if k not in ArmConfig.model_fields):
        return None
    keys = (set(spec_a) | set(spec_b)) - _SPEC_KEYS_ASIDE
    if any(spec_a.get(k) != spec_b.get(k) for k in keys):
        return None
    which = " and ".join(dict.fromkeys(losses))
    return (
        f"both update on-policy ({ON_POLICY}), so every importance ratio is 1 and nothing is clipped; "
        f"at ratio 1 {which} give the same gradient, and the arms differ only in loss and clip range"
    )


def same_gradient_pairs(spec: dict) -> list[tuple[str, str, str]]:
    """(arm, arm, why) for every pair of one spec's arms that take the same gradient."""
    arms = [a for a in spec.get("arms") or [] if isinstance(a, dict)]
    out = []
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            if (why := same_gradient(spec, a, spec, b)) is not None:
                out.append((str(a.get("name")), str(b.get("name")), why))
    return out
