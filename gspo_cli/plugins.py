"""Rewards and tasks from installed packages, registered by entry point.

A package declares them in its pyproject.toml:

    [project.entry-points."gspo_cli.rewards"]
    length = "mypkg.rewards:length_penalty"   # a reward function in TRL's convention
    [project.entry-points."gspo_cli.tasks"]
    riddles = "mypkg.tasks:RiddleTask"        # a Task class, or any callable(**params) -> Task

and a spec names them like the built-ins (`function: length`, `task.name: riddles`).

Plugins are read only when a spec names something no built-in is, and by `gspo plugins`: an
installed plugin costs nothing, and a broken one breaks nothing, until it is named. A plugin
whose name a built-in has is refused (the built-in is the one used), and so is a name two
packages register. Spec validation and the generated reference never look here: a plugin
changes what a spec may name, never what a spec means.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from gspo_cli.errors import SpecError

REWARDS_GROUP = "gspo_cli.rewards"
TASKS_GROUP = "gspo_cli.tasks"
KIND = {REWARDS_GROUP: "reward", TASKS_GROUP: "task"}


@dataclass(frozen=True)
class Registered:
    """One name a spec may use: a built-in's or a plugin's. `origin`: "built-in" or the
    package that registers it ("mypkg 0.1"); `target`: where the object lives
    ("mypkg.rewards:length_penalty"); `problem`: why a plugin is not usable (None: it is)."""

    kind: str
    name: str
    origin: str
    target: str
    problem: str | None = None


def plugin_names(group: str) -> list[str]:
    """The names installed packages register in `group`, read from their metadata (nothing is
    imported)."""
    return sorted({ep.name for ep in metadata.entry_points(group=group)})


def load_plugin(group: str, name: str) -> Any | None:
    """The callable the plugin `name` of `group` registers, imported now; None when no
    installed package registers `name`. SpecError in one line naming the plugin, its package
    and the error when it cannot be imported or is not callable, or when two packages
    register `name`. Call it only for names no built-in has (a built-in wins)."""
    eps = [ep for ep in metadata.entry_points(group=group) if ep.name == name]
    if not eps:
        return None
    if len(eps) > 1:
        who = ", ".join(f"{_package(ep)} ({ep.value})" for ep in eps)
        raise SpecError(
            f"plugin {KIND[group]} {name!r} is registered by several packages: {who}; uninstall all but one"
        )
    obj, problem = _load(eps[0])
    if problem is not None:
        raise SpecError(f"plugin {KIND[group]} {name!r} ({_package(eps[0])}, {eps[0].value}) {problem}")
    return obj


def survey(group: str, builtins: Mapping[str, Any]) -> list[Registered]:
    """Every name of `group`: the built-ins, then each installed plugin, imported now to say
    whether it works (its `problem` says why not: broken, a built-in's name, or a name another
    package registers too). Sorted by name; never raises for a plugin's fault."""
    kind = KIND[group]
    out = [Registered(kind, n, "built-in", _where(obj)) for n, obj in builtins.items()]
    eps = list(metadata.entry_points(group=group))
    for ep in eps:
        others = [_package(o) for o in eps if o.name == ep.name and o is not ep]
        if ep.name in builtins:
            problem = f"refused: the built-in {kind} {ep.name} has this name (the built-in is used)"
        elif others:
            problem = f"refused: {', '.join(others)} registers {ep.name} too"
        else:
            problem = _load(ep)[1]
        out.append(Registered(kind, ep.name, _package(ep), ep.value, problem))
    return sorted(out, key=lambda r: (r.name, r.origin != "built-in"))


def _load(ep: metadata.EntryPoint) -> tuple[Any, str | None]:
    """(the entry point's object, None) or (None, what is wrong with it, in one line)."""
    try:
        obj = ep.load()
    except Exception as err:  # noqa: BLE001 - a plugin's import: one line naming it, never a traceback
        return None, f"is broken: {type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    if not callable(obj):
        return None, f"is broken: {ep.value} is a {type(obj).__name__}, not a function or class"
    return obj, None


def _package(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unnamed package"


def _where(obj: Any) -> str:
    """`module:name` of a built-in; its module only when its own name is private."""
    name = getattr(obj, "__qualname__", "")
    return obj.__module__ if name.startswith("_") or not name else f"{obj.__module__}:{name}"
