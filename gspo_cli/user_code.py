"""Functions from the user's code, named FILE.py:NAME (a Python file, imported once under a name of
its own) or module:NAME (an importable module): reward functions and environments load them here,
with the same one-line messages."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

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
            spec.loader.exec_module(module)
        except Exception as err:  # noqa: BLE001 - the user's file: one line, naming it
            raise SpecError(f"{where}: {target} fails to import ({type(err).__name__}: {err})") from None
        file = str(path.resolve())
    else:
        try:
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
