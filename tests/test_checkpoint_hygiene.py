"""Whatever a checkpoint ships (generation_config.json, dropout in config.json, a chat
template, several stop ids), the sampler is the policy whose ratios are computed, prompts
look as the checkpoint expects, and responses end at its stop ids. Each test uses an
ordinary local HF directory made from TINY's built-in model with one file edited."""

import pytest
import torch
from helpers import TINY, edited_model_copy, tiny_model_dir
from transformers import AutoModelForCausalLM

from gspo_cli.errors import SpecError
from gspo_cli.eval.run import Sampling, Target, evaluate_model
from gspo_cli.models import load_model
from gspo_cli.models.loading import disable_dropout
from gspo_cli.models.prompts import PromptFormat, stop_token_ids
from gspo_cli.rollout import make_engine, response_logprobs
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.step import setup, train_step

PROMPTS = ["1+2=?\n", "3+4=?\n", "0+1=?\n", "2+2=?\n"] * 4
# Every sampling, length, stopping and output option of transformers 5.24's GenerationConfig,
# each at a value that would change what generate returns.
POLLUTED = {
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "min_p": 0.2,
    "top_h": 0.5,
    "typical_p": 0.5,
    "epsilon_cutoff": 3e-3,
    "eta_cutoff": 3e-3,
    "repetition_penalty": 1.3,
    "encoder_repetition_penalty": 1.2,
    "length_penalty": 2.0,
    "no_repeat_ngram_size": 2,
    "encoder_no_repeat_ngram_size": 2,
    "bad_words_ids": [[10]],
    "renormalize_logits": True,
    "forced_bos_token_id": 11,
    "forced_eos_token_id": 12,
    "remove_invalid_values": True,
    "exponential_decay_length_penalty": [2, 1.5],
    "suppress_tokens": [13],
    "begin_suppress_tokens": [14],
    "sequence_bias": [[[15], -5.0]],
    "guidance_scale": 1.5,
    "min_length": 40,
    "min_new_tokens": 4,
    "max_length": 12,
    "max_new_tokens": 3,
    "max_time": 1e-4,
    "stop_strings": ["+"],
    "num_beams": 2,
    "num_return_sequences": 2,
    "output_scores": True,
    "output_logits": True,
    "return_dict_in_generate": True,
    "use_cache": False,
    "low_memory": True,
    "prompt_lookup_num_tokens": 3,
    "token_healing": True,
    "early_stopping": True,
    "watermarking_config": {"greenlist_ratio": 0.5, "bias": 5.0},
}
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[{{ m['content'] }}]{% else %}"
    "Q: {{ m['content'] }}{% endif %}{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}/quick {% endif %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)


@pytest.fixture(scope="module")
def base_dir():
    return tiny_model_dir()


def _spec(source, **rollout):
    return spec_from_dict(
        {**TINY, "model": {**TINY["model"], "name": str(source)}, "rollout": {**TINY["rollout"], **rollout}}
    )


def _engine(source, **rollout):
    spec = _spec(source, **rollout)
    lm = load_model(str(source), spec.model)
    return make_engine(spec.rollout, lm.model, lm.tokenizer, model_dir=str(source)), lm


def _spy_on_generate(model) -> dict:
    """Records the logits processors and stopping criteria generate builds for `model`."""
    seen = {}
    real_proc, real_stop = model._get_logits_processor, model._get_stopping_criteria
    model._get_logits_processor = lambda *a, **k: seen.setdefault("proc", real_proc(*a, **k))
    model._get_stopping_criteria = lambda *a, **k: seen.setdefault("stop", real_stop(*a, **k))
    return seen


@pytest.mark.parametrize("decode", ["compact", "generate"])
def test_checkpoint_generation_config_does_not_reach_the_sampler(base_dir, tmp_path, decode):
    """Same weights, same seed: a directory whose generation_config sets every option samples
    exactly the clean directory's tokens with the same log-probs, with our loop (which never
    reads a generation config) and with generate, which builds no logits processor but
    temperature's and stops only at max_new_tokens and the stop ids."""
    polluted = edited_model_copy(base_dir, tmp_path / "polluted", generation_config=POLLUTED)
    batches = {}
    for name, source in (("clean", base_dir), ("polluted", polluted)):
        engine, lm = _engine(source, temperature=0.7, max_new_tokens=24, decode=decode)
        seen = _spy_on_generate(lm.model)
        torch.manual_seed(3)
        batches[name] = engine.generate(PROMPTS)
        if decode == "compact":
            assert not seen  # generate never ran
            continue
        # SamplerLogprobs is ours: it reads each step's distribution for the sampler's log-probs
        # (rollout.sampler_logprobs) and returns the scores unchanged.
        procs = [type(p).__name__ for p in seen["proc"] if type(p).__name__ != "SamplerLogprobs"]
        assert procs == ["TemperatureLogitsWarper"], name
        assert sorted(type(c).__name__ for c in seen["stop"]) == ["EosTokenCriteria", "MaxLengthCriteria"], name
        if name == "polluted":  # the checkpoint's own config is back after generate (saved with checkpoints)
            assert lm.model.generation_config.top_k == 20 and lm.model.generation_config.min_p == 0.2
    clean, dirty = batches["clean"], batches["polluted"]
    assert torch.equal(clean.input_ids, dirty.input_ids)
    assert torch.equal(clean.engine_logp, dirty.engine_logp)
    # Polluted, generate would return 2 beams x 2 sequences per prompt of at most 3 tokens.
    assert clean.input_ids.shape[0] == len(PROMPTS) and clean.response_mask.sum(-1).max() > 3
    assert not clean.truncated.all()  # responses ended at EOS: stops work


def test_sampler_logprobs_are_the_policy_under_a_polluted_config(base_dir, tmp_path):
    """pi_old taken from generate's logits equals a full forward of the policy at the
    sampling temperature, token for token, with the checkpoint's generation config set."""
    polluted = edited_model_copy(base_dir, tmp_path / "polluted", generation_config=POLLUTED)
    engine, lm = _engine(polluted, temperature=0.7)
    torch.manual_seed(4)
    batch = engine.generate(PROMPTS)
    full = response_logprobs(lm.model.eval(), batch, temperature=0.7).logp
    m = batch.response_mask > 0
    assert torch.allclose(batch.engine_logp[m], full[m], atol=1e-4)


@pytest.fixture(scope="module")
def chat_dir(base_dir, tmp_path_factory):
    """A chat checkpoint: a template in tokenizer_config.json, two stop ids besides EOS in
    generation_config.json (" " and "=", which the model writes early in most answers)."""
    vocab = load_model(str(base_dir), _spec(base_dir).model).tokenizer.get_vocab()
    stops = [vocab[" "], vocab["="]]
    path = edited_model_copy(
        base_dir,
        tmp_path_factory.mktemp("chat") / "m",
        tokenizer_config={"chat_template": TEMPLATE},
        generation_config={"eos_token_id": stops},
    )
    return path, stops


def test_prompts_go_through_the_chat_template(chat_dir):
    path, _ = chat_dir
    for rollout, text in (
        ({}, "Q: 1+2=?\nA: "),
        ({"system_prompt": "be brief"}, "[be brief]Q: 1+2=?\nA: "),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "Q: 1+2=?\n/quick A: "),
        ({"chat_template": "none"}, "1+2=?\n"),
    ):
        engine, lm = _engine(path, **rollout)
        batch = engine.generate(["1+2=?\n"])
        assert lm.tokenizer.decode(batch.input_ids[0, : batch.prompt_len]) == text, rollout


def test_responses_end_at_the_first_stop_id(chat_dir):
    path, extra = chat_dir
    engine, lm = _engine(path)
    eos = lm.tokenizer.eos_token_id
    assert engine.stop_ids == [eos, *extra]
    torch.manual_seed(5)
    batch = engine.generate(PROMPTS)
    ends = []
    for i in range(len(PROMPTS)):
        ids = batch.response_ids[i].tolist()
        first = next((j for j, t in enumerate(ids) if t in engine.stop_ids), None)
        if first is None:
            assert bool(batch.truncated[i]) and batch.response_mask[i].sum() == len(ids)
            continue
        assert not batch.truncated[i]
        assert batch.response_mask[i].tolist() == [1.0] * (first + 1) + [0.0] * (len(ids) - first - 1)
        ends.append(ids[first])
    assert set(ends) & set(extra), "the model never wrote an extra stop id: the test would prove nothing"


def test_system_prompt_without_a_template_is_a_spec_error(base_dir):
    lm = load_model(str(base_dir), _spec(base_dir).model)
    with pytest.raises(
        SpecError, match="^rollout.system_prompt: needs a chat template, but the tokenizer has no chat template"
    ):
        PromptFormat(system_prompt="hi").formatter(lm.tokenizer)
    with pytest.raises(SpecError, match=r"rollout.system_prompt: needs a chat template, but chat_template is none"):
        spec_from_dict({**TINY, "rollout": {"chat_template": "none", "system_prompt": "hi"}})
    assert PromptFormat().formatter(lm.tokenizer)(["1+2=?\n"]) == ["1+2=?\n"]  # auto, no template: raw text


def test_stop_ids_read_from_tokenizer_and_generation_config(base_dir, tmp_path):
    lm = load_model(str(base_dir), _spec(base_dir).model)
    assert stop_token_ids(lm.model, lm.tokenizer) == [lm.tokenizer.eos_token_id]  # derived from config.json
    path = edited_model_copy(base_dir, tmp_path / "m", generation_config={"eos_token_id": [7, 2, 9]})
    lm = load_model(str(path), _spec(path).model)
    assert lm.tokenizer.eos_token_id == 2 and stop_token_ids(lm.model, lm.tokenizer) == [2, 7, 9]


def test_evaluation_formats_prompts_like_training(chat_dir, monkeypatch):
    from gspo_cli.rollout import hf

    path, _ = chat_dir
    fed = []
    real = hf.HFRolloutEngine.generate
    monkeypatch.setattr(
        hf.HFRolloutEngine, "generate", lambda self, prompts: fed.extend(self.format(prompts)) or real(self, prompts)
    )
    spec = _spec(path, system_prompt="be brief")
    task = make_task(spec.task.name, spec.task.params)
    evaluate_model(
        Target(source=str(path), spec=spec), task, Sampling(samples=1, max_tokens=4), limit=2, log=lambda m: None
    )
    assert [f.split("Q: ")[0] for f in fed] == ["[be brief]", "[be brief]"]
    assert all(f.endswith("A: ") for f in fed)


def test_no_dropout_in_policy_forwards(base_dir, tmp_path):
    """attention_dropout 0.5 in config.json: raw transformers drops out in train mode (the
    test means something); loaded by us, train mode is eval mode, for the policy and the
    KL reference alike."""
    path = edited_model_copy(base_dir, tmp_path / "m", config={"attention_dropout": 0.5})
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    raw = AutoModelForCausalLM.from_pretrained(path).train()
    assert not torch.allclose(raw(ids).logits, raw(ids).logits)
    assert "config.attention_dropout" in disable_dropout(raw) and torch.equal(raw(ids).logits, raw(ids).logits)

    spec = spec_from_dict(
        {**TINY, "model": {**TINY["model"], "name": str(path)}, "arms": [{**TINY["arms"][0], "kl_coef": 0.1}]}
    )
    ctx = setup(spec, spec.arms[0], 0, make_task(spec.task.name, spec.task.params), str(path))
    assert ctx.model.config.attention_dropout == 0.0
    for model in (ctx.model.train(), ctx.ref_model):
        train_mode = model(ids).logits
        assert torch.equal(train_mode, model(ids).logits)
        assert torch.equal(train_mode, model.eval()(ids).logits)  # the same kernels, the same arguments


@pytest.mark.slow
def test_a_step_on_edited_checkpoints_is_the_clean_step(base_dir, tmp_path):
    """One training step (same seed) on the clean directory, one whose generation_config sets
    every option and one with attention_dropout 0.5: identical metrics, on-policy KL 0."""
    dirs = {
        "clean": base_dir,
        "polluted": edited_model_copy(base_dir, tmp_path / "p", generation_config=POLLUTED),
        "dropout": edited_model_copy(base_dir, tmp_path / "d", config={"attention_dropout": 0.5}),
    }
    metrics = {}
    for name, path in dirs.items():
        spec = spec_from_dict(
            {
                **TINY,
                "model": {**TINY["model"], "name": str(path)},
                "arms": [{"name": "gspo", "preset": "paper-gspo", "mini_batches": 1}],
            }
        )
        ctx = setup(spec, spec.arms[0], 0, make_task(spec.task.name, spec.task.params), str(path))
        m = train_step(ctx, 1)
        metrics[name] = {k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))}
    assert metrics["polluted"] == metrics["clean"]
    assert metrics["dropout"] == metrics["clean"]
    assert metrics["clean"]["policy/kl_old_k3"] < 1e-6
