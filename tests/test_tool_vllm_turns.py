"""The vLLM multi-turn loop (rollout/vllm_turns.py) without vLLM: a scripted stand-in for the
engine's `sample_ids` that honours stop ids and budgets as vLLM does. The loop sends each round
the row's ids so far (token-in-token-out), stops rounds at backticks and ends turns by the hf
engine's rule, and lays out the hf engine's batch. tests/vllm/test_vllm_tools.py runs real vLLM."""

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from gspo_cli.environments import RAW_WRAP, resolve_environment
from gspo_cli.errors import SpecError
from gspo_cli.models.prompts import raw_prompts
from gspo_cli.rollout.vllm_turns import VLLMTurnEngine, fence_ids
from gspo_cli.tasks.base import character_vocabulary


def _tokenizer():
    """One token per character, plus "ab" (merged from "a" "b"): text "ab" re-encodes to one id."""
    chars = character_vocabulary("")
    vocab = {t: i for i, t in enumerate([*chars, "ab"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


class FakeVLLM:
    """Row i (told apart by its prompt) samples scripts[i] in order, then EOS; each token's
    log-prob is -(its index in the script + 1) / 100. Stops after a stop id or max_tokens."""

    def __init__(self, tok, prompts: list[str], scripts: list[list[int]]):
        self.tokenizer, self.format, self.stop_ids = tok, raw_prompts(tok), [tok.eos_token_id]
        self.temperature, self.model, self.synced = 1.0, None, 0
        self.prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
        self.scripts, self.k = scripts, [0] * len(scripts)
        self.calls = []  # (row, ids sent, max_tokens, tokens returned)

    def sync_if_stale(self):
        self.synced += 1

    def sample_ids(self, prompt_ids, max_tokens, stop_ids, key=0):
        outs = []
        for ids, m in zip(prompt_ids, max_tokens):
            row = next(i for i, p in enumerate(self.prompt_ids) if ids[: len(p)] == p)
            got = []
            while len(got) < m:
                s, k = self.scripts[row], self.k[row]
                t = s[k] if k < len(s) else self.tokenizer.eos_token_id
                got.append((t, -(k + 1) / 100))
                self.k[row] += 1
                if t in stop_ids:
                    break
            self.calls.append((row, list(ids), m, [t for t, _ in got]))
            outs.append(([t for t, _ in got], [lp for _, lp in got]))
        return outs


def _ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def _engine(base, **limits):
    kw = dict(max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=32)
    env = resolve_environment("python", {"timeout_s": 1.0, "memory_mb": 128})
    return VLLMTurnEngine(base, env, **{**kw, **limits})


def test_rounds_send_the_ids_so_far_and_the_batch_is_the_hf_engines():
    tok = _tokenizer()
    a, b, eos, tick = _ids(tok, "a")[0], _ids(tok, "b")[0], tok.eos_token_id, _ids(tok, "`")[0]
    assert _ids(tok, "ab") != [a, b] and fence_ids(tok) == [tick]
    call = "Let me compute.\n```python\nprint(6*7)\n```"
    script0 = [a, b] + _ids(tok, call) + _ids(tok, "So 42.")
    script1 = _ids(tok, "No tool: 5.")
    prompts = ["Q1? ", "Q2? "]
    base = FakeVLLM(tok, prompts, [script0, script1])
    batch = _engine(base).generate(prompts)
    inserted = _ids(tok, RAW_WRAP[0]) + _ids(tok, "42\n") + _ids(tok, RAW_WRAP[1])
    want0 = [a, b] + _ids(tok, call) + inserted + _ids(tok, "So 42.") + [eos]
    n0, n1 = int(batch.response_mask[0].sum()), int(batch.response_mask[1].sum())
    assert batch.response_ids[0, :n0].tolist() == want0 and batch.response_ids[1, :n1].tolist() == script1 + [eos]
    tool0 = [0] * (2 + len(_ids(tok, call))) + [1] * len(inserted) + [0] * (len(_ids(tok, "So 42.")) + 1)
    assert batch.tool_mask[0, :n0].tolist() == tool0 and batch.tool_mask[1].sum() == 0
    # the engine's log-probs on the model's tokens, in sampling order; 0 on the tool's
    model_lps = [lp for lp, tool in zip(batch.engine_logp[0, :n0].tolist(), tool0) if not tool]
    assert model_lps == pytest.approx([-(k + 1) / 100 for k in range(len(script0) + 1)])
    assert batch.engine_logp[0, :n0][batch.tool_mask[0, :n0] > 0].abs().sum() == 0
    assert batch.engine_entropy is None and batch.engine_routes is None and base.synced == 1
    # Row 0's rounds: six ended at a backtick (the fences), the 6th closing the call; then the
    # answer. Each sent exactly the prompt and every id so far, the tool message's included.
    rounds = [c for c in base.calls if c[0] == 0]
    assert [r[3][-1] for r in rounds] == [tick] * 6 + [eos]
    sent = base.prompt_ids[0]
    for j, (_, ids, _, got) in enumerate(rounds):
        assert ids == sent
        sent = sent + got + (inserted if j == 5 else [])
    assert sent == base.prompt_ids[0] + want0
    assert batch.completions == ["ab" + call + "\nSo 42.", "No tool: 5."]
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"] and batch.turns[0][1]["content"] == "42\n"
    assert batch.tool_counts == [
        {"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0},
        {"turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0},
    ]
    assert batch.truncated.tolist() == [False, False]


def test_budgets_count_the_models_tokens_over_all_turns():
    tok = _tokenizer()
    call = "```python\nprint('x' * 500)\n```"
    prompts = ["Q "]
    base = FakeVLLM(tok, prompts, [_ids(tok, call) + _ids(tok, "done")])
    batch = _engine(base, tool_output_tokens=10, max_new_tokens=len(call) + 2).generate(prompts)
    out = batch.turns[0][1]["content"]
    assert out.startswith("x" * 10) and out.endswith("[output cut at 10 tokens]\n")
    # max_new_tokens counts the model's tokens only: the call, then 2 more of "done", cut there
    assert int(batch.model_mask[0].sum()) == len(call) + 2 and bool(batch.truncated[0])
    assert base.calls[-1][2] == 2  # the last round's budget: what the model had left
    n = len(call) + 2
    assert [c[2] for c in base.calls][:4] == [n, n - 1, n - 2, n - 3]  # a round per backtick of the opening fence
    # max_total_tokens cuts the tool message itself: the row ends there, truncated
    base = FakeVLLM(tok, prompts, [_ids(tok, call) + _ids(tok, "done")])
    batch = _engine(base, max_total_tokens=len(call) + 5).generate(prompts)
    assert int(batch.response_mask[0].sum()) == len(call) + 5 and int(batch.tool_mask[0].sum()) == 5
    assert bool(batch.truncated[0]) and batch.tool_counts[0]["tool_calls"] == 1


def test_tensor_parallel_groups_under_torchrun_are_refused_in_one_line():
    tok = _tokenizer()
    base = FakeVLLM(tok, ["Q "], [[]])
    base.tp, base.shares_world = 2, True
    with pytest.raises(SpecError, match="^task.environment: .*tensor_parallel_size > 1 under torchrun"):
        _engine(base)


TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_chat_model_ends_turns_at_its_stop_id_and_gets_the_templates_tool_message():
    """With a chat template a round stops at the stop ids only (no backtick stops) and the
    observation goes in the text the template writes around a tool message."""
    from gspo_cli.models.prompts import PromptFormat

    tok = _tokenizer()
    tok.chat_template = TEMPLATE
    eos = tok.eos_token_id
    turn = _ids(tok, "```python\nprint(6*7)\n```") + [eos]
    base = FakeVLLM(tok, ["Q"], [turn + _ids(tok, "%%")])
    base.format = PromptFormat().formatter(tok)
    base.prompt_ids = [_ids(tok, "<|user|>Q</s><|assistant|>")]
    engine = _engine(base)
    assert engine.round_stops == [eos] and engine.wrap == ("<|tool|>", "</s><|assistant|>")
    batch = engine.generate(["Q"])
    inserted = _ids(tok, "<|tool|>") + _ids(tok, "42\n") + _ids(tok, "</s><|assistant|>")
    n = int(batch.response_mask[0].sum())
    assert batch.response_ids[0, :n].tolist() == turn + inserted + _ids(tok, "%%") + [eos]
    assert batch.tool_mask[0, :n].tolist() == [0] * len(turn) + [1] * len(inserted) + [0] * 3
    assert [len(c[3]) for c in base.calls] == [len(turn), 3]  # two rounds: one per turn
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"] and not batch.truncated[0]


def test_multi_turn_batches_are_scored_whole_even_where_the_base_streams_rows():
    """The hf engine hands finished rows to a reward pool early (`streams_rows`); a multi-turn
    engine in front of it does not (its generate takes no on_rows), whatever its base says."""
    from gspo_cli.train.scored_rollout import generate_scored

    tok = _tokenizer()
    base = FakeVLLM(tok, ["Q "], [_ids(tok, "7")])
    base.streams_rows = True

    class EagerScoring:
        wants_rows = True

        def add(self, rows, completions, completion_ids):
            raise AssertionError("rows handed over early")

    batch = generate_scored(_engine(base), ["Q "], EagerScoring())
    assert batch.completions == ["7"]
