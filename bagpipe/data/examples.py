"""``Examples``: a block of one-hot examples as numpy arrays, the unit readers and the generator emit.

Shapes (N examples, Dd dense columns, F categorical features)::

    labels        int8    [N]       0/1 (None for unlabelled files such as Kaggle test.txt)
    dense         float32 [N, Dd]   DLRM transform: log(max(x, 0) + 1); missing -> 0
    ids           int64   [N, F]    row id per table; 0 = missing value
    dense_raw     int64   [N, Dd]   raw integers (0 where missing), when known
    dense_missing bool    [N, Dd]   which raw values are missing, when known

Raw dense values are kept so writers can emit the raw text formats and so other dense transforms
(torchrec's ``log(x - min + 2)``) can be applied to the same data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bagpipe.core.batch import Batch, batch_from_arrays

_LOG1P_TABLE_SIZE = 1 << 16
# log1p of every small count, computed exactly as below: most raw dense values are small counts,
# so a table lookup gives the same float32 bits at a fraction of the cost of log1p
_LOG1P_TABLE = np.log1p(np.arange(_LOG1P_TABLE_SIZE, dtype=np.float64)).astype(np.float32)


def dlrm_dense_transform(raw: np.ndarray) -> np.ndarray:
    """DLRM's dense transform: negatives clamped to 0, then ``log(x + 1)`` in float64, as float32."""
    if not np.issubdtype(raw.dtype, np.integer):  # no table for fractional values
        return np.log1p(np.maximum(raw, 0).astype(np.float64)).astype(np.float32)
    out = np.take(_LOG1P_TABLE, np.clip(raw, 0, _LOG1P_TABLE_SIZE - 1))
    if raw.size and raw.max() >= _LOG1P_TABLE_SIZE:  # rare: most counts are small
        large = raw >= _LOG1P_TABLE_SIZE
        out[large] = np.log1p(raw[large].astype(np.float64)).astype(np.float32)
    return out


@dataclass(frozen=True)
class Examples:
    """A block of examples (see the module docstring for the layout)."""

    labels: np.ndarray | None
    dense: np.ndarray
    ids: np.ndarray
    dense_raw: np.ndarray | None = None
    dense_missing: np.ndarray | None = None

    @classmethod
    def from_raw(
        cls, labels: np.ndarray | None, dense_raw: np.ndarray, dense_missing: np.ndarray, ids: np.ndarray
    ) -> Examples:
        raw = np.where(dense_missing, 0, dense_raw)
        return cls(labels, dlrm_dense_transform(raw), ids, raw, dense_missing)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def take(self, index: np.ndarray | slice) -> Examples:
        """Rows ``index`` (a slice or an integer array), as new ``Examples``."""

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[index]

        return Examples(pick(self.labels), self.dense[index], self.ids[index],
                        pick(self.dense_raw), pick(self.dense_missing))

    def take_ids(self, index: np.ndarray | slice) -> np.ndarray:
        """The ``[N, F]`` ids of rows ``index`` (what a ``RowStore`` gives the oracle)."""
        return self.ids[index]

    @staticmethod
    def concat(parts: Sequence[Examples], num_dense: int, num_features: int) -> Examples:
        """Concatenate blocks (an empty sequence gives zero rows of the given widths)."""
        if not parts:
            return Examples(np.zeros(0, np.int8), np.zeros((0, num_dense), np.float32),
                            np.zeros((0, num_features), np.int64))

        def cat(arrays: list[np.ndarray | None]) -> np.ndarray | None:
            return None if any(a is None for a in arrays) else np.concatenate(arrays)  # type: ignore[arg-type]

        return Examples(
            cat([p.labels for p in parts]),
            np.concatenate([p.dense for p in parts]),
            np.concatenate([p.ids for p in parts]),
            cat([p.dense_raw for p in parts]),
            cat([p.dense_missing for p in parts]),
        )

    def to_batch(self, keys: Sequence[str]) -> Batch:
        """A torchrec ``Batch`` (labels as float32; unlabelled rows are not trainable)."""
        if self.labels is None:
            raise ValueError("these examples have no labels (an unlabelled test file?)")
        return batch_from_arrays(
            torch.from_numpy(np.ascontiguousarray(self.dense)),
            torch.from_numpy(np.ascontiguousarray(self.ids)),
            torch.from_numpy(self.labels.astype(np.float32)),
            list(keys),
        )
