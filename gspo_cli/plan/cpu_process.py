"""What a CPU training process holds beyond its tensors (`model.device: cpu`, where a process's
"device memory" is its resident set), added to `gspo plan`'s phases after they are built.

Three mechanisms, each seen in /proc/self/status (RssAnon, RssFile) and glibc's mallinfo2 of a
training process (benchmarks/README.md, "LoRA vs full fine-tuning: peak memory"):

- **The checkpoint stays mapped.** from_pretrained maps the safetensors file and keeps the dense
  tensors of a checkpoint in the training dtype in place; MoE experts stored one per expert are
  read and fused into new tensors. The mapping lives as long as the dense weights do, so the
  experts' pages, read once, stay in the resident set: checkpoint bytes x expert parameters.
- **glibc keeps freed heap memory.** Tensors below glibc's mmap threshold (it rises to at most
  32 MiB once large blocks are freed) come from the heap, and freed heap memory stays with the
  process. The largest heap transient so far (the update's activations; with a checkpoint
  converted to another dtype at load, the per-expert copies made before fusing) is kept from
  then on; later heap transients reuse it, so a phase holds max(kept, its own heap transients).
- **bf16 matmul kernels are compiled per shape and cached** (oneDNN on CPU; fp32 matmuls use
  no such cache). Sequence lengths change every step, so the cache fills: its capacity
  (ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024) x the heap one cached kernel holds (measured).

A bf16 load from a checkpoint in another dtype also reads every page of the file while it
converts, and makes the per-expert copies before fusing (both during "load"). And under bf16
autocast the update's saved activations are counted at fp32 width: measured, the bf16 base's
memory grew more from 16 to 32 rows than the fp32 base's (benchmarks/README.md); the norms
compute in fp32 and PEFT casts each adapted layer's input to the adapters' fp32, which autocast
casts back (what is saved was not itemised).
"""

from __future__ import annotations

import os

MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
# Heap in use per cached oneDNN primitive: bf16 nn.Linear calls of 60 new shapes (hidden 640),
# torch 2.13 CPU, grew the heap in use by 0.69 MiB per shape with the default cache and by 0.32
# MiB with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0: 0.37 MiB per cached primitive.
ONEDNN_PRIMITIVE_BYTES = int(0.37 * 2**20)
ONEDNN_CACHE_CAPACITY = 1024  # oneDNN's default
# Each phase's terms that are heap transients (they reuse what the heap keeps), by name prefix.
HEAP_TRANSIENTS = {
    "rollout": ("KV cache", "prefill activations", "sampler log-probs", "recorded routes"),
    "pi_old": ("activations", "response hidden states", "recorded routes"),
    "update": ("activations", "response hidden states"),  # "activations kept at fp32 width" included
    "checkpoint": (),
}


def largest_activation_bytes(shape, rows: int, tokens: int) -> int:
    """The widest single activation of a forward, fp32: rows x tokens x the widest of the hidden
    state, a dense MLP layer's gate/up output and an MoE layer's top-k gate/up outputs."""
    dense = 2 * shape.intermediate if len(shape.moe_layers) < shape.layers else 0
    width = max(shape.hidden, dense, 2 * shape.top_k * shape.moe_intermediate)
    return 4 * rows * tokens * width


def add_cpu_process_terms(
    phases,
    shape,
    *,
    held: int,
    compute: int,
    converted: bool,
    ck: int,
    fsdp: bool,
    update_rows: int,
    tokens: int,
    procs: int,
) -> None:
    """Add the module docstring's terms to `phases` (phases.Phase, model.device cpu, in place).
    `held`: bytes per weight as loaded; `compute`: per element of model.dtype; `converted`: the
    checkpoint's dtype differs; `ck`: its bytes per weight; `fsdp`: loaded by rank 0 and
    broadcast (no mapping kept)."""
    by = {p.name: p for p in phases}
    experts = shape.expert_params()
    kept_heap = 0
    if not fsdp and experts and converted:
        load = by["load"]
        load.device += [
            ("checkpoint pages read while converting", ck * shape.total_params()),
            ("per-expert copies before fusing (heap, kept)", held * experts),
        ]
        kept_heap = held * experts
    acts = sum(b for n, b in by["update"].device if n.startswith("activations"))
    if compute == 2 and acts:  # autocast on CPU: the saved activations are as large as fp32 ones
        by["update"].device.append(("activations kept at fp32 width under autocast", acts))
        acts *= 2
    if largest_activation_bytes(shape, update_rows, tokens) < MMAP_THRESHOLD_MAX:
        kept_heap = max(kept_heap, acts)
    steady: list[tuple[str, int]] = []
    if not fsdp and experts and not converted:
        steady.append(("checkpoint's expert pages (file kept mapped)", ck * experts))
    if compute == 2:
        cap = int(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY))
        steady.append((f"bf16 matmul kernels cached per shape (oneDNN, {cap})", cap * ONEDNN_PRIMITIVE_BYTES))
    for name, prefixes in HEAP_TRANSIENTS.items():
        phase = by.get(name)
        if phase is None:
            continue
        transient = sum(b for n, b in phase.device if n.startswith(prefixes))
        # the log-prob pass's 3 fp32 chunk tensors come from the heap when each is below the threshold
        transient += sum(b for n, b in phase.device if n.startswith("logits chunk") and b // 3 < MMAP_THRESHOLD_MAX)
        extra = list(steady)
        if kept_heap > transient:
            extra.append(("heap kept by glibc from earlier transients", kept_heap - transient))
        phase.device += extra
    for phase in phases:
        phase.host = [
            (n, procs * phase.device_total) if n.startswith("device memory of") else (n, b) for n, b in phase.host
        ]
