"""``embedding_free``: the parameter-server systems' trainers with embedding traffic made free.

Issue #16 measures Bagpipe against "the embedding-free bound": the same trainers and dense
synchronisation as every networked system, with every embedding row already where it is needed.
Here each of the T trainers holds a full copy of every table (the seeded tables every system
starts from, ``bagpipe.training.start.start_tables``), reads a step's rows from it, and applies
its own slice's row gradients to it by SGD, with no communication at all. The dense part is a DDP
replica all-reduced over the trainer group exactly as in ``sync_ps``, the driver sends each
trainer the same slice of the global batch, and the Meter phases follow the one rule of
:class:`~bagpipe.core.meter.Phase` (deduplicating and reading the rows is ``fetch_wait``).

**A lower bound, not an exact trainer.** With T > 1 no trainer sees the others' row gradients,
so the trainers' tables diverge and the model is not the one ``local`` trains (with T = 1 it is).
Its iteration time is what the same trainers cost when embedding traffic is free: no system that
trains these tables exactly over the network can be faster, so it is a floor to report Bagpipe
against (``bagpipe.harness.report.bound``), never a competitor. ``full_state`` is trainer 0's
tables and the common dense replica.

Unlike ``local`` (every table and the whole batch in one process, no network at all), it keeps
the T trainer processes, their CPU contention and the dense all-reduce over the emulated network.
Starting and driving the trainers is :class:`~bagpipe.paramserver.ParameterServerSystem`'s, with
no server shards. A role that dies ends the job (its trainers hold tables no other role has).
"""

from __future__ import annotations

from typing import Any

import torch

from bagpipe.core import runtime
from bagpipe.core.batch import Batch, global_ids
from bagpipe.core.device import host_copy, move
from bagpipe.core.interface import ModelState, StepResult, TrainerSpec
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.roles import Rendezvous, RoleRef
from bagpipe.models import table_dim
from bagpipe.paramserver import ParameterServerSystem, ParameterServerTrainer, split_tables
from bagpipe.training.start import start_tables
from bagpipe.training.step import forward_backward, sgd_dense_, sgd_rows_, unique_rows

__all__ = ["EmbeddingFree", "EmbeddingFreeTrainer"]


class EmbeddingFreeTrainer(ParameterServerTrainer):
    """Trainer ``rank`` of ``embedding_free``: a dense replica and its own copy of every table.

    One step (only the dense all-reduce crosses the network)::

        dedup + read the slice's rows from its tables   (FETCH_WAIT)
        forward / backward                              (FORWARD, BACKWARD; DDP's wait is SYNC)
        SGD on its own rows and on the dense replica    (OPTIMIZER)

    ``servers`` is empty: the system starts none.
    """

    def __init__(
        self, rank: int, group: Rendezvous, servers: list[RoleRef], spec: TrainerSpec
    ) -> None:
        super().__init__(rank, group, servers, spec)
        tables = start_tables(spec.schema, table_dim(spec.model), spec.seed, spec.resume_state)
        #: Every table as one flat ``[total_rows, table_dim]`` tensor indexed by global row id.
        self.rows = torch.cat(list(tables.values())).to(self.device)

    def train_step(
        self, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord]:
        """Train on this trainer's slice (``ids [B/T, F]`` global row ids); its loss and record."""
        meter = runtime.current().meter
        with meter.phase(Phase.FETCH_WAIT):
            unique_ids, inverse = unique_rows(move(ids, self.rows.device, meter))
            rows = self.rows.index_select(0, unique_ids)
        grads = forward_backward(
            self.ddp_model, dense, rows, inverse, labels, self.global_batch_size, meter
        )
        with meter.phase(Phase.OPTIMIZER):
            sgd_rows_(self.rows, unique_ids, grads.row_grads, self.optim.embedding_lr)
            sgd_dense_(self.model, self.optim.dense_lr)
        meter.count("unique_rows", float(unique_ids.numel()))
        return grads.loss, meter.end_step()

    def embedding_state(self) -> dict[str, torch.Tensor]:
        return {"tables": self.rows}

    def table_rows(self) -> torch.Tensor:
        """A host copy of this trainer's flat row space (its tables, diverged from its peers')."""
        return host_copy(self.rows)


class EmbeddingFree(ParameterServerSystem):
    """The embedding-free bound (see the module docstring): T trainers, no server shards.

    Args:
        num_trainers: ``T`` trainer processes (the global batch splits into T equal slices).
        step_timeout_s: how long one step (or a state gather) may take before the run fails.
    """

    name = "embedding_free"
    trainer_class = EmbeddingFreeTrainer
    min_servers = 0  # its rows live on the trainers

    def __init__(self, num_trainers: int = 2, step_timeout_s: float = 600.0) -> None:
        super().__init__(num_trainers, 0, step_timeout_s)

    def train_step(self, step: int, batch: Batch) -> StepResult:
        ctx, _ = self._require_setup()
        return self._collect([
            trainer.rpc_async(kind=LinkKind.DATA).train_step(
                part.dense_features, global_ids(part, ctx.schema), part.labels
            )
            for trainer, part in self._slices(batch)
        ])

    def full_state(self) -> ModelState:
        """Trainer 0's tables (the trainers' tables diverge) and the dense replica."""
        ctx, _ = self._require_setup()
        rows = self._wait(self._trainers[0].rpc_async().table_rows())
        return ModelState(tables=split_tables(rows, ctx.schema), dense=self._dense_state())

    def stats(self) -> dict[str, Any]:
        return {"num_trainers": self.num_trainers}
