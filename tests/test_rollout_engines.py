"""Choosing the rollout engine, and the parts of the vLLM engine that need no vLLM.

The vLLM engine itself is tested against a real vLLM in tests/vllm (`make test-vllm`)."""

import importlib.util
import re
from types import SimpleNamespace

import pytest
import torch

from gspo_cli.errors import SpecError
from gspo_cli.models.builtin import build_tokenizer
from gspo_cli.rollout import HFRolloutEngine, RolloutBatch, logprob_mismatch, make_engine
from gspo_cli.rollout.vllm_batch import to_batch
from gspo_cli.spec.loading import spec_from_dict

ARM = {"name": "a", "preset": "paper-gspo"}


def _spec(**rollout):
    return spec_from_dict({"name": "x", "arms": [ARM], "rollout": rollout})


def _vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm.sampling_params") is not None
    except ModuleNotFoundError:
        return False


def test_hf_is_the_default_engine():
    tok = build_tokenizer("0123456789")
    engine = make_engine(_spec().rollout, torch.nn.Linear(1, 1), tok, model_dir="unused")
    assert isinstance(engine, HFRolloutEngine)


@pytest.mark.skipif(_vllm_installed(), reason="vLLM is installed here")
def test_vllm_engine_without_vllm_says_how_to_install():
    with pytest.raises(SpecError, match=r"^rollout.engine: vllm is not installed .*pip install vllm"):
        make_engine(_spec(engine="vllm").rollout, None, None, model_dir="unused")


@pytest.mark.parametrize(
    "rollout, arm, message",
    [
        ({"use_engine_logprobs": True}, {}, "rollout.use_engine_logprobs: needs engine: vllm"),
        ({"vllm": {"gpu_memory_utilization": 0.3}}, {}, "rollout.vllm: engine arguments given but engine is not vllm"),
        ({"engine": "vllm", "vllm": {"seed": 3}}, {}, "rollout.vllm.seed: set by gspo-cli itself"),
        ({"engine": "vllm", "temperature": 2.5}, {}, "rollout.temperature: 2.5 is above 2"),
        ({"sampler_logprobs": False}, {"routing_replay": "r3"}, r"arms\[0\].routing_replay: r3 replays the routes"),
    ],
)
def test_engine_settings_are_checked_with_the_spec(rollout, arm, message):
    with pytest.raises(SpecError, match=message):
        spec_from_dict({"name": "x", "arms": [{**ARM, **arm}], "rollout": rollout})


def test_vllm_settings_are_accepted():
    r = _spec(engine="vllm", use_engine_logprobs=True, vllm={"gpu_memory_utilization": 0.3}).rollout
    assert r.engine == "vllm" and r.use_engine_logprobs and r.vllm == {"gpu_memory_utilization": 0.3}


def test_logprob_mismatch_over_response_tokens_only():
    engine = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]])
    trainer = torch.tensor([[-1.5, -2.0, 0.0], [-0.25, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    stats = logprob_mismatch(engine, trainer, mask)
    assert stats == {"rollout/logprob_diff_mean": pytest.approx(0.25), "rollout/logprob_diff_max": 0.5}
    assert logprob_mismatch(engine, trainer, torch.zeros(2, 3))["rollout/logprob_diff_max"] == 0.0


def _completion(tokens, logps):
    return SimpleNamespace(
        token_ids=tokens, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logps)]
    )


def test_vllm_outputs_become_the_hf_batch_layout():
    tok = build_tokenizer("0123456789+=?\n")
    tok.padding_side = "left"
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = ["1+2=?\n", "10+20=?\n"]
    ids = tok(prompts, add_special_tokens=False).input_ids
    three, four = tok.convert_tokens_to_ids(["3", "4"])
    outs = [_completion([three, eos], [-0.1, -0.2]), _completion([three, four, four], [-1.0, -2.0, -3.0])]
    batch = to_batch(ids, outs, tok, torch.device("cpu"), [eos])
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    P = batch.prompt_len
    assert P == enc.input_ids.shape[1] and torch.equal(batch.input_ids[:, :P], enc.input_ids)
    assert torch.equal(batch.attention_mask[:, :P], enc.attention_mask)
    assert batch.response_ids.tolist() == [[three, eos, pad], [three, four, four]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]  # up to and including EOS
    assert batch.attention_mask[:, P:].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.truncated.tolist() == [False, True]
    assert batch.completions == ["3", "344"]
    assert torch.allclose(batch.engine_logp, torch.tensor([[-0.1, -0.2, 0.0], [-1.0, -2.0, -3.0]]))
    sub = batch.rows(torch.tensor([1]))
    assert isinstance(sub, RolloutBatch) and torch.equal(sub.engine_logp, batch.engine_logp[1:])


# ----------------------------------------------------------------- rollout.vllm settings


@pytest.mark.parametrize(
    "vllm, problem",
    [
        ({"sleep": 3}, "vllm.sleep: 3 is not 0, 1 or 2"),
        ({"sleep": True}, "vllm.sleep: True is not 0, 1 or 2"),
        ({"gpu_memory_utilization": 1.5}, "vllm.gpu_memory_utilization: 1.5 is not a fraction in (0, 1]"),
        ({"tensor_parallel_size": 0}, "vllm.tensor_parallel_size: 0 is not a positive whole number"),
    ],
)
def test_bad_vllm_values_are_spec_errors(vllm, problem):
    with pytest.raises(SpecError, match=re.escape(problem)):
        _spec(engine="vllm", vllm=vllm)


def test_colocated_engine_arguments():
    """Our own keys never reach vllm.LLM; on GPU the engine takes 30% of the GPU unless told
    otherwise; sleep mode switches vLLM's on and is refused on CPU in one line."""
    from gspo_cli.rollout.vllm_settings import COLOCATED_GPU_MEMORY_UTILIZATION, engine_kwargs_for

    assert COLOCATED_GPU_MEMORY_UTILIZATION == 0.3
    assert engine_kwargs_for({"sleep": 1}, on_cpu=False) == (
        {"enable_sleep_mode": True, "gpu_memory_utilization": 0.3},
        1,
    )
    assert engine_kwargs_for({"gpu_memory_utilization": 0.5}, on_cpu=False) == ({"gpu_memory_utilization": 0.5}, 0)
    assert engine_kwargs_for({"max_num_seqs": 8}, on_cpu=True) == ({"max_num_seqs": 8}, 0)
    with pytest.raises(SpecError, match=r"^rollout.vllm.sleep: vLLM's sleep mode needs a GPU") as err:
        engine_kwargs_for({"sleep": 2}, on_cpu=True)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "tp, world, message",
    [
        (3, 2, "rollout.vllm.tensor_parallel_size: 3 does not divide the 2 processes into engine groups"),
        (4, 6, "rollout.vllm.tensor_parallel_size: 4 does not divide the 6 processes into engine groups"),
        (
            2,
            1,
            "rollout.vllm.tensor_parallel_size: 2 needs 2 processes (a colocated engine's shards run in the "
            "trainer's processes): launch with `torchrun --nproc-per-node 2 -m gspo_cli train ...`",
        ),
    ],
)
def test_tensor_parallel_sizes_are_refused_before_vllm_is_imported(tp, world, message):
    from gspo_cli.rollout.vllm_settings import check_vllm_settings

    with pytest.raises(SpecError, match=re.escape(message)) as err:
        check_vllm_settings({"tensor_parallel_size": tp}, r3=False, world_size=world)
    assert "\n" not in str(err.value)


def test_engine_groups_that_fit_are_external_launcher_settings():
    from types import SimpleNamespace

    from gspo_cli.rollout.vllm_settings import check_tensor_parallel_heads, external_launcher_kwargs

    assert external_launcher_kwargs({"tensor_parallel_size": 2}, world_size=4) == {
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": 2,
    }
    assert external_launcher_kwargs({}, world_size=3)["tensor_parallel_size"] == 1
    with pytest.raises(SpecError, match=r"^rollout.vllm.data_parallel_size: .* must be 1 \(got 2\)$"):
        external_launcher_kwargs({"data_parallel_size": 2}, world_size=4)
    check_tensor_parallel_heads(2, SimpleNamespace(num_attention_heads=4))
    with pytest.raises(SpecError, match=r"^rollout.vllm.tensor_parallel_size: 4 does not divide the model's 2 atten"):
        check_tensor_parallel_heads(4, SimpleNamespace(num_attention_heads=2))
