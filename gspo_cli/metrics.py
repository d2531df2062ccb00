"""Every metric the trainer logs, defined once: its key, its meaning and its unit.

compare and plot read labels from here; the trainer computes values in train.py.
Keys are namespaced by what they measure and name their granularity.
"""

from __future__ import annotations

import math
import re

METRICS: dict[str, tuple[str, str]] = {
    # key: (description, unit)
    "step": ("optimizer phase (one rollout batch) index, from 1", "step"),
    "reward/mean": ("mean reward of the rollout batch", "reward"),
    "reward/std": ("standard deviation of rewards in the batch", "reward"),
    "reward/accuracy": ("share of responses the verifier judged correct", "fraction"),
    "reward/zero_var_group_frac": ("share of groups whose rewards are all equal (no signal)", "fraction"),
    "reward/no_reward_frac": (
        "task.rewards: share of responses no reward function applied to (all returned None; reward 0, advantage 0)",
        "fraction",
    ),
    "response/length_mean": ("mean response length (multi-turn: the model's own tokens)", "tokens"),
    "response/length_max": ("longest response", "tokens"),
    "response/truncated_frac": ("share of responses that hit max_new_tokens without EOS", "fraction"),
    "tools/turns_mean": ("task.environment: model turns per response", "turns"),
    "tools/tool_calls_mean": ("task.environment: tool calls per response", "calls"),
    "tools/tool_errors_mean": ("task.environment: tool calls per response that failed (error, limit)", "calls"),
    "tools/tool_timeouts_mean": ("task.environment: tool calls per response stopped at the time-out", "calls"),
    "tools/env_token_frac": ("task.environment: share of response tokens the environment inserted", "fraction"),
    "policy/loss": ("policy loss, mean over mini-batches", "loss"),
    "policy/clip_frac_token": ("share of response tokens whose gradient was zeroed by clipping", "fraction"),
    "policy/clip_frac_token_low": ("clipped tokens with ratio < 1-eps_low and negative advantage", "fraction"),
    "policy/clip_frac_token_high": ("clipped tokens with ratio > 1+eps_high and positive advantage", "fraction"),
    "policy/clip_frac_token_dual": (
        "clip_dual set: clipped tokens with ratio > clip_dual and negative advantage (dual-clip PPO; part of "
        "clip_frac_token, in neither low nor high)",
        "fraction",
    ),
    "policy/clip_frac_seq": ("mean over responses of each response's clipped-token share", "fraction"),
    "policy/ratio_mean": ("mean importance ratio over response tokens (token or sequence level)", "ratio"),
    "policy/ratio_min": ("smallest importance ratio", "ratio"),
    "policy/ratio_max": ("largest importance ratio", "ratio"),
    "policy/seq_ratio_mean": ("mean length-normalised sequence ratio", "ratio"),
    "policy/kl_old_k3": ("k3 estimate of KL(pi_old || pi_theta) per token", "nats"),
    "policy/kl_ref_k3": (
        "k3 estimate of KL to the reference (initial) policy per token, when kl_coef > 0: the mean over "
        "exactly the tokens the KL penalty averages, every token of the loss's mask, those of weight 0 "
        "(token filter, off-policy mask, mismatch.rejected: zero) included",
        "nats",
    ),
    "policy/entropy": ("mean per-token entropy of the sampling distribution (pi_old)", "nats"),
    "policy/grad_norm": ("gradient norm before clipping, mean over mini-batches", "norm"),
    "policy/lr": ("learning rate", "lr"),
    "moe/expert_change_frac": (
        "share of (token, layer, slot) expert choices that differ between pi_old and the current "
        "policy on the same rollout, at the positions that predict response tokens, over forwards after at "
        "least one update",
        "fraction",
    ),
    "moe/engine_route_diff_frac": (
        "routing_replay r3: share of (token, layer, slot) expert choices the trainer's router makes differently "
        "from the rollout engine's routes, on the first mini-batch, before any update of the step: at the "
        "sampling weights with rollout.staleness 0; with staleness k the trainer is k updates ahead of the "
        "weights that sampled, so it also counts those updates' route drift",
        "fraction",
    ),
    "mismatch/weight_mean": (
        "mismatch correction (or a proximal anchor's pi_prox / pi_behav on a stale batch): mean loss weight "
        "over response tokens (0 for dropped tokens; 1 = no correction)",
        "weight",
    ),
    "mismatch/masked_token_frac": ("mismatch correction: share of response tokens dropped (weight 0)", "fraction"),
    "mismatch/masked_seq_frac": ("mismatch correction: share of responses with at least one dropped token", "fraction"),
    "mismatch/truncated_token_frac": (
        "mismatch correction: share of response tokens whose weight was capped at `high`",
        "fraction",
    ),
    "mismatch/truncated_seq_frac": (
        "mismatch correction: share of responses with at least one capped weight",
        "fraction",
    ),
    "moe/aux_loss": (
        "router load-balancing loss of the whole mini-batch (all processes), mean over mini-batches "
        "(only when router_aux_loss_coef > 0)",
        "loss",
    ),
    "policy/dropped_token_frac": (
        "share of response tokens the loss cannot move (weight 0 or out of its count: mismatch masks, token "
        "filter, off-policy mask, overlong filter); clip fractions, ratio statistics and KL skip them",
        "fraction",
    ),
    "policy/off_policy_mask_sampler": (
        "off_policy_mask set: 1 when the mask compared pi_theta with the sampler's log-probs the batch "
        "carries (vLLM, the hf engine's sampler_logprobs; under rollout.staleness the worker's batch, which "
        "holds its own full forward of the sampling weights when the sampler returned none), 0 when with "
        "the trainer's pi_old",
        "flag",
    ),
    "policy/cov_selected_frac": (
        "clip_cov / kl_cov: share of the trained tokens (weight not 0) selected by their cov(A, log pi) "
        "(detached / KL-penalised)",
        "fraction",
    ),
    "rollout/dynamic_rounds": ("dynamic sampling: extra generation rounds this step", "rounds"),
    "rollout/signal_group_frac": (
        "dynamic sampling: share of trained groups whose dynamic_sampling.metric (by default the task's "
        "verdict) differs between responses",
        "fraction",
    ),
    "rollout/sampled_groups": ("dynamic sampling: groups generated this step, all rounds and processes", "groups"),
    "rollout/logprob_diff_mean": (
        "|sampler - trainer| log-prob of the sampled tokens, mean over response tokens "
        "(vLLM: every step; hf: every rollout.logprob_check_every steps)",
        "nats",
    ),
    "rollout/logprob_diff_max": (
        "|sampler - trainer| log-prob of the sampled tokens, max over response tokens",
        "nats",
    ),
    "rollout/staleness": (
        "rollout.staleness k: policy versions (finished steps) between the weights that sampled the "
        "batch and those it trains: step s's is min(s - 1, k)",
        "steps",
    ),
    "rollout/staleness_mean": (
        "rollout.staleness k: that lag, mean over the batch's rows (each row's sampling version is in "
        "samples.jsonl as policy_version); k after the first k steps",
        "steps",
    ),
    "rollout/staleness_max": ("rollout.staleness k: that lag, max over the batch's rows", "steps"),
    "perf/rollout_wait_s": (
        "rollout.staleness k: time the trainer waited for the worker's batch (0 when sampling kept up)",
        "s",
    ),
    "policy/skipped_minibatches": ("non-finite mini-batches dropped this step (divergence.skip_bad_batches)", "count"),
    "time/rollout_s": ("generation time", "s"),
    "time/score_s": ("verifier time", "s"),
    "time/weight_sync_s": (
        "rollout.staleness k: copying the trainer's weights into the worker's shared memory (part of the step)",
        "s",
    ),
    "time/old_logp_s": ("old-policy log-prob pass (and route recording)", "s"),
    "time/update_s": ("forward/backward/optimizer time over all mini-batches", "s"),
    "time/step_s": ("wall time of the whole step", "s"),
    "time/elapsed_s": ("wall time since the run started (training only)", "s"),
    "perf/peak_rss_mb": ("peak resident memory of the largest process so far (loading included)", "MB"),
    "perf/peak_gpu_mb": ("peak GPU memory allocated by torch in the largest process so far (CUDA only)", "MB"),
    "perf/tokens_per_s": ("response tokens of all processes per second of the slowest process's step time", "tokens/s"),
    "perf/micro_batches": (
        "train.micro_batch_tokens / micro_batch_rows: micro-batches one process ran per mini-batch update, mean "
        "over the step's updates and processes (logged when an update was split)",
        "count",
    ),
    "perf/oversize_rows": (
        "rows longer than train.micro_batch_tokens, each run alone as its own micro-batch, summed over the "
        "step's updates and processes",
        "rows",
    ),
}

# Statistics returned by every policy loss: the metric each becomes and what its mean is
# over (response tokens or non-empty responses), so that mini-batches and processes combine
# into the step's value with the right weights.
LOSS_STAT_KEYS = {
    "clip_frac_token": ("policy/clip_frac_token", "tokens"),
    "clip_frac_token_low": ("policy/clip_frac_token_low", "tokens"),
    "clip_frac_token_high": ("policy/clip_frac_token_high", "tokens"),
    "clip_frac_token_dual": ("policy/clip_frac_token_dual", "tokens"),
    "clip_frac_seq": ("policy/clip_frac_seq", "responses"),
    "ratio_mean": ("policy/ratio_mean", "tokens"),
    "seq_ratio_mean": ("policy/seq_ratio_mean", "responses"),
    "approx_kl": ("policy/kl_old_k3", "tokens"),
    "cov_frac": ("policy/cov_selected_frac", "tokens"),
}


# Evaluation scores are logged per evaluation set: eval/<set name>/<score>, the score being one
# of eval.scores' (avg@K, pass@k, maj@K, timeout_frac, runtime_error_frac, rating). Without
# named sets the held-out split of the training source is the set, named after the task.
EVAL_PREFIX = "eval/"


# The names an evaluation's scores take (eval.scores.summarize): avg@K, pass@k, maj@K, rating,
# reward_mean / reward_<name>, and the failure shares (timeout_frac, runtime_error_frac).
SCORE_NAME = re.compile(r"(avg|maj|pass)@\d+|rating|reward_\w+|\w+_frac")


def is_known(key: str) -> bool:
    """Whether `key` names something a run writes: an evaluation score name (SCORE_NAME) or a
    metrics.jsonl key `describe` knows (METRICS, reward/<name>, eval/<set>/<score>, ratio/...)."""
    return bool(SCORE_NAME.fullmatch(key)) or describe(key) != (key, "")


# Which way is better, for a metric key or a score name, in one place (compare's verdicts and
# --until-decided read it): more reward or score is better; less KL, loss, time, failure or tool
# error is better; anything else (entropy, lengths, clip fractions, ratios) has no direction.
_LOWER_WORDS = ("kl", "loss", "collapse", "tool_errors", "tool_timeouts")


def direction(key: str) -> int:
    """+1 when higher is better, -1 when lower is better, 0 when `key` has no direction."""
    name = key.lower()
    score = split_eval_key(name)[1] if split_eval_key(name) else name
    if any(w in name for w in _LOWER_WORDS) or name.startswith(("time/", "perf/")) or name.endswith("_s"):
        return -1
    if score.endswith("_frac") and SCORE_NAME.fullmatch(score):  # an evaluation's failure share
        return -1
    if SCORE_NAME.fullmatch(score) and not score.endswith("_std"):  # avg@K, pass@k, maj@K, rating, reward_*
        return 1
    spread = name == REWARD_PREFIX + "std" or name.endswith(SPREAD_SUFFIX)
    if name.startswith(REWARD_PREFIX) and not spread and "frac" not in name:
        return 1  # reward/mean, reward/accuracy, reward/<name>
    return 0


def eval_key(set_name: str, score: str) -> str:
    """The key of one evaluation set's score, e.g. eval_key("aime24", "avg@4") = "eval/aime24/avg@4"."""
    return f"{EVAL_PREFIX}{set_name}/{score}"


def split_eval_key(key: str) -> tuple[str, str] | None:
    """(set name, score) of an eval key, None for other keys. A set name has no slash."""
    if not key.startswith(EVAL_PREFIX) or "/" not in key[len(EVAL_PREFIX) :]:
        return None
    name, score = key[len(EVAL_PREFIX) :].split("/", 1)
    return name, score


# A reward function of task.rewards (or a task's own component: correct, format) is logged
# as reward/<name>, its mean over the rows it applies to, beside reward/<name>_std, the
# sample standard deviation over those rows (as reward/std beside reward/mean).
REWARD_PREFIX = "reward/"
SPREAD_SUFFIX = "_std"


def reward_key(name: str) -> str:
    """The key of one named reward's mean: reward_key("format") = "reward/format"."""
    return f"{REWARD_PREFIX}{name}"


def reward_std_key(name: str) -> str:
    """The key of one named reward's spread: reward_std_key("format") = "reward/format_std"."""
    return f"{REWARD_PREFIX}{name}{SPREAD_SUFFIX}"


def eval_reward_score(name: str) -> str:
    """An evaluation set's score for one named reward, its mean over the samples it applies to:
    eval_reward_score("format") = "reward_format" (the weighted sum: "reward_mean")."""
    return f"reward_{name}"


def judge_unparsable_key(name: str) -> str:
    """The key of an LLM judge's share of answers its pattern found no score in:
    judge_unparsable_key("judge") = "judge/judge/unparsable_frac"."""
    return f"judge/{name}/unparsable_frac"


def describe(key: str) -> tuple[str, str]:
    """(description, unit) for a key; eval keys are generated per evaluation set, reward/<name>
    keys per named reward."""
    if key in METRICS:
        return METRICS[key]
    if key.startswith(REWARD_PREFIX) and "/" not in key[len(REWARD_PREFIX) :]:
        name = key[len(REWARD_PREFIX) :]
        if name.endswith(SPREAD_SUFFIX) and name != SPREAD_SUFFIX:
            stem = name[: -len(SPREAD_SUFFIX)]
            return (f"standard deviation of reward {stem} over the rows it applies to", "reward")
        return (f"mean of reward {name} over the rows it applies to (task.rewards, or the task's own part)", "reward")
    if key.startswith("judge/") and key.endswith("/unparsable_frac"):
        return (
            f"share of LLM judge {key[6:-16]}'s answers its pattern found no score in (scored `unparsable`)",
            "fraction",
        )
    if (parts := split_eval_key(key)) is not None:
        return (f"score {parts[1]} on evaluation set {parts[0]}", "score")
    if key.startswith("ratio/logvar_mb"):
        return (
            f"variance of token log(pi_theta / pi_old) over the response tokens of mini-batch {key[15:]} of the "
            "step (0: the first; on-policy, ~0, only with rollout.staleness 0: with staleness k and the behaviour "
            "anchor pi_old is the weights that sampled, k updates behind, so mini-batch 0 includes their drift; "
            "with the proximal anchor pi_old is the trainer's weights before the step, ~0 again)",
            "nats^2",
        )
    if key.startswith("ratio/logvar_len_"):
        lo, hi = key[17:].split("_")
        return (
            f"variance of token log(pi_theta / pi_old) over the tokens of responses {lo}-{hi} tokens long, "
            "all mini-batches",
            "nats^2",
        )
    return (key, "")


# What a metric's unit allows: a band over seeds (mean ± 95% CI) is clipped to it, so a figure never
# draws a KL, a gradient norm or a variance below 0, nor a fraction above 1. Units not listed
# (reward, loss, score, lr) are unbounded.
UNIT_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "fraction": (0.0, 1.0),
    **dict.fromkeys(
        ("nats", "nats^2", "norm", "ratio", "weight", "tokens", "calls", "turns", "count", "s", "MB", "steps"),
        (0.0, None),
    ),
}


def bounds(key: str) -> tuple[float | None, float | None]:
    """(lowest, highest) value `key` can take by its unit (`describe`); None: no bound."""
    return UNIT_BOUNDS.get(describe(key)[1], (None, None))


# Statistics of a mismatch correction (algorithms.correction_stats): the metric each becomes
# and what its mean is over, as for LOSS_STAT_KEYS.
MISMATCH_STAT_KEYS = {
    "weight_mean": ("mismatch/weight_mean", "tokens"),
    "masked_token_frac": ("mismatch/masked_token_frac", "tokens"),
    "truncated_token_frac": ("mismatch/truncated_token_frac", "tokens"),
    "masked_seq_frac": ("mismatch/masked_seq_frac", "responses"),
    "truncated_seq_frac": ("mismatch/truncated_seq_frac", "responses"),
}


# Below this a value is float noise (a KL of 1e-14 from two forwards that agree to the last bit).
FLOAT_NOISE = 1e-9


def no_signal(zero_var_frac, reward_std) -> bool:
    """Whether a run had no reward signal: at every logged step all groups were zero-variance
    (reward/zero_var_group_frac = 1), or, without that metric, the batch's rewards were
    constant (reward/std = 0). Each argument is a sequence of per-step values (NaN skipped); no
    step logged: False (nothing to say). The one test, used by `gspo plot`'s note, `gspo compare`,
    `gspo report` and the trainer's end-of-run line."""
    z = [float(v) for v in zero_var_frac if math.isfinite(float(v))]
    if z:
        return all(v >= 1.0 - FLOAT_NOISE for v in z)
    s = [float(v) for v in reward_std if math.isfinite(float(v))]
    return bool(s) and all(abs(v) < FLOAT_NOISE for v in s)
