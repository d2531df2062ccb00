"""The anchor of the trust region: which policy an arm's ratios are taken against when the
batch is stale (rollout.staleness k >= 1). docs/algorithms/anchors.md has the formulas.

* ``behaviour``: the policy that sampled the batch (its log-probs come with the batch). The
  loss's ratio is pi_theta / pi_behav, clipped there; the default, and staleness 1's first rule.
* ``proximal``: the policy just before this step's first update (one no-grad forward of the
  trainer's weights), AReaL's decoupled PPO objective (arXiv:2505.24298): the ratio
  pi_theta / pi_prox is clipped, and each token's loss is weighed by pi_prox / pi_behav, the
  importance weight that corrects for sampling with the behaviour policy. The arm's mismatch
  settings, when set, bound that weight (truncate or mask: algorithms/mismatch.py, with
  pi_prox in the trainer's place and pi_behav in the engine's); without them the weight is
  left unbounded, as AReaL's default, per token for token-level losses and, for sequence-level
  losses (GSPO, LUSPO, GMPO), per response as the geometric mean exp(mean_t log(pi_prox /
  pi_behav)), the same length normalisation as their ratio.

At staleness 0 the proximal and behaviour policies are the same weights, so the anchors agree
and ``proximal`` costs nothing: the step takes exactly the behaviour anchor's path.
"""

from __future__ import annotations

from .mismatch import Correction, _log_ratio, _seq_log_ratio_BC, _token_ratio, get_mismatch_correction

ANCHORS = ("behaviour", "proximal")


def decoupled_token(prox_logp_BC, behav_logp_BC, mask_BC, *, low: float = 0.0, high: float = 0.0) -> Correction:
    """Per-token weight w_t = pi_prox / pi_behav (log-ratio clamped, no bound): AReaL's decoupled weight."""
    del low, high
    lr_BC, keep_BC = _log_ratio(prox_logp_BC, behav_logp_BC, mask_BC)
    weight_BC = _token_ratio(lr_BC) * keep_BC
    none_BC = keep_BC & False
    return Correction(weight_BC, none_BC, none_BC)


def decoupled_sequence(prox_logp_BC, behav_logp_BC, mask_BC, *, low: float = 0.0, high: float = 0.0) -> Correction:
    """Per-response weight w_i = exp(mean_t log(pi_prox / pi_behav)) on every token of response i."""
    del low, high
    lr_BC, keep_BC = _log_ratio(prox_logp_BC, behav_logp_BC, mask_BC)
    weight_BC = _seq_log_ratio_BC(lr_BC, keep_BC, mean=True).exp() * keep_BC
    none_BC = keep_BC & False
    return Correction(weight_BC, none_BC, none_BC)


def uses_proximal(anchor: str, staleness: int) -> bool:
    """Whether the step needs the proximal forward: anchor proximal on a stale batch."""
    return anchor == "proximal" and staleness > 0


def anchor_correction(anchor: str, staleness: int, mismatch_mode: str, loss_level: str):
    """The weight function of the step (called as a mismatch correction: (trainer's pi_old,
    the batch's sampler log-probs, mask)), or None for no weight. Behaviour anchor, or
    staleness 0: the arm's mismatch correction as without staleness. Proximal anchor on a
    stale batch: the mismatch correction bounds pi_prox / pi_behav when set, else the
    unbounded decoupled weight at the loss's level."""
    if mismatch_mode != "off":
        return get_mismatch_correction(mismatch_mode)
    if not uses_proximal(anchor, staleness):
        return None
    return decoupled_sequence if loss_level == "sequence" else decoupled_token
