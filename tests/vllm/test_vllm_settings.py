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
