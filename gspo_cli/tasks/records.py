"""Rows of a dataset file, whatever it was exported as: JSONL, a JSON list, parquet, a
`datasets` directory written by ``save_to_disk``, or the hub.

Every task with real data reads its rows here, so each format is handled (and fails with
one clear line naming the file) in one place. Rows come back as plain dicts with their
keys lower-cased, so `Problem` / `problem` / `PROBLEM` are one column; a row holding two of
them is refused (one would silently replace the other).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.files import iter_lines, read_text

HUB_PREFIX = "hub:"


def load_records(source: str, *, split: str = "train", field: str = "task.params.source") -> list[dict[str, Any]]:
    """Rows of `source`: a local ``.jsonl``/``.ndjson``, ``.json`` (a list of objects, or an object
    holding one under ``data``/``rows``/``problems``), ``.parquet`` file, a directory written by
    `datasets`' ``save_to_disk`` (a Dataset, or a DatasetDict whose `split` is read; its arrow
    files are read with pyarrow, no `datasets` needed), or ``hub:<dataset id>`` (needs the
    optional `datasets` package; uses its cache when offline).

    Any problem (missing file, bad JSON, unknown format, missing package) is a SpecError
    naming `field` and the file.
    """
    if source.startswith(HUB_PREFIX):
        rows = _load_hub(source[len(HUB_PREFIX) :], split, field)
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            rows = _load_saved_dataset(path, split, field)
        elif not path.is_file():
            raise SpecError(f"{field}: no such file {source} (use synthetic, a .jsonl/.json/.parquet file or hub:<id>)")
        elif (suffix := path.suffix.lower()) in (".jsonl", ".ndjson"):
            rows = _load_jsonl(path, field)
        elif suffix == ".json":
            rows = _load_json(path, field)
        elif suffix == ".parquet":
            rows = _load_parquet(path, field)
        else:
            raise SpecError(
                f"{field}: {source}: unknown format {suffix or '(no suffix)'}; expected .jsonl, .json or .parquet"
            )
    return [_lower_cased(row, i, source, field) for i, row in enumerate(rows)]


def _lower_cased(row: dict, i: int, source: str, field: str) -> dict[str, Any]:
    """`row` with its keys lower-cased and its values plain. SpecError naming both columns when
    two differ only in case (`Solution` would silently replace `solution`)."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        name = str(k).lower()
        if name in out:
            first = next(str(o) for o in row if str(o).lower() == name)
            raise SpecError(
                f"{field}: {source}: columns {first!r} and {str(k)!r} differ only in case (row {i}); column names "
                "are read in lower case, so one would replace the other: rename or drop one"
            )
        out[name] = _plain(v)
    return out


def columns_of(rows: list[dict[str, Any]]) -> list[str]:
    """The column names of `rows` (first-seen order, at most the first 50 rows looked at)."""
    seen: dict[str, None] = {}
    for row in rows[:50]:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _load_saved_dataset(path: Path, split: str, field: str) -> list[dict]:
    """Rows of a `save_to_disk` directory: state.json lists the arrow files (IPC streams)."""
    if (path / "dataset_dict.json").is_file():  # a DatasetDict: one folder per split
        splits = json.loads(read_text(path / "dataset_dict.json", field)).get("splits", [])
        if split not in splits:
            raise SpecError(f"{field}: {path}: no split {split!r} (it has: {', '.join(splits) or 'none'})")
        path = path / split
    state = path / "state.json"
    if not state.is_file():
        raise SpecError(
            f"{field}: {path}: is a directory, not a dataset file or a save_to_disk directory (no state.json)"
        )
    try:
        import pyarrow as pa

        files = [f["filename"] for f in json.loads(read_text(state, field)).get("_data_files", [])]
        rows: list[dict] = []
        for name in files:
            with pa.memory_map(str(path / name)) as src:
                rows += pa.ipc.open_stream(src).read_all().to_pylist()
        return rows
    except ImportError as err:
        raise SpecError(f"{field}: reading {path} needs pyarrow (pip install pyarrow): {err}") from None
    except SpecError:
        raise
    except Exception as err:  # noqa: BLE001 - a corrupt or foreign directory: say so, naming it
        raise SpecError(f"{field}: {path}: not a readable saved dataset ({type(err).__name__}: {err})") from None


def _load_jsonl(path: Path, field: str) -> list[dict]:
    rows = []
    for lineno, line in enumerate(iter_lines(path, field), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpecError(f"{field}: {path}:{lineno}: not JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise SpecError(f"{field}: {path}:{lineno}: expected a JSON object per line")
        rows.append(row)
    return rows


def _load_json(path: Path, field: str) -> list[dict]:
    try:
        data = json.loads(read_text(path, field))
    except json.JSONDecodeError as err:
        raise SpecError(f"{field}: {path}: not JSON ({err.msg}, line {err.lineno})") from None
    if isinstance(data, dict):
        data = next((data[k] for k in ("data", "rows", "problems") if isinstance(data.get(k), list)), None)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise SpecError(f"{field}: {path}: expected a JSON list of objects")
    return data


def _load_parquet(path: Path, field: str) -> list[dict]:
    try:
        import pandas as pd

        return pd.read_parquet(path).to_dict(orient="records")
    except ImportError as err:
        raise SpecError(f"{field}: reading {path} needs pyarrow (pip install pyarrow): {err}") from None
    except Exception as err:  # noqa: BLE001 - a corrupt or foreign file: say so, naming it
        raise SpecError(f"{field}: {path}: not a readable parquet file ({type(err).__name__}: {err})") from None


def _load_hub(dataset_id: str, split: str, field: str) -> list[dict]:
    try:
        import datasets  # optional: only hub sources need it
    except ImportError:
        raise SpecError(
            f"{field}: hub:{dataset_id} needs the `datasets` package (pip install datasets), "
            "or export the dataset to a local .jsonl/.parquet file"
        ) from None
    try:
        return [dict(r) for r in datasets.load_dataset(dataset_id, split=split)]
    except Exception as err:  # noqa: BLE001 - offline, unknown id, unknown split: one line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SpecError(f"{field}: cannot load hub:{dataset_id} (split {split!r}): {first}") from None


def _plain(v: Any) -> Any:
    """numpy scalars (parquet) -> Python values; NaN (pandas' missing) -> None."""
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
