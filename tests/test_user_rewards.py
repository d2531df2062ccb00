"""task.rewards: reward functions from the user's code, called with TRL's convention, and the
`prompts` task (issue 39)."""

from __future__ import annotations

import pytest

from gspo_cli.errors import SpecError
from gspo_cli.spec import RewardConfig
from gspo_cli.spec.loading import spec_from_dict


def test_spec_refuses_bad_reward_lists_at_load():
    def problems(rewards):
        with pytest.raises(SpecError) as err:
            spec_from_dict({"name": "x", "task": {"name": "prompts", "rewards": rewards}, "arms": [{"name": "a"}]})
        return str(err.value)

    assert "task.rewards[1].name: duplicate name 'f' (also rewards[0])" in problems(
        [{"function": "a.py:f"}, {"function": "b:f"}]
    )
    assert "task.rewards[1].correct: only one reward decides correctness" in problems(
        [{"function": "a:x", "correct": True}, {"function": "a:y", "correct": True}]
    )
    for reserved in ("mean", "std", "format", "correct", "no_reward_frac"):
        assert f"task.rewards[0].name: {reserved!r} is a metric gspo logs already" in problems(
            [{"function": f"m:{reserved}"}]
        )
    assert "task.rewards[0].name: 'a/b' cannot name a metric" in problems([{"function": "m:x", "name": "a/b"}])
    assert "task.rewards[0].nme: unknown key (did you mean 'name'?)" in problems([{"function": "m:x", "nme": "z"}])


def test_a_reward_file_is_stored_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = RewardConfig(function="sub/rewards.py:f")
    assert cfg.function == f"{tmp_path}/sub/rewards.py:f" and cfg.label == "f"
    assert RewardConfig(function="pkg.mod:g").function == "pkg.mod:g"
