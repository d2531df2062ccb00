"""`arms:` one algorithm per arm with every setting that defines it (loss, clip range,
aggregation, mini-batches, routing replay, advantage estimator, mismatch correction)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gspo_cli.spec.base import _check_dir_name, _Strict


class MismatchConfig(_Strict):
    """Correction for the gap between the rollout engine's and the trainer's probabilities of
    the sampled tokens: each token's loss is weighted by rho = pi_old(trainer) / pi(engine),
    truncated or masked (gspo_cli.algorithms.mismatch)."""

    mode: str = Field("off", description="off, or a correction registered in gspo_cli.algorithms.MISMATCH_CORRECTIONS")
    low: float = Field(0.5, ge=0, le=1, description="mask modes: drop below this ratio")
    high: float = Field(2.0, ge=1, description="truncate modes: cap; mask modes: drop above this ratio")

    @model_validator(mode="after")
    def _check(self):
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class ArmConfig(_Strict):
    """One arm of the experiment: an algorithm with every setting that defines it."""

    name: str = Field(description="arm name: the run directory <experiment>/<arm>/")
    preset: str | None = Field(None, description="fill the other fields from this preset first")
    loss: str = Field(description="a policy loss registered in gspo_cli.algorithms.POLICY_LOSSES")
    clip_low: float = Field(gt=0, lt=1, description="epsilon_low: ratios below 1 - clip_low are clipped")
    clip_high: float = Field(gt=0, description="epsilon_high: ratios above 1 + clip_high are clipped")
    aggregation: str = Field("seq_mean_token_mean", description="registered in gspo_cli.algorithms.AGGREGATIONS")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per rollout batch (all but the first off-policy)")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch")
    routing_replay: Literal["off", "r2", "r3"] = Field(
        "off", description="MoE: r2 replays pi_old's routes (the trainer's), r3 the rollout engine's"
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL penalty to the initial policy")
    advantage: str = Field("grpo", description="registered in gspo_cli.algorithms.ADVANTAGE_ESTIMATORS")
    adv_eps: float = Field(1e-6, ge=0, description="added to the group std before dividing")
    mismatch: MismatchConfig = Field(MismatchConfig(), description="rollout/trainer mismatch correction")

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "arm names")
