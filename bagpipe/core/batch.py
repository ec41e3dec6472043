"""The batch currency: torchrec's ``Batch`` (dense, ``KeyedJaggedTensor``, labels) plus small helpers.

Every dataset here is one-hot: each example has exactly one id per categorical feature (a missing value
is its own row, id 0, as in DLRM's preprocessing). The KJT is laid out feature-major, as torchrec's
Criteo pipeline does::

    keys    = ["cat_0", "cat_1"]          F = 2 features, B = 3 examples
    values  = [a0 a1 a2 | b0 b1 b2]        F * B ids, feature-major
    lengths = [1  1  1  | 1  1  1 ]         all ones

``ids_matrix`` turns it back into a dense ``[B, F]`` id matrix, which is what the oracle, the caches
and the embedding servers work on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from bagpipe.core.torchrec_api import Batch, KeyedJaggedTensor

if TYPE_CHECKING:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


class _FxTracingNotice(logging.Filter):
    """Drops torch's notice that ``is_fx_tracing`` is deprecated: torch's own metaclass of
    ``KeyedJaggedTensor`` calls it for every KJT built, so every process would print it once
    although nothing here traces (only that message is dropped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("is_fx_tracing will return true")


logging.getLogger("torch.fx._symbolic_trace").addFilter(_FxTracingNotice())

__all__ = [
    "Batch",
    "DatasetSchema",
    "batch_from_arrays",
    "global_ids",
    "ids_matrix",
    "slice_batch",
    "slice_bounds",
    "split_batch",
]


@dataclass(frozen=True)
class DatasetSchema:
    """The shape of a dataset: dense width and one embedding table per categorical feature.

    Table ``i`` is named ``t_<feature>`` and serves feature ``feature_names[i]`` (torchrec's
    ``EmbeddingBagConfig`` convention).
    """

    name: str
    num_dense: int
    table_sizes: tuple[int, ...]
    feature_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.table_sizes) != len(self.feature_names):
            raise ValueError(
                f"schema {self.name!r}: {len(self.table_sizes)} table sizes for "
                f"{len(self.feature_names)} features"
            )

    @property
    def num_tables(self) -> int:
        return len(self.table_sizes)

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(f"t_{feature}" for feature in self.feature_names)

    @property
    def total_rows(self) -> int:
        return sum(self.table_sizes)

    @property
    def table_offsets(self) -> torch.Tensor:
        """``[F]`` int64: where each table starts in the flat global row space.

        Systems that store or cache rows of all tables together address them by *global id*
        ``table_offsets[f] + row``: one ``unique`` over a batch instead of one per table.
        """
        sizes = torch.tensor((0, *self.table_sizes[:-1]), dtype=torch.int64)
        return torch.cumsum(sizes, dim=0)

    def embedding_configs(self, embedding_dim: int) -> list[EmbeddingBagConfig]:
        """torchrec's table configs (for its ``EmbeddingBagCollection``; needs torchrec)."""
        from torchrec.modules.embedding_configs import EmbeddingBagConfig

        return [
            EmbeddingBagConfig(
                name=table, embedding_dim=embedding_dim, num_embeddings=rows, feature_names=[feature]
            )
            for table, rows, feature in zip(
                self.table_names, self.table_sizes, self.feature_names, strict=True
            )
        ]


def batch_from_arrays(
    dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor, keys: tuple[str, ...] | list[str]
) -> Batch:
    """Build a one-hot ``Batch`` from ``dense [B, D]``, ``ids [B, F]`` (int64) and ``labels [B]``."""
    batch_size, num_features = ids.shape
    if num_features != len(keys):
        raise ValueError(f"ids have {num_features} columns for {len(keys)} keys")
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys),
        values=ids.t().reshape(-1).to(torch.int64),
        lengths=torch.ones(batch_size * num_features, dtype=torch.int32),
    )
    return Batch(dense_features=dense, sparse_features=sparse, labels=labels)


def ids_matrix(batch: Batch) -> torch.Tensor:
    """The ``[B, F]`` id matrix of a one-hot batch (feature ``f`` in column ``f``)."""
    kjt = batch.sparse_features
    num_features = len(kjt.keys())
    return kjt.values().view(num_features, -1).t()


def global_ids(batch: Batch, schema: DatasetSchema) -> torch.Tensor:
    """The ``[B, F]`` ids of a batch in the flat global row space (see ``table_offsets``)."""
    return ids_matrix(batch) + schema.table_offsets


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Examples ``start:stop`` of a one-hot batch, as a new ``Batch``."""
    return batch_from_arrays(
        _rows(batch.dense_features, start, stop),
        ids_matrix(batch)[start:stop],
        batch.labels[start:stop],
        batch.sparse_features.keys(),
    )


def _rows(tensor: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` as a view, or as a tensor of its own when they hold no element (a
    dataset without dense features): a ``[B, 0]`` view keeps a storage offset into an empty
    storage, which the RPC receiver's unpickler refuses, aborting the process."""
    rows = tensor[start:stop]
    return rows.clone() if rows.numel() == 0 else rows


def slice_bounds(size: int, part: int, parts: int) -> tuple[int, int]:
    """``(start, stop)`` of trainer slice ``part`` of ``parts`` in a global batch of ``size``.

    The one definition of "a trainer's slice": ``split_batch`` cuts with it, and every
    ``BatchSource.slice`` reads exactly these rows, so the two always agree.
    """
    if not 0 <= part < parts:
        raise ValueError(f"slice {part} of {parts}: need 0 <= part < parts")
    if size % parts:
        raise ValueError(f"global batch {size} does not split into {parts} equal trainer slices")
    step = size // parts
    return part * step, (part + 1) * step


def split_batch(batch: Batch, parts: int) -> list[Batch]:
    """Split a global batch into ``parts`` contiguous, equal slices (one per trainer).

    Equal slices keep "mean loss over the global batch" identical to the average of per-trainer
    means, which the equivalence tests rely on.
    """
    size = batch.labels.shape[0]
    return [slice_batch(batch, *slice_bounds(size, k, parts)) for k in range(parts)]
