"""`gspo plan` on CPU (model.device cpu): what a process holds beyond its tensors
(gspo_cli/plan/cpu_process.py), checked term by term on a tiny MoE with hand-computed sizes."""

from __future__ import annotations

import json

import pytest

from gspo_cli.plan import Hardware, model_shape, plan_memory
from gspo_cli.plan.cpu_process import ONEDNN_PRIMITIVE_BYTES, largest_activation_bytes
from gspo_cli.spec.loading import spec_from_dict

# 2 MoE layers of 4 experts, hidden 8, expert width 4: experts 2 x 4 x 3 x 8 x 4 = 768 parameters.
MOE = {
    "model_type": "qwen3_moe",
    "vocab_size": 10,
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 4,
    "tie_word_embeddings": False,
}
PAGES = "checkpoint's expert pages (file kept mapped)"
KEPT = "heap kept by glibc from earlier transients"
KERNELS = "bf16 matmul kernels cached per shape (oneDNN, 1024)"


def plan_for(tmp_path, device="cpu", dtype="float32", lora=True, rollout=None):
    (tmp_path / "config.json").write_text(json.dumps(MOE))
    model = {"name": str(tmp_path), "device": device, "dtype": dtype, **({"lora": {"r": 2}} if lora else {})}
    spec = spec_from_dict(
        {
            "name": "x",
            "model": model,
            "rollout": rollout or {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
            "arms": [{"name": "a", "preset": "paper-gspo", "mini_batches": 2}],
        }
    )
    shape, _ = model_shape(spec)
    assert shape.expert_params() == 768
    return shape, plan_memory(shape, spec, Hardware(), prompt_tokens=4)


def terms(plan, phase):
    return dict(plan.phase(phase).device)


@pytest.mark.parametrize("lora", [True, False])
def test_an_fp32_load_keeps_the_expert_pages_and_the_update_activations(tmp_path, lora):
    _, plan = plan_for(tmp_path, lora=lora)
    acts = sum(b for n, b in plan.phase("update").device if n.startswith("activations"))
    assert acts > 0
    for phase in ("rollout", "pi_old", "update", "checkpoint"):
        assert terms(plan, phase)[PAGES] == 4 * 768  # fp32 checkpoint, experts read once at load
        assert KERNELS not in terms(plan, phase)  # fp32 matmuls compile no kernels
    # the update's own activations reuse the heap: nothing kept on top of them
    assert KEPT not in terms(plan, "update")
    # the checkpoint has no heap transients: it holds the whole kept heap
    assert terms(plan, "checkpoint")[KEPT] == acts
    # rollout: kept heap minus what its own heap transients (KV cache, prefill, ...) reuse
    roll = plan.phase("rollout").device
    transients = sum(b for n, b in roll if n.startswith(("KV cache", "prefill", "sampler log-probs", "recorded")))
    assert dict(roll)[KEPT] == acts - transients
    # pi_old: its log-prob chunk (3 fp32 [4 rows x 6, 10] tensors, far below 32 MiB) is heap as well
    old = plan.phase("pi_old").device
    assert dict(old)["logits chunk (24 positions x 10 vocab, 3 fp32 tensors)"] == 3 * 4 * 24 * 10
    heap = sum(b for n, b in old if n.startswith(("activations", "response hidden", "recorded", "logits chunk")))
    assert dict(old)[KEPT] == acts - heap
    # the host holds the process's device memory, the new terms included
    for phase in plan.phases:
        assert dict(phase.host)["device memory of 1 process"] == phase.device_total
    assert "load" not in {p.name for p in plan.phases if PAGES in dict(p.device)}


def test_a_bf16_base_from_an_fp32_checkpoint(tmp_path):
    shape, plan = plan_for(tmp_path, dtype="bfloat16")
    load = terms(plan, "load")
    assert load["bf16 copy of the checkpoint"] == 2 * shape.total_params()
    assert load["checkpoint pages read while converting"] == 4 * shape.total_params()
    assert load["per-expert copies before fusing (heap, kept)"] == 2 * 768
    update = terms(plan, "update")
    # autocast: the update's saved activations counted at fp32 width (twice the bf16 term)
    bf16_acts = sum(b for n, b in update.items() if n.startswith("activations ("))
    assert update["activations kept at fp32 width under autocast"] == bf16_acts > 0
    acts = 2 * bf16_acts
    for phase in ("rollout", "pi_old", "update", "checkpoint"):
        assert PAGES not in terms(plan, phase)  # every tensor converted: the mapping is closed
        assert terms(plan, phase)[KERNELS] == 1024 * ONEDNN_PRIMITIVE_BYTES
    assert terms(plan, "checkpoint")[KEPT] == max(2 * 768, acts)


def test_the_kernel_cache_follows_its_capacity(tmp_path, monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
    _, plan = plan_for(tmp_path, dtype="bfloat16")
    assert terms(plan, "update")["bf16 matmul kernels cached per shape (oneDNN, 16)"] == 16 * ONEDNN_PRIMITIVE_BYTES


def test_activations_above_the_mmap_threshold_are_not_kept(tmp_path):
    # 512 x 8 rows / 2 mini-batches = 2048 rows of 4 + 200 tokens; the widest activation is the
    # top-2 gate/up output, 2 x 2 x 4 = 16 wide: 4 B x 2048 x 204 x 16 = 25.5 MiB < 32 MiB ...
    shape, small = plan_for(tmp_path, rollout={"prompts_per_step": 512, "group_size": 8, "max_new_tokens": 200})
    assert largest_activation_bytes(shape, 2048, 204) == 4 * 2048 * 204 * 16 < 32 * 2**20
    assert KEPT in terms(small, "checkpoint")
    # ... and at 1024 prompts 51 MiB: glibc maps it and returns it when freed
    shape, big = plan_for(tmp_path, rollout={"prompts_per_step": 1024, "group_size": 8, "max_new_tokens": 200})
    assert largest_activation_bytes(shape, 4096, 204) > 32 * 2**20
    assert KEPT not in terms(big, "checkpoint")


def test_a_gpu_process_has_none_of_these_terms(tmp_path):
    _, plan = plan_for(tmp_path, device="cuda", dtype="bfloat16")
    names = {n for p in plan.phases for n, _ in p.device}
    assert not names & {PAGES, KEPT, KERNELS, "checkpoint pages read while converting"}
