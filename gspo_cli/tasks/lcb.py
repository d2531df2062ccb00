"""Loading LiveCodeBench exports (the `code_generation_lite` JSONL rows).

Each row has `question_title`, `question_content`, `platform`, `question_id`,
`contest_id`, `contest_date` (ISO), `starter_code`, `difficulty` (easy/medium/hard),
`public_test_cases` and `private_test_cases` (a JSON list of
{"input", "output", "testtype": "stdin"|"functional"}; the private list is often stored
as base64 of a zlib-compressed pickle of that JSON string) and `metadata` (JSON with
`func_name` for functional tests).

The pickle comes from a downloaded file, so it is untrusted: it is read with an
unpickler that refuses every global (no class, no function, so no `os.system`), which
loads plain strings, lists and dicts and nothing else. A row whose pickle asks for a
global is skipped and counted, as is any malformed row; the file never aborts the load.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import pickle
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from gspo_cli.tasks.code_judge import TestCase

MAX_DECOMPRESSED_BYTES = 1 << 30  # a zlib bomb stops here instead of filling memory
DIFFICULTIES = ("easy", "medium", "hard")
# What a row needs (the rest is optional), for the error that lists what a file holds instead.
REQUIRED_COLUMNS = ("question_id", "question_content", "difficulty", "contest_date", "public_test_cases")


class UnsafePickle(ValueError):
    """The pickle asked for a global (a class or function): refused."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise UnsafePickle(f"refused global {module}.{name}")

    def persistent_load(self, pid):
        raise UnsafePickle("refused persistent id")


def safe_unpickle(data: bytes) -> Any:
    """Unpickle plain data only; UnsafePickle if the pickle references any global."""
    return _PlainDataUnpickler(io.BytesIO(data)).load()


@dataclass(frozen=True)
class LcbProblem:
    question_id: str
    title: str
    content: str
    platform: str
    contest_id: str
    contest_date: date
    difficulty: str
    starter_code: str
    func_name: str | None
    tests: tuple[TestCase, ...]  # public first, then private
    num_public: int


@dataclass
class LoadStats:
    rows: int = 0
    loaded: int = 0
    malformed: int = 0
    unsafe_pickle: int = 0
    filtered_date: int = 0
    filtered_difficulty: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # first words of each skip reason
    columns: list[str] = field(default_factory=list)  # the first row's keys, for errors

    def skip(self, reason: str, unsafe: bool = False) -> None:
        if unsafe:
            self.unsafe_pickle += 1
        else:
            self.malformed += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def decode_tests(raw: Any) -> list[dict]:
    """A test-case field as a list of dicts. Accepts the JSON text, an already-parsed
    list, or base64(zlib(pickle(JSON text))). ValueError when malformed, UnsafePickle
    when the pickle asks for a global."""
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        raise ValueError("test cases are neither a list nor a string")
    text = raw.strip()
    if text.startswith("["):
        return _as_list(json.loads(text))
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        pickled = inflater.decompress(packed, MAX_DECOMPRESSED_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError("compressed test cases are too large")
    except (binascii.Error, UnicodeEncodeError, zlib.error) as err:
        raise ValueError(f"test cases are neither JSON nor base64+zlib: {err}") from None
    try:
        value = safe_unpickle(pickled)
    except UnsafePickle:
        raise
    except Exception as err:  # a corrupt pickle can raise almost anything; never a global
        raise ValueError(f"bad pickle: {type(err).__name__}") from None
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return _as_list(json.loads(value) if isinstance(value, str) else value)


def _as_list(value: Any) -> list[dict]:
    if not isinstance(value, list):
        raise ValueError("test cases are not a list")
    return value


def _tests(cases: list[dict]) -> list[TestCase]:
    out = []
    for c in cases:
        if not (isinstance(c, dict) and isinstance(c.get("input"), str) and isinstance(c.get("output"), str)):
            raise ValueError("a test case lacks string input/output")
        kind = c.get("testtype", "stdin")
        if kind not in ("stdin", "functional"):
            raise ValueError(f"unknown testtype {kind!r}")
        out.append(TestCase(input=c["input"], output=c["output"], kind=kind))
    return out


def _parse_date(v: Any) -> date:
    if not isinstance(v, str):
        raise ValueError("contest_date is not a string")
    return datetime.fromisoformat(v.replace("Z", "+00:00")).date()


def parse_row(row: Any) -> LcbProblem:
    """One JSONL row as a problem; ValueError (or UnsafePickle) naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError("row is not an object")
    for key in ("question_id", "question_content"):
        if not isinstance(row.get(key), (str, int)) or not str(row[key]).strip():
            raise ValueError(f"missing {key}")
    difficulty = str(row.get("difficulty", "")).lower()
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty {row.get('difficulty')!r}")
    public = _tests(decode_tests(row.get("public_test_cases", "[]")))
    private = _tests(decode_tests(row.get("private_test_cases", "[]") or "[]"))
    tests = public + private
    if not tests:
        raise ValueError("no test cases")
    kinds = {t.kind for t in tests}
    if len(kinds) != 1:
        raise ValueError("mixed stdin and functional tests")
    meta = row.get("metadata") or "{}"
    meta = json.loads(meta) if isinstance(meta, str) else meta
    func_name = meta.get("func_name") if isinstance(meta, dict) else None
    if kinds == {"functional"}:
        if not isinstance(func_name, str) or not func_name.isidentifier():
            raise ValueError("functional tests without metadata.func_name")
        for t in tests:  # each input line must be a JSON value, the output one too
            json.loads(t.output)
            [json.loads(line) for line in t.input.split("\n") if line.strip()]
    return LcbProblem(
        question_id=str(row["question_id"]),
        title=str(row.get("question_title") or ""),
        content=str(row["question_content"]),
        platform=str(row.get("platform") or ""),
        contest_id=str(row.get("contest_id") or ""),
        contest_date=_parse_date(row.get("contest_date")),
        difficulty=difficulty,
        starter_code=str(row.get("starter_code") or ""),
        func_name=func_name if kinds == {"functional"} else None,
        tests=tuple(tests),
        num_public=len(public),
    )


def load_lcb(
    path: str | Path,
    *,
    date_from: date | None = None,
    date_to: date | None = None,
    difficulties: Iterable[str] | None = None,
) -> tuple[list[LcbProblem], LoadStats]:
    """Problems of a LiveCodeBench JSONL file whose contest_date lies in
    [date_from, date_to] (inclusive, either open) and whose difficulty is listed, in file
    order, and the counts of what was skipped and why. OSError if the file can't be read."""
    wanted = set(difficulties) if difficulties else set(DIFFICULTIES)
    stats, problems, seen = LoadStats(), [], set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            stats.rows += 1
            try:
                row = json.loads(line)
                if isinstance(row, dict) and not stats.columns:
                    stats.columns = list(row)
                prob = parse_row(row)
            except UnsafePickle:
                stats.skip("unsafe pickle", unsafe=True)
                continue
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
                stats.skip(str(err).split(":")[0][:60] or type(err).__name__)
                continue
            if prob.question_id in seen:
                stats.skip("duplicate question_id")
                continue
            seen.add(prob.question_id)
            if (date_from and prob.contest_date < date_from) or (date_to and prob.contest_date > date_to):
                stats.filtered_date += 1
                continue
            if prob.difficulty not in wanted:
                stats.filtered_difficulty += 1
                continue
            problems.append(prob)
    stats.loaded = len(problems)
    return problems, stats


def lcb_prompt(p: LcbProblem) -> str:
    """The prompt a model sees, in the spirit of LiveCodeBench's generation prompt."""
    head = f"### Question:\n{p.content.strip()}\n\n"
    if p.func_name:
        return (
            head + "### Format: Complete the starter code below. Put your whole solution in one "
            f"```python block.\n```python\n{p.starter_code.rstrip()}\n```\n\n### Answer:\n"
        )
    return (
        head + "### Format: Read the input from stdin, solve the problem and write the answer to "
        "stdout. Put your whole program in one ```python block.\n\n### Answer:\n"
    )
