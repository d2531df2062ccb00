"""vLLM sleep mode around an update (rollout.vllm.sleep), on a stand-in for vllm.LLM that
records its calls: vLLM's sleep mode needs a GPU, the order of calls does not. After sampling
the engine sleeps; before the next sampling it wakes its weights, syncs them if the trainer's
changed, and only then wakes its KV cache, so the gathered weights never sit beside a KV cache
that is already back. Level 2 drops the engine's weights, so the next wake always re-syncs."""

import pytest
import torch

from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine
from gspo_cli.rollout.vllm_weights import weights_version


class RecordingLLM:
    def __init__(self, calls):
        self.calls = calls

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake", tuple(tags)))


def _engine(level: int):
    """A VLLMRolloutEngine with its vllm.LLM replaced, synced to a one-layer model."""
    calls: list = []
    eng = object.__new__(VLLMRolloutEngine)  # no vllm.LLM: the sleep logic alone
    eng.model = torch.nn.Linear(2, 2)
    eng.llm = RecordingLLM(calls)
    eng.sleep_level, eng.asleep = level, False
    eng._synced = weights_version(eng.model)
    eng.sync_weights = lambda model=None: (calls.append(("sync",)), setattr(eng, "_synced", weights_version(eng.model)))
    return eng, calls


def _step(eng):
    """What the trainer does to the engine in one step: sample (sync first), sleep, update."""
    eng.sync_if_stale()
    eng.sleep()
    with torch.no_grad():
        eng.model.weight.add_(1.0)  # the optimizer step: an in-place write


def test_level_1_wakes_weights_then_syncs_then_wakes_the_kv_cache():
    eng, calls = _engine(1)
    _step(eng)
    assert calls == [("sleep", 1)]  # first sampling: weights already in sync
    calls.clear()
    assert eng.sync_if_stale() is True
    assert calls == [("wake", ("weights",)), ("sync",), ("wake", ("kv_cache",))]
    assert not eng.asleep
    calls.clear()
    assert eng.sync_if_stale() is False  # awake and in sync: nothing to do
    assert calls == []


def test_level_1_with_unchanged_weights_wakes_without_a_sync():
    eng, calls = _engine(1)
    eng.sleep()
    eng.sync_if_stale()
    assert calls == [("sleep", 1), ("wake", ("weights",)), ("wake", ("kv_cache",))]


def test_level_2_resyncs_even_when_the_trainer_did_not_change():
    eng, calls = _engine(2)
    eng.sleep()
    assert eng._synced is None
    assert eng.sync_if_stale() is True
    assert calls == [("sleep", 2), ("wake", ("weights",)), ("sync",), ("wake", ("kv_cache",))]


@pytest.mark.parametrize("level", [1, 2])
def test_sleeping_twice_is_one_sleep(level):
    eng, calls = _engine(level)
    eng.sleep()
    eng.sleep()
    assert calls == [("sleep", level)]


def test_without_sleep_mode_nothing_sleeps_or_wakes():
    eng, calls = _engine(0)
    _step(eng)
    assert eng.sync_if_stale() is True
    assert calls == [("sync",)]
