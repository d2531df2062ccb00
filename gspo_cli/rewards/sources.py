"""Where a reward function comes from when it is not one we ship: the user's code (FILE.py:NAME,
module:NAME) or an installed package's plugin (group gspo_cli.rewards); and the list of every
reward and task a spec may name (`registered`, for `gspo plugins`)."""

from __future__ import annotations

from collections.abc import Callable

from gspo_cli.errors import SpecError
from gspo_cli.plugins import REWARDS_GROUP, TASKS_GROUP, Registered, load_plugin, plugin_names, survey
from gspo_cli.rewards.shipped import SHIPPED
from gspo_cli.tasks import TASKS
from gspo_cli.user_code import load_function


def load_source(source: str) -> Callable:
    """The function a `Reward.source` names (in a reward pool worker): FILE.py:NAME (an absolute
    path), module:NAME or a plugin's name."""
    where = f"reward {source}"
    return plugin_reward(source, where) if ":" not in source else load_function(source, where)[0]


def plugin_reward(name: str, where: str) -> Callable:
    """The reward function an installed package registers as `name` (a plugin: TRL's convention)."""
    try:
        fn = load_plugin(REWARDS_GROUP, name)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None
    if fn is None:
        plugins = plugin_names(REWARDS_GROUP)
        raise SpecError(
            f"{where}: {name!r} is no shipped reward ({', '.join(SHIPPED)})"
            + (f" nor plugin reward ({', '.join(plugins)})" if plugins else "")
            + "; user code is FILE.py:NAME or module:NAME"
        )
    return fn


def registered() -> list[Registered]:
    """Every reward and task a spec may name, built-in and plugin, each plugin imported to say
    whether it works (for `gspo plugins`)."""
    return [*survey(REWARDS_GROUP, SHIPPED), *survey(TASKS_GROUP, TASKS)]
