"""Systems are found by name through the ``bagpipe.systems`` entry points."""

from __future__ import annotations

import pytest

from bagpipe.core import System, UnknownSystemError, load_system, registered_systems


def test_local_is_registered() -> None:
    assert "local" in registered_systems()
    system = load_system("local")
    assert issubclass(system, System)
    assert system.name == "local"


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownSystemError) as error:
        load_system("no_such_system")
    message = str(error.value)
    assert "no_such_system" in message
    assert "local" in message


def test_a_checkout_that_is_not_installed_finds_the_systems_its_pyproject_declares() -> None:
    """The bare GPU machine runs from a checkout without pip install: the same names load."""
    from pathlib import Path

    from bagpipe.core.registry import checkout_entry_points

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    declared = checkout_entry_points(pyproject)
    assert sorted(declared) == registered_systems()
    assert declared["local"].load() is load_system("local")
    assert checkout_entry_points(pyproject.parent / "no-such.toml") == {}
