"""The figures `gspo plot` can draw, defined once: each curve figure's metric, title and axis
label, and the profile families (one point per bucket, not a curve over training). `plot`
draws them; `report` and `--metrics` name them by these ids."""

from __future__ import annotations

from dataclasses import dataclass

from gspo_cli.metrics import reward_key

# The combined figure's panels when --metrics is not given: what a paper shows, where the runs
# have it. Every figure with data still gets its own file.
PANEL_FIGURES = ("reward", "eval", "clip", "expert_change", "engine_route_diff", "mismatch", "tools")


@dataclass(frozen=True)
class FigureSpec:
    key: str
    title: str
    ylabel: str
    log: bool = False
    dashed: tuple[tuple[str, str, str], ...] = ()  # (key, linestyle, legend name): no band
    x: str | None = None  # a fixed x axis, whatever --x says


FIGURES: dict[str, FigureSpec] = {
    "reward": FigureSpec("reward/mean", "Train reward", "mean reward"),
    "reward_time": FigureSpec("reward/mean", "Train reward vs wall time", "mean reward", x="time"),
    "eval": FigureSpec("eval", "Held-out score", "score"),  # one figure per task
    "clip": FigureSpec(
        "policy/clip_frac_token",
        "Clipped-token fraction (GSPO paper, Fig. 2)",
        "clipped tokens",
        log=True,
        dashed=(
            ("policy/clip_frac_token_low", "--", "low: ratio < 1-ε_low, Â < 0"),
            ("policy/clip_frac_token_high", ":", "high: ratio > 1+ε_high, Â > 0"),
        ),
    ),
    "expert_change": FigureSpec("moe/expert_change_frac", "MoE expert change (π_old vs π_θ)", "changed expert choices"),
    "engine_route_diff": FigureSpec(
        "moe/engine_route_diff_frac",
        "MoE routes: engine vs trainer (R3, before the step's updates)",
        "differing expert choices",
    ),
    "mismatch": FigureSpec(
        "mismatch/weight_mean", "Mismatch correction: mean IS weight (π_old / π_engine)", "mean loss weight"
    ),
    "mismatch_dropped": FigureSpec(
        "mismatch/masked_token_frac",
        "Mismatch correction: dropped and capped tokens",
        "masked tokens",
        dashed=(
            ("mismatch/truncated_token_frac", "--", "capped at high"),
            ("mismatch/masked_seq_frac", ":", "responses with a masked token"),
        ),
    ),
    "kl": FigureSpec("policy/kl_old_k3", "KL(π_old ‖ π_θ), k3 estimate", "KL"),
    "entropy": FigureSpec("policy/entropy", "Policy entropy", "entropy per token"),
    "length": FigureSpec("response/length_mean", "Response length", "mean length"),
    "grad_norm": FigureSpec("policy/grad_norm", "Gradient norm (before clipping)", "grad norm"),
    # task.environment runs only (no other run logs tools/*): per response, and the share of
    # the response the environment wrote, which no loss sees
    "tools": FigureSpec(
        "tools/tool_calls_mean",
        "Tool use per response: calls (solid)",
        "per response",
        dashed=(
            ("tools/turns_mean", "--", "model turns"),
            ("tools/tool_errors_mean", ":", "tool errors"),
            ("tools/tool_timeouts_mean", "-.", "tool time-outs"),
        ),
    ),
    "env_tokens": FigureSpec(
        "tools/env_token_frac", "Environment's share of the response tokens", "environment tokens"
    ),
    # one figure per named reward (reward_figure), when the runs' specs list task.rewards
    "rewards": FigureSpec("rewards", "Train reward by function", "mean reward"),
}


# Profiles: one point per bucket of a metric family (mean over each run's steps), not a curve
# over training. The GSPO paper's diagnostic: token log-ratio variance by response length and
# by mini-batch index (later mini-batches are further off-policy).
PROFILES: dict[str, tuple[str, str, str]] = {
    # figure id: (metric prefix, title, x label)
    "logvar_length": (
        "ratio/logvar_len_",
        "Token log-ratio variance by response length",
        "response length bucket [tokens]",
    ),
    "logvar_minibatch": (
        "ratio/logvar_mb",
        "Token log-ratio variance by mini-batch",
        "mini-batch index within the step (0: on-policy at rollout.staleness 0)",
    ),
}


def reward_figure(name: str) -> FigureSpec:
    """The figure of one named reward (task.rewards): its mean over the rows it applies to, by step."""
    return FigureSpec(reward_key(name), f"Train reward: {name}", f"mean {name}")
