"""Your own data: a dataset with a `prompt` column, a string (TRL's standard format) or a list
of chat messages (conversational), scored by the reward functions of `task.rewards` (see
`gspo_cli.rewards`).

Every other column reaches the reward functions by name, one value per row. A `solution`
column (else `completion`) is the reference completion the built-in model's cold start trains
on. The held-out evaluation split is the first rows of the file, as for `math`.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings

from pydantic import BaseModel, ConfigDict, Field

from gspo_cli.errors import SpecError
from gspo_cli.tasks.base import Conversation, Problem, Score, Task
from gspo_cli.tasks.records import columns_of, load_records

# Columns the cold start of the built-in model learns to write, first found wins.
REFERENCE_COLUMNS = ("solution", "completion")


class PromptsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1, description="a .jsonl/.json/.parquet file, save_to_disk directory or hub:<id>")
    split: str = Field("train", description="dataset split, for hub: sources")


class PromptsTask(Task):
    name = "prompts"

    def __init__(self, **params):
        self.p = PromptsParams(**params)
        self.problems = load_prompt_problems(self.p.source, split=self.p.split)
        self.train_pool = list(self.problems)

    @property
    def num_problems(self) -> int:
        return len(self.problems)

    def train_problems(self, rng: random.Random, n: int) -> list[Problem]:
        return [rng.choice(self.train_pool) for _ in range(n)]

    def eval_problems(self, n: int) -> list[Problem]:
        return self.problems[:n]

    def score(self, problem: Problem, completion: str) -> Score:
        raise SpecError("task.rewards: the prompts task is scored by its reward functions; list at least one")

    def fingerprint(self) -> str:
        rows = [(getattr(p.prompt, "messages", p.prompt), p.solution) for p in self.train_pool]
        digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
        return f"{self.name}:{digest[:16]}"


def load_prompt_problems(source: str, *, split: str = "train") -> list[Problem]:
    """One problem per row with a `prompt`: a string (standard), or a list of {"role", "content"}
    messages (conversational, kept as a `Conversation`); the row's other columns kept for the
    reward functions (meta `columns`). A row whose prompt is missing, null, empty or of another
    type is dropped, and the drops are said in one warning (how many of how many rows, and why).
    SpecError when the source cannot be read, a message is malformed, or no row has a prompt
    (naming the columns found)."""
    rows = load_records(source, split=split)
    problems, dropped = [], {}
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            prompt = _conversation(prompt, f"task.params.source: {source}: row {i}")
        if not isinstance(prompt, str) or not prompt:
            dropped.setdefault(_why_dropped(row), []).append(i)
            continue
        columns = {k: v for k, v in row.items() if k != "prompt"}
        reference = next((row[c] for c in REFERENCE_COLUMNS if isinstance(row.get(c), str)), None)
        answer = row.get("answer")
        problems.append(
            Problem(
                id=str(row.get("id", i)),
                prompt=prompt,
                answer="" if answer is None else str(answer),
                solution=reference,
                meta={"columns": columns},
                text=str(prompt),
            )
        )
    if not problems:
        found = ", ".join(columns_of(rows)) or "none"
        raise SpecError(
            f"task.params.source: {source}: no row with a `prompt` string ({len(rows)} rows); columns found: {found}"
        )
    if dropped:
        n = sum(len(rows_) for rows_ in dropped.values())
        why = ", ".join(f"{len(rows_)} {what} (first: row {rows_[0]})" for what, rows_ in dropped.items())
        warnings.warn(f"task.params.source: {source}: dropped {n} of {len(rows)} rows: {why}", stacklevel=2)
    return problems


def _why_dropped(row: dict) -> str:
    """Why `row` has no usable prompt, as the drop warning counts it."""
    if "prompt" not in row:
        return "without a `prompt` column"
    prompt = row["prompt"]
    if prompt is None:
        return "whose `prompt` is null"
    if prompt == "":
        return "whose `prompt` is empty"
    kind = {bool: "true/false", int: "a number", float: "a number", dict: "an object"}.get(type(prompt), "not text")
    return f"whose `prompt` is {kind}, not a string or a list of messages"


def _conversation(messages: list, where: str) -> Conversation:
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise SpecError(f"{where}: prompt[{j}] is not a message with a string role and content (got {m!r:.60})")
    if not messages:
        raise SpecError(f"{where}: an empty list of messages")
    return Conversation(messages)
