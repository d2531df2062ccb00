"""model.lora with the colocated vLLM engine: after every update the engine gets the merged weights
of the adapted model (models/lora.py merged_parameters, through the existing weight stream)."""

import math

import pytest
from safetensors.torch import load_file
from vllm_tiny import TINY, tiny_spec

from gspo_cli.runs import RunDir
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter

pytest.importorskip("peft", reason="model.lora needs the lora extra (peft)")


def test_lora_training_samples_from_the_merged_weights(tmp_path, tiny_source):
    """The engine's log-probs match the trainer's (adapted) forward, step after step: the
    merged weights reached it; the adapters moved; the checkpoint holds adapters only."""
    spec = tiny_spec(output_dir=str(tmp_path), model={**TINY["model"], "lora": {"r": 4, "experts": True}})
    (res,) = train_experiment(spec, reporter=quiet_reporter())
    rd = RunDir(res.path)
    assert res.status == "completed", rd.info()
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in m.values())
        assert m["rollout/logprob_diff_mean"] < 1e-5 and m["rollout/logprob_diff_max"] < 1e-4, m
    adapters = load_file(rd.latest_checkpoint() / "adapter_model.safetensors")
    lora_b = [v for k, v in adapters.items() if "lora_B" in k]
    assert lora_b and any(v.abs().max() > 0 for v in lora_b), "no adapter moved (B starts at 0)"
    assert not (rd.latest_checkpoint() / "model.safetensors").exists()
