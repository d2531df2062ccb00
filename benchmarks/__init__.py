"""`make bench` (bench.py), the reward-pool benchmark, the GPU check and the plan check; not part of the package."""
