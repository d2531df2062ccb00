"""What `rollout.staleness: k` (k >= 1) adds to a plan: the sampling worker's process and the k
copies of the weights the trainer hands it through shared memory (rollout/async_worker.py).

The worker runs beside every phase of the trainer, so its memory is added to each phase:
- host: k copies of the trainer's state dict in shared memory (fp32 master weights; with LoRA
  the base in model.dtype and the adapters), and the worker's Python/torch runtime;
- on the worker's device (model.device: the host for cpu, the same GPU for cuda): its own copy
  of the model and, with the hf engine, what sampling a batch needs (the trainer's rollout
  phase's terms beyond the state it keeps). With vllm-server the server samples: not counted.
The trainer's own rollout phase is left as it is (at staleness >= 1 the trainer no longer samples
itself), so the plan errs high there.
"""

from __future__ import annotations


def add_sampling_worker(phases, spec, *, params: int, weight_bytes: int, kind: str, host_runtime: int) -> list[str]:
    """Add the worker's terms to every phase (in place; phases from plan_memory). `weight_bytes`:
    bytes per parameter of the trainer's state dict. Returns the plan's notes."""
    k = spec.rollout.staleness
    if not k:
        return []
    rollout = next(p for p in phases if p.name == "rollout")
    sampling = sum(b for _, b in rollout.transient_terms()) if spec.rollout.engine == "hf" else 0
    worker = [(f"sampling worker: its copy of the model ({spec.model.dtype})", weight_bytes * params)]
    if sampling:
        worker.append(("sampling worker: sampling a batch", sampling))
    shared = (f"staleness {k}: {k} weight copies in shared memory", k * weight_bytes * params)
    for phase in phases:
        phase.host.append(shared)
        phase.host.append(("sampling worker: runtime (1 process)", host_runtime))
        (phase.host if kind == "cpu" else phase.device).extend(worker)
    where = "host" if kind == "cpu" else "device"
    return [f"rollout.staleness {k}: a sampling worker and {k} weight copies are counted in every phase ({where})"]
