"""The orchestrator of `make bench`: starts the worker processes (workers.py, profiling.py),
steps the ours/TRL pair in lockstep, and reduces their records to one result dict, the
`bench.json` that render.py turns into the report. It measures and summarizes; it formats
nothing but its progress lines.
"""

from __future__ import annotations

import json
import os
import platform
import time

from benchmarks.blocks import equal_cores, probe_threads, summarize_equal_cores
from benchmarks.common import SHARED_LOAD, base_raw, load_spec_and_task, loadavg, median, model_source, pick_threads
from benchmarks.procs import Worker, run_worker
from benchmarks.quickstart import quickstart_memory


def ours_vs_trl(cfg: dict, reps: int, warmup: int, steps: int, log, threads: dict | None = None) -> dict:
    """`reps` pairs of fresh processes; inside each, the two sides alternate step by step
    (who goes first alternates too), so both see the same load at nearly the same time.
    `threads`: torch threads by side ("ours", "trl"; default: cfg's). Sound at equal cores
    too: the side not stepping is blocked reading its stdin, its OpenMP threads asleep."""
    records = {"ours": [], "trl": []}
    finals = {"ours": [], "trl": []}
    threads = threads or {"ours": cfg["threads"], "trl": cfg["threads"]}
    for rep in range(reps):
        # a new seed per repetition (the same for both sides: same prompts), so the samples differ
        rep_cfg = {**cfg, "rounds": warmup + steps, "seed": cfg["seed"] + rep}
        workers = {side: Worker(side, {**rep_cfg, "threads": threads[side]}) for side in ("ours", "trl")}
        ready = {side: w.recv() for side, w in workers.items()}
        for i in range(warmup + steps):
            order = ("ours", "trl") if (i + rep) % 2 == 0 else ("trl", "ours")
            for side in order:
                workers[side].send("step")
                rec = workers[side].recv()
                if i >= warmup:
                    records[side].append({**rec, "rep": rep, "round": i, "load": loadavg()})
        for side, w in workers.items():
            w.send("done")
            finals[side].append({**w.finish(), "setup_s": ready[side]["setup_s"]})
        last = {side: records[side][-steps:] for side in records}
        log(
            f"  repetition {rep + 1}/{reps}: ours {median([r['step_s'] for r in last['ours']]):.3f} s, "
            f"TRL {median([r['step_s'] for r in last['trl']]):.3f} s per step (load {loadavg():.2f})"
        )
    return {"records": records, "finals": finals}


STEP_KEYS = (
    "step_s",
    "cpu_s",
    "rollout_s",
    "score_s",
    "old_logp_s",
    "update_s",
    "gen_tok_per_s",
    "length_mean",
    "length_max",
    "gen_ms_per_token_step",
)


def paired(a_recs: list[dict], b_recs: list[dict], key: str = "step_s", id_keys=("rep", "round")):
    """Median over rounds of a/b, the two measured in the same round (adjacent in time)."""
    by = {tuple(r.get(k) for k in id_keys): r[key] for r in b_recs}
    return median(
        [r[key] / by[tuple(r.get(k) for k in id_keys)] for r in a_recs if by.get(tuple(r.get(k) for k in id_keys))]
    )


def _summ(recs: list[dict]) -> dict:
    """Per-key medians of step records, and how many there were."""
    return {**{k: median([r.get(k) for r in recs]) for k in STEP_KEYS}, "n_steps": len(recs)}


def summarize_side(recs: list[dict], finals: list[dict]) -> dict:
    """One side of the ours/TRL duel: medians of its step records, per repetition, and of its
    processes' final reports (peak RSS, set-up time)."""
    out = _summ(recs)
    reps = sorted({r["rep"] for r in recs})
    out["per_rep_step_s"] = [median([r["step_s"] for r in recs if r["rep"] == k]) for k in reps]
    out["peak_rss_mb"] = median([f["peak_rss_mb"] for f in finals])
    out["peak_rss_mb_max"] = max(f["peak_rss_mb"] for f in finals)
    out["setup_s"] = median([f["setup_s"] for f in finals])
    out["torch_threads"] = finals[0].get("torch_threads")
    return out


def _variants(a, common: dict, log) -> tuple[dict, dict, list[dict]]:
    """Stages 2 and 3: our arms, then the scaling variants, each set round-robin in one
    process. Returns (arms worker result, scaling worker result, the scaling variants)."""
    log("2/5 arm overheads (routing replay, GSPO vs GRPO), round-robin in one process")
    rounds = a.warmup + a.steps * a.reps
    arm_variants = [
        {"label": p, "preset": p, "group": a.group, "max_new": a.max_new_tokens}
        for p in ("paper-grpo", "paper-grpo-rr", "paper-gspo")
    ]
    arms = run_worker("variants", {**common, "variants": arm_variants, "warmup": a.warmup, "rounds": rounds}, log)
    log("3/5 scaling with group size and response length, round-robin in one process")
    g_sizes = sorted({max(2, a.group // 2), a.group, a.group * 2})
    t_sizes = sorted({max(4, a.max_new_tokens // 3), 2 * a.max_new_tokens // 3, 4 * a.max_new_tokens // 3})
    scale_variants = [
        {"label": f"G={g}", "preset": "paper-gspo", "group": g, "max_new": a.max_new_tokens} for g in g_sizes
    ]
    scale_variants += [
        {"label": f"T={t}", "preset": "paper-gspo", "group": a.group, "max_new": t, "ignore_eos": True} for t in t_sizes
    ]
    scale_rounds = a.warmup + max(2, a.steps * a.reps // 2)
    scaling = run_worker(
        "variants", {**common, "variants": scale_variants, "warmup": a.warmup, "rounds": scale_rounds}, log
    )
    return arms, scaling, scale_variants


def orchestrate(a) -> dict:
    """The whole benchmark for parsed arguments `a` (bench.py's flags); returns the result
    dict (bench.json). Profiles are written to `a.out`; quickstart.json there is read."""
    a.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    loads = [loadavg()]

    def log(msg):
        print(msg, flush=True)
        loads.append(loadavg())

    threads, threads_why = pick_threads(a.threads, loads[0])
    common = {
        "prompts": a.prompts,
        "group": a.group,
        "max_new": a.max_new_tokens,
        "mini_batches": a.mini_batches,
        "seed": a.seed,
        "threads": threads,
    }
    log(
        f"gspo bench: {a.prompts} prompts x {a.group} samples, max {a.max_new_tokens} new tokens, "
        f"{a.mini_batches} mini-batches, {a.warmup} warm-up + {a.steps} measured steps, {a.reps} repetitions; "
        f"load average {loads[0]:.2f} on {os.cpu_count()} cores; torch threads per process: {threads_why}"
    )

    # The model (cold start on first use, cached afterwards) is built once, before any timing.
    t = time.perf_counter()
    raw = base_raw(
        prompts=a.prompts,
        group=a.group,
        max_new=a.max_new_tokens,
        mini_batches=a.mini_batches,
        steps=1,
        preset="paper-gspo",
    )
    spec, task = load_spec_and_task(raw)
    source = model_source(spec, task)
    log(f"model: {source} ({time.perf_counter() - t:.1f} s to resolve)")

    # 1. Ours vs TRL at equal cores: each side's best thread count, then one process each,
    # stepped alternately (synchronous), then blocks of ours, ours with staleness 1 and TRL.
    side_threads, side_why, probe = _side_threads(a, {**common, "preset": "paper-gspo"}, threads, threads_why, log)
    log("1/5 ours vs TRL (GSPO): two processes stepped alternately")
    duel = ours_vs_trl({**common, "preset": "paper-gspo"}, a.reps, a.warmup, a.steps, log, side_threads)
    log("1b/5 equal cores in blocks: ours, ours with rollout.staleness 1, TRL, one fresh process each in turn")
    eq = equal_cores({**common, "preset": "paper-gspo"}, side_threads, a.reps, a.warmup, a.steps, log)

    # 2. Arm overheads, 3. scaling: our trainer, variants round-robin in one process each.
    arms, scaling, scale_variants = _variants(a, common, log)

    # 4. Quickstart memory (the full quickstart is timed separately: --quickstart-full).
    log("4/5 quickstart peak memory")
    qs_mem = quickstart_memory(a.quickstart_steps, log, threads) if a.quickstart_steps else None
    qs_file = a.out / "quickstart.json"
    qs_full = json.loads(qs_file.read_text()) if qs_file.is_file() else None

    # 5. Profiles of our step.
    log("5/5 profiles (cProfile, CPU time) of our step")
    profiles = (
        [
            run_worker(
                "profile",
                {**common, "preset": p, "warmup": a.warmup, "steps": a.profile_steps, "out_dir": str(a.out)},
                log,
            )
            for p in ("paper-gspo", "paper-grpo-rr")
        ]
        if a.profile_steps
        else []
    )

    loads.append(loadavg())
    loads += [r["load"] for side in ("ours", "trl") for r in duel["records"][side]]
    loads += [b["load"] for bs in eq["blocks"].values() for b in bs]
    eq_summary = summarize_equal_cores(eq, side_why, probe)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "versions": _versions(),
        },
        "config": {
            **common,
            "warmup": a.warmup,
            "steps": a.steps,
            "reps": a.reps,
            "model_source": source,
            "threads_why": threads_why,
            "threads_by_side": side_threads,
        },
        "load": {"start": loads[0], "max": max(loads), "median": median(loads), "shared": max(loads) > SHARED_LOAD},
        **summarize_runs(duel, arms["records"], scaling["records"], scale_variants, base=f"G={a.group}"),
        "equal_cores": eq_summary,
        "quickstart_memory": qs_mem,
        "quickstart_full": qs_full,
        "profiles": profiles,
        "raw": {"ours_vs_trl": duel, "arms": arms, "scaling": scaling},
        "bench_wall_s": time.time() - started,
    }
    # ours with staleness 1 / TRL, blocks paired by repetition (the lockstep can't hold it)
    result["ratio"]["step_paired_async"] = eq_summary["ratio"]["async_vs_trl"]
    return result


def summarize_runs(duel: dict, arm_records: dict, scale_records: dict, scale_variants: list[dict], base: str) -> dict:
    """The result's summary keys (ours, trl, ratio, arms, the overheads, scaling) from the raw
    records: `duel` from ours_vs_trl, the variants' records by label, `base` the scaling
    variant the others are compared with. Ratios are medians of per-round ratios (paired)."""
    rec_o, rec_t = duel["records"]["ours"], duel["records"]["trl"]
    ours, trl = summarize_side(rec_o, duel["finals"]["ours"]), summarize_side(rec_t, duel["finals"]["trl"])
    ar = arm_records

    def rel(a_lab, b_lab, key="step_s"):
        return paired(ar[a_lab], ar[b_lab], key, ("round",)) - 1

    return {
        "ours": ours,
        "trl": trl,
        "ratio": {
            "step_paired": paired(rec_o, rec_t),  # the target's number: robust to load drifts
            "step_of_medians": ours["step_s"] / trl["step_s"],
            "cpu_paired": paired(rec_o, rec_t, "cpu_s"),
            **{
                k: paired(rec_o, rec_t, k)
                for k in ("rollout_s", "old_logp_s", "update_s", "gen_tok_per_s", "gen_ms_per_token_step")
            },
        },
        "arms": {lab: _summ(recs) for lab, recs in ar.items()},
        "rr_overhead": rel("paper-grpo-rr", "paper-grpo"),
        "rr_overhead_cpu": rel("paper-grpo-rr", "paper-grpo", "cpu_s"),
        "rr_overhead_update": rel("paper-grpo-rr", "paper-grpo", "update_s"),
        "gspo_vs_grpo": rel("paper-gspo", "paper-grpo"),
        "gspo_vs_grpo_cpu": rel("paper-gspo", "paper-grpo", "cpu_s"),
        "gspo_vs_grpo_update": rel("paper-gspo", "paper-grpo", "update_s"),
        "scaling": {
            v["label"]: {
                **_summ(scale_records[v["label"]]),
                "group": v["group"],
                "max_new": v["max_new"],
                "ignore_eos": bool(v.get("ignore_eos")),
                "vs_base": paired(scale_records[v["label"]], scale_records[base], id_keys=("round",)),
                "vs_base_cpu": paired(scale_records[v["label"]], scale_records[base], "cpu_s", ("round",)),
            }
            for v in scale_variants
        },
    }


def _side_threads(a, cfg: dict, threads: int, threads_why: str, log) -> tuple[dict, dict, dict | None]:
    """(torch threads by side, why by side, the probe or None). Every side may use all cores:
    on a box that is idle at start (`threads` 0, torch's default) the lockstep sides ("ours",
    "trl") each get their fastest count out of 1 and all cores, measured in blocks
    (a.probe_steps steps after a.warmup; 0: no probe, torch's default); staleness 1
    ("ours_async") gets all cores, split between trainer and worker as the trainer splits
    them. A given count (or auto's 1 on a busy box) goes to every side as it is."""
    cores = os.cpu_count() or 1
    if threads or cores == 1 or not a.probe_steps:
        return (
            {"ours": threads, "trl": threads, "ours_async": threads},
            {side: threads_why for side in ("ours", "trl", "ours_async")},
            None,
        )
    candidates = sorted({1, cores})
    log(f"0/5 thread probe: ours and TRL at {candidates} torch threads, one block each")
    probe = probe_threads(cfg, candidates, max(1, a.warmup), a.probe_steps, log)
    best = probe["best"]
    why = {side: f"{best[side]} (fastest of {candidates}, probed)" for side in best}
    why["ours_async"] = f"{cores}, split between trainer and worker (all cores)"
    return {**best, "ours_async": cores}, why, probe


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "trl", "accelerate", "gspo-cli"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out
