"""The mutation report keeps what it cannot remeasure: a module whose work folder is not here
keeps its survivors' section from the page written before."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bagpipe.bench import mutants_report
from bagpipe.bench.mutants_report import COLUMNS, report

EARLIER = """# Mutation testing

| module | mutants |
|---|---|

## Before and after

| module | caught_pct_before |
|---|---|

## meter (`bagpipe/core/meter.py`)

No survivors.

## het cache (`baselines/het/cache.py`)

* `baselines.het.cache.x__mutmut_1`: not caught.

  ```diff
  ## not a heading: a line of the diff
  ```
"""


def test_a_module_without_a_work_folder_keeps_its_earlier_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mutants_report, "WORK", tmp_path / "no-work-folders")
    (tmp_path / "mutants.md").write_text(EARLIER)
    frame = pd.DataFrame([{column: 0 for column in COLUMNS} | {"module": module, "caught_pct": 90.0}
                          for module in ("meter", "het cache", "fae scheduler")])
    report(frame, tmp_path)
    page = (tmp_path / "mutants.md").read_text()
    assert "## meter (`bagpipe/core/meter.py`)\n\nNo survivors.\n" in page
    assert EARLIER[EARLIER.index("## het cache"):] in page
    assert "## fae scheduler\n\nNo work folder here, no earlier section.\n" in page
    assert page.count("## Before and after") <= 1
