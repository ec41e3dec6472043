"""Find systems by name through the ``bagpipe.systems`` entry-point group.

An outside package adds a system by declaring, in its own ``pyproject.toml``::

    [project.entry-points."bagpipe.systems"]
    my_system = "my_package.module:MySystem"

A checkout that is not installed (the bare GPU machine runs ``python -m bagpipe.bench`` from the
repository root, with no pip install) finds the systems its own ``pyproject.toml`` declares.
"""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from bagpipe.core.interface import System

ENTRY_POINT_GROUP = "bagpipe.systems"


class UnknownSystemError(KeyError):
    """A system name that no installed package registers."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def registered_systems() -> list[str]:
    return sorted(_registered())


def load_system(name: str) -> type[System]:
    found = _registered()
    if name not in found:
        raise UnknownSystemError(f"no system {name!r}; registered: {sorted(found)}")
    system = found[name].load()
    if not (isinstance(system, type) and issubclass(system, System)):
        raise TypeError(f"entry point {name!r} -> {system!r} is not a bagpipe.core.System subclass")
    return system


def _registered() -> dict[str, EntryPoint]:
    """The installed entry points; none installed, those of this checkout's ``pyproject.toml``."""
    installed = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return installed or checkout_entry_points(Path(__file__).resolve().parents[2] / "pyproject.toml")


def checkout_entry_points(pyproject: Path) -> dict[str, EntryPoint]:
    """The ``bagpipe.systems`` entry points ``pyproject`` declares (none if there is no file)."""
    if not pyproject.is_file():
        return {}
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    return {
        name: EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
        for name, value in declared.items()
    }
