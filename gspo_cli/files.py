"""Reading the text files a user hands us (specs, datasets, completions, run directories).

Every reader goes through here, so a file that is not UTF-8, a directory where a file was
expected, or a file we may not read ends in the same one-line SpecError naming the file
(exit code 2), never a UnicodeDecodeError or OSError traceback.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from gspo_cli.errors import SpecError


def unreadable(path: str | Path, err: Exception, label: str = "") -> SpecError:
    """The one-line error for `err` raised while reading `path`; `label` (e.g. a spec field
    or option, `--completions`) goes first when given."""
    if isinstance(err, UnicodeDecodeError):
        why = "not a UTF-8 text file"
    elif isinstance(err, IsADirectoryError):
        why = "is a directory, not a file"
    elif isinstance(err, PermissionError):
        why = "permission denied"
    elif isinstance(err, FileNotFoundError):
        why = "no such file"
    elif isinstance(err, OSError):
        why = f"cannot read: {err.strerror or err}"
    else:
        raise TypeError(f"not a reading error: {err!r}") from err
    return SpecError(f"{label}: {path}: {why}" if label else f"{path}: {why}")


def read_text(path: str | Path, label: str = "") -> str:
    """The whole of `path` as UTF-8 text; SpecError (see `unreadable`) if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise unreadable(path, err, label) from None


def iter_lines(path: str | Path, label: str = "") -> Iterator[str]:
    """The lines of `path` as UTF-8 text, read lazily (datasets can be gigabytes), each with
    its newline; SpecError (see `unreadable`) as soon as the file fails to open or decode."""
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except (OSError, UnicodeDecodeError) as err:
        raise unreadable(path, err, label) from None


def files_digest(files: Iterable[Path]) -> str:
    """16 hex digits of sha256 over the files' names and bytes, in the order given; an unchanged
    set of files (path, size, mtime) is hashed once per process."""
    return _files_digest(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=8)
def _files_digest(files: tuple) -> str:
    h = hashlib.sha256()
    for name, _, _ in files:
        h.update(Path(name).name.encode() + b"\0")
        with open(name, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


# A file gspo writes for people to read (REPORT.md, a calibration report) ends with this line, holding
# the digest of the text above it: a file without it, or whose text no longer matches it, was written
# or edited by hand, and `write_report_file` keeps it instead of overwriting it.
_STAMP = "<!-- written by gspo: {digest} (edit it and gspo keeps your copy beside the next one) -->"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_report_file(path: str | Path, text: str) -> Path | None:
    """Write `text` (Markdown) to `path`, stamped as gspo's. An existing file that gspo did not write,
    or that was edited since, is kept first as `<stem>.edited.md` (`.edited-2.md`... when taken);
    returns where it was kept, None when nothing needed keeping."""
    path = Path(path)
    body = text if text.endswith("\n") else text + "\n"
    kept = None
    if path.exists() and not _stamped(path):
        kept = path.with_name(f"{path.stem}.edited{path.suffix}")
        n = 2
        while kept.exists():
            kept, n = path.with_name(f"{path.stem}.edited-{n}{path.suffix}"), n + 1
        path.rename(kept)
    path.write_text(body + _STAMP.format(digest=_digest(body)) + "\n")
    return kept


def _stamped(path: Path) -> bool:
    """Whether `path` is a file gspo wrote and nobody edited since."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    body, _, last = text.rstrip("\n").rpartition("\n")
    return last == _STAMP.format(digest=_digest(body + "\n"))
