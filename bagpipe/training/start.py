"""Where a system starts: the seeded initial weights, or a checkpoint's (``ctx.resume``).

Every system builds its tables and dense replicas through these functions (or, for a role that
holds part of one table, :func:`start_table`), so a run restarted from a checkpoint starts from
exactly the weights the interrupted run had, wherever the system keeps them. A system whose roles
plan ahead over the data (Bagpipe's oracle) hands them :class:`TrainingStream`, the batches the
runner will train from the resumed step on, and numbers its steps from there.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from bagpipe.core.batch import Batch, DatasetSchema
from bagpipe.core.interface import ModelState
from bagpipe.core.source import BatchSource
from bagpipe.models import ModelConfig, RecModel, build_dense_model, initial_table

__all__ = ["TrainingStream", "start_dense_model", "start_table", "start_tables"]


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
    cfg: ModelConfig,
    schema: DatasetSchema,
    seed: int,
    resume: ModelState | None,
    device: torch.device | None = None,
) -> RecModel:
    """The dense part, seeded, then loaded with the checkpoint's weights when resuming, on
    ``device`` (the host by default). It is drawn on the host whatever the device, so one seed
    gives the same weights on a CPU and on a GPU."""
    model = build_dense_model(cfg, schema, seed)
    if resume is not None:
        model.load_state_dict(resume.dense)
    return model.to(device) if device is not None else model


class TrainingStream:
    """The batches the runner trains at steps ``first .. end - 1``, in order.

    The runner trains ``source[step % len(source)]`` at ``step``, over as many epochs as the run
    is long; a role that plans ahead (Bagpipe's oracle) must see exactly that sequence, wrapping
    at every epoch, and a resumed one must see it from the resumed step on. Random access makes
    both free.
    """

    def __init__(self, source: BatchSource, first: int, end: int) -> None:
        if len(source) == 0:
            raise ValueError("training source has no batches")
        if not 0 <= first <= end:
            raise ValueError(f"steps {first}..{end}: need 0 <= first <= end")
        self.source = source
        self.first = first
        self.end = end

    def __iter__(self) -> Iterator[Batch]:
        batches = len(self.source)
        return (self.source[step % batches] for step in range(self.first, self.end))

    def global_ids(self) -> Iterator[torch.Tensor]:
        """The same batches' ``[B, F]`` global row ids, nothing else read (``source.ids``).

        What a planner needs: on a host of its own it would read only the id columns, so here it
        neither generates nor parses the dense features and labels that the trainers read.
        """
        batches, offsets = len(self.source), self.source.schema.table_offsets
        return (self.source.ids(step % batches) + offsets for step in range(self.first, self.end))
