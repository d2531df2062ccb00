"""Multi-turn rollouts in the hf engine (rollout/turns.py) with the built-in `python`
environment: a scripted model closes a ```python block, the sandbox runs it, its output comes
back as forced tokens, and the model continues. Token-in-token-out: the ids are the ones
sampled, plus the tool output's own, even where decoding and re-encoding would merge them."""

import torch
from sandbox_corpus import HOSTILE
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config

from gspo_cli.rollout.hf import HFRolloutEngine
from gspo_cli.rollout.turns import RAW_WRAP, MultiTurnEngine
from gspo_cli.tasks.base import character_vocabulary
from gspo_cli.tasks.environments import resolve_environment
from gspo_cli.tasks.sandbox import detect_isolation


def _tokenizer():
    """One token per character, plus "ab" (merged from "a" "b"): text "ab" re-encodes to one id."""
    chars = character_vocabulary("")
    vocab = {t: i for i, t in enumerate([*chars, "ab"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


class Scripted(torch.nn.Module):
    """A stand-in causal LM: row i samples script[i] token by token (then EOS); a fed token that is
    not the script's next one is the environment's and leaves the script where it is (so a script
    goes on with characters its tool output does not contain)."""

    def __init__(self, tok, scripts: list[list[int]]):
        super().__init__()
        self.config = Qwen3Config(
            vocab_size=len(tok), hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1
        )
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.scripts, self.k, self.eos, self.V = scripts, [0] * len(scripts), tok.eos_token_id, len(tok)
        self.forwards = 0

    def _target(self, i):
        s = self.scripts[i]
        return s[self.k[i]] if self.k[i] < len(s) else self.eos

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None, **kw):
        self.forwards += 1
        if input_ids.shape[1] == 1:
            for i, t in enumerate(input_ids[:, 0].tolist()):
                if attention_mask[i, -1] and t == self._target(i):
                    self.k[i] += 1
        logits = torch.full((input_ids.shape[0], 1, self.V), -1e9)
        for i in range(input_ids.shape[0]):
            logits[i, 0, self._target(i)] = 0.0
        return type("Out", (), {"logits": logits})()


def _engine(tok, scripts, **limits):
    base = HFRolloutEngine(
        Scripted(tok, scripts), tok, max_new_tokens=200, temperature=1.0, stop_ids=[tok.eos_token_id]
    )
    kw = dict(max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=32)
    env = resolve_environment("python", {"timeout_s": 1.0, "memory_mb": 128})
    return MultiTurnEngine(base, env, **{**kw, **limits})


def _ids(tok, text):
    return tok(text, add_special_tokens=False).input_ids


def test_a_tool_call_runs_and_the_ids_are_token_in_token_out():
    tok = _tokenizer()
    a, b = _ids(tok, "a")[0], _ids(tok, "b")[0]
    assert _ids(tok, "ab") != [a, b]  # the round trip would merge them
    call = "Let me compute.\n```python\nprint(6*7)\n```"
    script0 = [a, b] + _ids(tok, call) + _ids(tok, "So 42.")
    script1 = _ids(tok, "No tool: 5.")
    engine = _engine(tok, [script0, script1])
    batch = engine.generate(["Q1? ", "Q2? "])
    eos = tok.eos_token_id
    inserted = _ids(tok, RAW_WRAP[0]) + _ids(tok, "42\n") + _ids(tok, RAW_WRAP[1])
    want0 = [a, b] + _ids(tok, call) + inserted + _ids(tok, "So 42.") + [eos]
    resp = batch.response_ids
    n0 = int(batch.response_mask[0].sum())
    assert resp[0, :n0].tolist() == want0  # exactly the sampled ids and the tool's, "a" "b" kept apart
    tool0 = [0] * (2 + len(_ids(tok, call))) + [1] * len(inserted) + [0] * (len(_ids(tok, "So 42.")) + 1)
    assert batch.tool_mask[0, :n0].tolist() == tool0
    assert batch.model_mask[0].sum() == n0 - len(inserted)
    n1 = int(batch.response_mask[1].sum())
    assert resp[1, :n1].tolist() == script1 + [eos] and batch.tool_mask[1].sum() == 0
    assert batch.completions[0] == "ab" + call + "\nSo 42." and batch.completions[1] == "No tool: 5."
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"] and batch.turns[0][1]["content"] == "42\n"
    assert batch.tool_counts[0] == {"turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0}
    assert batch.tool_counts[1] == {"turns": 1, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}
    assert batch.truncated.tolist() == [False, False]
    # Every position is attended once; the prompt's left padding is not.
    assert batch.attention_mask[:, batch.prompt_len :].sum() == n0 + n1


def test_long_output_is_cut_and_says_so_and_limits_count_the_models_tokens():
    tok = _tokenizer()
    call = "```python\nprint('x' * 500)\n```"
    engine = _engine(tok, [_ids(tok, call) + _ids(tok, "done")], tool_output_tokens=10, max_new_tokens=len(call) + 2)
    batch = engine.generate(["Q "])
    out = batch.turns[0][1]["content"]
    assert out.startswith("x" * 10) and out.endswith("[output cut at 10 tokens]\n")
    # max_new_tokens counts the model's tokens only: the call, then 2 more of "done", cut there
    assert int(batch.model_mask[0].sum()) == len(call) + 2 and bool(batch.truncated[0])
    assert int(batch.tool_mask[0].sum()) > 10


def test_hostile_tool_code_comes_back_as_an_error_never_a_hang():
    tok = _tokenizer()
    names = ["loop", "flood", "memory_bomb", "fork_bomb"]
    scripts = [
        _ids(tok, f"```python\n{HOSTILE[n]}\n```") + _ids(tok, "%%") for n in names
    ]  # no character of any output
    batch = _engine(tok, scripts).generate(["Q "] * len(names))
    counts = {n: c for n, c in zip(names, batch.tool_counts)}
    outs = {n: t[1]["content"] for n, t in zip(names, batch.turns)}
    level = detect_isolation().level  # the isolation level these ran at (root, rootless or basic)
    assert all(c["tool_calls"] == 1 and c["tool_errors"] == 1 for c in counts.values()), (level, counts)
    assert counts["loop"]["tool_timeouts"] == 1 and outs["loop"].startswith("TimeoutError")
    assert outs["flood"].endswith("[output cut at 32 tokens]\n") and outs["memory_bomb"].startswith("MemoryError")
    assert all(t[2]["content"] == "%%" for t in batch.turns)  # the model went on after each


TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_chat_model_gets_the_tool_message_its_template_writes():
    """With a chat template the turn ends at the stop token; the observation goes in the text
    the template writes around a tool message, the next assistant header after it."""
    from gspo_cli.models.prompts import PromptFormat

    tok = _tokenizer()
    tok.chat_template = TEMPLATE
    eos = tok.eos_token_id
    turn = _ids(tok, "```python\nprint(6*7)\n```") + [eos]
    base = HFRolloutEngine(
        Scripted(tok, [turn + _ids(tok, "%%")]),
        tok,
        max_new_tokens=200,
        temperature=1.0,
        stop_ids=[eos],
        prompt_format=PromptFormat().formatter(tok),
    )
    env = resolve_environment("python", {"timeout_s": 1.0})
    engine = MultiTurnEngine(
        base, env, max_new_tokens=200, max_total_tokens=400, max_turns=4, max_tool_calls=3, tool_output_tokens=32
    )
    assert engine.wrap == ("<|tool|>", "</s><|assistant|>")
    batch = engine.generate(["Q"])
    inserted = _ids(tok, "<|tool|>") + _ids(tok, "42\n") + _ids(tok, "</s><|assistant|>")
    assert eos in inserted  # the template's own end of the tool message, as the tokenizer reads it
    want = turn + inserted + _ids(tok, "%%") + [eos]
    n = int(batch.response_mask[0].sum())
    assert batch.response_ids[0, :n].tolist() == want
    assert batch.tool_mask[0, :n].tolist() == [0] * len(turn) + [1] * len(inserted) + [0] * 3
    prompt = batch.input_ids[0, : batch.prompt_len][batch.attention_mask[0, : batch.prompt_len] > 0]
    assert prompt.tolist() == _ids(tok, "<|user|>Q</s><|assistant|>")
    assert [t["role"] for t in batch.turns[0]] == ["model", "tool", "model"] and not batch.truncated[0]
