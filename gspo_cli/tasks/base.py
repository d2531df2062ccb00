"""The task interface: problems, reference solutions for the cold start, and a verifier."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import string
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gspo_cli.errors import SpecError


class Conversation(str):
    """A conversational prompt (TRL's format: a list of {"role", "content"} messages). It reads
    as text wherever a prompt is text (overlap keys, logs, samples.jsonl, lengths): the messages'
    contents, one per line; the engines' prompt formatter renders `messages` through the chat
    template, and reward functions get the messages."""

    messages: tuple[dict[str, str], ...]

    def __new__(cls, messages):
        msgs = tuple({"role": str(m["role"]), "content": str(m["content"])} for m in messages)
        obj = super().__new__(cls, "\n".join(m["content"] for m in msgs))
        obj.messages = msgs
        return obj

    def __reduce__(self):  # pickled by its messages (the staleness-1 worker receives prompts)
        return (Conversation, (list(self.messages),))


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    answer: str
    solution: str | None = None  # a reference completion (used by the cold start)
    # Task-specific data (a code problem's tests...); not part of equality or the hash.
    meta: dict | None = field(default=None, compare=False, hash=False)
    # The statement before the prompt template (dataset problems); overlap checks compare it.
    text: str | None = field(default=None, compare=False, hash=False)


# LaTeX spacing commands: `7\,000` and `7000`, `a\;b` and `ab` are one problem.
_LATEX_SPACING = re.compile(r"\\(?:[,;:! ]|quad\b|qquad\b)|~")
_WHITESPACE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """The overlap key of a problem statement: Unicode NFKC, lower case, LaTeX spacing commands
    (`\\,` `\\;` `\\:` `\\!` `\\ ` `\\quad` `\\qquad` `~`) and all whitespace removed. Two
    statements with the same key are the same problem, whatever their spacing or case."""
    text = unicodedata.normalize("NFKC", text).lower()
    return _WHITESPACE.sub("", _LATEX_SPACING.sub("", text))


def problem_key(problem: Problem) -> str:
    """`normalize_text` of the problem's statement (its prompt when it has no separate text)."""
    return normalize_text(problem.text if problem.text is not None else problem.prompt)


@dataclass(frozen=True)
class Score:
    """A verifier's verdict on one completion. `reward` is what RL optimises."""

    reward: float
    correct: bool
    components: dict[str, float] = field(default_factory=dict)
    # What a reader needs to see why (code: per-test verdicts); None when the task has nothing to add.
    detail: dict | None = field(default=None, compare=False)
    # Reward functions (task.rewards): whether any applied to this row (None: the task's own verifier).
    rewarded: bool | None = None


class Task(ABC):
    name: str
    # Training never draws a problem whose `problem_key` is here (see `exclude`).
    excluded: frozenset[str] = frozenset()
    # A dataset task's training problems (None: a generator, which filters as it draws).
    train_pool: list[Problem] | None = None

    def exclude(self, problems: Iterable[Problem], what: str = "the evaluation sets") -> int | None:
        """Never train on `problems` (matched by `problem_key`). A dataset task drops them from
        its training pool now and returns how many rows it dropped; a generator (synthetic)
        drops them as drawn and returns None. SpecError when no training problem is left."""
        self.excluded = self.excluded | {problem_key(p) for p in problems}
        if self.train_pool is None:
            return None
        kept = [p for p in self.train_pool if problem_key(p) not in self.excluded]
        if not kept:
            raise SpecError(
                f"task.params.source: all {len(self.train_pool)} training problems are also in {what}; "
                "train on other data (task.params.source) or evaluate on other sets"
            )
        removed = len(self.train_pool) - len(kept)
        self.train_pool = kept
        return removed

    def trainable(self, problem: Problem) -> bool:
        """Whether training may draw `problem` (not excluded)."""
        return not self.excluded or problem_key(problem) not in self.excluded

    def data_fingerprint(self) -> str:
        """`fingerprint` plus what was excluded from training: everything that determines the
        problems a cold start sees (the built-in model cache key)."""
        if not self.excluded:
            return self.fingerprint()
        digest = hashlib.sha256("\n".join(sorted(self.excluded)).encode()).hexdigest()[:16]
        return f"{self.fingerprint()}-minus:{digest}"

    def content_fingerprint(self) -> str:
        """What training draws from, by content (run.json records it): a digest of every
        training row of a dataset (after exclusions), or a generator's `data_fingerprint`.
        Editing a data file in place changes it."""
        if self.train_pool is None:
            return self.data_fingerprint()
        return f"{self.name}:{problems_digest(self.train_pool)}"

    @abstractmethod
    def train_problems(self, rng: random.Random, n: int) -> list[Problem]:
        """`n` training problems drawn with `rng` (never from the eval split)."""

    @abstractmethod
    def eval_problems(self, n: int) -> list[Problem]:
        """A fixed, deterministic held-out set of at most `n` problems."""

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> Score:
        """Judge one completion; never raises on garbage, gives reward 0 instead."""

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Score]:
        """Scores of completions[i] for problems[i]. The trainer and evaluation call this for a
        whole batch; tasks whose judging is slow (code) override it to judge in parallel."""
        return [self.score(p, c) for p, c in zip(problems, completions)]

    def score_rollout(self, problems, completions, completion_ids=None, step: int = 0) -> list[Score]:
        """`score_batch`, given what reward functions may also use: each completion's token ids
        and the training step (tasks scored by their own verifier ignore both)."""
        return self.score_batch(problems, completions)

    def corpus_text(self, rng: random.Random, n: int = 256) -> str:
        """Text the built-in tokenizer is trained on."""
        probs = self.train_problems(rng, n)
        return "".join(p.prompt + (p.solution or "") for p in probs)

    def fingerprint(self) -> str:
        """Everything that determines the problems a cold start sees (for caching)."""
        return self.name


def problems_digest(problems: Iterable[Problem]) -> str:
    """16 hex digits of sha256 over the problems' content, in order: id, prompt, answer,
    solution, statement and task data (a code problem's tests). Equal digests: the same
    problems."""
    h = hashlib.sha256()
    for p in problems:
        row = [p.id, getattr(p.prompt, "messages", p.prompt), p.answer, p.solution, p.text, p.meta]
        h.update(json.dumps(row, sort_keys=True, default=_plain).encode() + b"\n")
    return h.hexdigest()[:16]


def _plain(obj):
    """JSON for what a problem's meta may hold besides JSON types (test cases, dates)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return str(obj)


# The built-in character tokenizer's special tokens, ids 0..3 (gspo_cli.models.builtin).
TOKENIZER_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def character_vocabulary(corpus: str) -> list[str]:
    """The built-in tokenizer's tokens in id order: the specials, then every printable ASCII
    character plus any other character in `corpus`, sorted (so unseen-but-typeable text still
    round-trips). Torch-free so that `gspo plan` sizes a built-in model without building it."""
    chars = sorted((set(string.printable) - set("\x0b\x0c\r")) | set(corpus))
    return [*TOKENIZER_SPECIALS, *chars]


def in_eval_split(key: str, eval_fraction: float = 0.1) -> bool:
    """Stable hash split: a problem belongs to the held-out set by its text alone, so train
    and eval never overlap whatever seeds are used."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return (h % 10_000) < eval_fraction * 10_000


def extract_boxed(text: str) -> str | None:
    r"""Content of the last \boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None
