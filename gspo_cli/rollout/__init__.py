"""Rollout engines behind one interface: `engine.generate(prompts) -> RolloutBatch`."""

from gspo_cli.rollout.base import RolloutBatch, response_logprobs
from gspo_cli.rollout.hf import HFRolloutEngine

__all__ = ["HFRolloutEngine", "RolloutBatch", "response_logprobs"]
