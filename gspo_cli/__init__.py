"""gspo-cli: a command-line experiment runner comparing GRPO and GSPO for RL post-training.

Shape letters. A tensor's name ends in the letters of its axes (`logp_BC`, `adv_B`,
`routes_LBTk`), and each letter means one thing everywhere in the package:

    B  sequences in a batch (B = Q * G)      P  prompt positions (left-padded)
    Q  prompts, i.e. groups, in a batch      C  response positions (generated tokens)
    G  group size (samples per prompt)       T  positions of a whole sequence, T = P + C
    L  MoE layers                            V  vocabulary
    k  experts chosen per token (top-k)      N  token positions flattened over a batch (B * T)

A `1` keeps a singleton axis (`mean_Q1`). Counts in score names are not axes: avg@K and
pass@k count samples per problem (`gspo_cli.eval.scores`).
"""
