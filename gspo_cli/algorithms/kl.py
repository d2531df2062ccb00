"""KL estimators between the policy and another policy, per response token.

The k3 estimator (Schulman, "Approximating KL divergence", 2020) of KL(π_θ ‖ π_ref) from
samples: with r = π_ref / π_θ at the sampled token, k3 = r − 1 − log r. It is never
negative (x − 1 ≥ log x), unlike the plain −log r, and unbiased when the tokens come from
π_θ itself (in a step they come from π_old, which is close).
"""

from __future__ import annotations

import torch

# Log-ratios are clamped to +-20 before exp: exp(20) ~ 4.9e8 is far outside any clip range,
# so the clamp never changes a decision, and a stale or broken policy cannot overflow to inf.
LOG_RATIO_CLAMP = 20.0


def kl_k3_BC(logp_BC: torch.Tensor, ref_logp_BC: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_θ ‖ π_ref), (B, C) -> (B, C), in nats.

    `logp_BC` are the current policy's log-probs of the sampled response tokens, `ref_logp_BC`
    the reference policy's. log r is clamped to ±LOG_RATIO_CLAMP first, so a token the
    reference finds far likelier (or unlikelier) gives a large finite value, not inf (exp of a
    large log-ratio overflows). Padding positions hold whatever their inputs give: callers
    aggregate under the response mask. Differentiable in `logp_BC`; shapes must match
    (broadcasting is not intended).
    """
    if logp_BC.shape != ref_logp_BC.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp_BC.shape)}, ref_logp {tuple(ref_logp_BC.shape)}")
    log_r_BC = (ref_logp_BC - logp_BC).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(log_r_BC) - log_r_BC  # expm1: exact for the tiny ratios of a near-on-policy step
