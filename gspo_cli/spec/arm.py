"""`arms:` one algorithm per arm with every setting that defines it (loss and its parameters,
clip range, aggregation, mini-batches, routing replay, advantage estimator, multi-reward, mismatch
correction, token filters, off-policy mask, overlong handling, dynamic sampling)."""

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
    rejected: Literal["drop", "zero"] = Field(
        "drop",
        description="mask modes: drop: rejected tokens leave the loss's count (verl's rejection sampling); "
        "zero: they stay in it at weight 0",
    )

    @model_validator(mode="after")
    def _check(self):
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class TokenFilterConfig(_Strict):
    """Which response tokens carry gradient (gspo_cli.algorithms.filters); token-level losses only."""

    entropy_top: float | None = Field(
        None,
        gt=0,
        le=1,
        description="80/20 rule: only this share of highest-entropy tokens (pi_old's entropy, over the "
        "rollout batch of all processes) carries gradient; paper 0.2",
    )


class OverlongConfig(_Strict):
    """DAPO's treatment of responses near or past rollout.max_new_tokens."""

    filter: bool = Field(False, description="truncated responses (no EOS) leave the loss and its count")
    buffer_frac: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="soft punishment: the last buffer_frac x max_new_tokens tokens ramp the reward down "
        "to -penalty (DAPO: 4096 of 20480, 0.2); 0: off",
    )
    penalty: float = Field(1.0, ge=0, description="soft punishment at the maximum length")


SIGNAL_METRICS = ("correct", "reward", "shaped")
MULTI_REWARD = ("sum_then_normalize", "normalize_then_sum")


class DynamicSamplingConfig(_Strict):
    """DAPO's dynamic sampling: drop groups whose `metric` is equal in every response and sample
    more prompts until the batch holds rollout.prompts_per_step groups with signal."""

    max_rounds: int = Field(0, ge=0, description="extra generation rounds at most per step; 0: off")
    metric: str = Field(
        "correct",
        description="what a group must differ in to count as signal: correct: the task's verdict (DAPO and "
        "verl's recipe, filter_groups.metric acc; code with partial_reward: all tests passed); reward: the "
        "task's reward (verl: score); shaped: the reward the advantages see, with the overlong penalty "
        "(verl: seq_reward); reward:<name>: the named reward of task.rewards, over the rows it applies to",
        json_schema_extra={"pattern": r"^(correct|reward|shaped|reward:\S(.*\S)?)$"},
    )

    @field_validator("metric")
    @classmethod
    def _metric_form(cls, v: str) -> str:
        name = v.removeprefix("reward:")
        if v not in SIGNAL_METRICS and (name == v or not name or name != name.strip()):
            raise ValueError(f"expected {', '.join(SIGNAL_METRICS)} or reward:<name> (a task.rewards name); got {v!r}")
        return v


class ArmConfig(_Strict):
    """One arm of the experiment: an algorithm with every setting that defines it."""

    name: str = Field(description="arm name: the run directory <experiment>/<arm>/")
    preset: str | None = Field(None, description="fill the other fields from this preset first")
    loss: str = Field(description="a policy loss registered in gspo_cli.algorithms.POLICY_LOSSES")
    clip_low: float = Field(
        gt=0,
        description="epsilon_low, as the loss reads it: losses that clip the ratio (grpo, gspo, gspo_token, "
        "luspo, clip_cov, cispo) clip below 1 - clip_low, so at most 1 (1.0: no lower bound, CISPO's); gmpo "
        "clips the token log-ratio below -clip_low (ratio e^-clip_low; any positive value); sapo and kl_cov "
        "do not use it",
    )
    clip_high: float = Field(
        gt=0,
        description="epsilon_high: ratios above 1 + clip_high are clipped (gmpo: log-ratios above clip_high; "
        "sapo, kl_cov: unused)",
    )
    clip_dual: float | None = Field(
        None,
        gt=1,
        description="dual-clip PPO (Ye et al. 2020, arXiv:1912.09729; verl clip_ratio_c, default 3 there): a "
        "negative-advantage token's objective is at least clip_dual x A, so ratios above clip_dual carry no "
        "gradient; the token-level PPO-clipped losses only (grpo, gspo_token, clip_cov); null: off",
    )
    aggregation: str = Field("seq_mean_token_mean", description="registered in gspo_cli.algorithms.AGGREGATIONS")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per rollout batch (all but the first off-policy)")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch")
    routing_replay: Literal["off", "r2", "r3"] = Field(
        "off", description="MoE: r2 replays pi_old's routes (the trainer's), r3 the rollout engine's"
    )
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL penalty to the initial policy")
    advantage: str = Field("grpo", description="registered in gspo_cli.algorithms.ADVANTAGE_ESTIMATORS")
    adv_eps: float = Field(1e-6, ge=0, description="added to the group std before dividing")
    multi_reward: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        "sum_then_normalize",
        description="how several task.rewards make one advantage: sum_then_normalize: their weighted sum is "
        "the reward the advantage estimator normalises; normalize_then_sum (GDPO; TRL's "
        "multi_objective_aggregation): each reward normalised within its group over the rows it applies to, "
        "then the weighted sum, divided by its std over the batch; needs advantage grpo and 2 or more "
        "task.rewards",
    )
    mismatch: MismatchConfig = Field(MismatchConfig(), description="rollout/trainer mismatch correction")
    anchor: Literal["behaviour", "proximal"] = Field(
        "behaviour",
        description="with rollout.staleness >= 1, the policy the ratios are taken against (the trust region's "
        "anchor): behaviour: the sampler's log-probs; proximal: the trainer's forward of the weights before this "
        "step's first update, each token's loss weighed by pi_prox / pi_behav (AReaL's decoupled PPO; per "
        "response, the geometric mean, for sequence-level losses; bounded by mismatch.mode when set); one more "
        "no-grad forward per step. At staleness 0 both are the same policy (docs/algorithms/anchors.md)",
    )
    loss_params: dict[str, float] = Field(
        default_factory=dict,
        description="the loss's own keyword parameters (e.g. sapo: tau_pos, tau_neg); defaults: the paper's",
    )
    token_filter: TokenFilterConfig = TokenFilterConfig()
    off_policy_mask: float | None = Field(
        None,
        ge=0,
        description="DeepSeek-V3.2: drop responses with A < 0 whose mean log(pi_old / pi_theta) exceeds this delta",
    )
    overlong: OverlongConfig = OverlongConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "arm names")


def reward_problems(i: int, arm: ArmConfig, rewards: list[str], judged: bool = False) -> list[str]:
    """One line per setting of arm `i` that names or needs task.rewards (their names: `rewards`;
    `judged`: one is marked `correct: true`) and cannot have them: multi_reward normalize_then_sum,
    dynamic_sampling.metric reward:<name>, and dynamic sampling by `correct` when task.rewards
    replace the task's verdict and none decides correctness (every row would be incorrect, so no
    group would ever have signal)."""
    problems = []
    where = f"arms[{i}]"
    if arm.multi_reward == "normalize_then_sum":
        if len(rewards) < 2:
            have = f"task.rewards has {len(rewards)}" if rewards else "the task scores with its own verifier"
            problems.append(
                f"{where}.multi_reward: normalize_then_sum normalises each of 2 or more task.rewards in its group; "
                f"{have} (one reward gives grpo's advantages times one batch-wide factor): use sum_then_normalize"
            )
        elif arm.advantage != "grpo":
            problems.append(
                f"{where}.multi_reward: normalize_then_sum normalises each reward by its group mean and std in "
                f"place of the advantage estimator; it needs advantage: grpo (got {arm.advantage})"
            )
    metric = arm.dynamic_sampling.metric
    if metric not in SIGNAL_METRICS:
        name = metric.removeprefix("reward:")
        if name not in rewards:
            known = f"task.rewards names: {', '.join(rewards)}" if rewards else "the task has no task.rewards"
            problems.append(f"{where}.dynamic_sampling.metric: no reward named {name!r} ({known})")
    if arm.dynamic_sampling.max_rounds and metric == "correct" and rewards and not judged:
        problems.append(
            f"{where}.dynamic_sampling.metric: correct needs a reward of task.rewards marked correct: true, and "
            f"none is (every group would lack signal): mark the one that decides correctness, or set metric: "
            f"reward (their weighted sum) or reward:<name> (one of {', '.join(rewards)})"
        )
    return problems


class AggregationWarning(UserWarning):
    """A sequence-level loss under an aggregation that weighs its responses by their length."""


def aggregation_warning(i: int, arm: ArmConfig) -> str | None:
    """One line when arm `i` has a sequence-level loss (one ratio per response: gspo, luspo,
    gmpo) and an aggregation that does not weigh its responses equally: the objective becomes
    length-weighted, which the loss's paper does not have (TRL warns likewise). None otherwise,
    and for names no registry holds (the spec refuses those). Imports the algorithms (torch)."""
    from gspo_cli import algorithms

    if arm.loss not in algorithms.LOSS_LEVELS or arm.aggregation not in algorithms.AGGREGATIONS:
        return None
    if algorithms.LOSS_LEVELS[arm.loss] != "sequence" or algorithms.weighs_responses_equally(arm.aggregation):
        return None
    return (
        f"arms[{i}].aggregation: {arm.aggregation} weighs each response of the sequence-level loss {arm.loss} "
        "by its token count, a length-weighted objective its paper does not have; seq_mean_token_mean "
        "gives the mean over responses"
    )
