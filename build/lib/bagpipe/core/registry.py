"""Find systems by name through the ``bagpipe.systems`` entry-point group.

An outside package adds a system by declaring, in its own ``pyproject.toml``::

    [project.entry-points."bagpipe.systems"]
    my_system = "my_package.module:MySystem"
"""

from __future__ import annotations

from importlib.metadata import entry_points

from bagpipe.core.interface import System

ENTRY_POINT_GROUP = "bagpipe.systems"


class UnknownSystemError(KeyError):
    """A system name that no installed package registers."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def registered_systems() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_system(name: str) -> type[System]:
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        raise UnknownSystemError(f"no system {name!r}; registered: {sorted(found)}")
    system = found[name].load()
    if not (isinstance(system, type) and issubclass(system, System)):
        raise TypeError(f"entry point {name!r} -> {system!r} is not a bagpipe.core.System subclass")
    return system
