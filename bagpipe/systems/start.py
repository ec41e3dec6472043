"""Where a system starts: the seeded initial weights, or a checkpoint's (``ctx.resume``).

Every system builds its tables and dense replicas through these functions (or, for a role that
holds part of one table, :func:`start_table`), so a run restarted from a checkpoint starts from
exactly the weights the interrupted run had, wherever the system keeps them. A system whose roles
plan ahead over the data (Bagpipe's oracle) hands them :class:`SourceTail`, the stream from the
resumed step on, and numbers its steps from there.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from bagpipe.core.batch import Batch, DatasetSchema
from bagpipe.core.system import ModelState
from bagpipe.data.source import BatchSource
from bagpipe.models import ModelConfig, RecModel, build_dense_model, initial_table

__all__ = ["SourceTail", "start_dense_model", "start_table", "start_tables"]


def start_table(
    schema: DatasetSchema, table_index: int, dim: int, seed: int, resume: ModelState | None
) -> torch.Tensor:
    """Table number ``table_index`` (``[rows, dim]``, a tensor the caller may modify)."""
    name, rows = schema.table_names[table_index], schema.table_sizes[table_index]
    if resume is None:
        return initial_table(rows, dim, seed, table_index)
    table = resume.tables.get(name)
    if table is None or tuple(table.shape) != (rows, dim):
        shape = None if table is None else tuple(table.shape)
        raise ValueError(
            f"resume state: table {name!r} has shape {shape}, the schema wants {(rows, dim)}"
        )
    return table.clone()


def start_tables(
    schema: DatasetSchema, dim: int, seed: int, resume: ModelState | None
) -> dict[str, torch.Tensor]:
    """Every table, keyed by table name (see :func:`start_table`)."""
    return {
        name: start_table(schema, index, dim, seed, resume)
        for index, name in enumerate(schema.table_names)
    }


def start_dense_model(
    cfg: ModelConfig, schema: DatasetSchema, seed: int, resume: ModelState | None
) -> RecModel:
    """The dense part, seeded, then loaded with the checkpoint's weights when resuming."""
    model = build_dense_model(cfg, schema, seed)
    if resume is not None:
        model.load_state_dict(resume.dense)
    return model


class SourceTail:
    """Batches ``first, first + 1, ...`` of ``source`` as a source of their own (index 0 = ``first``).

    Random access makes this free: a resumed run's planner sees exactly the stream the
    interrupted run's planner saw from that step on.
    """

    def __init__(self, source: BatchSource, first: int) -> None:
        if not 0 <= first <= len(source):
            raise ValueError(f"resume step {first} is outside the source's {len(source)} batches")
        self.source = source
        self.first = first
        self.schema = source.schema
        self.batch_size = source.batch_size

    def __len__(self) -> int:
        return len(self.source) - self.first

    def __getitem__(self, index: int) -> Batch:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of a {len(self)}-batch tail")
        return self.source[self.first + index]

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(len(self)))
