"""The paper's ratio diagnostic (token log-ratio variance by response length and by
mini-batch), its exact reduction across processes, its profile figure, and the routers'
learning-rate scale."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from helpers import TINY, tiny_model_dir

from gspo_cli.analysis.figures.plot import build_plot, make_figures
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.distributed import DistInfo
from gspo_cli.errors import SpecError
from gspo_cli.metrics import describe
from gspo_cli.train.stats import StepStats, _combine, logvar_length_key, record_logratio_var


def test_length_buckets():
    keys = [logvar_length_key(n) for n in (1, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 999)]
    assert keys == [
        "ratio/logvar_len_1_16",
        "ratio/logvar_len_1_16",
        "ratio/logvar_len_17_32",
        "ratio/logvar_len_17_32",
        "ratio/logvar_len_33_64",
        "ratio/logvar_len_33_64",
        "ratio/logvar_len_65_128",
        "ratio/logvar_len_65_128",
        "ratio/logvar_len_129_256",
        "ratio/logvar_len_129_256",
        "ratio/logvar_len_257_inf",
        "ratio/logvar_len_257_inf",
    ]
    assert describe("ratio/logvar_len_33_64")[1] == "nats^2" and "33-64" in describe("ratio/logvar_len_33_64")[0]
    assert "mini-batch 2" in describe("ratio/logvar_mb2")[0]


def test_record_by_minibatch_and_length_hand_computed():
    # Row 0: 2 response tokens, log-ratios 0.1, 0.3; row 1: 1 token, 0.2; row 2: 20 tokens, all 0.5.
    new = torch.zeros(3, 20)
    new[0, :2] = torch.tensor([0.1, 0.3])
    new[1, 0] = 0.2
    new[2, :] = 0.5
    old = torch.zeros(3, 20)
    mask = torch.zeros(3, 20)
    mask[0, :2], mask[1, 0], mask[2, :] = 1, 1, 1
    new[1, 5] = 9.0  # outside the mask: ignored
    s = StepStats()
    record_logratio_var(s, new, old, mask, minibatch=3)
    out = s.reduce(DistInfo())
    # Mini-batch 3: 23 tokens, 0.1, 0.3, 0.2 and twenty 0.5.
    vals = np.array([0.1, 0.3, 0.2] + [0.5] * 20)
    assert out["ratio/logvar_mb3"] == pytest.approx(vals.var(), rel=1e-6)
    assert out["ratio/logvar_len_1_16"] == pytest.approx(np.var([0.1, 0.3, 0.2]), rel=1e-6)  # = 0.00667
    assert out["ratio/logvar_len_17_32"] == pytest.approx(0.0, abs=1e-12)
    assert set(out) == {"ratio/logvar_mb3", "ratio/logvar_len_1_16", "ratio/logvar_len_17_32"}


def test_variance_parts_add_up_across_ranks():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 0.1, 50), rng.normal(0.3, 0.2, 7)
    r0, r1 = StepStats(), StepStats()
    r0.var("k", a.tolist()[:20])
    r0.var("k", torch.tensor(a[20:]))  # two mini-batches on one rank
    r1.var("k", b.tolist())
    got = _combine([r0.parts["k"], r1.parts["k"]])
    assert got == pytest.approx(np.concatenate([a, b]).var(), rel=1e-9)
    assert _combine([("var", 0, 0.0, 0.0)]) is None


def _write_run(root, arm, seed, rows):
    d = root / "exp" / arm / f"seed{seed}"
    d.mkdir(parents=True)
    spec = {"name": "exp", "rollout": {"prompts_per_step": 2, "group_size": 2}, "arms": [{"name": arm}]}
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text("")
    (d / "run.json").write_text(json.dumps({"status": "completed", "experiment": "exp", "arm": arm, "seed": seed}))


def test_profile_figures_are_seed_means_of_step_means(tmp_path):
    # grpo seeds 0/1: the 17-32 bucket's variance is 2e-3 / 4e-3 at step 1 and twice that at
    # step 2 -> run means 3e-3 / 6e-3 -> plotted 4.5e-3; the 1-16 bucket 1e-3 throughout.
    for seed, base in ((0, 2e-3), (1, 4e-3)):
        rows = [
            {"step": st, "reward/mean": 0.1, "ratio/logvar_len_1_16": 1e-3, "ratio/logvar_len_17_32": base * st}
            | {"ratio/logvar_mb0": 1e-9, "ratio/logvar_mb1": base * st}
            for st in (1, 2)
        ]
        _write_run(tmp_path, "grpo", seed, rows)
    groups = group_runs(load_runs([str(tmp_path / "exp")]), "arm")
    plot = build_plot(groups, ["logvar_length", "logvar_minibatch"])
    assert [p.name for p in plot.panels] == ["logvar_length", "logvar_minibatch"]
    figs = make_figures(plot)
    ax = figs["logvar_length"].axes[0]
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), [1e-3, 4.5e-3], rtol=1e-9)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1-16", "17-32"]
    assert ax.get_yscale() == "log"
    mb = figs["logvar_minibatch"].axes[0].get_lines()[0]
    np.testing.assert_allclose(mb.get_ydata(), [1e-9, 4.5e-3], rtol=1e-9)
    # Runs that do not log the family: the figure is skipped, not drawn empty.
    _write_run(tmp_path / "old", "gspo", 0, [{"step": 1, "reward/mean": 0.2}])
    old = build_plot(group_runs(load_runs([str(tmp_path / "old" / "exp")]), "arm"), ["reward", "logvar_length"])
    assert [p.name for p in old.panels] == ["reward"] and old.skipped == ["logvar_length"]
    with pytest.raises(SpecError, match="unknown figure 'logvar'"):
        build_plot(groups, ["logvar"])


@pytest.fixture(scope="module")
def tiny_moe():
    from gspo_cli.models import load_model
    from gspo_cli.models.routing import RoutingController
    from gspo_cli.spec import ModelConfig

    lm = load_model(str(tiny_model_dir()), ModelConfig(**{**TINY["model"], "name": "builtin:tiny-moe"}))
    return lm.model, RoutingController(lm.model)


def test_router_lr_scale_moves_routers_that_much_faster(tiny_moe):
    from gspo_cli.train.optim import param_groups as _param_groups

    model, routing = tiny_moe
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    groups = _param_groups(model, routing, 1e-3, 10.0, "tiny")
    assert [g.get("lr") for g in groups] == [None, pytest.approx(1e-2)]
    router_names = {n for n, p in model.named_parameters() if any(p is q for q in groups[1]["params"])}
    assert router_names and all(n.endswith("mlp.gate.weight") for n in router_names)
    assert len(router_names) == TINY["model"]["builtin"]["num_layers"]
    opt = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.0)
    ids = torch.randint(4, 20, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # Adam's first step moves every weight with a gradient by ~lr
    try:
        for name, p in model.named_parameters():
            step = (p.detach() - before[name]).abs().max().item()
            if name in router_names:
                assert step == pytest.approx(1e-2, rel=1e-3)
            elif "embed" in name or "norm" in name:
                assert step <= 1e-3 * 1.001
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(before[name])
    assert _param_groups(model, routing, 1e-3, 1.0, "tiny") == [{"params": list(model.parameters())}]
    with pytest.raises(SpecError, match="router_lr_scale: 10.0 needs an MoE model; dense-x has no routers"):
        _param_groups(model, None, 1e-3, 10.0, "dense-x")
