"""Training runs whose rollouts come from the vLLM engine, end to end on the tiny MoE."""

import math

import pytest
from safetensors.torch import load_file
from vllm_tiny import TINY, tiny_spec

from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter


def _run(tmp_path, tiny_source, **rollout):
    spec = tiny_spec(output_dir=str(tmp_path), rollout={**TINY["rollout"], **rollout})
    (res,) = train_experiment(spec, reporter=quiet_reporter())
    return res, RunDir(res.path)


def test_training_samples_from_the_engine(tmp_path, tiny_source):
    res, rd = _run(tmp_path, tiny_source)
    assert res.status == "completed", rd.info()
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in m.values())
        # The engine samples from the trainer's weights of that step, update after update.
        assert m["rollout/logprob_diff_mean"] < 1e-5 and m["rollout/logprob_diff_max"] < 1e-4, m
    assert [e["step"] for e in rd.evals()] == [0, 2]  # evaluation goes through the engine too
    start = load_file(f"{tiny_source}/model.safetensors")
    end = load_file(rd.latest_checkpoint() / "model.safetensors")
    assert any(not (start[k] == end[k]).all() for k in start), "no parameter moved"


def test_engine_logprobs_as_pi_old(tmp_path, tiny_source):
    res, rd = _run(tmp_path, tiny_source, use_engine_logprobs=True)
    assert res.status == "completed", rd.info()
    for m in rd.metrics():
        assert math.isfinite(m["policy/loss"]) and m["rollout/logprob_diff_max"] < 1e-4


def test_routes_of_the_engine_are_not_available_on_cpu(tmp_path, tiny_source):
    """Why routing_replay r3 with vLLM is refused on CPU: vLLM 0.32 returns routed experts only
    from its Model Runner V2, which needs Triton (GPU). If this starts failing, vLLM gained R3
    on CPU. The refusal is one line, before any engine starts."""
    import vllm

    with pytest.raises(Exception, match="Model Runner V2"):
        vllm.LLM(model=tiny_source, skip_tokenizer_init=True, enforce_eager=True, enable_return_routed_experts=True)
    spec = tiny_spec(output_dir=str(tmp_path), arms=[{**TINY["arms"][0], "routing_replay": "r3"}])
    with pytest.raises(SpecError, match="^routing_replay: r3 with rollout.engine: vllm needs .* GPU model runner"):
        train_experiment(spec, reporter=quiet_reporter())


def test_same_seed_same_run(tmp_path, tiny_source):
    """The engine's sampler is seeded from the run's seed: a rerun reproduces every metric."""
    _, a = _run(tmp_path / "a", tiny_source)
    _, b = _run(tmp_path / "b", tiny_source)

    def strip(ms):
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in ms]

    assert strip(a.metrics()) == strip(b.metrics())
