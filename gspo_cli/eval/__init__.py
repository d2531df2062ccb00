"""Held-out scoring: `scores` (pass@k, avg@K, maj@K over a task's verifier) and `run` (`gspo eval`:
resolve a run, checkpoint or model, sample, score, write)."""
