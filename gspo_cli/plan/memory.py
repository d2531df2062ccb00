"""Memory per phase of an RL step, per device and per host, from a ModelShape and the spec.

Two layouts. `sharded` is how runs load and step: under FSDP the model is built on
the meta device and filled from rank 0's one copy in the checkpoint's dtype; FSDP2 full
sharding of fp32 master weights, gradients and AdamW state, with bf16 all-gathers
(MixedPrecisionPolicy, no autocast) when model.dtype is bfloat16; log-probs and entropy from the
output head applied in 64 MiB chunks (rollout/base.py); per-rank checkpoints
(torch.distributed.checkpoint). `before` is the unsharded layout the tool had earlier, kept for
comparison (accepted under its former name, `today`): every process loads the whole fp32 model on the host
and moves it to its device before sharding, FSDP gathers fp32 under autocast, log-probs build
[rows, tokens, vocab] fp32 logits, and a checkpoint gathers the whole weights and AdamW state on
rank 0's host.

Units are bytes; 1 GB = 1e9 bytes (a '30.5 B parameter model is 122 GB in fp32').
"""

from __future__ import annotations

from dataclasses import replace

from gspo_cli.plan import lora as plan_lora
from gspo_cli.plan.cpu_process import add_cpu_process_terms
from gspo_cli.plan.phases import Hardware, Phase, Plan, workload
from gspo_cli.plan.reward_models import add_reward_models
from gspo_cli.plan.shapes import DTYPE_BYTES, ModelShape, activation_elems_per_token, forward_elems_per_token
from gspo_cli.plan.staleness import add_sampling_worker
from gspo_cli.plan.units import count, gb  # noqa: F401 - cli.plan reads them here
from gspo_cli.runs import plural
from gspo_cli.spec import ExperimentSpec

LAYOUTS = ("sharded", "before")
LAYOUT_ALIASES = {"today": "before"}  # the name `before` had while it was the code as it was
FP32 = 4
# Per device: CUDA context, NCCL buffers and allocator slack (a flat allowance, not derived).
CUDA_RUNTIME = 3 * 10**9
# Per process on the host: Python, torch, transformers and their libraries.
HOST_RUNTIME = {"cuda": 4 * 10**9, "cpu": 6 * 10**8}
# Largest fp32 logits (positions x vocab x 4 B) one chunk of the log-prob pass builds: a copy of
# LOGITS_CHUNK_BYTES in gspo_cli/rollout/base.py (response_logprobs), which imports torch;
# tests/test_plan.py checks the two are equal.
LOGITS_CHUNK_BYTES = 1 << 26
# In the `before` layout the hf engine kept the sampler's logits for its log-probs only below this.
HF_LOGITS_BUDGET = 1 << 30
# rollout.vllm.gpu_memory_utilization when the spec leaves it out (vLLM on a GPU): a copy of
# COLOCATED_GPU_MEMORY_UTILIZATION in gspo_cli/rollout/vllm_settings.py (not vLLM's own 0.92);
# tests/test_plan.py checks the two are equal.
COLOCATED_GPU_MEMORY_UTILIZATION = 0.3
# model.device cpu (a process's memory is its RSS): what loading transformers' modeling code and
# the first forward/backward add to a process whatever the model's size (kernels, autograd,
# allocator arenas, gloo buffers). Measured with benchmarks/plan_check.py on an 11 M-parameter model.
CPU_LOAD_LIBRARIES = 140 * 2**20
CPU_STEP_RUNTIME = 250 * 2**20


def plan_memory(
    shape: ModelShape, spec: ExperimentSpec, hw: Hardware, *, prompt_tokens: int, layout: str = "sharded"
) -> Plan:
    """Per-phase memory (load, rollout, pi_old, update, checkpoint) of `spec` on `hw`.

    Per device: the busiest rank's bytes on its device. Per host: rank 0's node (it holds the
    checkpoint copy when loading and, in the `before` layout, the gathered checkpoint). With
    model.device cpu the "device" is the process's share of host memory and the host holds
    every process. `layout`: "sharded" (how runs load and step) or "before" (the earlier
    unsharded layout; "today" is accepted for it), see the module docstring."""
    layout = LAYOUT_ALIASES.get(layout, layout)
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {LAYOUTS}")
    before = layout == "before"
    W = hw.world
    kind = "cpu" if spec.model.device == "cpu" else "cuda"
    wl = workload(spec, shape, W, prompt_tokens)
    c = wl.compute_bytes
    P = shape.total_params()
    fsdp = W > 1 and spec.model.sharding == "fsdp"
    share = W if fsdp else 1
    notes: list[str] = []

    # What every rank keeps between phases once the first update has run (AdamW's moments
    # are created at the first step; gradients stay allocated until the next zero_grad).
    resident = [
        ("fp32 master weights" + (f" (1/{W})" if fsdp else ""), FP32 * P // share),
        ("fp32 gradients" + (f" (1/{W})" if fsdp else ""), FP32 * P // share),
        ("AdamW moments, fp32" + (f" (1/{W})" if fsdp else ""), 2 * FP32 * P // share),
    ]
    if wl.kl:
        resident.append(("KL reference weights" + (f" (1/{W})" if fsdp else ""), FP32 * P // share))
    if W > 1 and not fsdp:
        resident.append(("DDP gradient buckets", FP32 * P))
    lora = spec.model.lora is not None  # the base frozen in model.dtype, fp32 adapters (plan/lora.py)
    if lora:
        resident = plan_lora.resident_terms(shape, spec, share, W)
        wl = replace(wl, kl=False)  # the KL reference is the base with its adapters off: no copy

    # Weights a forward needs beyond the shards: FSDP gathers the root (embeddings, head; kept
    # through forward and backward) and about two decoder layers at a time (one prefetched).
    gather_bytes = FP32 if (before or c == FP32) else c
    gathered: list[tuple[str, int]] = []
    if fsdp:
        gathered = [
            (
                f"gathered root + 2 layers ({'fp32' if gather_bytes == FP32 else 'bf16'})",
                gather_bytes * (shape.embedding_params() + 2 * shape.largest_layer_params()),
            )
        ]
    if c != FP32 and (before or not fsdp) and not lora:  # a LoRA base is already in model.dtype
        # autocast keeps a compute-dtype copy of every gathered nn.Linear weight for the whole
        # forward; grouped-GEMM experts are not autocast ops and are not copied.
        linear = P - shape.expert_params() - shape.vocab * shape.hidden * (0 if shape.tied else 1)
        gathered.append(("autocast weight copies (non-expert)", c * linear))

    layer_elems = [activation_elems_per_token(shape, i) for i in range(shape.layers)]
    live_elems = [forward_elems_per_token(shape, i) for i in range(shape.layers)]
    T, V = wl.tokens, shape.vocab

    def logits(rows: int) -> list[tuple[str, int]]:
        C = wl.new_tokens
        if before:
            # lm_head output for every position in the compute dtype, then fp32: logits/temperature,
            # log-softmax and one more [rows, response, vocab] tensor (entropy's exp, or backward's gradient).
            return [(f"logits ({rows} rows x {T} tokens x {V} vocab)", rows * (T * V * c + 3 * C * V * FP32))]
        # rollout/base.py, response_logprobs: the head runs on the response positions' final hidden
        # states (copied out of [rows, tokens, hidden]; the update keeps the copy for backward, as
        # the checkpointed chunks' input), N positions at a time, N x vocab x 4 B <= 64 MiB. At most
        # three fp32 [N, vocab] tensors live at once: pi_old's forward with entropy holds the
        # log-probs, their exp and the product; the update's backward recomputes the chunk and holds
        # the saved log-probs, the gathered token's gradient and log-softmax's gradient (the head's
        # compute-dtype output and its fp32 cast, 6 B per element, come and go before). No logits
        # are kept between chunks or for backward.
        n = min(rows * C, max(1, LOGITS_CHUNK_BYTES // (FP32 * V)))
        return [
            (f"logits chunk ({n} positions x {V} vocab, 3 fp32 tensors)", 3 * FP32 * n * V),
            (f"response hidden states ({rows} rows x {C} tokens)", rows * C * shape.hidden * c),
        ]

    runtime_dev = (
        [("CUDA context, NCCL, allocator slack", CUDA_RUNTIME)]
        if kind == "cuda"
        else [("CPU kernels, autograd, allocator (fixed)", CPU_STEP_RUNTIME)]
    )
    host_proc = HOST_RUNTIME[kind]
    procs_on_node = min(hw.gpus_per_node, W)

    def host_terms(extra: list[tuple[str, int]], device_total: int) -> list[tuple[str, int]]:
        base = [(f"runtime ({plural(procs_on_node, 'process', 'processes')})", procs_on_node * host_proc)]
        if kind == "cpu":
            base.append(
                (f"device memory of {plural(procs_on_node, 'process', 'processes')}", procs_on_node * device_total)
            )
        return base + extra

    phases = []

    # load
    ck = DTYPE_BYTES.get(shape.checkpoint_dtype, FP32)
    experts = shape.expert_params()
    if before or not fsdp:
        # from_pretrained in every process (one process, DDP, and the `before` layout):
        # it maps the safetensors files and uses an fp32 checkpoint's dense tensors in place
        # (pages shared by the node's processes through the page cache); MoE experts, stored one
        # per expert, are concatenated into new fused tensors (their pages read and a copy made);
        # a checkpoint in another dtype is converted into an fp32 copy per process. In the
        # `before` layout FSDP then moved the whole model to the device before fully_shard (measured on CPU:
        # benchmarks/README.md, "gspo plan against measured peaks").
        held = c if lora else FP32  # LoRA loads the base in model.dtype
        converted = ck != held
        if converted:
            per_proc = [(f"{'bf16' if held == 2 else 'fp32'} copy of the checkpoint", held * P)]
        elif experts:
            per_proc = [("experts fused at load (pages read + fused copy)", 2 * held * experts)]
        else:
            per_proc = []
        if kind == "cpu":
            dev = list(per_proc)
            if fsdp and not converted:  # fully_shard reads every tensor: the rest of the file is paged in
                dev.append(("checkpoint pages read by fully_shard", FP32 * (P - experts)))
            host_extra = []
        else:
            dev = [(f"whole {'bf16' if held == 2 else 'fp32'} model" + (" before sharding" if fsdp else ""), held * P)]
            host_extra = [
                (f"{n} x {plural(procs_on_node, 'process', 'processes')}", procs_on_node * b) for n, b in per_proc
            ]
            if not converted:
                host_extra.append(("checkpoint pages (page cache, shared)", FP32 * P))
        if wl.kl:
            dev.append(("KL reference (whole, fp32)", FP32 * P))
    else:
        # FSDP (models/loading.py, _load_sharded): every rank allocates its fp32 shards; rank 0
        # alone reads the checkpoint with from_pretrained in the checkpoint's own dtype (its
        # tensors' pages read; per-expert tensors fused into a new copy) and broadcasts it one
        # tensor at a time. The busiest process is rank 0.
        dev = [(f"fp32 master shard (1/{share})", FP32 * P // share)]
        if wl.kl:
            dev.append((f"KL reference shard (1/{share})", FP32 * P // share))
        biggest = shape.vocab * shape.hidden
        rank0 = [(f"rank 0: checkpoint pages read ({shape.checkpoint_dtype})", ck * P)]
        if experts:
            rank0.append(("rank 0: experts fused at load (copy)", ck * experts))
        if kind == "cpu":
            # rank 0 broadcasts the tensors it read (no copy); a checkpoint in another dtype is
            # converted one tensor at a time into the fp32 shards.
            dev += rank0
            if ck != FP32:
                dev.append(("one tensor converted in flight (largest: embedding)", FP32 * biggest))
            host_extra = []
        else:
            # each rank's device receives the whole tensor, then converts its slice
            dev.append(("one tensor in flight (largest: embedding)", (ck + FP32) * biggest))
            host_extra = rank0
    libraries = [("libraries loaded with the model", CPU_LOAD_LIBRARIES)]
    phase = Phase("load", (runtime_dev if kind == "cuda" else libraries) + dev)
    phase.host = host_terms(host_extra, phase.device_total)
    phases.append(phase)

    # rollout
    engine = spec.rollout.engine
    dev = list(resident)
    rows = wl.sample_rows
    vllm_held: list[tuple[str, int]] = []  # what a colocated engine holds on each GPU outside rollout
    vllm_host: list[tuple[str, int]] = []
    if engine == "vllm":
        vcfg = spec.rollout.vllm
        util = float(vcfg.get("gpu_memory_utilization", COLOCATED_GPU_MEMORY_UTILIZATION))
        tp = int(vcfg.get("tensor_parallel_size", 1))
        sleep = int(vcfg.get("sleep", 0))
        engine_weights = c * P // tp  # each engine group's member holds 1/tp of the weights
        if hw.gpu_bytes is not None:
            share_bytes = int(util * hw.gpu_bytes)
            dev.append((f"vLLM (gpu_memory_utilization {util} of the GPU)", share_bytes))
            if engine_weights > share_bytes:
                notes.append(
                    f"vLLM's weights ({gb(engine_weights)} per GPU in {spec.model.dtype}"
                    + (f", 1/{tp} with tensor_parallel_size {tp}" if tp > 1 else "")
                    + f") exceed its share ({util} x {gb(hw.gpu_bytes)}): it cannot start"
                )
            if sleep == 0:
                vllm_held = [(f"vLLM, awake (gpu_memory_utilization {util}; rollout.vllm.sleep 0)", share_bytes)]
        # the weight sync after each update: the stream gathers one parameter at a time and
        # holds up to three copies of it (docs/scaling/vllm-fsdp.md, measured on CPU)
        dev.append(("weight sync: largest tensor, 3 copies", 3 * c * shape.vocab * shape.hidden))
        if sleep == 1:  # level 1 keeps the engine's weights in host memory while it sleeps
            vllm_host = [
                (
                    f"vLLM weights asleep in host memory ({plural(procs_on_node, 'process', 'processes')})",
                    procs_on_node * engine_weights,
                )
            ]
    elif engine == "vllm-server":
        # the server's devices are its own; here only the push: one gathered parameter at a time
        # (the largest: the embedding or an MoE layer's fused gate/up experts)
        largest = max(shape.vocab, 2 * shape.experts * shape.moe_intermediate) * shape.hidden
        dev.append(("weight push to the vLLM server: largest parameter, gathered", c * largest))
        notes.append("rollout.engine vllm-server: the server's own GPUs are not in this plan")
    else:
        dev += gathered
        kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * c * rows * T
        dev.append((f"KV cache ({rows} rows x {T} tokens)", kv))
        dev.append(("prefill activations (one layer)", rows * wl.prompt_tokens * max(live_elems) * c))
        sampler = rows * wl.new_tokens * V * FP32
        if spec.rollout.sampler_logprobs and before and sampler <= HF_LOGITS_BUDGET:
            # generate's per-step logits, stacked, /temperature, log-softmax, exp and product (entropy)
            dev.append(("sampler logits for log-probs", 6 * sampler))
        elif spec.rollout.sampler_logprobs and not before:
            # log-probs and entropy taken at each decoding step: a few [rows, vocab] tensors
            dev.append(("sampler log-probs per decoding step", 3 * rows * V * FP32))
        if wl.routes and spec.rollout.sampler_logprobs:
            dev.append(("recorded routes", 8 * shape.layers * rows * T * shape.top_k))
    phase = Phase("rollout", runtime_dev + dev)
    phase.host = host_terms([], phase.device_total)
    phases.append(phase)

    # pi_old (and the KL reference's log-probs): no-grad forwards of the local batch (micro-batches)
    dev = list(resident) + vllm_held + gathered
    dev.append(("activations (no grad, one layer)", wl.forward_rows * T * max(live_elems) * c))
    dev += logits(wl.forward_rows)
    if wl.routes:
        dev.append(("recorded routes", 8 * shape.layers * wl.rows * T * shape.top_k))
    phase = Phase("pi_old", runtime_dev + dev)
    phase.host = host_terms(list(vllm_host), phase.device_total)
    phases.append(phase)

    # update: one mini-batch's forward and backward, then the optimizer step
    ur = wl.update_rows
    dev = list(resident) + vllm_held + gathered
    if fsdp:
        grad_bytes = FP32 if before else c + FP32  # bf16 gradients, cast to fp32 for the reduce-scatter
        dev.append(("unsharded gradients of one layer", grad_bytes * shape.largest_layer_params()))
    if wl.checkpointing:
        dev.append(("activations: layer inputs (checkpointed)", ur * T * shape.hidden * c * shape.layers))
        dev.append(("activations: one layer recomputed", ur * T * max(layer_elems) * c))
    else:
        dev.append((f"activations ({ur} rows x {T} tokens x {shape.layers} layers)", ur * T * sum(layer_elems) * c))
    dev += logits(ur)
    phase = Phase("update", runtime_dev + dev)
    phase.host = host_terms(list(vllm_host), phase.device_total)
    phases.append(phase)

    # checkpoint: what saving adds over the resident state
    dev = list(resident) + vllm_held
    if before:
        full = FP32 * P + 2 * FP32 * P  # whole weights + whole AdamW state
        if W > 1:
            host_extra = [("rank 0 gathers whole weights + AdamW (fp32)", full)]
            if kind == "cpu":
                dev.append(("rank 0 gathers whole weights + AdamW (fp32)", full))
                host_extra = []
        else:
            host_extra = []
            dev.append(("safetensors write buffer (weights)", resident[1][1] if lora else FP32 * P))
    else:
        # torch.distributed.checkpoint writes tensor by tensor: each rank stages at most its
        # largest local tensor (an expert stack or the embedding) in host memory at a time.
        widest = max(shape.vocab * shape.hidden, max(shape.mlp_params(i) for i in shape.moe_layers or [0]))
        staged = FP32 * widest // share
        host_extra = [(f"one tensor per rank staged for writing ({procs_on_node} ranks)", procs_on_node * staged)]
        if kind == "cpu":
            dev.append(("one tensor staged for writing", staged))
            host_extra = []
    phase = Phase("checkpoint", runtime_dev + dev)
    phase.host = host_terms(host_extra + vllm_host, phase.device_total)
    phases.append(phase)

    for phase in phases:
        phase.resident = frozenset(name for name, _ in resident)
    if kind == "cpu" and not before:  # a CPU process's memory beyond its tensors (plan/cpu_process.py)
        held = c if lora else FP32
        kw = dict(held=held, compute=c, converted=ck != held, ck=ck, fsdp=fsdp, update_rows=wl.update_rows)
        add_cpu_process_terms(phases, shape, **kw, tokens=wl.tokens, procs=procs_on_node)
    notes += add_reward_models(phases, spec, kind, procs_on_node)  # task.rewards[].model: their weights
    weight_bytes = c if lora else FP32  # the state dict the trainer publishes to the worker
    notes += add_sampling_worker(phases, spec, params=P, weight_bytes=weight_bytes, kind=kind, host_runtime=host_proc)
    if spec.train.gradient_checkpointing is False and shape.layers > 8:
        notes.append("train.gradient_checkpointing is off: the update keeps every layer's activations")
    return Plan(layout=layout, params=P, world=W, device_kind=kind, phases=phases, hardware=hw, notes=notes)
