"""``small_pages``: off inside, the previous advice back after."""

from __future__ import annotations

from numpy._core.multiarray import _set_madvise_hugepage  # type: ignore[attr-defined]

from bagpipe.core.memory import small_pages


def test_small_pages_restore_numpys_huge_page_advice() -> None:
    before = _set_madvise_hugepage(True)
    try:
        with small_pages():
            assert _set_madvise_hugepage(False) is False  # off inside
        assert _set_madvise_hugepage(True) is True  # restored
    finally:
        _set_madvise_hugepage(before)
