"""The task interface: problems, reference solutions for the cold start, and a verifier."""

from __future__ import annotations

import hashlib
import random
import string
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    id: str
    prompt: str
    answer: str
    solution: str | None = None  # a reference completion (used by the cold start)
    # Task-specific data (a code problem's tests...); not part of equality or the hash.
    meta: dict | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class Score:
    """A verifier's verdict on one completion. `reward` is what RL optimises."""

    reward: float
    correct: bool
    components: dict[str, float] = field(default_factory=dict)
    # What a reader needs to see why (code: per-test verdicts); None when the task has nothing to add.
    detail: dict | None = field(default=None, compare=False)


class Task(ABC):
    name: str

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

    def corpus_text(self, rng: random.Random, n: int = 256) -> str:
        """Text the built-in tokenizer is trained on."""
        probs = self.train_problems(rng, n)
        return "".join(p.prompt + (p.solution or "") for p in probs)

    def fingerprint(self) -> str:
        """Everything that determines the problems a cold start sees (for caching)."""
        return self.name


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
