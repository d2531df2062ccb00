"""The measuring side of `make bench`, our trainer's part: one worker per process (TRL's side is
in trl_worker.py; the equal-work terms are in bench.py's docstring), and the fixed reference
workload that times the box's drift between rounds.

Each worker reads its config (a dict, from the orchestrator's command line), answers with
tagged JSON lines (`common.emit`) and times only; summaries and the report are elsewhere
(paired.py, orchestrate.py, render.py).
"""

from __future__ import annotations

import os
import time

from benchmarks.common import (
    base_raw,
    compiles,
    emit,
    load_spec_and_task,
    model_source,
    peak_rss_mb,
    set_threads,
    wait_for_turn,
)

# A step's time split into phases, the same keys on both sides (seconds; None: not measured):
# gen (sampling, weight sync excluded), score (the reward), old_logp (pi_old's log-prob pass),
# update (every mini-batch's forward, backward and optimizer step), sync (weights into the
# sampler), wait (waiting for a sampler that runs beside the trainer). `gen_overlapped`: the
# sampling ran in another process during the previous step, so it is not part of this step.
PHASES = ("gen_s", "score_s", "old_logp_s", "update_s", "sync_s", "wait_s")


def _spec_for(
    cfg: dict, *, steps: int, group: int | None = None, max_new: int | None = None, preset: str | None = None
):
    """(spec, task) of the quickstart at a worker's sizes; group/max_new/preset override cfg's,
    cfg["staleness"] (default 0) is rollout.staleness, cfg["engine"] (default "hf") rollout.engine,
    cfg["spec"] (default: the quickstart) the spec the model, task and optimizer come from."""
    raw = base_raw(
        prompts=cfg["prompts"],
        group=group or cfg["group"],
        max_new=max_new or cfg["max_new"],
        mini_batches=cfg["mini_batches"],
        steps=steps,
        preset=preset or cfg["preset"],
        staleness=cfg.get("staleness", 0),
        engine=cfg.get("engine", "hf"),
        spec_path=cfg.get("spec"),
        compile=bool(cfg.get("compile")),
        smoke=bool(cfg.get("smoke")),
    )
    return load_spec_and_task(raw)


def worker_ours(cfg: dict) -> None:
    """Our trainer: setup() once, then turns ("turn N THREADS": N steps back to back) until
    "done". cfg["max_steps"] bounds the steps of all turns together. With cfg["staleness"] = 1
    the steps are stale.StaleRollouts' (a worker process samples one step ahead, torch threads
    split as the trainer splits them, so a turn's THREADS is ignored); at the end of a turn the
    batch already requested is waited for, so the sampler never runs during another side's
    turn (the next turn's first step then has its batch ready: the orchestrator does not
    measure first steps). cfg["engine"] = "vllm": the vLLM engine, its weight sync timed apart."""
    t0 = time.perf_counter()  # set-up: imports, model, engine (and sampler), as for TRL
    import torch

    from gspo_cli.train.staleness import StaleRollouts, split_threads
    from gspo_cli.train.step import setup, train_step

    set_threads(cfg.get("threads", 0))
    stale_on = bool(cfg.get("staleness"))
    spec, task = _spec_for(cfg, steps=cfg["max_steps"] + stale_on)
    source = model_source(spec, task)
    threads = torch.get_num_threads()
    stale_threads = "{} trainer + {} worker".format(*split_threads(threads))
    ctx = setup(spec, spec.arms[0], cfg["seed"], task, source)
    # the worker process starts here, inside the set-up time
    stale = StaleRollouts(ctx, source=source, seed=cfg["seed"]) if stale_on else None
    emit({"ready": True, "setup_s": time.perf_counter() - t0})
    B = cfg["prompts"] * cfg["group"]
    step = 0
    try:
        while (turn := wait_for_turn()) is not None:
            n, turn_threads = turn
            if not stale:
                set_threads(turn_threads)
            recs = []
            for _ in range(n):
                step += 1
                c0, sync0 = time.process_time(), getattr(ctx.engine, "sync_s", 0.0)
                m = stale.step(ctx, step) if stale else train_step(ctx, step)
                rec = our_step_record(m, B, sync_s=getattr(ctx.engine, "sync_s", 0.0) - sync0)
                recs.append(
                    {**rec, "cpu_s": time.process_time() - c0, "t_end": time.perf_counter(), "compiles": compiles()}
                )
            if stale:
                stale.checkpoint_state()  # waits for the batch requested for the next step
            emit(
                {
                    "turn": recs,
                    "torch_threads": stale_threads if stale else torch.get_num_threads(),
                    "affinity": sorted(os.sched_getaffinity(0)),  # vLLM's CPU worker may bind threads
                }
            )
    finally:
        if stale:
            stale.close()
    emit(
        {
            "final": True,
            "peak_rss_mb": peak_rss_mb(),
            "torch_threads": stale_threads if stale else torch.get_num_threads(),
        }
    )


def our_step_record(m: dict, B: int, sync_s: float = 0.0) -> dict:
    """One step's record (seconds, tokens, tokens/s, the PHASES) from our trainer's metrics; B =
    rollouts per step; `sync_s`: weight sync inside the rollout (the vLLM engine's), taken out of
    generation. With staleness 1 the sync is the metric time/weight_sync_s, and generation ran
    in the worker, overlapped with the previous step."""
    stale = "perf/rollout_wait_s" in m
    sync = m.get("time/weight_sync_s", 0.0) if stale else sync_s
    gen_tokens = m["response/length_mean"] * B
    return {
        "step_s": m["time/step_s"],
        "rollout_s": m["time/rollout_s"],
        "gen_s": m["time/rollout_s"] - (0.0 if stale else sync),
        "gen_overlapped": stale,
        "score_s": m["time/score_s"],
        "old_logp_s": m["time/old_logp_s"],
        "update_s": m["time/update_s"],
        "sync_s": sync,
        "wait_s": m.get("perf/rollout_wait_s", 0.0),
        "gen_tokens": gen_tokens,
        "gen_tok_per_s": gen_tokens / max(m["time/rollout_s"], 1e-9),
        "length_mean": m["response/length_mean"],
        "length_max": m["response/length_max"],
        "gen_ms_per_token_step": 1000 * m["time/rollout_s"] / max(m["response/length_max"], 1),
        "reward_mean": m["reward/mean"],
    }


def reference_workload(reps: int = 40) -> float:
    """Seconds for a fixed CPU workload on one torch thread: `reps` products of two 256x256
    float32 matrices and a pure-Python loop of 200k additions per rep (~0.3-0.5 s on this box
    when idle). Timed between rounds, its spread is the drift the box put on the rounds."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    t = time.perf_counter()
    for _ in range(reps):
        (a @ b).sum()
        sum(range(200_000))
    return time.perf_counter() - t


def worker_ref(cfg: dict) -> None:
    """The drift reference: on each "turn N THREADS", times reference_workload() once (N and
    THREADS are ignored) and answers {"ref_s": seconds}."""
    reference_workload(5)  # first-call costs (allocator, libraries) out of the timings
    emit({"ready": True, "setup_s": 0.0})
    while wait_for_turn() is not None:
        emit({"ref_s": reference_workload()})
    emit({"final": True, "peak_rss_mb": peak_rss_mb(), "torch_threads": 1})


def worker_variants(cfg: dict) -> None:
    """Several of our configurations in one process, stepped round-robin (rotating order),
    so that load changes on the box affect them alike. Variant keys: label, preset, group,
    max_new, ignore_eos (sample exactly max_new tokens: only the rollout's stopping rule
    changes; rewards and the loss still end at the first EOS)."""
    from gspo_cli.train.step import setup, train_step

    set_threads(cfg.get("threads", 0))
    ctxs = []
    for v in cfg["variants"]:
        spec, task = _spec_for(cfg, steps=cfg["rounds"], group=v["group"], max_new=v["max_new"], preset=v["preset"])
        ctx = setup(spec, spec.arms[0], cfg["seed"], task, model_source(spec, task))
        if v.get("ignore_eos"):
            # an id no sampled token can equal: generate() then never stops early
            ctx.engine.gen_config.eos_token_id = len(ctx.engine.tokenizer) + 1000
        ctxs.append(ctx)
    records: dict[str, list[dict]] = {v["label"]: [] for v in cfg["variants"]}
    n = len(ctxs)
    for r in range(cfg["rounds"]):
        for j in range(n):
            k = (j + r) % n
            v = cfg["variants"][k]
            c0 = time.process_time()
            m = train_step(ctxs[k], r + 1)
            cpu = time.process_time() - c0
            if r >= cfg["warmup"]:
                rec = our_step_record(m, cfg["prompts"] * v["group"])
                rec.update(round=r, cpu_s=cpu)
                records[v["label"]].append(rec)
    emit({"side": "ours-variants", "records": records, "peak_rss_mb": peak_rss_mb()})
