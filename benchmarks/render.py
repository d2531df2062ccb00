"""The rendering side of `make bench`: pure functions from measurements to text.

`render(result)` turns a result dict (bench.json, as orchestrate.py builds it) into the
markdown report (bench.md); `profile_text` lays out one cProfile file. Nothing here runs,
times or reads files, so a committed bench.json renders to the same report anywhere
(tests/test_bench_render.py checks that against benchmarks/reference/).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import SHARED_LOAD


def fmt_s(x) -> str:
    """Seconds with 3 decimals, or a dash for a missing value."""
    return "—" if x is None else f"{x:.3f} s"


def pct(x) -> str:
    """A signed percentage (0.05 -> "+5.0%"), or a dash for a missing value."""
    return "—" if x is None else f"{x:+.1%}"


def render(r: dict) -> str:
    """The markdown report of a result dict (bench.json's keys; `quickstart_memory`,
    `quickstart_full` and `profiles` may be None or empty, `equal_cores` absent (runs before
    it existed): their sections are left out).
    A missing required key raises KeyError."""
    lines = [*_header(r), *_ours_vs_trl(r), *_equal_cores(r), *_arms(r), *_scaling(r), *_quickstart(r)]
    lines += [*_profiles(r), *_targets(r)]
    return "\n".join(lines) + "\n"


def _header(r: dict) -> list[str]:
    c, load, v = r["config"], r["load"], r["host"]["versions"]
    lines = [
        "# gspo-cli vs TRL: one RL step on the built-in tiny MoE",
        "",
        (
            f"{r['when']}; {r['host']['cores']} cores; torch threads per process: {c['threads_why']}; "
            f"torch {v['torch']}, transformers {v['transformers']}, trl {v['trl']}. "
            f"Load average {load['start']:.2f} at start, {load['max']:.2f} at most."
        ),
        "",
    ]
    if load["shared"]:
        lines += [
            (
                f"**The box was shared** (load average up to {load['max']:.2f} > {SHARED_LOAD} on "
                f"{r['host']['cores']} cores): absolute times are inflated and noisy. The two sides were "
                "stepped alternately, so read the paired ratios (median over rounds of ours/TRL measured "
                "back to back) and the CPU times."
            ),
            "",
        ]
    return lines


def _ours_vs_trl(r: dict) -> list[str]:
    c, o, t, q = r["config"], r["ours"], r["trl"], r["ratio"]
    lines = [
        (
            f"Work per RL step: {c['prompts']} prompts x {c['group']} samples, at most {c['max_new']} new tokens, "
            f"{c['mini_batches']} optimizer steps (mini-batches), GSPO loss (sequence ratio, clip 3e-4/4e-4, "
            f"seq-mean-token-mean), fp32, grouped_mm experts on both sides. "
            f"Medians of {o['n_steps']} measured steps per side: "
            f"{c['reps']} pairs of fresh processes (seeds {c['seed']}..{c['seed'] + c['reps'] - 1}) x {c['steps']} "
            f"steps, after {c['warmup']} warm-up step(s) each, the two processes stepped alternately."
        ),
        "",
        "| | gspo-cli | TRL GRPOTrainer | ours / TRL (paired) |",
        "|---|---:|---:|---:|",
        f"| **wall time per RL step** | {fmt_s(o['step_s'])} | {fmt_s(t['step_s'])} | **{q['step_paired']:.2f}x** |",
        f"| CPU time per RL step (all threads) | {fmt_s(o['cpu_s'])} | {fmt_s(t['cpu_s'])} | {q['cpu_paired']:.2f}x |",
    ]
    for key, name in (
        ("rollout_s", "generation"),
        ("score_s", "scoring"),
        ("old_logp_s", "old log-probs (+ advantages; TRL: + batch stats)"),
        ("update_s", "updates (all mini-batches)"),
    ):
        ratio = q.get(key)
        lines.append(
            f"| {name} | {fmt_s(o[key])} ({o[key] / o['step_s']:.0%}) | "
            f"{fmt_s(t[key])} ({t[key] / t['step_s']:.0%}) | {'' if ratio is None else f'{ratio:.2f}x'} |"
        )
    lines += [
        (f"| generation tokens/s | {o['gen_tok_per_s']:.0f} | {t['gen_tok_per_s']:.0f} | {q['gen_tok_per_s']:.2f}x |"),
        (
            f"| generation time per sampling step (÷ longest response) | {o['gen_ms_per_token_step']:.1f} ms | "
            f"{t['gen_ms_per_token_step']:.1f} ms | {q['gen_ms_per_token_step']:.2f}x |"
        ),
        (
            f"| response length, mean / longest (tokens, incl. EOS) | {o['length_mean']:.1f} / {o['length_max']:.0f} | "
            f"{t['length_mean']:.1f} / {t['length_max']:.0f} | |"
        ),
        (
            f"| peak RSS of the process | {o['peak_rss_mb']:.0f} MB | {t['peak_rss_mb']:.0f} MB | "
            f"{o['peak_rss_mb'] / t['peak_rss_mb']:.2f}x |"
        ),
        (
            f"| median step per repetition | {', '.join(f'{x:.3f}' for x in o['per_rep_step_s'])} | "
            f"{', '.join(f'{x:.3f}' for x in t['per_rep_step_s'])} | ratio of medians {q['step_of_medians']:.2f}x |"
        ),
        "",
        (
            "Phase shares are of the step's wall time. TRL's phases come from timing its own methods "
            "(`_generate`, `_calculate_rewards`, `_generate_and_score_completions`) inside each round; its "
            "\"updates\" are the round minus those."
        ),
    ]
    return lines


def _equal_cores(r: dict) -> list[str]:
    e = r.get("equal_cores")
    if not e:
        return []
    c, sides, q = r["config"], e["sides"], e["ratio"]
    names = {"ours": "gspo-cli, synchronous", "ours_async": "gspo-cli, rollout.staleness 1", "trl": "TRL GRPOTrainer"}
    vs_trl = {"ours": q["sync_vs_trl"], "ours_async": q["async_vs_trl"], "trl": 1.0}
    lines = [
        "",
        "## Equal cores: synchronous, staleness 1 and TRL, in blocks",
        "",
        (
            f"Every side may use all {r['host']['cores']} cores. Torch threads: {_threads_text(e['threads_why'])}. "
            f"A block is one fresh process alone on the box: {e['warmup']['ours']} warm-up step(s) (staleness 1: "
            f"{e['warmup']['ours_async']}, the worker's start included), then {c['steps']} steps back to back; its "
            "s/step is the measured steps' wall time over their number, so staleness 1's overlap and its waits for "
            f"the sampler both count. {c['reps']} rotations of the three sides; ratios are medians over "
            "repetitions of blocks of the same repetition. (Lockstep would let our sampler run during TRL's step.)"
        ),
        "",
        "| | torch threads | s/step (median block) | per repetition | generation | updates | waited for the sampler "
        "| vs TRL (paired blocks) |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for side, s in sides.items():
        lines.append(
            f"| {names[side]} | {s['torch_threads']} | {fmt_s(s['s_per_step'])} | "
            f"{', '.join(f'{x:.3f}' for x in s['per_rep_s_per_step'])} | {fmt_s(s['rollout_s'])} | "
            f"{fmt_s(s['update_s'])} | {fmt_s(s['wait_s']) if s['wait_s'] is not None else ''} | "
            f"**{vs_trl[side]:.2f}x** |"
        )
    lines += [
        "",
        (
            f"Staleness 1 / synchronous: {q['async_vs_sync']:.2f}x (paired blocks). Synchronous / TRL stepped in "
            f"lockstep (above): {r['ratio']['step_paired']:.2f}x. Staleness 1's generation runs in the worker, "
            "beside the updates; its CPU time is not in the trainer's."
        ),
    ]
    if e.get("probe"):
        per = e["probe"]["s_per_step"]
        counts = sorted(per["ours"], key=int)
        lines += [
            "",
            "Thread probe (one block per cell, s/step):",
            "",
            "| torch threads | ours | TRL |",
            "|---:|---:|---:|",
        ]
        lines += [f"| {n} | {fmt_s(per['ours'][n])} | {fmt_s(per['trl'][n])} |" for n in counts]
    return lines


def _threads_text(why: dict) -> str:
    """Why each side got its torch threads, said once if the sides share the reason."""
    if len(set(why.values())) == 1:
        return f"{why['ours']}, every process (staleness 1: its trainer and its worker each)"
    return f"ours {why['ours']}; ours with staleness 1 {why['ours_async']}; TRL {why['trl']} (lockstep above: the same)"


def _arms(r: dict) -> list[str]:
    lines = [
        "",
        "## Our arms (one process, stepped round-robin)",
        "",
        "| arm | step | CPU | generation | old log-probs | updates | step vs paper-grpo (paired) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for lab, s in r["arms"].items():
        vs = {"paper-grpo": "—", "paper-grpo-rr": pct(r["rr_overhead"]), "paper-gspo": pct(r["gspo_vs_grpo"])}[lab]
        lines.append(
            f"| {lab} | {fmt_s(s['step_s'])} | {fmt_s(s['cpu_s'])} | {fmt_s(s['rollout_s'])} | "
            f"{fmt_s(s['old_logp_s'])} | {fmt_s(s['update_s'])} | {vs} |"
        )
    lines += [
        "",
        (
            f"Routing replay (paper-grpo-rr vs paper-grpo): {pct(r['rr_overhead'])} step wall time, "
            f"{pct(r['rr_overhead_cpu'])} step CPU time, {pct(r['rr_overhead_update'])} update time. "
            f"GSPO vs GRPO loss: {pct(r['gspo_vs_grpo'])} step wall time, {pct(r['gspo_vs_grpo_cpu'])} CPU time, "
            f"{pct(r['gspo_vs_grpo_update'])} update time. Medians of per-round ratios; paper-grpo already records "
            "the routes (to measure expert volatility), so the difference is the replay itself."
        ),
    ]
    return lines


def _scaling(r: dict) -> list[str]:
    c = r["config"]
    lines = [
        "",
        "## Scaling (paper-gspo, our trainer, one process, stepped round-robin)",
        "",
        (
            "| group size G | max new tokens T | rollouts | tokens per sequence | step | CPU | generation | updates "
            "| step / base (paired) | CPU / base (paired) |"
        ),
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in r["scaling"].values():
        per_seq = f"exactly {s['max_new']} (EOS ignored)" if s["ignore_eos"] else f"{s['length_mean']:.1f} (to EOS)"
        lines.append(
            f"| {s['group']} | {s['max_new']} | {c['prompts'] * s['group']} | {per_seq} | "
            f"{fmt_s(s['step_s'])} | {fmt_s(s['cpu_s'])} | {fmt_s(s['rollout_s'])} | "
            f"{fmt_s(s['update_s'])} | {s['vs_base']:.2f}x | {s['vs_base_cpu']:.2f}x |"
        )
    lines += [
        "",
        (
            "Base: G = {g}, T = {t}. The cold-started model ends its answers with EOS after ~20 tokens, so "
            "the response-length rows sample a fixed number of tokens (EOS ignored while sampling; rewards "
            "and the loss still stop at the first EOS, but every forward and backward runs over the full "
            "width)."
        ).format(g=c["group"], t=c["max_new"]),
        "",
    ]
    return lines


def _quickstart(r: dict) -> list[str]:
    qs, qf = r.get("quickstart_memory"), r.get("quickstart_full")
    lines = []
    if qs or qf:
        lines += ["## Quickstart", "", "| measurement | wall time | max RSS |", "|---|---:|---:|"]
        if qs:
            omp = f", OMP_NUM_THREADS={qs['threads']}" if qs.get("threads") else ""
            lines.append(
                f"| `gspo train experiments/quickstart.yaml --set train.steps={qs['steps']}` (cached "
                f"cold start, load {qs['load_start']:.1f}→{qs['loadavg_after']:.1f}{omp}) | "
                f"{qs['wall_s']:.0f} s | {qs['max_rss_mb']:.0f} MB |"
            )
        if qf:
            on = f" on {qf['cores']} cores" if qf.get("cores") else ""  # runs before it was recorded: unsaid
            lines.append(
                f"| `make run` equivalent (sweep --jobs 2 + compare + plot) from an empty model cache{on}, cold start "
                f"{qf['cold_start_s']:.0f} s included ({qf['when']}, load {qf['load']['start']:.1f}"
                f"→{qf['load']['end']:.1f}{', box shared' if qf['shared'] else ''}; torch threads: "
                f"{qf.get('threads', 'default').split(' (')[0]}) | "
                f"{qf['total_s']:.0f} s ({qf['total_s'] / 60:.1f} min) | "
                f"{qf['train']['max_rss_mb']:.0f} MB (largest process) |"
            )
        lines.append("")
    return lines


def _profiles(r: dict) -> list[str]:
    lines = []
    if r.get("profiles"):
        lines += ["## Where our step's CPU time goes (cProfile; nested rows are part of the row above)", ""]
        for p in r["profiles"]:
            lines += [f"{p['preset']} ({p['total_s']:.2f} s CPU profiled; details in `{Path(p['file']).name}`):", ""]
            lines += [
                f"{'  - ' if b['label'].startswith(' ') else '- '}{b['share']:.1%} {b['label'].strip()} "
                f"(`{b['where']}`)"
                for b in p["buckets"]
            ]
            lines.append("")
    return lines


def _targets(r: dict) -> list[str]:
    q, qs, qf = r["ratio"], r.get("quickstart_memory"), r.get("quickstart_full")
    lines = ["## Targets", ""]
    lines += [
        (
            f"- ours ≤ 0.5x TRL per RL step: {q['step_paired']:.2f}x wall (paired), {q['cpu_paired']:.2f}x CPU — "
            f"{'met' if q['step_paired'] <= 0.5 else 'missed'}"
        ),
        *(
            [
                f"- ours with rollout.staleness 1 ≤ 0.5x TRL per RL step, equal cores: {q['step_paired_async']:.2f}x "
                f"(paired blocks) — {'met' if q['step_paired_async'] <= 0.5 else 'missed'}"
            ]
            if q.get("step_paired_async") is not None
            else []
        ),
        (
            f"- routing replay ≤ +10% step time: {pct(r['rr_overhead'])} wall, {pct(r['rr_overhead_cpu'])} CPU — "
            f"{'met' if r['rr_overhead'] <= 0.10 else 'missed'}"
        ),
    ]
    if qs:
        lines.append(
            f"- quickstart peak memory ≤ 4 GB: {qs['max_rss_mb']:.0f} MB max RSS "
            f"(train.steps={qs['steps']}) — {'met' if qs['max_rss_mb'] <= 4096 else 'missed'}"
        )
    if qf:
        on = f" on {qf['cores']} cores" if qf.get("cores") else ""
        lines.append(
            f"- quickstart ≤ 5 min with cold start{on}: "
            f"{qf['total_s'] / 60:.1f} min — "
            f"{'met' if qf['total_s'] <= 300 else 'missed'}" + (" (box shared)" if qf["shared"] else "")
        )
    lines += [
        "",
        (
            f"Benchmark wall time: {r['bench_wall_s']:.0f} s. Reproduce: `make bench` "
            "(options: `.venv/bin/python benchmarks/bench.py --help`)."
        ),
    ]
    return lines


def profile_text(cfg: dict, total: float, buckets: list[dict], by_cumulative: str, by_own: str) -> str:
    """One profile file: a header with the sizes in `cfg` (steps, preset, warmup, prompts,
    group, max_new, mini_batches), the buckets (profiling.profile_buckets) and pstats' two
    listings as text. `total` is the profiled CPU time in seconds."""
    lines = [
        (
            f"cProfile of {cfg['steps']} steps of {cfg['preset']} after {cfg['warmup']} warm-up "
            f"({cfg['prompts']} prompts x {cfg['group']}, max_new_tokens {cfg['max_new']}, "
            f"{cfg['mini_batches']} mini-batches); profiled CPU time {total:.2f} s "
            "(process time of all threads; cProfile inflates Python-heavy code)."
        ),
        "",
        "Buckets (cumulative time, share of profiled time):",
    ]
    lines += [f"  {b['share']:6.1%}  {b['seconds']:7.3f} s  {b['label']}  [{b['where']}]" for b in buckets]
    lines += ["", "Top by cumulative time:", by_cumulative, "Top by own time:", by_own]
    return "\n".join(lines)


def vllm_rollout_text(m: dict) -> str:
    """vllm_rollout.py's report, four lines. `m`: threads, prompts, tokens, params_m (millions),
    hf_/vllm_ best, median (tokens/s) and length (mean tokens), start_s and sync_s (seconds),
    gap_mean and gap_max (nats)."""
    return (
        f"threads {m['threads']}, {m['prompts']} prompts x {m['tokens']} new tokens, {m['params_m']:.1f} M params\n"
        f"hf generate : best {m['hf_best']:6.0f}, median {m['hf_median']:6.0f} tokens/s "
        f"(mean length {m['hf_length']:.1f})\n"
        f"vllm        : best {m['vllm_best']:6.0f}, median {m['vllm_median']:6.0f} tokens/s "
        f"(mean length {m['vllm_length']:.1f}); engine start {m['start_s']:.1f} s, "
        f"weight sync {m['sync_s'] * 1000:.0f} ms\n"
        f"log-prob |engine - trainer|: mean {m['gap_mean']:.1e}, max {m['gap_max']:.1e} nats\n"
    )
