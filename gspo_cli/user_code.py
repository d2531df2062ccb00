"""Functions from the user's code, named FILE.py:NAME (a Python file, imported once under a name of
its own) or module:NAME (an importable module): reward functions and environments load them here,
with the same one-line messages. Whatever the user's code prints while it is imported or called goes
to standard error (`output_to_stderr`): standard output is the command's own (`--json`)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError


def load_function(function: str, where: str) -> tuple[Callable, str | None]:
    """(the function `function` names, the absolute path of its file or None for a module).
    SpecError in one line starting with `where` when the file or module is missing or fails to
    import, or NAME is not a callable in it."""
    target, name = function.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise SpecError(f"{where}: no such file {target}")
        module_name = "gspo_rewards_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        try:
            with output_to_stderr():  # a module-level print is no part of the command's output
                spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - the user's file: one line, naming it
            raise SpecError(f"{where}: {target} fails to import ({type(err).__name__}: {err})") from None
        file = str(path.resolve())
    else:
        try:
            with output_to_stderr():
                module = importlib.import_module(target)
        except ModuleNotFoundError as err:
            raise SpecError(f"{where}: no module {target!r} ({err})") from None
        except Exception as err:  # noqa: BLE001 - the user's module: one line, naming it
            raise SpecError(f"{where}: module {target} fails to import ({type(err).__name__}: {err})") from None
        file = None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        what = "is not callable" if fn is not None else "is not defined"
        raise SpecError(f"{where}: {name} {what} in {target}; its functions: {', '.join(found) or 'none'}")
    return fn, file


_redirect_lock = threading.Lock()
_redirect: dict[str, Any] = {"depth": 0}  # nested and concurrent callers share one redirection


@contextlib.contextmanager
def output_to_stderr() -> Iterator[None]:
    """While the block runs, whatever it writes to standard output (print, sys.stdout, file
    descriptor 1: a subprocess it starts) goes to standard error. Process-wide: another thread
    writing to standard output meanwhile is redirected too."""
    with _redirect_lock:
        if _redirect["depth"] == 0:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            _redirect["stdout"], sys.stdout = sys.stdout, sys.stderr
            try:
                _redirect["fd"] = os.dup(1)
                os.dup2(2, 1)
            except OSError:  # no file descriptor 1 or 2: Python's level is all there is
                _redirect["fd"] = None
        _redirect["depth"] += 1
    try:
        yield
    finally:
        with _redirect_lock:
            _redirect["depth"] -= 1
            if _redirect["depth"] == 0:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                if _redirect["fd"] is not None:
                    os.dup2(_redirect["fd"], 1)
                    os.close(_redirect["fd"])
                sys.stdout = _redirect["stdout"]


# The user's code the main thread runs now (innermost last), and the stop it owes: a stop signal
# abandons such a call at once (`abandon`, from the signal handler) instead of waiting for it and
# then a whole step; a call that swallows the exception is stopped when it returns.
_running: list[str] = []
_abandoned: list[str] = []


@contextlib.contextmanager
def user_call(what: str) -> Iterator[None]:
    """Marks the main thread running the user's code `what` (e.g. "reward slow_judge"): a stop signal
    in it raises InterruptedRun at once (`abandon`); if that code catches it and goes on, the stop is
    raised when it returns or fails. Other threads are not marked: a signal reaches the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _running.append(what)
    try:
        yield
    except BaseException:
        if _abandoned:
            raise _interrupted(_abandoned.pop()) from None
        raise
    finally:
        _running.pop()
    if _abandoned:
        raise _interrupted(_abandoned.pop())


def abandon(signal_name: str) -> None:
    """From a stop signal's handler (the main thread): InterruptedRun when the main thread is in the
    user's code (`user_call`), else nothing (the loop stops at its next safe point)."""
    if _running:
        _abandoned[:] = [f"stopped by {signal_name} while {_running[-1]} ran"]
        raise _interrupted(_abandoned[0])


def _interrupted(message: str) -> Exception:
    from gspo_cli.errors import InterruptedRun

    return InterruptedRun(
        f"{message}: the call was abandoned and this step is lost; its run keeps the last checkpoint: rerun the "
        "same command to resume"
    )
