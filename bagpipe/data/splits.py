"""Where a file dataset's evaluation rows start: fixed by the dataset, never by the run.

* Terabyte (``preset=criteo_terabyte``): the last day file is the evaluation set, as in MLPerf and
  DLRM (day 23 of ``day_0 .. day_23``); every earlier day is training data.
* Every other dataset: the trailing ``eval_fraction`` of rows (1/7 by default, DLRM's Kaggle split:
  ``train.txt`` cut into 7 "days", the 7th held out).

Both are a tail of the prepared rows, so train is rows ``0 .. start`` and eval ``start .. end``.
"""

from __future__ import annotations

from bagpipe.data.config import DatasetConfig
from bagpipe.data.shard_format import Manifest

DAY_SPLIT_PRESETS = ("criteo_terabyte",)


def eval_start(manifest: Manifest, cfg: DatasetConfig) -> int:
    """The first evaluation row of ``manifest``'s rows (see the module docstring)."""
    rows = manifest.rows
    if cfg.preset in DAY_SPLIT_PRESETS:
        if len(manifest.files) < 2:
            raise ValueError(f"dataset.path={cfg.path!r}: preset {cfg.preset!r} evaluates on its "
                             "last day file, so the path must match at least two day files "
                             "(e.g. /data/day_*)")
        start = manifest.file_first_rows()[-1]
    else:
        start = rows - max(1, round(rows * cfg.eval_fraction))
    if not 0 < start < rows:
        raise ValueError(f"dataset.path={cfg.path!r}: {rows} rows are too few to split train/eval")
    return start
