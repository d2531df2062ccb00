"""task.rewards[].model: a sequence-classification reward model, on tiny
random models built from a config (nothing downloads)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import free_port
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.models.builtin import build_tokenizer
from gspo_cli.rewards import model as rm_mod
from gspo_cli.rewards import with_rewards
from gspo_cli.rewards.model import RewardModel, gathered_scores, scoring_alone
from gspo_cli.runs import RunDir
from gspo_cli.spec import RewardConfig
from gspo_cli.spec.task import RewardModelConfig
from gspo_cli.tasks import make_task

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
ROWS = [
    {"prompt": "What is 2+2?", "answer": "4", "solution": "4"},
    {"prompt": "Name a colour.", "answer": "red", "solution": "red"},
    {"prompt": "Say hi.", "answer": "hi", "solution": "hi"},
]


def build_rm(path, *, template=None, pad=True, num_labels=1, causal=False, seed=0):
    """A tiny random Qwen2 sequence classifier (or causal LM) with a character tokenizer in `path`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    tok = build_tokenizer("<>")
    if not pad:
        tok.pad_token = None
    if template:
        tok.chat_template = template
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=num_labels,
        pad_token_id=tok.pad_token_id if pad else None,
    )
    torch.manual_seed(seed)
    model = (Qwen2ForCausalLM if causal else Qwen2ForSequenceClassification)(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _fresh_cache():
    rm_mod._LOADED.clear()
    yield
    rm_mod._LOADED.clear()


def hand_score(path, text: str, label: int = 0, dtype=torch.float64) -> float:
    """A forward of the saved model on `text` alone (no padding), its logit `label`, in float64
    unless told otherwise: scores of padded batches are compared with it, to 1e-10 where they are
    computed in float64 too (`reward`), else within 10x `float32_floor`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).eval()
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return float(model(input_ids=ids).logits[0, label])


def float32_floor(path) -> float:
    """float32's rounding of the saved model's scores: the largest gap between its float32 and
    float64 scores of a few texts (scores a spec builds, which has no float64, are within 10x it)."""
    texts = ["What is 2+2? 4", "Hi hello there", "A much longer prompt than the others, with words. ok", "x a b c"]
    floor = max(abs(hand_score(path, t, dtype=torch.float32) - hand_score(path, t)) for t in texts)
    assert 0 < floor < 1e-5, floor
    return floor


def reward(path, **kw) -> RewardModel:
    """As training builds it: told the policy's device and dtype (float64 here, which a spec
    cannot ask for: batched scores then equal `hand_score` to 1e-10, on any CPU)."""
    return RewardModel(RewardModelConfig(path=str(path), **kw), "task.rewards[0].model.path", "cpu", "float64")


def test_scores_are_a_plain_forward_and_batching_changes_nothing(tmp_path):
    path = build_rm(tmp_path / "rm")
    prompts = ["What is 2+2?", "Hi", "A much longer prompt than the others, with words.", "x"]
    completions = [" 4", " hello there", " ok", " a b c d e f"]
    one = reward(path, batch_size=1)(prompts=prompts, completions=completions)
    four = reward(path, batch_size=4)(prompts=prompts, completions=completions)
    hand = [hand_score(path, p + c) for p, c in zip(prompts, completions)]
    assert one == pytest.approx(hand, abs=1e-10) and four == pytest.approx(hand, abs=1e-10)
    assert len(set(round(v, 4) for v in hand)) == 4  # a random head: the rows are told apart


def test_without_a_pad_token_one_is_set_for_tokenizer_and_head(tmp_path):
    path = build_rm(tmp_path / "rm", pad=False)
    r = reward(path, batch_size=3)
    assert r.model.config.pad_token_id == r.tokenizer.eos_token_id
    got = r(prompts=["ab", "abcdef", "a"], completions=["c", "g", "b"])
    assert got == pytest.approx([hand_score(path, t) for t in ["abc", "abcdefg", "ab"]], abs=1e-10)


def test_a_chat_template_renders_prompt_and_completion_as_messages(tmp_path):
    path = build_rm(tmp_path / "rm", template=TEMPLATE)
    r = reward(path)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert r.texts(["2+2?", chat], [" 4", [{"role": "assistant", "content": "4"}]]) == [
        "<user>2+2?<assistant> 4",
        "<system>Be brief.<user>2+2?<assistant>4",
    ]
    got = r(prompts=["2+2?"], completions=["4"])
    assert got == pytest.approx([hand_score(path, "<user>2+2?<assistant>4")], abs=1e-10)
    # without a template: the texts joined, a message list by its contents
    plain = reward(build_rm(tmp_path / "plain"))
    assert plain.texts(["2+2?", chat], [" 4", [{"role": "assistant", "content": "4"}]]) == ["2+2? 4", "Be brief.2+2?4"]


def test_truncation_keeps_the_last_max_length_tokens(tmp_path):
    path = build_rm(tmp_path / "rm")
    r = reward(path, max_length=5)
    assert r.encode(["abcdefgh"]) == [r.tokenizer("defgh", add_special_tokens=False)["input_ids"]]
    assert r(prompts=["abc"], completions=["defgh"]) == pytest.approx([hand_score(path, "defgh")], abs=1e-10)


def test_several_labels_score_by_the_first(tmp_path):
    path = build_rm(tmp_path / "rm", num_labels=3)
    assert reward(path)(prompts=["ab"], completions=["c"]) == pytest.approx([hand_score(path, "abc", 0)], abs=1e-10)
    assert hand_score(path, "abc", 0) != pytest.approx(hand_score(path, "abc", 1))


def test_a_missing_path_or_a_causal_lm_is_refused_in_one_line(tmp_path):
    with pytest.raises(SpecError) as err:
        reward(tmp_path / "nowhere")
    assert str(err.value) == f"task.rewards[0].model.path: no such directory {tmp_path / 'nowhere'}"
    lm = build_rm(tmp_path / "lm", causal=True)
    cfg = [RewardConfig(model=str(lm))]
    with pytest.raises(SpecError) as err:
        with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), cfg)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"task.rewards[0].model.path: {lm} is not a sequence-classification")
    assert "(config.json: Qwen2ForCausalLM)" in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="has no config.json"):
        reward(tmp_path / "empty")


def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_a_reward_model_scores_a_prompts_task_with_its_weight_and_digest(tmp_path):
    path = build_rm(tmp_path / "rm")
    cfg = [RewardConfig(model={"path": str(path), "batch_size": 2}, weight=2.0, name="rm")]
    task = with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), cfg)
    # built without the policy's device (a sweep's identity check): loaded only when it scores
    assert task.rewards[0].call.model is None and not rm_mod._LOADED
    problems = task.eval_problems(3)
    scores = task.score_rollout(problems, ["4", "red", "hi"])
    hand = [hand_score(path, p.prompt + c) for p, c in zip(problems, ["4", "red", "hi"])]
    bound = 10 * float32_floor(path)  # the spec's float32
    assert [s.components["rm"] for s in scores] == pytest.approx(hand, abs=bound)
    assert [s.reward for s in scores] == pytest.approx([2 * h for h in hand], abs=2 * bound)
    assert list(rm_mod._LOADED) == [(str(path.resolve()), "cpu", "float32")]
    from gspo_cli.rewards import file_fingerprints

    digest = file_fingerprints(task.rewards)[str(path.resolve())]
    assert digest.startswith("dir:") and len(digest) == 20
    # the same rewards built again (an evaluation set's task) share the loaded copy
    again = with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), cfg)
    assert again.rewards[0].call.model is task.rewards[0].call.model and len(rm_mod._LOADED) == 1


def test_device_and_dtype_default_to_the_policys(tmp_path):
    from gspo_cli.spec.model import ModelConfig

    path = build_rm(tmp_path / "rm")
    cfg = [RewardConfig(model=str(path))]
    task = with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), cfg, ModelConfig(dtype="bfloat16"))
    assert next(task.rewards[0].call.model.parameters()).dtype == torch.bfloat16
    # an evaluation set's task, built without the model config, shares that copy
    again = with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), cfg)
    assert again.rewards[0].call.model is task.rewards[0].call.model
    own = [RewardConfig(model={"path": str(path), "dtype": "float32"})]
    mine = with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), own, ModelConfig(dtype="bfloat16"))
    assert next(mine.rewards[0].call.model.parameters()).dtype == torch.float32


class FakeDist:
    """torch.distributed's gather_object / scatter_object_list across `world` ranks run in turn:
    each rank's call is recorded, rank 0's (the last) completes the exchange."""

    def __init__(self, world):
        self.world, self.rank, self.sent, self.out = world, 0, {}, None

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world

    def gather_object(self, obj, gathered, dst=0):
        self.sent[self.rank] = obj
        if self.rank == dst:
            gathered[:] = [self.sent[r] for r in range(self.world)]

    def scatter_object_list(self, box, parts, src=0):
        if self.rank == src:
            self.out = parts
        box[0] = self.out[self.rank] if self.out is not None else None


def test_rank0_placement_gathers_scores_once_and_scatters_back():
    calls = []

    def score(prompts, completions):
        calls.append(list(prompts))
        return [float(len(p) + len(c)) for p, c in zip(prompts, completions)]

    fake = FakeDist(3)
    rows = {1: (["a", "bb"], ["x", "y"]), 2: (["ccc", "d"], ["z", "ww"]), 0: (["e", "f"], ["", "vvv"])}
    for rank in (1, 2, 0):  # the others reach the gather first; rank 0 scores when its own rows arrive
        fake.rank = rank
        got = gathered_scores(score, *rows[rank], fake)
    assert calls == [["e", "f", "a", "bb", "ccc", "d"]]  # one call, in rank order
    assert got == [1.0, 4.0]
    assert fake.out == [[1.0, 4.0], [2.0, 3.0], [4.0, 3.0]]  # each rank's own rows' scores

    def boom(prompts, completions):
        raise ValueError("out of memory\nmore")

    fake.rank = 0
    assert gathered_scores(boom, ["a"], ["b"], FakeDist(1)) == "on rank 0: ValueError: out of memory"


def test_rank0_placement_off_rank_0_loads_nothing_and_evaluates_to_none(tmp_path, monkeypatch):
    path = build_rm(tmp_path / "rm")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    off = reward(path, placement="rank0")
    assert off.model is None and not rm_mod._LOADED
    with scoring_alone():
        assert off(prompts=["a"], completions=["b"]) == [None]
    every = reward(path, placement="every_rank")
    assert every.model is not None


def test_gspo_train_never_trains_the_reward_model(tmp_path):
    path = build_rm(tmp_path / "rm", seed=3)
    from safetensors.torch import load_file

    weights = load_file(str(path / "model.safetensors"))
    spec = {
        "name": "rm",
        "model": {"name": "builtin:tiny-dense", "cold_start": {"steps": 0}},
        "task": {
            "name": "prompts",
            "params": {"source": str(data_file(tmp_path))},
            "eval_size": 1,
            "rewards": [{"model": str(path), "name": "rm"}],
        },
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "train": {"steps": 2, "eval_every": 0, "checkpoint_every": 0},
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(tmp_path / "rm.yaml"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    rd = RunDir(tmp_path / "out/rm/gspo/seed0")
    assert rd.status() == "completed" and len(rd.metrics()) == 2
    assert all("reward/rm" in m for m in rd.metrics())
    model = next(iter(rm_mod._LOADED.values()))[0]
    assert not model.training and all(not p.requires_grad and p.grad is None for p in model.parameters())
    for name, p in model.state_dict().items():
        assert torch.equal(p, weights[name]), name
    assert str(path.resolve()) in rd.info()["identity"]["rewards"]


def test_gspo_plan_counts_the_reward_models_weights_where_they_are_held(tmp_path):
    from gspo_cli.plan import Hardware, model_shape, plan_memory
    from gspo_cli.spec.loading import spec_from_dict

    path = build_rm(tmp_path / "rm")
    params = sum(p.numel() for p in reward(path).model.parameters())
    base = {
        "name": "p",
        "model": {"name": "builtin:tiny-dense"},
        "task": {"name": "prompts", "params": {"source": str(data_file(tmp_path))}, "eval_size": 1},
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }

    def plan(placement="every_rank", dtype=None, gpus=1):
        rewards = [{"model": {"path": str(path), "placement": placement, "dtype": dtype, "batch_size": 2}}]
        spec = spec_from_dict({**base, "task": {**base["task"], "rewards": rewards}})
        return plan_memory(model_shape(spec)[0], spec, Hardware(gpus_per_node=gpus), prompt_tokens=16)

    without = spec_from_dict({**base, "task": {**base["task"], "rewards": [{"function": "math_accuracy"}]}})
    bare = plan_memory(model_shape(without)[0], without, Hardware(), prompt_tokens=16)
    got = plan()
    for before, after in zip(bare.phases, got.phases):
        terms = dict(after.device)
        assert terms["reward model reward_model (every_rank)"] == 4 * params  # float32, model.dtype's
        extra = terms.get("reward model reward_model (every_rank): forward of one batch", 0)
        assert (extra > 0) == (after.name == "rollout")
        assert after.device_total - before.device_total == 4 * params + extra
    assert dict(plan(dtype="bfloat16").phases[0].device)["reward model reward_model (every_rank)"] == 2 * params
    # two processes on the host: every rank holds a copy, rank0 placement one
    host = {p: dict(plan(p, gpus=2).phases[0].host) for p in ("every_rank", "rank0")}
    assert host["every_rank"]["reward model reward_model (every_rank) (2 processes)"] == 2 * 4 * params
    assert host["rank0"]["reward model reward_model (rank0) (1 process)"] == 4 * params
    # gspo plan itself: the term in its JSON, the reward model's size in words
    spec = {**base, "task": {**base["task"], "rewards": [{"model": str(path), "name": "rm"}]}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "p.yaml"), "--json", "--prompt-tokens", "16"])
    assert res.exit_code == 0, res.output
    load = json.loads(res.output)["layouts"]["sharded"]["phases"][0]
    assert load["device_terms"]["reward model rm (every_rank)"] == 4 * params


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port"]
SCORE_SCRIPT = """
import json, sys
from gspo_cli import distributed
from gspo_cli.spec.task import RewardModelConfig
from gspo_cli.rewards.model import RewardModel, scoring_alone

info = distributed.setup("cpu")
path, out = sys.argv[1], sys.argv[2]
rows = {0: (["a", "bb"], ["x", "y"]), 1: (["ccccccccc", "d"], ["z", "ww"])}[info.rank]
res = {}
for placement in ("every_rank", "rank0"):
    r = RewardModel(RewardModelConfig(path=path, placement=placement, batch_size=3), "w")
    res[placement] = {"scores": r(prompts=rows[0], completions=rows[1]), "holds": r.model is not None}
with scoring_alone():
    res["alone"] = r(prompts=rows[0], completions=rows[1])
with open(f"{out}.{info.rank}.json", "w") as fh:
    json.dump(res, fh)
"""


@pytest.mark.slow
def test_two_processes_score_their_own_rows_with_either_placement(tmp_path):
    path = build_rm(tmp_path / "rm")
    (tmp_path / "score.py").write_text(SCORE_SCRIPT)
    cmd = TORCHRUN + [str(free_port()), str(tmp_path / "score.py"), str(path), str(tmp_path / "res")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"res.{rank}.json").read_text()) for rank in (0, 1)]
    texts = [["ax", "bby"], ["cccccccccz", "dww"]]
    bound = 10 * float32_floor(path)  # the processes score in float32
    for rank in (0, 1):
        hand = [hand_score(path, t) for t in texts[rank]]
        assert res[rank]["every_rank"] == {"scores": pytest.approx(hand, abs=bound), "holds": True}
        assert res[rank]["rank0"] == {"scores": pytest.approx(hand, abs=bound), "holds": rank == 0}
    # evaluating alone: rank 0 scores its rows, a rank without the model gives no verdict
    assert res[0]["alone"] == pytest.approx(res[0]["rank0"]["scores"], abs=1e-6) and res[1]["alone"] == [None, None]


@pytest.mark.slow
def test_torchrun_trains_with_a_reward_model_on_rank_0(tmp_path):
    path = build_rm(tmp_path / "rm", seed=5)
    spec = {
        "name": "rm",
        "model": {"name": "builtin:tiny-dense", "cold_start": {"steps": 0}},
        "task": {
            "name": "prompts",
            "params": {"source": str(data_file(tmp_path))},
            "eval_size": 1,
            "rewards": [{"model": {"path": str(path), "placement": "rank0"}, "name": "rm"}],
        },
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "train": {"steps": 2, "checkpoint_every": 0},
        "output_dir": str(tmp_path / "out"),
        "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 1}],
    }
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump(spec))
    cmd = TORCHRUN + [str(free_port()), "-m", "gspo_cli", "train", str(tmp_path / "rm.yaml"), "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rd = RunDir(tmp_path / "out/rm/gspo/seed0")
    assert rd.status() == "completed" and [m["step"] for m in rd.metrics()] == [1, 2]
    assert all(math.isfinite(m["reward/rm"]) for m in rd.metrics())
    assert all(m["reward/no_reward_frac"] == 0 for m in rd.metrics())  # rank 1's rows were scored on rank 0
    assert "reward_rm" in rd.evals()[-1]["scores"]  # rank 0 evaluated alone with its copy


def test_rank0_scoring_that_fails_is_one_line_on_every_rank_with_one_exchange(tmp_path, monkeypatch):
    import torch.distributed as dist

    from gspo_cli.errors import RunError

    exchanges = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(
        dist, "gather_object", lambda obj, out, dst=0: exchanges.append(obj) or out.__setitem__(slice(None), [obj, obj])
    )
    monkeypatch.setattr(dist, "scatter_object_list", lambda box, parts, src=0: box.__setitem__(0, parts[0]))
    cfg = [RewardConfig(model={"path": str(build_rm(tmp_path / "rm")), "placement": "rank0"}, name="rm")]
    task = with_rewards(make_task("prompts", {"source": str(data_file(tmp_path))}), cfg)
    problems = task.eval_problems(2)
    # both ranks' rows (here: this one's, twice) scored in one call on rank 0, the first half back
    scores = task.score_rollout(problems, ["4", "red"])
    assert len(exchanges) == 1 and [s.components["rm"] for s in scores] == pytest.approx(
        [hand_score(tmp_path / "rm", p.prompt + c) for p, c in zip(problems, ["4", "red"])],
        abs=10 * float32_floor(tmp_path / "rm"),  # the spec's float32
    )

    def boom(ids):
        raise ValueError("CUDA out of memory\ndetails")

    monkeypatch.setattr(task.rewards[0].call, "score_ids", boom)
    with pytest.raises(RunError) as err:
        task.score_rollout(problems, ["4", "red"])
    assert str(err.value) == (
        "reward rm raised on the row whose prompt starts 'What is 2+2?': RuntimeError: on rank 0: ValueError: CUDA "
        "out of memory"
    )
    assert len(exchanges) == 2  # finding the failing row exchanges nothing more: no rank waits on another


def test_gspo_train_refuses_a_causal_lm_reward_before_any_model_is_built(tmp_path):
    lm = build_rm(tmp_path / "lm", causal=True)
    spec = {
        "name": "rm",
        "model": {"name": "builtin:tiny-dense"},
        "task": {
            "name": "prompts",
            "params": {"source": str(data_file(tmp_path))},
            "eval_size": 1,
            "rewards": [{"model": str(lm)}],
        },
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(tmp_path / "rm.yaml"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert (
        f"task.rewards[0].model.path: {lm} is not a sequence-classification model (config.json: Qwen2ForCausalLM)"
        in out
    )
    assert "cold start" not in out and "Traceback" not in out and not (tmp_path / "out").exists()


HUB_RM = """
import sys, time
from gspo_cli.errors import SpecError
from gspo_cli.spec.task import RewardModelConfig
from gspo_cli.rewards.model import RewardModel
t = time.time()
try:
    RewardModel(RewardModelConfig(path="some-org/not-cached-rm"), "task.rewards[0].model.path", "cpu", "float32")
except SpecError as err:
    print(round(time.time() - t, 2), err)
"""


def test_a_hub_id_with_the_hub_unreachable_is_refused_quickly(tmp_path):
    """One short probe of the hub, then the local cache only (the hub client alone retried ~30 s)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run([sys.executable, "-c", HUB_RM], capture_output=True, text=True, env=env, timeout=180)
    seconds, line = proc.stdout.strip().split(" ", 1)
    assert line.startswith("task.rewards[0].model.path: cannot read the config of some-org/not-cached-rm"), proc
    assert float(seconds) < 12, seconds
