"""`gspo plan`: exact parameter counts (against transformers' own build on the meta device),
hand-computed phase totals for a tiny config, Qwen3-30B-A3B's headline figures, and the
command's one-line errors."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.plan import Hardware, model_shape, plan_memory, read_config, shape_from_config
from gspo_cli.spec.loading import spec_from_dict

ROOT = Path(__file__).resolve().parents[1]
QWEN3_30B = ROOT / "experiments" / "configs" / "qwen3-30b-a3b"
runner = CliRunner()


def meta_count(cfg: dict) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


SMALL = {"vocab_size": 97, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4}


@pytest.mark.parametrize(
    "cfg",
    [
        {**SMALL, "model_type": "qwen3", "num_key_value_heads": 2, "intermediate_size": 80,
         "tie_word_embeddings": True},  # Qwen3's head_dim defaults to 128, not 48 / 4
        {**SMALL, "model_type": "qwen3", "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64,
         "tie_word_embeddings": False, "attention_bias": True},
        {**SMALL, "model_type": "qwen3_moe", "num_key_value_heads": 2, "intermediate_size": 72, "num_experts": 6,
         "num_experts_per_tok": 2, "moe_intermediate_size": 40, "tie_word_embeddings": False},
        # Dense layers among MoE ones: every second layer sparse, layer 0 forced dense.
        {**SMALL, "num_hidden_layers": 4, "model_type": "qwen3_moe", "num_key_value_heads": 4,
         "intermediate_size": 72, "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 24,
         "decoder_sparse_step": 2, "mlp_only_layers": [1], "tie_word_embeddings": True},
    ],
)  # fmt: skip
def test_parameter_counts_equal_a_meta_device_build(cfg):
    n = meta_count(cfg)
    assert shape_from_config(cfg).total_params() == n
    # As transformers writes it (config.json of a saved model: num_experts -> num_local_experts).
    from transformers import AutoConfig

    saved = json.loads(AutoConfig.for_model(**cfg).to_json_string())
    assert shape_from_config(saved).total_params() == n


def test_qwen3_30b_a3b_headline_figures():
    """DESIGN.md: 30.5 B parameters (48 x (604 M experts + 18.9 M attention) + 2 x 311 M
    embedding/head), 122 GB in fp32, 61 GB per GPU of weights + grads + AdamW over 8."""
    raw = read_config(QWEN3_30B)
    shape = shape_from_config(raw)
    P = shape.total_params()
    assert P == meta_count(raw) == 30_532_122_624
    assert shape.expert_params() // 48 == 128 * 3 * 2048 * 768 == 603_979_776
    assert shape.attention_params() == 18_874_624
    assert shape.vocab * shape.hidden == 311_164_928
    assert round(4 * P / 1e9, 1) == 122.1
    spec = spec_from_dict(yaml.safe_load((ROOT / "experiments" / "gpu_qwen3_moe.yaml").read_text()))
    plan = plan_memory(shape, spec, Hardware(gpus_per_node=8, gpu_bytes=80 * 10**9), prompt_tokens=512)
    state = dict(plan.phase("checkpoint").device)
    per_gpu = sum(b for name, b in state.items() if name.startswith(("fp32 master", "fp32 gradients", "AdamW")))
    assert per_gpu == 16 * P // 8 - (16 * P // 8) % 4  # three terms, each floored
    assert round(per_gpu / 1e9, 1) == 61.1
    # The shipped GPU spec (64 prompts x 8, in micro-batches) is what the plan says fits 8 x 80 GB;
    # the paper's 64 x 4096 without micro-batches does not.
    assert plan.problems() == [] and spec.rollout.prompts_per_step == 64
    big = spec.model_copy(
        update={
            "rollout": spec.rollout.model_copy(update={"max_new_tokens": 4096, "sample_rows": None}),
            "train": spec.train.model_copy(update={"micro_batch_tokens": None}),
        }
    )
    too_big = plan_memory(shape, big, Hardware(gpus_per_node=8, gpu_bytes=80 * 10**9), prompt_tokens=512)
    assert [line.split(":")[0] for line in too_big.problems()] == ["rollout", "pi_old", "update"]
    # Rank 0 alone reads the checkpoint, in its dtype (bf16): its pages (half the fp32 model) and
    # a fused copy of the experts, stored one per expert in the file; 61.1 + 58.0 GB on its host.
    host = dict(plan.phase("load").host)
    assert host["rank 0: checkpoint pages read (bfloat16)"] == 2 * P
    assert host["rank 0: experts fused at load (copy)"] == 2 * shape.expert_params() == 2 * 48 * 603_979_776


def test_builtin_config_is_the_one_the_builder_makes():
    from gspo_cli.models.builtin import build_config, build_tokenizer
    from gspo_cli.tasks import make_task

    spec = spec_from_dict({"name": "x", "arms": [{"name": "a", "preset": "paper-gspo"}]})
    shape, warnings = model_shape(spec)
    task = make_task(spec.task.name, spec.task.params)
    tok = build_tokenizer(task.corpus_text(random.Random(spec.model.cold_start.seed + 1)))
    config = build_config("tiny-moe", spec.model.builtin, tok)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(config)
    assert shape.vocab == len(tok) and not warnings
    assert shape.total_params() == sum(p.numel() for p in model.parameters())


TINY_DENSE = {
    "model_type": "qwen3",
    "vocab_size": 10,
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "tie_word_embeddings": True,
}


def test_hand_computed_phase_totals(tmp_path):
    # P: per layer q 8x8 + k,v 2 x 8x4 + o 8x8 + q/k norms 2x4 = 200, MLP 3 x 8 x 16 = 384,
    # two norms 16 -> 600; 2 layers + embedding 80 (tied) + final norm 8 = 1288.
    (tmp_path / "config.json").write_text(json.dumps(TINY_DENSE))
    spec = spec_from_dict(
        {
            "name": "x",
            "model": {"name": str(tmp_path), "device": "cuda", "sharding": "fsdp"},
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
            "arms": [{"name": "a", "preset": "paper-gspo", "mini_batches": 2}],
        }
    )
    shape, _ = model_shape(spec)
    assert shape.total_params() == 1288 == meta_count(TINY_DENSE)
    plan = plan_memory(shape, spec, Hardware(gpus_per_node=2, gpu_bytes=10**10), prompt_tokens=4)
    load, update = plan.phase("load"), plan.phase("update")
    # load: CUDA allowance 3e9 + fp32 master shard 4 x 1288 / 2 + one embedding in flight (4 + 4) x 80
    assert load.device_total == 3 * 10**9 + 2576 + 640
    # host: 2 processes x 4e9 + rank 0's read of the checkpoint (fp32: the config names no dtype) 4 x 1288
    assert load.host_total == 8 * 10**9 + 5152
    # update, 2 ranks x 2 rows, 2 mini-batches -> 1 row of T = 4 + 6 tokens:
    #   resident 16 x 1288 / 2 = 10304; gathered fp32 root (88) + 2 layers (1200): 4 x 1288 = 5152;
    #   one layer's unsharded grads (4 + 4) x 600 = 4800; activations 1 x 10 x (92 + 88) x 2 layers
    #   x 4 B = 14400 (attention 2h+3q+3kv+2q+q+2h = 92, SwiGLU 2h+4I+h = 88);
    #   logits: the 6 response positions fit one 64 MiB chunk: 3 fp32 [6, 10] tensors = 720;
    #   the response hidden states the head reads, 1 x 6 x 8 x 4 B = 192
    assert update.device_total == 3 * 10**9 + 10304 + 5152 + 4800 + 14400 + 720 + 192
    assert update.dominant() == "CUDA context, NCCL, allocator slack"
    assert plan.fits(update) == (True, None)
    # The `before` layout: the whole fp32 model reaches the device before sharding, and the
    # update's logits are one row's whole [10 tokens, 10 vocab] plus 3 fp32 [6, 10]: 400 + 720.
    before = plan_memory(shape, spec, Hardware(gpus_per_node=2), prompt_tokens=4, layout="before")
    assert dict(before.phase("load").device)["whole fp32 model before sharding"] == 4 * 1288
    assert dict(before.phase("update").device)["logits (1 rows x 10 tokens x 10 vocab)"] == 1120
    # "today", the layout's former name, is still accepted
    today = plan_memory(shape, spec, Hardware(gpus_per_node=2), prompt_tokens=4, layout="today")
    assert today.layout == "before" and [p.device for p in today.phases] == [p.device for p in before.phases]
    with pytest.raises(ValueError, match="layout: 'after'"):
        plan_memory(shape, spec, Hardware(), prompt_tokens=4, layout="after")
    # One process (and DDP) still loads with from_pretrained in every process: the `sharded`
    # and the `before` layouts plan the same load; an fp32 dense checkpoint is used in place
    # (benchmarks/README.md: 115 MB measured for a 480 MB model), so on CPU only the libraries.
    one = spec.model_copy(update={"model": spec.model.model_copy(update={"device": "cpu", "sharding": "ddp"})})
    for hw in (Hardware(), Hardware(gpus_per_node=2)):
        now, was = (plan_memory(shape, one, hw, prompt_tokens=4, layout=k).phase("load") for k in ("sharded", "before"))
        assert now.device == was.device == [("libraries loaded with the model", 140 * 2**20)]
        assert now.host == was.host


def test_plan_constants_are_the_codes():
    """The plan keeps torch-free copies of two constants of the code it models."""
    from gspo_cli.plan import memory
    from gspo_cli.rollout import base, vllm_settings

    assert memory.LOGITS_CHUNK_BYTES == base.LOGITS_CHUNK_BYTES == 64 * 2**20
    assert memory.COLOCATED_GPU_MEMORY_UTILIZATION == vllm_settings.COLOCATED_GPU_MEMORY_UTILIZATION


def test_logits_chunks_are_64_mib_of_positions():
    """Qwen3's 151,936-token vocabulary: 110 positions per chunk (110 x 151,936 x 4 B =
    66,851,840 <= 2**26 = 67,108,864 < 111 x 151,936 x 4), three fp32 [110, vocab] tensors at
    once, whatever the number of rows or the response length."""
    shape = shape_from_config(read_config(QWEN3_30B))
    spec = spec_from_dict(yaml.safe_load((ROOT / "experiments" / "gpu_qwen3_moe.yaml").read_text()))
    assert 110 * 151_936 * 4 <= 2**26 < 111 * 151_936 * 4
    for tokens in (2048, 4096):
        longer = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"max_new_tokens": tokens})})
        plan = plan_memory(shape, longer, Hardware(gpus_per_node=8), prompt_tokens=512)
        rows = 10240 // (512 + tokens)  # the spec's train.micro_batch_tokens, rows at their longest
        for phase in ("pi_old", "update"):
            terms = dict(plan.phase(phase).device)
            assert terms["logits chunk (110 positions x 151936 vocab, 3 fp32 tensors)"] == 3 * 4 * 110 * 151_936
            assert terms[f"response hidden states ({rows} rows x {tokens} tokens)"] == rows * tokens * 2048 * 2


def test_vllm_share_defaults_to_the_colocated_default(tmp_path):
    """rollout.engine vllm without gpu_memory_utilization: the engine takes 0.3 of the GPU
    (gspo-cli's default on GPU, not vLLM's 0.92); with FSDP too, and no note that it is not
    supported."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_DENSE))
    raw = {
        "name": "x",
        "model": {"name": str(tmp_path), "device": "cuda", "sharding": "fsdp"},
        "rollout": {"engine": "vllm"},
        "arms": [{"name": "a", "preset": "paper-gspo"}],
    }
    spec = spec_from_dict(raw)
    shape, _ = model_shape(spec)
    plan = plan_memory(shape, spec, Hardware(gpus_per_node=2, gpu_bytes=80 * 10**9), prompt_tokens=4)
    assert dict(plan.phase("rollout").device)["vLLM (gpu_memory_utilization 0.3 of the GPU)"] == 24 * 10**9
    assert plan.notes == []
    raw["rollout"]["vllm"] = {"gpu_memory_utilization": 0.5}
    plan = plan_memory(shape, spec_from_dict(raw), Hardware(gpus_per_node=2, gpu_bytes=80 * 10**9), prompt_tokens=4)
    assert dict(plan.phase("rollout").device)["vLLM (gpu_memory_utilization 0.5 of the GPU)"] == 40 * 10**9


def test_gradient_checkpointing_keeps_layer_inputs_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_DENSE))
    raw = {"name": "x", "model": {"name": str(tmp_path)}, "arms": [{"name": "a", "preset": "paper-gspo"}]}
    on = spec_from_dict({**raw, "train": {"gradient_checkpointing": True}})
    shape, _ = model_shape(on)
    kept = dict(plan_memory(shape, on, Hardware(), prompt_tokens=4).phase("update").device)
    rows, T = 128 // 4, 4 + 48  # 16 x 8 rows, paper-gspo's 4 mini-batches; 48 new tokens by default
    assert kept["activations: layer inputs (checkpointed)"] == rows * T * 8 * 4 * 2
    assert kept["activations: one layer recomputed"] == rows * T * 180 * 4  # 92 + 88 elements per token
    off = spec_from_dict({**raw, "train": {"gradient_checkpointing": False}})
    kept = dict(plan_memory(shape, off, Hardware(), prompt_tokens=4).phase("update").device)
    assert kept[f"activations ({rows} rows x {T} tokens x 2 layers)"] == rows * T * 180 * 2 * 4


def test_plan_modules_import_no_torch():
    code = (
        "import sys\nimport gspo_cli.plan, gspo_cli.cli.plan\n"
        "from gspo_cli.plan import shape_from_config, read_config\n"
        f"print(shape_from_config(read_config({str(QWEN3_30B)!r})).total_params())\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "30532122624"


def _spec_file(tmp_path, model_name: str, **extra) -> Path:
    path = tmp_path / "exp.yaml"
    raw = {"name": "x", "model": {"name": model_name}, "arms": [{"name": "a", "preset": "paper-gspo"}], **extra}
    path.write_text(yaml.safe_dump(raw))
    return path


def test_cli_missing_config_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["plan", str(_spec_file(tmp_path, str(tmp_path / "empty"))), "--gpus", "2"])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(
        f"error: model.name: {tmp_path / 'empty'} has no config.json"
    )
    res = runner.invoke(app, ["plan", str(_spec_file(tmp_path, "Org/not-cached"))])
    assert res.exit_code == 2 and "hub id with no config.json in the Hugging Face cache" in res.stderr


@pytest.mark.parametrize("size", ["80XB", "GB", "-5GB", "0"])
def test_cli_bad_size_is_one_line(tmp_path, size):
    res = runner.invoke(app, ["plan", str(_spec_file(tmp_path, str(QWEN3_30B))), "--gpu-memory", size])
    assert res.exit_code == 2
    assert res.stderr == f"error: --gpu-memory: {size!r} is not a size (e.g. 80GB, 141GB, 96GiB, 1TB)\n"


def test_cli_warns_but_never_refuses(tmp_path):
    """The 30B model in fp32 on one 80 GB GPU fits nowhere: warnings, exit 0."""
    res = runner.invoke(app, ["plan", str(_spec_file(tmp_path, str(QWEN3_30B))), "--gpu-memory", "80GB"])
    assert res.exit_code == 0, res.output
    assert "warning: does not fit: load:" in res.stderr
    assert "30.53 B parameters" in res.stdout
    res = runner.invoke(
        app, ["plan", str(_spec_file(tmp_path, str(QWEN3_30B))), "--gpu-memory", "80GB", "--json", "--gpus", "8"]
    )
    out = json.loads(res.stdout)
    assert out["params"] == 30_532_122_624 and out["world"] == 8 and out["gpu_bytes"] == 80 * 10**9
    assert [p["phase"] for p in out["layouts"]["sharded"]["phases"]] == [
        "load", "rollout", "pi_old", "update", "checkpoint"
    ]  # fmt: skip


def test_size_units():
    from gspo_cli.cli.plan import parse_size

    assert parse_size("80GB", "x") == 80 * 10**9
    assert parse_size("96 GiB", "x") == 96 * 2**30
    assert parse_size("1TB", "x") == 10**12
    assert parse_size("141", "x") == 141 * 10**9
    with pytest.raises(SpecError, match="--host-memory: '1 PB'"):
        parse_size("1 PB", "--host-memory")


def test_the_documented_command(tmp_path):
    """docs/scaling/plan.md's command and the per-GPU totals it explains, with the largest
    micro-batch budget that fits (7 rows of 2560 tokens); unsplit, the same batch does not fit.
    For the former batch (8 prompts, no micro-batches) pi_old and update were 74.0 and 78.2 GB
    while the plan counted one row's whole logits (4,511,891,456 B: 2560 x 151,936 x 2 B + 3 x
    2048 x 151,936 x 4 B); the 64 MiB chunks count 3 x 110 x 151,936 x 4 B = 200,555,520 plus
    the response hidden states (8 or 2 rows x 2048 x 2048 x 2 B)."""
    args = ["plan", str(ROOT / "experiments" / "gpu_qwen3_moe.yaml"), "--gpus", "8", "--gpu-memory", "80GB"]
    args += ["--config", str(QWEN3_30B), "--host-memory", "1TB", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    phases = json.loads(res.stdout)["layouts"]["sharded"]["phases"]
    totals = {p["phase"]: round(p["device_bytes"] / 1e9, 1) for p in phases}
    assert totals == {"load": 20.1, "rollout": 72.6, "pi_old": 69.3, "update": 76.1, "checkpoint": 64.1}
    assert json.loads(res.stdout)["largest_micro_batch_tokens"] == 7 * 2560
    doc = (ROOT / "docs" / "scaling" / "plan.md").read_text()
    assert all(f"{v} GB" in doc for v in totals.values())
    unsplit = runner.invoke(app, [*args, "--set", "train.micro_batch_tokens=null", "--set", "rollout.sample_rows=null"])
    unsplit_totals = {
        p["phase"]: round(p["device_bytes"] / 1e9, 1)
        for p in json.loads(unsplit.stdout)["layouts"]["sharded"]["phases"]
    }
    assert (unsplit_totals["pi_old"], unsplit_totals["update"]) == (81.9, 89.3)  # as the docs say
    res = runner.invoke(
        app,
        [*args, "--set", "rollout.prompts_per_step=8", "--set", "train.micro_batch_tokens=null"]
        + ["--set", "rollout.sample_rows=null"],
    )
    phases = json.loads(res.stdout)["layouts"]["sharded"]["phases"]
    totals = {p["phase"]: round(p["device_bytes"] / 1e9, 1) for p in phases}
    assert totals == {"load": 20.1, "rollout": 70.2, "pi_old": 69.7, "update": 73.9, "checkpoint": 64.1}
    before = {p["phase"]: p["device_bytes"] for p in json.loads(res.stdout)["layouts"]["today"]["phases"]}
    old_logits = 2560 * 151_936 * 2 + 3 * 2048 * 151_936 * 4
    for phase, rows in (("pi_old", 8), ("update", 2)):
        device = next(p["device_bytes"] for p in phases if p["phase"] == phase)
        chunked = 3 * 110 * 151_936 * 4 + rows * 2048 * 2048 * 2
        assert round((device - chunked + old_logits) / 1e9, 1) == {"pi_old": 74.0, "update": 78.2}[phase]
    assert round(before["pi_old"] / 1e9, 1) == 111.8  # the whole logits of 8 rows
    assert all(p["device_fits"] and p["host_fits"] for p in phases)
    assert all(f"{v} GB" in doc for v in totals.values())


def test_a_colocated_vllm_engine_in_every_phase(tmp_path):
    """vLLM's share of the GPU (gpu_memory_utilization x GPU) stays on the GPU through pi_old,
    the update and the checkpoint unless the engine sleeps; level 1 keeps its weights (1/tp of
    them per process) in host memory, level 2 nothing. The weight sync holds up to three copies
    of the largest tensor (the 10-vocab x 8 embedding). The share check counts 1/tp of the
    weights per GPU."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_DENSE))

    def plan(gpu_bytes=10**10, **vllm):
        spec = spec_from_dict(
            {
                "name": "x",
                "model": {"name": str(tmp_path), "device": "cuda", "sharding": "fsdp"},
                "rollout": {
                    "prompts_per_step": 2,
                    "group_size": 2,
                    "max_new_tokens": 6,
                    "engine": "vllm",
                    "vllm": vllm,
                },
                "arms": [{"name": "a", "preset": "paper-gspo"}],
            }
        )
        shape, _ = model_shape(spec)
        return plan_memory(shape, spec, Hardware(gpus_per_node=2, gpu_bytes=gpu_bytes), prompt_tokens=4)

    awake, light, deep = plan(), plan(sleep=1), plan(sleep=2)
    share = 3 * 10**9  # the colocated default, 0.3 of 10 GB
    rollout = dict(awake.phase("rollout").device)
    assert rollout["vLLM (gpu_memory_utilization 0.3 of the GPU)"] == share
    assert rollout["weight sync: largest tensor, 3 copies"] == 3 * 4 * 10 * 8
    for name in ("pi_old", "update", "checkpoint"):
        held = awake.phase(name).device_total - light.phase(name).device_total
        assert held == share, name
        assert light.phase(name).device == deep.phase(name).device
        extra = light.phase(name).host_total - deep.phase(name).host_total
        assert extra == 2 * 4 * 1288, name  # 2 processes x the fp32 weights, whole with tp 1
    tp2 = plan(sleep=1, tensor_parallel_size=2)
    assert tp2.phase("update").host_total - deep.phase("update").host_total == 2 * 4 * 1288 // 2
    # the share: 0.3 x 10 kB = 3,000 B against the weights' 5,152 B, or 2,576 B per GPU with tp 2
    assert any("exceed its share" in n for n in plan(gpu_bytes=10**4).notes)
    assert not any("exceed its share" in n for n in plan(gpu_bytes=10**4, tensor_parallel_size=2).notes)


def test_a_vllm_server_costs_the_trainer_one_gathered_parameter():
    """rollout.engine vllm-server: no engine, KV cache or sampler on the trainer's GPUs during the
    rollout, only the weight push's one gathered parameter, the largest of Qwen3-30B-A3B being a
    layer's fused gate/up experts (128 x 2 x 768 x 2048 in bf16, above the 151936 x 2048
    embedding); the plan says the server's GPUs are not in it."""
    shape = shape_from_config(read_config(QWEN3_30B))
    raw = yaml.safe_load((ROOT / "experiments" / "gpu_qwen3_moe.yaml").read_text())
    hw = Hardware(gpus_per_node=8, gpu_bytes=80 * 10**9)
    colocated = plan_memory(shape, spec_from_dict(raw), hw, prompt_tokens=512)
    raw["rollout"] = {**raw["rollout"], "engine": "vllm-server", "server": {"url": "http://gpu9:8000"}}
    raw["rollout"].pop("vllm", None)
    served = plan_memory(shape, spec_from_dict(raw), hw, prompt_tokens=512)
    rollout = dict(served.phase("rollout").device)
    assert rollout["weight push to the vLLM server: largest parameter, gathered"] == 2 * 128 * 2 * 768 * 2048
    assert not [name for name in rollout if "vLLM (" in name or "KV cache" in name or "sampler" in name]
    assert served.phase("rollout").device_total < colocated.phase("rollout").device_total
    assert "rollout.engine vllm-server: the server's own GPUs are not in this plan" in served.notes


@pytest.mark.parametrize("columns", ["100", "250"])
def test_the_table_fits_100_columns(tmp_path, columns):
    """The documented command and a spec with the longest term name (the vLLM server's weight
    push): no line of stdout or stderr wider than 100 columns, whatever COLUMNS says, and no
    comparison with the code of an old issue."""
    raw = yaml.safe_load((ROOT / "experiments" / "gpu_qwen3_moe.yaml").read_text())
    raw["rollout"] = {**raw["rollout"], "engine": "vllm-server", "server": {"url": "http://gpu9:8000"}}
    raw["rollout"].pop("vllm", None)
    served = tmp_path / "served.yaml"
    served.write_text(yaml.safe_dump(raw))
    for spec in (ROOT / "experiments" / "gpu_qwen3_moe.yaml", served):
        args = ["plan", str(spec), "--gpus", "8", "--gpu-memory", "80GB", "--config", str(QWEN3_30B)]
        res = runner.invoke(app, [*args, "--host-memory", "1TB"], env={"COLUMNS": columns})
        assert res.exit_code == 0, res.output
        lines = (res.stdout + res.stderr).splitlines()
        assert max(map(len, lines)) <= 100, max(lines, key=len)
        header = next(ln for ln in lines if ln.startswith("phase"))
        assert (
            header.split() == "phase per GPU fits per host fits largest term beyond weights, gradients, AdamW".split()
        )
        assert "issue" not in res.stdout
        if spec == served:
            continue
        load = next(ln for ln in lines if ln.startswith("load "))
        assert load.split()[:7] == ["load", "20.1", "GB", "yes", "151.0", "GB", "yes"]
        # docs/scaling/plan.md's worked example is this output, verbatim
        assert res.stdout.rstrip() in (ROOT / "docs" / "scaling" / "plan.md").read_text()
    res = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "100"})
    assert "issue" not in res.stdout.lower()


def test_a_cpu_plan_that_does_not_fit_names_its_largest_term_and_remedy_in_100_columns():
    """The quickstart at 256 prompts on a 1 GB host: every line within 100 columns (the
    micro-batch line and the warnings were 126 and ~110), the host's 600 MB runtime shown with the
    terms, warnings per process as the table's column is, naming the largest single term (not
    the sum 'device memory of 1 process') and, for rollout, rollout.sample_rows; 256 rows sampled
    at once then fit."""
    args = ["plan", str(ROOT / "experiments" / "quickstart.yaml"), "--host-memory", "1GB"]
    args += ["--set", "rollout.prompts_per_step=256"]
    res = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    lines = (res.stdout + res.stderr).splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    out = " ".join(res.stdout.split())
    assert "phase per process fits per host fits" in out
    assert (
        "per host, every phase: runtime (1 process) 600 MB + device memory of 1 process (the per-process column)" in out
    )
    warned = " ".join(res.stderr.split()).split("warning: ")[1:]
    assert [w.split(":")[1].strip() for w in warned] == ["rollout", "pi_old", "update"]
    assert warned[0].startswith(
        "does not fit: rollout: 1.2 GB per host exceeds 1.0 GB (largest term: runtime (1 process), 600 MB)"
    )
    assert "its own part shrinks with rollout.sample_rows (rows sampled at once; now 2048 per process)" in warned[0]
    assert "(largest term: activations (512 rows x 48 tokens x 4 layers), 1.4 GB)" in warned[2]
    assert "train.micro_batch_tokens" in warned[2] and "device memory of" not in res.stderr
    fixed = runner.invoke(app, [*args, "--set", "rollout.sample_rows=256"])
    assert fixed.exit_code == 0 and "does not fit: rollout" not in fixed.stderr


def test_a_gpu_plan_warns_per_gpu_as_its_table_says(tmp_path):
    args = ["plan", str(ROOT / "experiments" / "gpu_qwen3_moe.yaml"), "--gpus", "8", "--config", str(QWEN3_30B)]
    res = runner.invoke(app, [*args, "--gpu-memory", "40GB", "--host-memory", "100GB"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    warned = " ".join(res.stderr.split())
    assert "per device" not in warned and "phase per GPU fits" in " ".join(res.stdout.split())
    assert "rollout: 72.6 GB per GPU exceeds 40.0 GB (largest term: AdamW moments, fp32 (1/8), 30.5 GB)" in warned
    assert (
        "load: 151.0 GB per host exceeds 100.0 GB (largest term: rank 0: checkpoint pages read (bfloat16), 61.1 GB)"
        in warned
    )
    assert "now 16 per process" in warned  # rollout.sample_rows 16 of the 64 rows per process
    host = " ".join(res.stdout.split()).split("per host, every phase: ")[1]
    assert host.startswith("runtime (8 processes) 32.0 GB; load adds rank 0: checkpoint pages read (bfloat16) 61.1 GB")
    assert max(map(len, (res.stdout + res.stderr).splitlines())) <= 100


def test_staleness_adds_the_sampling_worker_and_its_weight_copies(tmp_path):
    """rollout.staleness k: every phase's host gains k fp32 copies of the weights (shared memory),
    the worker's runtime, its own model copy and (hf engine) what sampling a batch adds; the
    device of a cpu run is unchanged (the worker is another process)."""
    from gspo_cli.plan.memory import FP32, HOST_RUNTIME

    (tmp_path / "config.json").write_text(json.dumps(TINY_DENSE))
    raw = {
        "name": "x",
        "model": {"name": str(tmp_path), "device": "cpu"},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "arms": [{"name": "a", "preset": "paper-gspo", "mini_batches": 2}],
    }
    spec0 = spec_from_dict(raw)
    spec4 = spec_from_dict({**raw, "rollout": {**raw["rollout"], "staleness": 4}})
    shape, _ = model_shape(spec0)
    P = shape.total_params()
    p0, p4 = (plan_memory(shape, s, Hardware(), prompt_tokens=4) for s in (spec0, spec4))
    rollout0 = p0.phase("rollout")
    sampling = sum(b for _, b in rollout0.transient_terms())
    assert sampling > 0
    for a, b in zip(p0.phases, p4.phases, strict=True):
        assert b.device_total == a.device_total
        assert b.host_total - a.host_total == 4 * FP32 * P + HOST_RUNTIME["cpu"] + FP32 * P + sampling
    assert dict(p4.phase("update").host)["staleness 4: 4 weight copies in shared memory"] == 4 * 4 * P
    assert any("rollout.staleness 4" in n for n in p4.notes) and not any("staleness" in n for n in p0.notes)
    # on a GPU the worker's model and sampling sit on the device; the shared copies stay on the host
    cuda = {**raw, "model": {**raw["model"], "device": "cuda"}}
    g0, g4 = (
        plan_memory(
            shape, spec_from_dict({**cuda, "rollout": {**raw["rollout"], "staleness": k}}), Hardware(), prompt_tokens=4
        )
        for k in (0, 2)
    )
    r = g0.phase("rollout")
    assert g4.phase("update").device_total - g0.phase("update").device_total == FP32 * P + sum(
        b for _, b in r.transient_terms()
    )
    assert g4.phase("update").host_total - g0.phase("update").host_total == 2 * FP32 * P + HOST_RUNTIME["cuda"]


def test_plan_refuses_what_train_would_refuse_in_that_world(tmp_path):
    """The same checks as training, for the world --gpus x --nodes describes: staleness with
    several processes, prompts that do not divide over them, a built-in model's prompts past its
    positions; each one line, exit 2."""
    stale = _spec_file(tmp_path, str(QWEN3_30B), rollout={"staleness": 8, "prompts_per_step": 8, "group_size": 8})
    res = runner.invoke(app, ["plan", str(stale), "--gpus", "8"])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: rollout.staleness: 8 is not supported with several processes")
    assert runner.invoke(app, ["plan", str(stale), "--gpus", "1"]).exit_code == 0
    uneven = _spec_file(tmp_path, str(QWEN3_30B), rollout={"prompts_per_step": 4, "group_size": 8})
    res = runner.invoke(app, ["plan", str(uneven), "--gpus", "8"])
    assert res.exit_code == 2 and res.stderr.startswith("error: rollout.prompts_per_step: 4 is not divisible by"), (
        res.output
    )
    long = _spec_file(
        tmp_path,
        "builtin:tiny-moe",
        model={"name": "builtin:tiny-moe", "builtin": {"max_positions": 32}},
        rollout={"max_new_tokens": 30},
    )
    res = runner.invoke(app, ["plan", str(long)])
    assert res.exit_code == 2, res.output
    assert "the built-in model reads 32 positions (model.builtin.max_positions), 30 of them for the response" in (
        res.stderr
    )
