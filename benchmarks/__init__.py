"""`make bench` (bench.py) and the vLLM rollout measurement (vllm_rollout.py); not part of the package."""
