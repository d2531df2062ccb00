"""Hand-written run directories with known values, for the compare and plot tests.

Experiment `exp`, arms `grpo` and `gspo`, seeds 0-2, steps 1..20 (time/elapsed_s = 2 x step):

  gspo seed k: reward 0 up to step 5+k, then c_k = 0.5, 0.6, 0.7; clip_frac_token 0.1(k+1);
               eval avg@4 at steps 0/10/20 = 0.1, 0.3+0.1k, 0.2+0.1k.
  grpo seed 0: completed, reward 0.2; seed 1: running, 12 steps then a torn line, reward 0.3;
       seed 2: diverged, reward 0.45. clip_frac_token 0.001 (seed 2: 0.003), no evals.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

GSPO_C = (0.5, 0.6, 0.7)
GRPO_R = (0.2, 0.3, 0.45)
BATCH = 4 * 2  # rollout.prompts_per_step x group_size in the specs below


def gspo_reward(seed: int, step: int) -> float:
    return 0.0 if step <= 5 + seed else GSPO_C[seed]


def length(seed: int, step: int) -> float:
    return 10.0 + seed + step


def write_run(
    root: Path,
    arm: str,
    seed: int,
    records: list[dict],
    *,
    status: str = "completed",
    evals: list[dict] = (),
    clip_high: float = 0.27,
    torn: bool = False,
    task: dict | None = None,
    samples: list[dict] = (),
) -> Path:
    d = root / "exp" / arm / f"seed{seed}"
    d.mkdir(parents=True)
    spec = {
        "name": "exp",
        "rollout": {"prompts_per_step": 4, "group_size": 2},
        "arms": [{"name": arm, "loss": arm, "clip_low": 0.2, "clip_high": clip_high}],
        "seeds": [seed],
        **({"task": task} if task is not None else {}),
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    text = "".join(json.dumps(r) + "\n" for r in records)
    if torn:
        text += '{"step": 13, "reward/me'  # a crash mid-write: no newline
    (d / "metrics.jsonl").write_text(text)
    (d / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    if samples:
        (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    info = {"status": status, "experiment": "exp", "arm": arm, "seed": seed, "step": len(records), "total_steps": 20}
    (d / "run.json").write_text(json.dumps(info))
    return d


def _record(step: int, seed: int, reward: float, clip: float) -> dict:
    return {
        "step": step,
        "reward/mean": reward,
        "policy/clip_frac_token": clip,
        "policy/clip_frac_token_low": clip / 2,
        "policy/clip_frac_token_high": clip / 2,
        "response/length_mean": length(seed, step),
        "time/step_s": 2.0,
        "time/elapsed_s": 2.0 * step,
    }


def make_experiment(root: Path) -> Path:
    """Writes root/exp/{grpo,gspo}/seed{0,1,2}; returns root/exp."""
    for k in range(3):
        recs = [_record(t, k, gspo_reward(k, t), 0.1 * (k + 1)) for t in range(1, 21)]
        evals = [
            {
                "step": s,
                "task": "arith",
                "n": 8,
                "samples": 4,
                "scores": {"avg@4": v, "pass@1": v, "pass@4": 1.0},
                "time_s": 0.1,
            }
            for s, v in ((0, 0.1), (10, 0.3 + 0.1 * k), (20, 0.2 + 0.1 * k))
        ]
        write_run(root, "gspo", k, recs, evals=evals, clip_high=4e-4)
    for k, status in enumerate(("completed", "running", "diverged")):
        steps = 12 if status == "running" else 20
        recs = [_record(t, k, GRPO_R[k], 0.003 if k == 2 else 0.001) for t in range(1, steps + 1)]
        write_run(root, "grpo", k, recs, status=status, torn=status == "running")
    return root / "exp"


def make_no_signal_experiment(root: Path, steps: int = 12) -> Path:
    """Writes root/exp/{grpo,gspo}/seed0 of a run without reward signal: every group's rewards
    equal at every step (reward 0, reward/std 0, zero_var_group_frac 1), so nothing is clipped
    (clip fractions exactly 0), the KL is float noise (1e-14 x step) and both arms log the same
    reward and length (drawn on top of each other). Returns root/exp."""
    for arm in ("grpo", "gspo"):
        recs = [
            {
                "step": t,
                "reward/mean": 0.0,
                "reward/std": 0.0,
                "reward/zero_var_group_frac": 1.0,
                "policy/clip_frac_token": 0.0,
                "policy/clip_frac_token_low": 0.0,
                "policy/clip_frac_token_high": 0.0,
                "policy/kl_old_k3": 1e-14 * t,
                "response/length_mean": 16.0,
                "time/step_s": 2.0,
                "time/elapsed_s": 2.0 * t,
            }
            for t in range(1, steps + 1)
        ]
        write_run(root, arm, 0, recs, clip_high=4e-4 if arm == "gspo" else 0.27)
    return root / "exp"


# --------------------------------------------------------------------------- known effects, for the statistics


def simulate_problem_counts(
    rng,
    *,
    experiments: int,
    seeds: int,
    problems: int,
    samples: int,
    delta: float,
    sd_seed: float = 0.03,
    sd_problem: float = 0.03,
    sd_inter: float = 0.02,
    sd_shared: float = 0.05,
):
    """Correct counts of a baseline and an arm evaluated on the same held-out problems, for
    `experiments` independent experiments at once: arrays (E, S, P) of ints out of `samples`.

    Baseline success probability of problem p at seed s: q_p + u_s (q_p uniform in [0.3, 0.7], a
    problem's difficulty; u_s ~ N(0, sd_shared), what arms share at equal seed). The arm adds
    delta + a_s + b_p + g_sp: a_s ~ N(0, sd_seed) its own training noise per seed, b_p ~ N(0,
    sd_problem) how much more problem p favours it (mean 0 over the population of problems, so the
    true difference is delta), g_sp ~ N(0, sd_inter). Counts are binomial. Probabilities are
    clipped to [0, 1], which the default sizes reach with negligible probability.
    """
    import numpy as np

    E, S, P = experiments, seeds, problems
    q = rng.uniform(0.3, 0.7, (E, 1, P))
    u = rng.normal(0, sd_shared, (E, S, 1))
    base_p = np.clip(q + u, 0, 1)
    arm_p = np.clip(
        base_p
        + delta
        + rng.normal(0, sd_seed, (E, S, 1))
        + rng.normal(0, sd_problem, (E, 1, P))
        + rng.normal(0, sd_inter, (E, S, P)),
        0,
        1,
    )
    return rng.binomial(samples, arm_p), rng.binomial(samples, base_p)


def simulate_seed_values(rng, *, experiments: int, seeds: int, delta: float, sd_diff: float, sd_base: float = 0.2):
    """Per-seed numbers of a baseline and an arm, (E, S) each: baseline ~ N(0.5, sd_base) per seed
    (widely spread, shared by the arm at equal seed), arm = baseline + delta + N(0, sd_diff)."""
    base = 0.5 + rng.normal(0, sd_base, (experiments, seeds))
    return base + delta + rng.normal(0, sd_diff, (experiments, seeds)), base


def make_problem_experiment(
    root: Path,
    *,
    arms: dict[str, float],
    seeds: tuple[int, ...] = (0, 1, 2),
    problems: int = 40,
    samples: int = 4,
    rng_seed: int = 0,
    records: bool = True,
    comparison: dict | None = None,
    arm_fields: dict | None = None,
    sd_seed: float = 0.03,
    sd_problem: float = 0.03,
    sd_shared: float = 0.05,
) -> Path:
    """root/exp/<arm>/seed<k> for each arm (name -> its true difference from 0; the baseline is the
    arm given 0.0): the model of `simulate_problem_counts`, q_p + u_s shared by every arm at equal
    seed, each arm adding its difference + a_s + b_p. One held-out evaluation at step 10 with
    problem records in eval.jsonl ("problems": id, correct, reward); train reward = the held-out
    score at every step. `records=False` writes the same scores without problem records (a run
    from before they existed). `comparison`: the spec's comparison section; `arm_fields`: spec
    fields added to every arm (e.g. mini_batches). Returns root/exp."""
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    S, P = len(seeds), problems
    shared = rng.uniform(0.3, 0.7, (1, P)) + rng.normal(0, sd_shared, (S, 1))
    ids = [f"p-{i}" for i in range(P)]
    for name, delta in arms.items():
        p = shared + delta
        if delta != 0.0 or sd_seed or sd_problem:
            p = p + rng.normal(0, sd_seed, (S, 1)) + rng.normal(0, sd_problem, (1, P))
        counts = rng.binomial(samples, np.clip(p, 0, 1))
        for k, seed in enumerate(seeds):
            c = [int(x) for x in counts[k]]
            score = float(np.mean(c) / samples)
            ev = {"step": 10, "task": "arith", "n": P, "samples": samples, "scores": {f"avg@{samples}": score}}
            if records:
                ev["problems"] = {"id": ids, "correct": c, "reward": [round(x / samples, 4) for x in c]}
            recs = [{"step": t, "reward/mean": score, "time/elapsed_s": 2.0 * t} for t in range(1, 11)]
            d = write_run(root, name, seed, recs, evals=[ev])
            spec = yaml.safe_load((d / "spec.yaml").read_text())
            spec["arms"][0].update(arm_fields or {})
            (d / "spec.yaml").write_text(yaml.safe_dump({**spec, **({"comparison": comparison} if comparison else {})}))
    return root / "exp"


def crn_problem_counts(rng, *, experiments: int, seeds: int, problems: int, samples: int, sd_problem: float = 0.15):
    """Correct counts (E, S, P) of an arm and a baseline evaluated with common random numbers: the
    K samples of a problem at a seed come from the same uniforms for both arms, so their sampling
    noise mostly cancels in the difference. Baseline probability q_p + u_s (q_p uniform in [0.3,
    0.7], u_s ~ N(0, 0.05)); the arm adds b_p ~ N(0, sd_problem), how much problem p favours it,
    shared by every seed (mean 0 over problems: the true difference is 0). No seed-level noise of
    the difference, so the seeds' differences agree closely while the problems' noise is wide."""
    import numpy as np

    E, S, P, K = experiments, seeds, problems, samples
    base_p = np.clip(rng.uniform(0.3, 0.7, (E, 1, P)) + rng.normal(0, 0.05, (E, S, 1)), 0, 1)
    arm_p = np.clip(base_p + rng.normal(0, sd_problem, (E, 1, P)), 0, 1)
    u = rng.random((E, S, P, K))
    return (u < arm_p[..., None]).sum(-1), (u < base_p[..., None]).sum(-1)
