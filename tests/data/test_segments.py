"""Whole-line segments (``bagpipe.data.segments``): the line numbers every reader error is built
on, and the cutting of a file into segments that lose and repeat nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bagpipe.data.errors import DataFormatError
from bagpipe.data.segments import Segment, iter_segments


@pytest.mark.parametrize(("data", "lines"), [
    (b"", 0),
    (b"a\tb\n\nc\n", 3),
    (b"a\nb", 2),  # the file's last line has no newline
    (b"a\r\nb\r\n", 2),
    (b"a\r\nb", 2),
    (b"a\rb\rc\r", 3),  # lone carriage returns end lines too
])
def test_a_segment_counts_its_physical_lines(data: bytes, lines: int) -> None:
    assert Segment(data, 1, False).num_lines() == lines


def test_nonempty_lines_number_the_rows_the_csv_parser_sees() -> None:
    segment = Segment(b"x\n\nyy\n\n\nz\n", 40, False)  # a one-character line is a row too
    assert np.array_equal(segment.nonempty_lines(), [40, 42, 45])


@pytest.mark.parametrize("data", [b"1\t2\n3\t4\n5\t6\n", b"1\t2\n3\t4\n5\t6", b"1\t22222222\n3\n",
                                  b"1\t2"])  # the last: a header line alone, with no newline
@pytest.mark.parametrize("block_bytes", [1, 3, 4, 64])
def test_segments_cut_a_file_into_whole_lines_numbered_from_one(
    tmp_path: Path, data: bytes, block_bytes: int
) -> None:
    path = tmp_path / "part.tsv"
    path.write_bytes(data)
    segments = list(iter_segments(str(path), block_bytes, skip_header=True))
    assert b"".join(s.data for s in segments) == data
    assert all(s.data.endswith(b"\n") for s in segments[:-1])
    assert [s.first_line for s in segments] == list(
        np.cumsum([1] + [s.num_lines() for s in segments[:-1]]))
    assert [s.has_header for s in segments] == [True] + [False] * (len(segments) - 1)


def test_a_missing_file_is_an_error_naming_it_at_line_one(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.tsv")
    with pytest.raises(DataFormatError, match="unreadable input") as caught:
        next(iter_segments(path, 64, skip_header=False))
    assert (caught.value.path, caught.value.line) == (path, 1)
