"""A user's reward function called once, in a reward pool worker or in the trainer: TRL's keyword
arguments (`call_rows`), `async def` functions, what it may raise (`RAISED`, `error_line`: one
bounded line), where what it prints goes (`output_to_stderr`, from user_code), the row it fails on
(`failing_row`), and what it returns in a form a worker can send back (`portable`).

`async def` rewards are awaited once per call, as TRL awaits them; with `per_row` (the pool in
`task.reward_calls: chunks`) once per row instead, the rows of one call gathered concurrently
on one event loop, at most ASYNC_CONCURRENCY rows at a time.
"""

from __future__ import annotations

import asyncio
import inspect
import numbers
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gspo_cli.user_code import output_to_stderr  # noqa: F401 - where a reward's prints go, named here too

ASYNC_CONCURRENCY = 64  # rows of one call awaited at once (async def rewards called per row)
MESSAGE_CHARS = 300  # the most of an exception's message that a reward's error line quotes


def is_async(fn: Callable) -> bool:
    """An `async def` function (or an object whose __call__ is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(vars(type(fn)).get("__call__"))


def call_rows(fn: Callable, kwargs: dict[str, Any], n: int, per_row: bool = False) -> Any:
    """`fn(**kwargs)` on n rows (TRL's keyword arguments: lists of n values, and trainer_state),
    an `async def` fn awaited on an event loop of its own; with `per_row` an `async def` fn once
    per row, the n calls gathered on one event loop, their answers joined."""
    if not is_async(fn):
        return fn(**kwargs)
    coro = _gathered(fn, kwargs, n) if per_row else fn(**kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual case
        return asyncio.run(coro)
    out: dict[str, Any] = {}  # a loop runs here already (a notebook): use a thread of our own

    def run() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as err:  # noqa: BLE001 - raised again below
            out["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def row_slice(kwargs: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    """The keyword arguments of `rows` only (lists sliced; trainer_state kept)."""
    return {k: [v[i] for i in rows] if isinstance(v, list) else v for k, v in kwargs.items()}


async def _gathered(fn: Callable, kwargs: dict[str, Any], n: int) -> Any:
    gate = asyncio.Semaphore(ASYNC_CONCURRENCY)

    async def one(i: int):
        async with gate:
            return await fn(**row_slice(kwargs, [i]))

    answers = await asyncio.gather(*(one(i) for i in range(n)))
    values: list = []
    for got in answers:
        try:
            values.extend(list(got))
        except TypeError:  # not a list: what the caller's check reports
            return got
    return values


def failing_row(fn: Callable, kwargs: dict[str, Any], n: int) -> int:
    """The first row on which `fn` raises when called on that row alone (0 when none does)."""
    for i in range(n):
        try:
            call_rows(fn, row_slice(kwargs, [i]), 1)
        except RAISED:
            return i
    return 0


# What a reward function may raise that ends its run in one line: sys.exit() included, which
# would otherwise end the trainer (or its worker) without a word.
RAISED = (Exception, SystemExit)


def error_line(err: BaseException) -> str:
    """`Type: the first line of its message`, the message cut to MESSAGE_CHARS characters."""
    if isinstance(err, SystemExit):
        return f"SystemExit: the function called sys.exit({err.code!r})"[: MESSAGE_CHARS + 40]
    head = str(err)[: MESSAGE_CHARS + 1]  # a message of megabytes is never split whole
    first = (head.splitlines() or [""])[0]
    if len(first) > MESSAGE_CHARS:
        first = first[:MESSAGE_CHARS] + " [cut]"
    return f"{type(err).__name__}: {first}"


class Opaque:
    """A value a worker cannot send back (not picklable): its repr and type, for the error message."""

    def __init__(self, value: Any):
        self.text, self.type_name = repr(value), type(value).__name__

    def __repr__(self) -> str:
        return self.text


def portable(got: Any) -> Any:
    """What a function returned, as the trainer can receive it: 0-d tensors and arrays as their
    number, numbers and None as they are, anything else as itself if it pickles (else Opaque).
    A mapping or a string is sent whole (the trainer refuses it), never as its keys or letters."""
    if isinstance(got, (Mapping, str, bytes)):
        return got if _pickles(got) else Opaque(got)
    try:
        items = list(got)
    except TypeError:
        return got if _pickles(got) else Opaque(got)
    out = []
    for v in items:
        if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):
            v = v.item()
        out.append(v if v is None or isinstance(v, numbers.Real) or _pickles(v) else Opaque(v))
    return out


def _pickles(v: Any) -> bool:
    try:
        pickle.dumps(v)
    except Exception:  # noqa: BLE001 - any failure: not sendable
        return False
    return True
