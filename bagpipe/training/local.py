"""``local``: every table in this process, synchronous SGD; the ground truth for every system.

Every table and the dense model live on the run's device (``ctx.device``), as a single GPU
trainer would hold them. No embedding traffic at all, so its iteration time is the ideal lower
bound the other systems are
measured against (TARGETS.md: Bagpipe / local <= 1.2), and its weights after k steps are what every
synchronous system must reproduce.
"""

from __future__ import annotations

from typing import Any

import torch

from bagpipe.core import runtime
from bagpipe.core.batch import Batch, global_ids
from bagpipe.core.device import host_copy, move, trainer_device
from bagpipe.core.interface import ModelState, StepResult, System, TrainContext
from bagpipe.core.meter import Phase
from bagpipe.models import RecModel, table_dim
from bagpipe.training.start import start_dense_model, start_tables
from bagpipe.training.step import forward_backward, sgd_dense_, sgd_rows_, unique_rows


class LocalSystem(System):
    """All tables as one flat ``[total_rows, table_dim]`` tensor indexed by global row id."""

    name = "local"
    supports_resume = True

    def __init__(self) -> None:
        self._ctx: TrainContext | None = None
        self._rows = torch.empty(0)
        self._model: RecModel | None = None

    def setup(self, ctx: TrainContext) -> None:
        """Build the tables and the dense model; this process plays the only role (the driver)."""
        runtime.init(runtime.DRIVER, ctx.network)
        resume = ctx.trainer_spec().resume_state
        device = trainer_device(ctx.device, 0, 1)
        tables = start_tables(ctx.schema, table_dim(ctx.model), ctx.seed, resume)
        self._rows = torch.cat([tables[name] for name in ctx.schema.table_names]).to(device)
        self._model = start_dense_model(ctx.model, ctx.schema, ctx.seed, resume, device)
        self._model.train()
        self._ctx = ctx

    def train_step(self, step: int, batch: Batch) -> StepResult:
        ctx, model = self._require_setup()
        batch_size = batch.labels.shape[0]
        if batch_size != ctx.global_batch_size:
            raise ValueError(
                f"step {step}: batch of {batch_size} examples, but global_batch_size is "
                f"{ctx.global_batch_size}"
            )
        meter = runtime.current().meter
        with meter.phase(Phase.FORWARD):
            ids = move(global_ids(batch, ctx.schema), self._rows.device, meter)
            ids, inverse = unique_rows(ids)
            rows = self._rows.index_select(0, ids)
        grads = forward_backward(
            model, batch.dense_features, rows, inverse, batch.labels, batch_size, meter
        )
        with meter.phase(Phase.OPTIMIZER):
            sgd_rows_(self._rows, ids, grads.row_grads, ctx.optim.embedding_lr)
            sgd_dense_(model, ctx.optim.dense_lr)
        meter.count("unique_rows", float(ids.numel()))
        return StepResult(loss=grads.loss, record=meter.end_step())

    def full_state(self) -> ModelState:
        ctx, model = self._require_setup()
        parts = torch.split(self._rows, list(ctx.schema.table_sizes))
        tables = {
            name: host_copy(part) for name, part in zip(ctx.schema.table_names, parts, strict=True)
        }
        dense = {key: host_copy(value) for key, value in model.state_dict().items()}
        return ModelState(tables=tables, dense=dense)

    def state_devices(self) -> dict[str, str]:
        _, model = self._require_setup()
        return {"dense": str(next(model.parameters()).device), "tables": str(self._rows.device)}

    def stats(self) -> dict[str, Any]:
        return {"table_bytes": self._rows.numel() * self._rows.element_size()}

    def _require_setup(self) -> tuple[TrainContext, RecModel]:
        if self._ctx is None or self._model is None:
            raise RuntimeError("LocalSystem used before setup(ctx)")
        return self._ctx, self._model
