"""The benchmark's rendering (benchmarks/render.py) and pairing (benchmarks/orchestrate.py):
pure functions of measurements, checked without running a benchmark."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks.blocks import block_stats, paired_blocks
from benchmarks.orchestrate import paired, summarize_side
from benchmarks.render import pct, profile_text, render, vllm_rollout_text

REFERENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "reference"


def _side(step_s: float, **over) -> dict:
    """One side's summary: generation a quarter and updates three quarters of `step_s` (exact shares)."""
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
        "per_rep_step_s": [step_s],
        "peak_rss_mb": 500.0,
    }
    return {**side, **over}


def small_result(**over) -> dict:
    """A result dict with every key render() reads: ours 0.5 s vs TRL 1.0 s per step."""
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
            "warmup": 1,
            "steps": 1,
            "reps": 2,
            "threads_why": "1 (--threads)",
        },
        "load": {"start": 0.5, "max": 1.0, "median": 0.7, "shared": False},
        "ours": _side(0.5),
        "trl": _side(1.0, old_logp_s=0.1),
        "ratio": {
            "step_paired": 0.5,
            "step_of_medians": 0.5,
            "cpu_paired": 0.5,
            "rollout_s": 0.5,
            "old_logp_s": 0.0,
            "update_s": 0.5,
            "gen_tok_per_s": 1.0,
            "gen_ms_per_token_step": 1.0,
        },
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
    assert "| **wall time per RL step** | 0.500 s | 1.000 s | **0.50x** |" in lines
    # phase shares are of each side's own step time: 0.25 of ours, 0.25 of TRL's
    assert "| generation | 0.125 s (25%) | 0.250 s (25%) | 0.50x |" in lines
    assert "| paper-grpo-rr | 0.500 s | 0.500 s | 0.125 s | 0.000 s | 0.375 s | +5.0% |" in lines
    assert "| 4 | 32 | 16 | exactly 32 (EOS ignored) | 0.500 s | 0.500 s | 0.125 s | 0.375 s | 1.50x | 1.25x |" in lines
    assert "| 4 | 16 | 16 | 10.0 (to EOS) | 0.500 s | 0.500 s | 0.125 s | 0.375 s | 1.00x | 1.00x |" in lines
    assert "- ours ≤ 0.5x TRL per RL step: 0.50x wall (paired), 0.50x CPU — met" in lines
    assert "- routing replay ≤ +10% step time: +5.0% wall, +4.0% CPU — met" in lines
    assert "seeds 0..1" in text and "Benchmark wall time: 30 s." in text
    # optional sections are left out when their measurements are absent
    assert "## Quickstart" not in text and "## Where our step's CPU time goes" not in text
    assert "**The box was shared**" not in text
    assert text.endswith(".\n")


def test_verdicts_flip_at_their_targets_and_a_shared_box_is_flagged():
    r = small_result(rr_overhead=0.11, load={"start": 3.0, "max": 3.5, "median": 3.2, "shared": True})
    r["ratio"]["step_paired"] = 0.51
    text = render(r)
    assert "— missed" in text.split("- ours ≤ 0.5x TRL per RL step")[1].splitlines()[0]
    assert "+11.0% wall, +4.0% CPU — missed" in text
    assert "**The box was shared** (load average up to 3.50 > 2.5 on 2 cores)" in text


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
    del r["ratio"]
    with pytest.raises(KeyError, match="ratio"):
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


def test_paired_is_the_median_of_per_round_ratios_over_matching_rounds():
    ours = [
        {"rep": 0, "round": 1, "step_s": 2.0},
        {"rep": 0, "round": 2, "step_s": 3.0},
        {"rep": 1, "round": 1, "step_s": 9.0},
    ]  # no TRL partner: left out
    trl = [{"rep": 0, "round": 1, "step_s": 1.0}, {"rep": 0, "round": 2, "step_s": 2.0}]
    assert paired(ours, trl) == pytest.approx((2.0 + 1.5) / 2)
    # the ratio of medians would be 3.0 / 1.5 = 2.0: pairing is a different number
    assert paired([{"round": 5, "cpu_s": 1.0}], [{"round": 5, "cpu_s": 4.0}], "cpu_s", ("round",)) == 0.25
    assert paired(ours, []) is None


def test_summarize_side_medians_per_repetition_and_of_the_processes():
    recs = [
        {"rep": r, "round": i, "step_s": s, "cpu_s": s}
        for r, i, s in [(0, 1, 1.0), (0, 2, 3.0), (1, 1, 5.0), (1, 2, 7.0)]
    ]
    finals = [
        {"peak_rss_mb": 500.0, "setup_s": 1.0, "torch_threads": 1},
        {"peak_rss_mb": 600.0, "setup_s": 2.0, "torch_threads": 1},
    ]
    s = summarize_side(recs, finals)
    assert s["step_s"] == 4.0 and s["n_steps"] == 4
    assert s["per_rep_step_s"] == [2.0, 6.0]
    assert (s["peak_rss_mb"], s["peak_rss_mb_max"], s["setup_s"]) == (550.0, 600.0, 1.5)
    assert s["rollout_s"] is None  # a key no record has: no median, not zero


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


def _block(rep: int, s: float, **over) -> dict:
    return {"rep": rep, "s_per_step": s, **over}


def equal_cores_result(probe=None) -> dict:
    """small_result() with an equal_cores key: ours 0.4 / 0.6, staleness 1 0.3 / 0.3, TRL 0.8 / 1.0 s/step."""
    blocks = {
        "ours": [_block(0, 0.4), _block(1, 0.6)],
        "ours_async": [_block(0, 0.3), _block(1, 0.3)],
        "trl": [_block(0, 0.8), _block(1, 1.0)],
    }

    def side(per_rep, threads, wait_s=None):
        return {
            "s_per_step": sum(per_rep) / 2,
            "step_median": sum(per_rep) / 2,
            "rollout_s": 0.1,
            "update_s": 0.2,
            "wait_s": wait_s,
            "per_rep_s_per_step": per_rep,
            "n_steps": 8,
            "torch_threads": threads,
            "peak_rss_mb": 500.0,
        }

    eq = {
        "sides": {
            "ours": side([0.4, 0.6], 2),
            "ours_async": side([0.3, 0.3], "1 trainer + 1 worker", wait_s=0.01),
            "trl": side([0.8, 1.0], 1),
        },
        "warmup": {"ours": 1, "ours_async": 2, "trl": 1},
        "threads_why": {"ours": "2 (probed)", "trl": "1 (probed)", "ours_async": "2, split"},
        "probe": probe,
        "ratio": {
            "sync_vs_trl": paired_blocks(blocks["ours"], blocks["trl"]),
            "async_vs_trl": paired_blocks(blocks["ours_async"], blocks["trl"]),
            "async_vs_sync": paired_blocks(blocks["ours_async"], blocks["ours"]),
        },
        "blocks": blocks,
    }
    r = small_result(equal_cores=eq)
    r["ratio"]["step_paired_async"] = eq["ratio"]["async_vs_trl"]
    return r


def test_paired_blocks_match_repetitions_and_take_the_median_ratio():
    r = equal_cores_result()
    q = r["equal_cores"]["ratio"]
    # per repetition: 0.4/0.8 = 0.5 and 0.6/1.0 = 0.6 -> 0.55; staleness 1: 0.375, 0.3 -> 0.3375
    assert q["sync_vs_trl"] == pytest.approx(0.55)
    assert q["async_vs_trl"] == pytest.approx(0.3375)
    assert q["async_vs_sync"] == pytest.approx((0.75 + 0.5) / 2)
    assert paired_blocks([_block(0, 1.0), _block(2, 9.0)], [_block(0, 4.0)]) == 0.25  # rep 2 has no partner
    assert paired_blocks([_block(0, 1.0)], []) is None


def test_block_stats_time_the_measured_steps_from_the_end_of_warm_up():
    # step ends at 10, 11, 11.5, 12.5 s: warm-up 1 -> 3 measured steps in 12.5 - 10 = 2.5 s
    recs = [{"step_s": s, "t_end": t, "update_s": 0.1} for s, t in [(3.0, 10.0), (0.9, 11.0), (0.5, 11.5), (1.0, 12.5)]]
    block = {"setup_s": 2.0, "records": recs, "final": {"peak_rss_mb": 400.0, "torch_threads": 2}, "load": 0.5}
    st = block_stats(block, warmup=1)
    assert st["s_per_step"] == pytest.approx(2.5 / 3) and st["step_median"] == 0.9 and st["n_steps"] == 3
    assert st["update_s"] == 0.1 and st["wait_s"] is None  # no record has a wait: none, not zero
    assert block_stats(block, warmup=2)["s_per_step"] == pytest.approx(1.5 / 2)
    for bad in (0, 4):
        with pytest.raises(ValueError, match="warm-up"):
            block_stats(block, warmup=bad)


def test_equal_cores_section_and_async_target_render():
    text = render(equal_cores_result())
    lines = text.splitlines()
    assert "## Equal cores: synchronous, staleness 1 and TRL, in blocks" in lines
    assert "| gspo-cli, synchronous | 2 | 0.500 s | 0.400, 0.600 | 0.100 s | 0.200 s |  | **0.55x** |" in lines
    assert (
        "| gspo-cli, rollout.staleness 1 | 1 trainer + 1 worker | 0.300 s | 0.300, 0.300 | 0.100 s | 0.200 s "
        "| 0.010 s | **0.34x** |"
    ) in lines
    assert "| TRL GRPOTrainer | 1 | 0.900 s | 0.800, 1.000 | 0.100 s | 0.200 s |  | **1.00x** |" in lines
    assert (
        "Staleness 1 / synchronous: 0.62x (paired blocks). Synchronous / TRL stepped in lockstep (above): 0.50x."
        in text
    )
    assert "ours 2 (probed); ours with staleness 1 2, split; TRL 1 (probed)" in text
    assert "- ours with rollout.staleness 1 ≤ 0.5x TRL per RL step, equal cores: 0.34x (paired blocks) — met" in lines
    assert "Thread probe" not in text
    # runs from before the blocks (the committed reference) render without the section
    assert "## Equal cores" not in render(small_result()) and "staleness 1 ≤" not in render(small_result())


def test_thread_probe_renders_the_same_from_memory_and_from_json():
    probe = {"s_per_step": {"ours": {1: 0.7, 2: 0.5}, "trl": {1: 0.9, 2: 1.1}}, "best": {"ours": 2, "trl": 1}}
    r = equal_cores_result(probe)
    text = render(r)
    assert "| 1 | 0.700 s | 0.900 s |" in text.splitlines() and "| 2 | 0.500 s | 1.100 s |" in text.splitlines()
    assert render(json.loads(json.dumps(r))) == text  # json turns the thread counts into strings
