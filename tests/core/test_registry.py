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
