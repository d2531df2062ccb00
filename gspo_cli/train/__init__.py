"""The RL loop top to bottom: `loop` (experiment -> runs -> steps), `step` (rollout, rewards,
advantages, old log-probs, mini-batch updates), `stats` (step metrics reduced across ranks),
`optim`, `staleness` (one-step-stale rollouts), `resume` (skip, resume or start afresh),
`checkpoint` (whole or per-rank sharded), `export` (checkpoint -> HF directory), `watch` (signals, collapse),
`sinks` (TensorBoard, W&B), `reporting` (plain progress lines) and `sweep` (many runs)."""
