"""`make bench`: one RL step of gspo-cli next to the same step in TRL's GRPOTrainer.

Equal work on both sides: the built-in tiny MoE of the quickstart (its cold-started
checkpoint; experts: each side's default, TRL transformers' grouped_mm, ours gspo_grouped_mm, the same
matmuls with index_select gathers), the quickstart task's prompts in the same order, G samples per
prompt, the same max new tokens, pure sampling (temperature 1, no top-k, top-p 1), the same
number of optimizer steps per rollout (our `mini_batches` = TRL's `steps_per_generation`,
one epoch = `num_iterations=1`), GSPO's sequence ratio with the paper's clip range and
aggregation (TRL: `importance_sampling_level="sequence"`, `loss_type="grpo"`), no KL, no
router load-balancing loss, fp32, no gradient checkpointing, no logging, no saving, the
same optimizer (AdamW, constant lr, grad clip 1) and a reward that is our task's scorer.

Each side runs in its own long-lived process (so its peak RSS is its own), all pinned to the
same cores; only one runs at a time, in turns (a warm-up step, then --turn-steps steps back to
back). A round is one turn of every side; three comparisons (paired.py): (a) our synchronous
step vs TRL's GRPOTrainer, (b) ours with rollout.staleness 1 vs TRL's fastest mode that runs
here (its GRPOTrainer: its AsyncGRPOTrainer needs CUDA), (c) both sampling with vLLM, in the
vLLM virtualenv. Each is stated as the median over rounds of ours/TRL with a 95% bootstrap
interval (stats.py), beside the drift of a fixed reference workload timed between rounds and
each side's time per phase. Every side is weighed eager and compiled (ours: train.compile; TRL:
its Trainer's torch_compile) by a probe before the rounds, which run each side in its faster
mode: the comparisons are of the fastest modes found here (--no-compile: eager only). Arm
overheads and scaling run our trainer only, with the variants stepped round-robin in one
process. On a busy box each process gets one torch thread
(`--threads auto`): with one thread per core, OpenMP spin-waits stall steps for seconds; on an
idle one a probe picks each side's count.

    python benchmarks/bench.py                     # everything, ~6 min on 2 cores (model cached)
    python benchmarks/bench.py --quick             # a smoke run, ~1-2 min
    python benchmarks/bench.py --smoke             # every stage at its smallest (the test suite's)
    python benchmarks/bench.py --paired-only       # only the three comparisons
    python benchmarks/bench.py --quickstart-full   # only: time the whole quickstart from a cold cache
                                                   # (-> quickstart.json, shown in later reports)

Results go to results/bench/ (git-ignored; --out to choose): bench.md (the report, also
printed), bench.json (every summary), profile_<arm>.txt (cProfile, CPU time, of a few of
our steps), paired_rounds.json (the turns so far). A committed reference run is in
benchmarks/reference/.

This file is the command line only. The measuring is in workers.py (our side, the drift
reference), trl_worker.py (TRL's side), profiling.py, quickstart.py, paired.py (the paired
stage) and orchestrate.py (the stages, summaries); the statistics in stats.py; the rendering
in render.py (pure: result dict -> markdown); shared helpers in common.py and procs.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: import `benchmarks.*` from the repository root, and do not let this
    # folder's modules (common, render, ...) stand as top-level names for other libraries.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common import DEFAULT_OUT, TRL_STUB_NOTE, spec_errors_in_one_line
from benchmarks.orchestrate import orchestrate
from benchmarks.profiling import worker_profile
from benchmarks.quickstart import quickstart_full
from benchmarks.render import render
from benchmarks.trl_worker import worker_trl
from benchmarks.workers import worker_ours, worker_ref, worker_variants

WORKERS = {
    "ours": worker_ours,
    "trl": worker_trl,
    "ref": worker_ref,
    "variants": worker_variants,
    "profile": worker_profile,
}


def _comparisons(value: str) -> str:
    """--comparisons: some of the letters a, b, c."""
    if not value or not set(value) <= set("abc"):
        raise argparse.ArgumentTypeError(f"{value!r}: give some of the letters a, b, c (e.g. c)")
    return value


def main(argv=None) -> None:
    """Parse the flags and run: a worker (internal), the full quickstart, or the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mini-batches", type=int, default=4)
    p.add_argument(
        "--rounds", type=int, default=9, help="paired rounds: one turn of every side each (default 9; >= 7 for a CI)"
    )
    p.add_argument(
        "--turn-steps", type=int, default=3, help="measured steps per turn, after one warm-up step (default 3)"
    )
    p.add_argument(
        "--probe-rounds",
        type=int,
        default=3,
        help="thread probe rounds (each synchronous side at 1 thread and one per core; the fastest turn "
        "decides; with --threads default, or auto on a box idle at start; 0: skip, torch's default)",
    )
    p.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="paired stage: eager only (default: the probe also tries each side compiled, ours with train.compile, "
        "TRL with torch_compile, and keeps the faster; the first run with an empty compile cache compiles for minutes)",
    )
    p.add_argument(
        "--cores",
        default=None,
        help="comma-separated CPU cores every benchmark process is pinned to (default: all this process may use)",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        help="the vLLM virtualenv's python for comparison (c) (default: .venv-vllm/bin/python; missing: (c) skipped)",
    )
    p.add_argument("--paired-only", action="store_true", help="only the paired comparisons (stage 1), not stages 2-5")
    p.add_argument(
        "--comparisons",
        default="abc",
        type=_comparisons,
        help="paired stage: which comparisons run (default abc; e.g. c: only the two vLLM sides)",
    )
    p.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="the spec whose model, task and optimizer both sides use (default: experiments/quickstart.yaml)",
    )
    p.add_argument("--warmup", type=int, default=1, help="stages 2-3: warm-up rounds, not measured")
    p.add_argument("--steps", type=int, default=4, help="stages 2-3: measured rounds per repetition")
    p.add_argument("--reps", type=int, default=3, help="stages 2-3: repetitions (rounds = warmup + steps x reps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        default="auto",
        help="torch threads per process: a number, 'default' (torch's choice: one per core), or 'auto' "
        "(default): 1 when the box is busy at start (load average > cores/2), else torch's choice",
    )
    p.add_argument(
        "--quickstart-steps",
        type=int,
        default=20,
        help="steps of the quickstart run whose peak RSS is measured (0: skip)",
    )
    p.add_argument(
        "--quickstart-full",
        action="store_true",
        help="only time the whole quickstart (train + compare + plot) from an empty model cache and write "
        "quickstart.json, which later bench reports include",
    )
    p.add_argument("--profile-steps", type=int, default=3, help="steps under cProfile per profiled arm (0: skip)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 rounds of 1 step per turn, at most 1 probe round, small sizes, no quickstart; writes to "
        "$TMPDIR/gspo-bench-quick",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's check that every stage runs: 1 round of 1 step per turn, no probe, eager, 2 prompts "
        "x 2 samples of up to 8 tokens, the spec's model with random weights (no cold start), 1-step quickstart and "
        "profiles; TRL's side a stub (our step) where TRL is not installed; writes to $TMPDIR/gspo-bench-smoke",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="folder for bench.md, bench.json, profiles and quickstart.json (default: results/bench)",
    )
    p.add_argument("--worker", nargs=2, metavar=("KIND", "JSON"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        kind, cfg = a.worker
        with spec_errors_in_one_line(f"bench worker {kind}"):
            WORKERS[kind](json.loads(cfg))
        return
    if a.quickstart_full:
        a.out.mkdir(parents=True, exist_ok=True)
        res = quickstart_full(lambda m: print(m, flush=True), a.threads)
        (a.out / "quickstart.json").write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res, indent=1))
        return
    if a.quick:
        a.prompts, a.group, a.max_new_tokens, a.steps, a.reps = 4, 4, 16, 1, 1
        a.rounds, a.turn_steps, a.probe_rounds = 2, 1, min(a.probe_rounds, 1)
        a.compile = False  # minutes of compiling are no smoke test
        a.quickstart_steps, a.profile_steps = 0, 1
        if a.out == DEFAULT_OUT:  # a smoke run never replaces the real results
            a.out = Path(tempfile.gettempdir()) / "gspo-bench-quick"
    a.trl_stub = False
    if a.smoke:
        a.prompts, a.group, a.max_new_tokens, a.mini_batches = 2, 2, 8, 2
        a.warmup, a.steps, a.reps = 0, 1, 1
        a.rounds, a.turn_steps, a.probe_rounds = 1, 1, 0
        a.compile = False
        a.quickstart_steps, a.profile_steps = 1, 1
        # TRL's side needs TRL (`make bench` installs it); a smoke run without it says so and
        # runs our synchronous step in its place, so every other part still runs
        a.trl_stub = importlib.util.find_spec("trl") is None
        if a.trl_stub:
            print(f"bench --smoke: {TRL_STUB_NOTE}", flush=True)
        if a.out == DEFAULT_OUT:
            a.out = Path(tempfile.gettempdir()) / "gspo-bench-smoke"
    result = orchestrate(a)
    text = render(result)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "bench.md").write_text(text)
    (a.out / "bench.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    print()
    print(text)
    print(f"wrote {a.out / 'bench.md'} and {a.out / 'bench.json'}")


if __name__ == "__main__":
    with spec_errors_in_one_line("bench"):
        main()
