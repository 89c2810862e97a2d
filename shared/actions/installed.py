"""The actions a worker can run, by name: the built-ins (``jobfence.actions.builtin``) and
those installed as entry points of the ``jobfence.actions`` group, read once per process.
An installed action may not shadow a built-in. Apart from the protocol
(``jobfence.actions``), which the built-ins themselves implement."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from jobfence.actions import ENTRY_POINT_GROUP, Action
from jobfence.errors import InvalidSpec


@cache
def registry() -> Mapping[str, Action]:
    """Built-ins plus installed actions; an installed action may not shadow a built-in."""
    from importlib.metadata import entry_points

    from jobfence.actions.builtin import BUILTINS

    actions: dict[str, Action] = dict(BUILTINS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in actions:
            continue
        loaded = ep.load()
        action = loaded() if isinstance(loaded, type) else loaded
        if not isinstance(action, Action):
            raise TypeError(f"entry point {ep.value} is not a jobfence action")
        actions[ep.name] = action
    return actions


def get_action(name: str) -> Action:
    actions = registry()
    try:
        return actions[name]
    except KeyError:
        known = ", ".join(sorted(actions))
        raise InvalidSpec(f"unknown action {name!r} (known: {known})") from None
