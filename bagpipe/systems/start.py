"""The weights a system starts from: the seeded initial ones, or a checkpoint's (``ctx.resume``).

Every system builds its tables and dense replicas through these two functions (or, for a role that
holds part of one table, :func:`start_table`), so a run restarted from a checkpoint starts from
exactly the weights the interrupted run had, wherever the system keeps them.
"""

from __future__ import annotations

import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.system import ModelState
from bagpipe.models import ModelConfig, RecModel, build_dense_model, initial_table

__all__ = ["start_dense_model", "start_table", "start_tables"]


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
