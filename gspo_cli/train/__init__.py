"""The RL loop top to bottom: `preflight` (every check before a model loads, in order), `loop`
(experiment -> runs -> steps), `step` (rollout, rewards, advantages, old log-probs, mini-batch
updates), `stats` (step metrics reduced across ranks),
`optim`, `staleness` (one-step-stale rollouts), `resume` (skip, resume or start afresh),
`checkpoint` (whole or per-rank sharded), `export` (checkpoint -> HF directory), `watch` (signals, collapse),
`sinks` (TensorBoard, W&B), `reporting` (plain progress lines), `sweep` (many runs) and
`until_decided` (rounds of seeds until the sequential rule of `analysis.stats` decides)."""
