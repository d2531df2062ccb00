"""model.lora: LoRA adapters (PEFT) on a frozen base: the spec section, what trains, the reference
with adapters off, checkpoints in PEFT's format, resume after kill -9, export and refusals."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from helpers import TINY, max_gap, models_in_float64, tiny_model_dir
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.models import load_model, lora
from gspo_cli.models.routing import RoutingController
from gspo_cli.params import param_line, params_note
from gspo_cli.rollout import response_logprobs
from gspo_cli.runs import RunDir
from gspo_cli.spec import ModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.optim import router_parameters
from gspo_cli.train.reporting import quiet_reporter
from gspo_cli.train.step import setup

peft = pytest.importorskip("peft")

LORA = {**TINY["model"], "lora": {"r": 4}}


def model_cfg(source, **lora_kw):
    return ModelConfig(name=source, lora={"r": 4, **lora_kw})


def batch_for(tokenizer, texts=("1+2=3", "4+4=8", "3+1=4")):
    """A RolloutBatch of equally long texts: the first character the prompt, the rest the response."""
    from helpers import rows_batch

    ids = torch.tensor([tokenizer(t, add_special_tokens=False).input_ids for t in texts])
    b = rows_batch([ids.shape[1] - 1] * len(texts))
    b.input_ids = ids
    return b


def perturb(model, std=0.05, seed=1):
    """Adapters away from their zero start (B = 0 at init), as training would move them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * std)


# ------------------------------------------------------------------------------------ spec


def test_spec_section_defaults_and_refusals():
    spec = spec_from_dict({**TINY, "model": LORA})
    cfg = spec.model.lora
    assert (cfg.r, cfg.lora_alpha, cfg.dropout, cfg.target_modules, cfg.experts, cfg.routers) == (
        4,
        8.0,
        0.0,
        "all-linear",
        False,
        "frozen",
    )
    assert spec_from_dict(TINY).model.lora is None
    with pytest.raises(SpecError, match=r"dropout: 0.1: adapter dropout is refused; .*pi_theta .* pi_old"):
        spec_from_dict({**TINY, "model": {**LORA, "lora": {"dropout": 0.1}}})
    with pytest.raises(SpecError, match="routers"):
        spec_from_dict({**TINY, "model": {**LORA, "lora": {"routers": "some"}}})


def test_without_peft_the_extra_is_named_before_any_model_loads(tmp_path, monkeypatch):
    import gspo_cli.train.loop as loop

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    monkeypatch.setattr(loop, "resolve_model_source", lambda *a, **k: pytest.fail("a model was built"))
    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(yaml.safe_dump({**TINY, "output_dir": str(tmp_path / "out")}))
    res = CliRunner().invoke(app, ["train", str(spec_file), "--set", "model.lora.r=8"])
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.strip().splitlines()
    assert "model.lora: LoRA needs the peft package" in line and "gspo-cli[lora]" in line


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            {"rollout": {**TINY["rollout"], "engine": "vllm-server", "server": {"url": "http://127.0.0.1:9"}}},
            "rollout.engine: vllm-server with model.lora",
        ),
        ({"train": {"steps": 2, "compile": True}}, "train.compile with model.lora"),
        ({"model": {**LORA, "router_aux_loss_coef": 0.01}}, "router_aux_loss_coef: 0.01 with model.lora.routers"),
        ({"optimizer": {"lr": 1e-3, "router_lr_scale": 4.0}}, "router_lr_scale: 4 with model.lora.routers frozen"),
    ],
)
def test_unsupported_combinations_refused_in_one_line(edit, message):
    spec = spec_from_dict({**TINY, "model": LORA, **{k: v for k, v in edit.items() if k != "model"}})
    if "model" in edit:
        spec = spec_from_dict({**TINY, "model": edit["model"]})
    with pytest.raises(SpecError, match=message) as err:
        lora.check_spec(spec)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------ the model


@pytest.fixture(scope="module")
def base_dir():
    return tiny_model_dir()


def test_only_adapters_train_in_float32_over_a_bf16_base(base_dir):
    model = load_model(base_dir, ModelConfig(name=base_dir, dtype="bfloat16", lora={"r": 4})).model
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in trainable.values())
    assert all(p.dtype == torch.bfloat16 for p in frozen)
    # all-linear: q, k, v, o in each of the 2 layers (the MoE layers' experts and routers are not nn.Linear)
    layers = {n.split(".lora_")[0].removeprefix("model.") for n in trainable}
    assert layers == {f"layers.{i}.self_attn.{m}" for i in range(2) for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    # hidden 32, heads 2 x 16, kv 1 x 16: q,o 4*(32+32), k,v 4*(32+16); two layers
    assert lora.trainable_count(model)[0] == 2 * (2 * 4 * 64 + 2 * 4 * 48) == 1792


def test_reference_with_adapters_off_equals_a_frozen_copy(base_dir):
    cfg = model_cfg(base_dir, experts=True, routers="full")
    frozen = load_model(base_dir, ModelConfig(name=base_dir)).model.eval()
    model = load_model(base_dir, cfg).model
    tok = load_model(base_dir, ModelConfig(name=base_dir), training=False).tokenizer
    batch = batch_for(tok)
    with torch.no_grad():
        start = response_logprobs(model, batch).logp
        perturb(model)
        adapted = response_logprobs(model, batch).logp
        ref = response_logprobs(lora.AdaptersOff(model), batch).logp
        copy_ = response_logprobs(frozen, batch).logp
    assert torch.equal(start, copy_)  # B = 0 and router copies equal: the start is the base
    assert (adapted - copy_).abs().max() > 1e-3  # the adapters (and the trained routers' copies) matter
    assert torch.equal(ref, copy_)  # adapters off: the base, bit for bit, without a second copy
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)  # flags restored


def test_expert_adapters_through_grouped_mm_equal_the_eager_loop(base_dir):
    """The grouped GEMM has no float64 kernel: grouped_mm and the loop (float32) may differ by at
    most 4x the loop's own float32 floor, its gap to the same loop in float64."""
    outs = []
    for impl in ("gspo_grouped_mm", "eager", "float64"):
        cfg = ModelConfig(
            name=base_dir, experts_implementation=impl.replace("float64", "eager"), lora={"r": 4, "experts": True}
        )
        torch.manual_seed(0)
        model = load_model(base_dir, cfg).model
        perturb(model)
        if impl == "float64":
            models_in_float64(model)
        ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
        logits = model(input_ids=ids).logits
        logits.square().mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if "experts" in n and p.grad is not None}
        outs.append((logits.detach(), grads))
    (a, ga), (b, gb), (x, gx) = outs
    assert x.dtype == torch.float64 and ga and set(ga) == set(gb)
    for what, fused, loop, exact in (("logits", a, b, x), ("gradient", ga, gb, gx)):
        floor = max_gap(loop, exact)
        assert 0 < floor < 1e-4 and max_gap(fused, loop) <= 4 * floor, (what, max_gap(fused, loop), floor)


@pytest.mark.parametrize("routers", ["lora", "full"])
def test_routing_controller_finds_one_router_per_layer(base_dir, routers):
    model = load_model(base_dir, model_cfg(base_dir, routers=routers)).model
    ctl = RoutingController(model)
    assert ctl.num_layers == 2 and ctl.decoder_layers == [0, 1]
    # optimizer.router_lr_scale's group: the routers' adapters, or their trained copies
    trained = [n for n, p in model.named_parameters() if p.requires_grad and ".mlp.gate." in n]
    names = {id(p): n for n, p in model.named_parameters()}
    grouped = [names[id(p)] for p in router_parameters(model, ctl) if p.requires_grad]
    assert sorted(grouped) == sorted(trained) and len(trained) == (4 if routers == "lora" else 2)
    # replay forces the routes: a forward replaying its own recorded routes gives the same logits
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), ctl.recording() as rec:
        first = model(input_ids=ids).logits
    with torch.no_grad(), ctl.replaying(rec.routes):
        again = model(input_ids=ids).logits
    assert torch.equal(first, again)


def test_bad_targets_list_what_exists(base_dir):
    with pytest.raises(SpecError, match=r"'qproj' matches no module of .*; its linear layers are k_proj, o_proj"):
        load_model(base_dir, model_cfg(base_dir, target_modules=["qproj"]))
    with pytest.raises(SpecError, match=r"'gate' names model.layers.0.mlp.gate, a Qwen3MoeTopKRouter.*routers"):
        load_model(base_dir, model_cfg(base_dir, target_modules=["gate"]))
    dense = {**TINY["model"], "name": "builtin:tiny-dense"}
    dense_dir = load_model.__globals__["resolve_model_source"](
        spec_from_dict({**TINY, "model": dense}).model,
        __import__("gspo_cli.tasks", fromlist=["make_task"]).make_task(TINY["task"]["name"], TINY["task"]["params"]),
        log=lambda m: None,
    )
    with pytest.raises(SpecError, match=r"^model.lora.experts: true, but .* has no fused 3-D expert weights"):
        load_model(dense_dir, model_cfg(dense_dir, experts=True))
    with pytest.raises(SpecError, match=r"^model.lora.routers: lora, but .* has no MoE routers"):
        load_model(dense_dir, model_cfg(dense_dir, routers="lora"))


def test_param_line_and_compare_note():
    info = {
        "trainable": 1792,
        "total": 123456,
        "lora": {"r": 4, "alpha": 8.0, "targets": "all-linear", "experts": False, "routers": "frozen"},
    }
    info["lora"]["base_dtype"] = "bfloat16"
    assert param_line(info) == (
        "trains 1.79 k of 123 k parameters (1.5%): LoRA r=4 alpha=8 on all-linear, experts frozen, routers frozen; "
        "the base frozen in bfloat16"
    )
    full = {"trainable": 123456, "total": 123456}
    assert params_note([("full", full)]) is None  # no LoRA run: nothing to say
    assert params_note([("full", full), ("lora", info)]) == (
        f"Trained parameters: full trains all 123 k parameters; lora {param_line(info)}."
    )


# ------------------------------------------------------------------------------------ runs

RAW = {
    **TINY,
    "model": LORA,
    "arms": [TINY["arms"][1], TINY["arms"][4]],  # grpo_rr (R2 replay) and grpo_kl (KL to adapters off)
    "train": {"steps": 4, "checkpoint_every": 1, "eval_every": 2},
}


def strip(records):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in records]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    results = train_experiment(spec_from_dict({**RAW, "output_dir": str(out)}), reporter=quiet_reporter())
    assert [r.status for r in results] == ["completed", "completed"], [r.summary for r in results]
    return out


@pytest.mark.slow
def test_runs_train_and_checkpoint_adapters(reference_run, base_dir):
    base_params = sum(p.numel() for p in load_model(base_dir, ModelConfig(name=base_dir)).model.parameters())
    for arm in ("grpo_rr", "grpo_kl"):
        rd = RunDir(reference_run / f"e2e/{arm}/seed0")
        ckpt = rd.latest_checkpoint()
        files = {p.name for p in ckpt.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "lora_base.json", "config.json"} <= files
        assert not any(f.startswith("model") for f in files)  # the base is not copied
        assert json.loads((ckpt / "adapter_config.json").read_text())["r"] == 4
        params = rd.info()["params"]
        assert params["trainable"] == 1792 and params["total"] == base_params + 1792 > 10 * 1792
        assert params["lora"] == {
            "r": 4,
            "alpha": 8.0,
            "targets": "all-linear",
            "experts": False,
            "routers": "frozen",
            "base_dtype": "float32",
        }
        metrics = rd.metrics()
        assert len(metrics) == 4 and all(m["policy/grad_norm"] > 0 for m in metrics)
    res = CliRunner().invoke(app, ["compare", str(reference_run / "e2e")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "Trained parameters: " in text and "grpo_rr trains 1.79 k of " in text and "grpo_kl trains 1.79 k" in text
    kl = [m["policy/kl_ref_k3"] for m in RunDir(reference_run / "e2e/grpo_kl/seed0").metrics()]
    assert all(0 < k < 0.1 for k in kl)  # the adapters move the policy off its reference, a little


@pytest.mark.slow
def test_kill_9_then_resume_matches_uninterrupted(tmp_path, reference_run):
    raw = {**RAW, "arms": [RAW["arms"][1]], "output_dir": str(tmp_path / "out")}
    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    rd = RunDir(tmp_path / "out/e2e/grpo_kl/seed0")
    cmd = [sys.executable, "-m", "gspo_cli", "train", str(spec_file), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while rd.latest_checkpoint() is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    if rd.status() == "completed":
        pytest.skip("the run finished before the signal landed")
    assert rd.status() == "running"  # killed: nothing said it stopped
    rerun = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert rd.info()["resumes"] == 1
    assert strip(rd.metrics()) == strip(RunDir(reference_run / "e2e/grpo_kl/seed0").metrics())


@pytest.mark.slow
def test_resume_on_another_base_is_refused(tmp_path, reference_run):
    ckpt = RunDir(reference_run / "e2e/grpo_kl/seed0").latest_checkpoint()
    moved = tmp_path / "ckpt"
    import shutil

    shutil.copytree(ckpt, moved)
    record = json.loads((moved / "lora_base.json").read_text())
    (moved / "lora_base.json").write_text(json.dumps({**record, "digest": "sha256:0000"}))
    cfg = spec_from_dict(RAW).model
    with pytest.raises(SpecError, match=r"trained on another base model \(digest sha256:0000"):
        load_model(str(moved), cfg)


@pytest.mark.slow
def test_export_merged_and_adapter_round_trip(tmp_path, reference_run, base_dir):
    run = reference_run / "e2e/grpo_kl/seed0"
    spec = spec_from_dict({**RAW, "arms": [RAW["arms"][1]], "output_dir": str(reference_run)})
    ckpt = RunDir(run).latest_checkpoint()
    adapted = load_model(str(ckpt), spec.model)  # the trainer's view: base + adapters
    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    for out, extra in ((merged_dir, []), (adapter_dir, ["--adapter"])):
        res = CliRunner().invoke(app, ["export", str(run), "--out", str(out), *extra])
        assert res.exit_code == 0, res.output
    assert (merged_dir / "config.json").is_file() and not (merged_dir / "adapter_config.json").exists()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter_dir.iterdir()}
    merged = load_model(str(merged_dir), ModelConfig(name=str(merged_dir)), training=False).model
    batch = batch_for(adapted.tokenizer)
    with torch.no_grad():
        a = response_logprobs(adapted.model, batch).logp
        m = response_logprobs(merged, batch).logp
        base = response_logprobs(load_model(base_dir, ModelConfig(name=base_dir)).model, batch).logp
        models_in_float64(adapted.model)  # the floor: the adapted forward in float64
        floor = max_gap(a, response_logprobs(adapted.model, batch).logp)
    assert (a - base).abs().max() > 1e-4  # the adapters trained
    assert 0 < floor < 1e-5 and max_gap(a, m) <= 10 * floor, (max_gap(a, m), floor)
    # gspo eval on the run: the checkpoint loads as a model (adapters merged)
    res = CliRunner().invoke(app, ["eval", str(run), "--samples", "1", "--limit", "2", "-q"])
    assert res.exit_code == 0, res.output
    summary = json.loads((run / "eval_summary.json").read_text())
    assert summary["checkpoint"] == "step_000004" and summary["problems"] == 2


def test_setup_builds_a_kl_reference_without_a_copy(base_dir, tmp_path):
    from gspo_cli.tasks import make_task

    spec = spec_from_dict({**RAW, "output_dir": str(tmp_path)})
    task = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arm("grpo_kl"), 0, task, base_dir)
    assert isinstance(ctx.ref_model, lora.AdaptersOff) and ctx.ref_model.model is ctx.model
    # the optimizer holds the adapters only
    held = {id(p) for g in ctx.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for n, p in ctx.model.named_parameters() if ".lora_" in n}


@pytest.mark.slow
def test_features_train_with_adapters(tmp_path):
    """One step each: the loss zoo and a mismatch correction; bf16 with activation checkpointing,
    expert and router adapters, a faster router group and the load-balancing loss; trained routers
    (routers: full) with routing replay and a KL term."""
    arms = [
        {"name": "cispo", "preset": "cispo", "mini_batches": 2},
        {"name": "sapo", "preset": "sapo", "mini_batches": 2, "mismatch": {"mode": "token_tis"}},
        {"name": "gmpo_rr", "preset": "gmpo", "mini_batches": 2, "routing_replay": "r2"},
    ]
    variants = {
        "zoo": ({"lora": {"r": 4}}, {}, arms),
        "bf16": (
            {"dtype": "bfloat16", "router_aux_loss_coef": 0.01, "lora": {"r": 4, "experts": True, "routers": "lora"}},
            {"router_lr_scale": 4.0},
            [TINY["arms"][2]],
        ),
        "full": ({"lora": {"r": 4, "routers": "full"}}, {}, [{**TINY["arms"][1], "kl_coef": 0.1}]),
    }
    for key, (model, optimizer, arm_list) in variants.items():
        raw = {
            **TINY,
            "model": {**TINY["model"], **model},
            "optimizer": {"lr": 1e-3, **optimizer},
            "arms": arm_list,
            "train": {"steps": 1, "gradient_checkpointing": key == "bf16"},
            "output_dir": str(tmp_path / key),
        }
        results = train_experiment(spec_from_dict(raw), reporter=quiet_reporter())
        assert [r.status for r in results] == ["completed"] * len(arm_list), [r.summary for r in results]
        for r in results:
            (m,) = RunDir(r.path).metrics()
            assert m["policy/grad_norm"] > 0 and all(v == v for v in m.values() if isinstance(v, float))
            assert RunDir(r.path).info()["params"]["lora"]["routers"] == model["lora"].get("routers", "frozen")


@pytest.mark.parametrize(
    "lora_kw", [{}, {"experts": True, "routers": "lora"}, {"target_modules": ["q_proj", "o_proj"], "r": 3}]
)
def test_plan_counts_the_adapters_the_model_gets(base_dir, lora_kw):
    """gspo plan's adapter count (plan/lora.py, from config.json alone) equals the trainable
    parameters PEFT creates on the built-in MoE."""
    from pathlib import Path

    from gspo_cli.plan import lora as plan_lora
    from gspo_cli.plan.shapes import shape_from_config
    from gspo_cli.spec import LoraSpec

    spec = LoraSpec(**{"r": 4, **lora_kw})
    shape = shape_from_config(json.loads((Path(base_dir) / "config.json").read_text()))
    model = load_model(base_dir, ModelConfig(name=base_dir, lora=spec)).model
    assert plan_lora.adapter_params(shape, spec) == lora.trainable_count(model)[0]


@pytest.mark.slow
def test_the_quickstart_with_lora_trains_both_arms(tmp_path):
    """`gspo train experiments/quickstart.yaml --set model.lora.r=8`, at TINY's size and 2 steps."""
    from pathlib import Path

    quickstart = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
    small = [f"model.builtin.{k}={v}" for k, v in TINY["model"]["builtin"].items()]
    small += ["model.cold_start.steps=120", "model.cold_start.batch_size=32", "model.cold_start.lr=0.01"]
    small += ["train.steps=2", "train.eval_every=0", "task.eval_size=4", "rollout.prompts_per_step=4"]
    args = ["train", str(quickstart), "--set", "model.lora.r=8", "-o", str(tmp_path)]
    res = CliRunner().invoke(app, args + [x for s in small for x in ("--set", s)])
    assert res.exit_code == 0, res.output
    for arm in ("grpo", "gspo"):
        rd = RunDir(tmp_path / f"quickstart/{arm}/seed0")
        assert rd.status() == "completed" and len(rd.metrics()) == 2
        assert rd.info()["params"]["lora"]["r"] == 8
        assert f"[{arm}/seed0] trains " in res.output and "LoRA r=8 alpha=16 on all-linear" in res.output
        assert (rd.latest_checkpoint() / "adapter_model.safetensors").is_file()


def test_the_lora_example_is_the_quickstart_with_adapters():
    from pathlib import Path

    from gspo_cli.spec.loading import load_spec

    root = Path(__file__).resolve().parents[1] / "experiments"
    example, quickstart = load_spec(root / "lora_quickstart.yaml"), load_spec(root / "quickstart.yaml")
    assert (example.model.lora.r, example.model.lora.routers, example.model.lora.experts) == (8, "frozen", False)
    assert example.optimizer.lr == 10 * quickstart.optimizer.lr  # LoRA Without Regret's ~10x
    assert example.model.builtin == quickstart.model.builtin and example.task == quickstart.task
    assert [a.loss for a in example.arms] == [a.loss for a in quickstart.arms]


@pytest.mark.slow
def test_staleness_one_samples_with_the_trainers_adapters(tmp_path, monkeypatch, base_dir):
    """rollout.staleness 1: the worker (its own LoRA model) gets the trainer's adapters; step 2's
    batch, sampled with the weights before step 1's updates, has their log-probs."""
    import gspo_cli.train.staleness as stale_mod
    from gspo_cli.tasks import make_task
    from gspo_cli.train.staleness import StaleRollouts

    raw = {
        **RAW,
        "arms": [RAW["arms"][1]],
        "output_dir": str(tmp_path),
        "rollout": {**RAW["rollout"], "staleness": 1, "logprob_check_every": 1},
    }
    spec = spec_from_dict(raw)
    lora.check_spec(spec)  # allowed
    task = make_task(spec.task.name, spec.task.params)
    ctx = setup(spec, spec.arms[0], 0, task, base_dir)
    seen = []
    real_learn = stale_mod.learn

    def spy(ctx_, batch, scores, step, **kw):
        seen.append((batch, {k: v.clone() for k, v in lora.adapter_state(ctx_.model).items()}))
        return real_learn(ctx_, batch, scores, step, **kw)

    monkeypatch.setattr(stale_mod, "learn", spy)
    with StaleRollouts(ctx, source=base_dir, seed=0) as stale:
        m1 = stale.step(ctx, 1)
        m2 = stale.step(ctx, 2)
    assert (m1["rollout/staleness"], m2["rollout/staleness"]) == (0, 1)
    (_, w0), (batch, w1) = seen
    mask = batch.response_mask > 0

    def forward(adapters):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(ctx.model, {k.removeprefix(lora.PEFT_PREFIX): v for k, v in adapters.items()})
        with torch.no_grad():
            return response_logprobs(ctx.model, batch, spec.rollout.temperature).logp

    stale_logp, current_logp = forward(w0), forward(w1)
    # The worker samples with its own float32 model: the floor is the same forward in float64.
    models_in_float64(ctx.model)
    floor = max_gap(stale_logp[mask], forward(w0)[mask])
    gap = max_gap(batch.engine_logp[mask], stale_logp[mask])
    assert 0 < floor < 1e-5 and gap <= 10 * floor, (gap, floor)
    assert (batch.engine_logp - current_logp).abs()[mask].max().item() > 1e-4  # step 1's updates moved them


@pytest.mark.slow
def test_ddp_updates_the_adapters_like_one_process(tmp_path, base_dir):
    """Two DDP processes (torchrun, gloo) on halves of a fixed global batch give the adapters the
    one-process gradient and the same step metrics (tests/dist/update_check.py); with a KL term
    (the reference: adapters off) and activation checkpointing."""
    from pathlib import Path

    raw = {
        **TINY,
        "model": LORA,
        "output_dir": str(tmp_path / "out"),
        "train": {"steps": 1, "gradient_checkpointing": True},
        "rollout": {**TINY["rollout"], "prompts_per_step": 4, "group_size": 4},
        "arms": [{"name": "a", "preset": "paper-grpo", "mini_batches": 1, "kl_coef": 0.1, "clip_high": 0.2}],
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    script = Path(__file__).parent / "dist" / "update_check.py"
    runs = {}
    for world in (1, 2):
        launcher = (
            [sys.executable]
            if world == 1
            else [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        )
        out = tmp_path / f"{world}.pt"
        res = subprocess.run(launcher + [str(script), str(spec), base_dir, str(out)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[world] = torch.load(out)
    a, b = runs[1]["grads"], runs[2]["grads"]
    assert set(a) == set(b) and len(a) == 16 and all(".lora_" in k for k in a)  # the adapters alone
    scale = max(g.abs().max().item() for g in a.values())
    assert scale > 0 and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-10 * scale  # float64
    m1, m2 = runs[1]["metrics"], runs[2]["metrics"]
    assert m1["policy/kl_ref_k3"] == 0.0  # B = 0: before its first update the policy is its reference
    for key, v in m1.items():
        if not key.startswith(("time/", "perf/")):
            assert m2[key] == pytest.approx(v, rel=1e-9, abs=1e-12), key


def test_merged_parameters_are_the_merged_model(base_dir, tmp_path):
    """What the vLLM weight stream sends with LoRA (lora.merged_parameters: base names, adapters
    merged, trained routers in place) equals PEFT's own merge of the saved adapters, name for name."""
    cfg = model_cfg(base_dir, experts=True, routers="full")
    model = load_model(base_dir, cfg).model
    perturb(model)
    lora.save_adapters(model, tmp_path, base_dir)
    merged = dict(lora.merged_parameters(model))
    plain = load_model(str(tmp_path), cfg, training=False).model  # PEFT's merge_and_unload
    expected = dict(plain.named_parameters())
    assert set(merged) == set(expected)
    assert max((merged[k] - expected[k]).abs().max().item() for k in merged) < 1e-6
    moved = [k for k in merged if "experts" in k or "gate" in k or "q_proj" in k]
    base = dict(load_model(base_dir, ModelConfig(name=base_dir)).model.named_parameters())
    assert moved and all((merged[k] - base[k]).abs().max() > 1e-4 for k in moved)


def test_experts_kept_as_linear_layers_follow_the_experts_choice():
    """An architecture whose experts are nn.Linear modules (not fused 3-D tensors): all-linear
    leaves them to `experts` (false: frozen, true: adapted like any linear layer)."""
    from gspo_cli.spec import LoraSpec

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(4, 4)
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    model = torch.nn.Module()
    model.layer = Block()
    frozen = lora.peft_config(LoraSpec(r=2), model, "toy")
    adapted = lora.peft_config(LoraSpec(r=2, experts=True), model, "toy")
    assert sorted(frozen.target_modules) == ["layer.q_proj"]
    assert sorted(adapted.target_modules) == ["layer.experts.0", "layer.experts.1", "layer.q_proj"]
