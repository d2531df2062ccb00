"""Equal cores, measured in blocks: our step synchronous (rollout.staleness 0), our step with
staleness 1, and TRL's, each given the whole box in turn.

Why blocks and not lockstep: with staleness 1 our worker process keeps sampling the next
batch after a step ends, so stepping it alternately with TRL would run that sampling during
TRL's step. A block is one fresh process running `warmup` steps then `steps` measured ones
back to back, alone (the orchestrator starts the next process only once this one has
exited, its sampler stopped). Its steady-state time per step is the measured steps' wall
time divided by their number (for staleness 1 that counts waits for the sampler, and the
overlap it buys). Blocks rotate through the three sides, one fresh process each, for several
repetitions; a ratio is the median over repetitions of the two blocks' times of the same
repetition (adjacent in time, so load drifts on the box hit both alike).

`probe_threads` measures each side's best torch thread count first (also in blocks), so
that "equal cores" gives each side all of them and lets it use them as it runs best.
"""

from __future__ import annotations

from benchmarks.common import median
from benchmarks.procs import run_block

# side -> (worker kind, extra config)
SIDES = {"ours": ("ours", {}), "ours_async": ("ours", {"staleness": 1}), "trl": ("trl", {})}


def block_stats(block: dict, warmup: int) -> dict:
    """Summary of one block (procs.run_block's result) whose first `warmup` steps (>= 1) are
    not measured: s_per_step (wall time from the end of the last warm-up step to the end of
    the last step, divided by the measured steps), step_median (median of the steps' own
    times), and medians of rollout_s, update_s, cpu_s (the trainer process's) and wait_s
    (staleness 1: time spent waiting for the sampler; None otherwise). A block without a
    measured step raises ValueError."""
    recs = block["records"]
    if warmup < 1 or len(recs) <= warmup:
        raise ValueError(f"a block needs >= 1 warm-up and >= 1 measured step, got {len(recs)} steps, warmup {warmup}")
    measured = recs[warmup:]
    out = {
        "s_per_step": (measured[-1]["t_end"] - recs[warmup - 1]["t_end"]) / len(measured),
        "step_median": median([r["step_s"] for r in measured]),
        "n_steps": len(measured),
        "setup_s": block["setup_s"],
        "peak_rss_mb": block["final"]["peak_rss_mb"],
        "torch_threads": block["final"]["torch_threads"],
        "load": block["load"],
    }
    out.update({k: median([r.get(k) for r in measured]) for k in ("rollout_s", "update_s", "cpu_s", "wait_s")})
    return out


def paired_blocks(a: list[dict], b: list[dict], key: str = "s_per_step"):
    """Median over repetitions of a/b, the blocks matched by their `rep` (None if none match)."""
    by = {x["rep"]: x[key] for x in b}
    return median([x[key] / by[x["rep"]] for x in a if by.get(x["rep"])])


def _rotation(names: list[str], rep: int) -> list[str]:
    k = rep % len(names)
    return names[k:] + names[:k]


def probe_threads(cfg: dict, candidates: list[int], warmup: int, steps: int, log) -> dict:
    """Each lockstep side's ("ours", "trl") s/step at each torch thread count in `candidates`,
    one block each, interleaved; returns {"s_per_step": {side: {n: s}}, "best": {side: n}}."""
    per: dict[str, dict[int, float]] = {"ours": {}, "trl": {}}
    for n in candidates:
        for side in _rotation(list(per), n):
            block = run_block(side, {**cfg, "threads": n, "rounds": warmup + steps})
            per[side][n] = block_stats(block, warmup)["s_per_step"]
            log(f"  threads {n}: {side:4s} {per[side][n]:.3f} s/step (load {block['load']:.2f})")
    return {"s_per_step": per, "best": {side: min(times, key=times.get) for side, times in per.items()}}


def equal_cores(cfg: dict, threads: dict, reps: int, warmup: int, steps: int, log) -> dict:
    """`reps` rotations of one block per side (SIDES), each side with `threads[side]` torch
    threads (0: torch's default; staleness 1 splits its count between trainer and worker);
    a new seed per repetition, the same for all sides. Staleness 1 warms up one step more:
    its first step samples with nothing to overlap, the second is the first overlapped one.
    Returns {"blocks": {side: [block_stats + rep]}, "warmup": {side: steps}}."""
    blocks: dict[str, list[dict]] = {side: [] for side in SIDES}
    warm = {side: warmup + (side == "ours_async") for side in SIDES}
    for rep in range(reps):
        for side in _rotation(list(SIDES), rep):
            kind, extra = SIDES[side]
            side_cfg = {**cfg, **extra, "threads": threads[side], "seed": cfg["seed"] + rep}
            block = run_block(kind, {**side_cfg, "rounds": warm[side] + steps})
            blocks[side].append({**block_stats(block, warm[side]), "rep": rep})
        last = {side: blocks[side][-1]["s_per_step"] for side in SIDES}
        log(
            f"  repetition {rep + 1}/{reps}: ours {last['ours']:.3f}, ours staleness 1 {last['ours_async']:.3f}, "
            f"TRL {last['trl']:.3f} s/step"
        )
    return {"blocks": blocks, "warmup": warm}


def summarize_equal_cores(eq: dict, threads_why: dict, probe: dict | None) -> dict:
    """The result's `equal_cores` key and its ratios: per side the median block s/step and the
    blocks' medians; ratios (paired by repetition) of ours, ours staleness 1, each over TRL,
    and staleness 1 over synchronous."""
    blocks = eq["blocks"]
    sides = {}
    for side, bs in blocks.items():
        sides[side] = {
            **{k: median([b[k] for b in bs]) for k in ("s_per_step", "step_median", "rollout_s", "update_s", "wait_s")},
            "per_rep_s_per_step": [b["s_per_step"] for b in bs],
            "n_steps": sum(b["n_steps"] for b in bs),
            "torch_threads": bs[0]["torch_threads"],
            "peak_rss_mb": max(b["peak_rss_mb"] for b in bs),
        }
    return {
        "sides": sides,
        "warmup": eq["warmup"],
        "threads_why": threads_why,
        "probe": probe,
        "ratio": {
            "sync_vs_trl": paired_blocks(blocks["ours"], blocks["trl"]),
            "async_vs_trl": paired_blocks(blocks["ours_async"], blocks["trl"]),
            "async_vs_sync": paired_blocks(blocks["ours_async"], blocks["ours"]),
        },
        "blocks": blocks,
    }
