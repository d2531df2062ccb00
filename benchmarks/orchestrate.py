"""The orchestrator of `make bench`: runs the stages (the paired comparisons in paired.py, our
arms and scaling in one process each, quickstart memory, profiles) and reduces their records to
one result dict, the `bench.json` that render.py turns into the report. It measures and
summarizes; it formats nothing but its progress lines.
"""

from __future__ import annotations

import json
import os
import platform
import time

from benchmarks.common import SHARED_LOAD, base_raw, load_spec_and_task, loadavg, median, model_source, pick_threads
from benchmarks.paired import paired_stage
from benchmarks.procs import run_worker
from benchmarks.quickstart import quickstart_memory

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


ARM_PRESETS = ("paper-grpo", "paper-grpo-rr", "paper-gspo")  # stage 2's arms
PROFILED = ("paper-gspo", "paper-grpo-rr")  # stage 5's


def _arm_variants(a) -> list[dict]:
    return [{"label": p, "preset": p, "group": a.group, "max_new": a.max_new_tokens} for p in ARM_PRESETS]


def _scale_variants(a) -> list[dict]:
    g_sizes = sorted({max(2, a.group // 2), a.group, a.group * 2})
    t_sizes = sorted({max(4, a.max_new_tokens // 3), 2 * a.max_new_tokens // 3, 4 * a.max_new_tokens // 3})
    scale_variants = [
        {"label": f"G={g}", "preset": "paper-gspo", "group": g, "max_new": a.max_new_tokens} for g in g_sizes
    ]
    scale_variants += [
        {"label": f"T={t}", "preset": "paper-gspo", "group": a.group, "max_new": t, "ignore_eos": True} for t in t_sizes
    ]
    return scale_variants


def check_specs(a, common: dict) -> None:
    """Build and validate the spec of every configuration the stages will run (the paired
    sides, the arms, the scaling variants, the profiled arms), so that a spec the benchmark
    cannot run is one SpecError before any worker starts, not a worker's traceback."""
    from benchmarks.paired import COMPILED, SIDES

    configs = [extra for _, extra, _ in (*SIDES.values(), *COMPILED.values())]
    configs = [{"preset": "paper-gspo", **c} for c in configs]
    if not a.paired_only:
        configs += [{"preset": v["preset"], "group": v["group"], "max_new": v["max_new"]} for v in _arm_variants(a)]
        configs += [{"preset": "paper-gspo", "group": v["group"], "max_new": v["max_new"]} for v in _scale_variants(a)]
        configs += [{"preset": p} for p in PROFILED]
    for c in configs:
        load_spec_and_task(
            base_raw(
                prompts=a.prompts,
                group=c.get("group", a.group),
                max_new=c.get("max_new", a.max_new_tokens),
                mini_batches=a.mini_batches,
                steps=1,
                preset=c["preset"],
                staleness=c.get("staleness", 0),
                engine=c.get("engine", "hf"),
                spec_path=common["spec"],
                compile=bool(c.get("compile")),
                smoke=common["smoke"],
            )
        )


def _variants(a, common: dict, log) -> tuple[dict, dict, list[dict]]:
    """Stages 2 and 3: our arms, then the scaling variants, each set round-robin in one
    process. Returns (arms worker result, scaling worker result, the scaling variants)."""
    log("2/5 arm overheads (routing replay, GSPO vs GRPO), round-robin in one process")
    rounds = a.warmup + a.steps * a.reps
    arm_variants = _arm_variants(a)
    arms = run_worker("variants", {**common, "variants": arm_variants, "warmup": a.warmup, "rounds": rounds}, log)
    log("3/5 scaling with group size and response length, round-robin in one process")
    scale_variants = _scale_variants(a)
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
        "spec": str(a.spec) if a.spec else None,
        "smoke": bool(getattr(a, "smoke", False)),
        "trl_stub": bool(getattr(a, "trl_stub", False)),
    }
    log(
        f"gspo bench: {a.prompts} prompts x {a.group} samples, max {a.max_new_tokens} new tokens, "
        f"{a.mini_batches} mini-batches; {a.rounds} paired rounds of 1 warm-up + {a.turn_steps} steps per turn; "
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
        spec_path=common["spec"],
        smoke=common["smoke"],
    )
    spec, task = load_spec_and_task(raw)
    check_specs(a, common)  # every stage's spec, before any process starts: a bad one is one line
    source = model_source(spec, task)
    log(f"model: {source} ({time.perf_counter() - t:.1f} s to resolve)")

    # 1. The paired comparisons: one process per side, pinned, interleaved turns, bootstrap CIs.
    paired_res = paired_stage(a, {**common, "preset": "paper-gspo"}, threads, threads_why, log)
    if a.paired_only:
        arms = scaling = None
        scale_variants = []
        qs_mem = qs_full = None
        profiles = []
    else:
        arms, scaling, scale_variants, qs_mem, qs_full, profiles = _extras(a, common, threads, log)

    loads.append(loadavg())
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
            "rounds": a.rounds,
            "turn_steps": a.turn_steps,
            "probe_rounds": a.probe_rounds,
            "model_source": source,
            "threads_why": threads_why,
            # MoE experts per side: ours the spec's (default gspo_grouped_mm), TRL transformers' default
            "experts": {"ours": spec.model.experts_implementation, "trl": "grouped_mm"},
        },
        "load": {"start": loads[0], "max": max(loads), "median": median(loads), "shared": max(loads) > SHARED_LOAD},
        "paired": paired_res,
        **(summarize_runs(arms["records"], scaling["records"], scale_variants, base=f"G={a.group}") if arms else {}),
        "quickstart_memory": qs_mem,
        "quickstart_full": qs_full,
        "profiles": profiles,
        "raw": {"arms": arms, "scaling": scaling} if arms else {},
        "bench_wall_s": time.time() - started,
    }
    return result


def _extras(a, common: dict, threads: int, log):
    """Stages 2-5: our arms, scaling, quickstart memory, profiles. Returns (arms, scaling,
    scale variants, quickstart memory, quickstart.json's content, profiles)."""
    # 2. Arm overheads, 3. scaling: our trainer, variants round-robin in one process each.
    arms, scaling, scale_variants = _variants(a, common, log)

    # 4. Quickstart memory (the full quickstart is timed separately: --quickstart-full).
    log("4/5 quickstart peak memory")
    qs_mem = quickstart_memory(a.quickstart_steps, log, threads, smoke=common["smoke"]) if a.quickstart_steps else None
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
            for p in PROFILED
        ]
        if a.profile_steps
        else []
    )

    return arms, scaling, scale_variants, qs_mem, qs_full, profiles


def summarize_runs(arm_records: dict, scale_records: dict, scale_variants: list[dict], base: str) -> dict:
    """The result's summary keys (arms, the overheads, scaling) from the raw records: the
    variants' records by label, `base` the scaling variant the others are compared with.
    Ratios are medians of per-round ratios (paired)."""
    ar = arm_records

    def rel(a_lab, b_lab, key="step_s"):
        return paired(ar[a_lab], ar[b_lab], key, ("round",)) - 1

    return {
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


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "trl", "accelerate", "gspo-cli"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out
