"""The run directory's JSON files, written so a crash never leaves half a record: a JSON file
replaced atomically, JSON Lines appended and flushed one record at a time, read back without a
torn last line, and rewound to a step."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gspo_cli.files import iter_lines


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_jsonl(path: Path, obj: dict[str, Any]) -> None:
    """Append one line and flush it to disk, so a crash loses at most the line being written."""
    line = json.dumps(obj, allow_nan=True) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete records (JSON objects); a torn last line (crash mid-write) is skipped, not an
    error, and so is a line that is not an object (`[1,2,3]`, `null`: not a record this code wrote).
    A missing file has none; a file that cannot be read (not UTF-8, no permission) is a
    SpecError naming it."""
    if not path.exists():
        return []
    out = []
    for line in iter_lines(path):
        if not line.endswith("\n"):
            break  # torn final line
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep only records with step <= max_step (and drop a torn tail): what a resumed run
    rewinds to, so the continued file has no duplicated or missing steps."""
    if not path.is_file():
        return
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
