"""FAE's trainer role: a replica of the hot rows in its "fast" memory, over plain
:class:`~bagpipe.paramserver.EmbeddingServer` shards (the "CPU" master copy).

* **Hot step**: lookups go to the trainer's replica (global id -> hot slot); the whole replica's
  gradient rides in the dense part's last DDP bucket (one SUM all-reduce, as data-parallel
  replicas of FAE's hot table reduce theirs), then every trainer applies the same SGD step to its
  replica. No embedding traffic.
* **Cold step**: rows are pulled from the servers and their gradients pushed back (the servers
  apply SGD), as in ``sync_ps``.
* **Swaps**: cold -> hot copies the hot rows from the servers into every replica; hot -> cold
  copies them back from trainer 0's replica (all replicas are equal). Both are charged as
  ``LinkKind.H2D`` (FAE's CPU<->GPU embedding sync) and delayed on the trainer/server link.

All server traffic goes through the shared client (:class:`~bagpipe.paramserver.ShardedTables`),
as ``sync_ps``'s does.

On a CPU-only machine the replica is a CPU tensor; ``fae_replica_bytes`` reports it as the device
memory FAE would use.
"""

from __future__ import annotations

import torch

from bagpipe.core import runtime
from bagpipe.core.device import host_copy, move
from bagpipe.core.interface import TrainerSpec
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.roles import Rendezvous, RoleRef
from bagpipe.models import table_dim
from bagpipe.paramserver import ParameterServerTrainer, ShardedTables, wait_acks
from bagpipe.training.step import forward_backward, sgd_dense_, unique_rows
from baselines.fae.scheduler import COLD, HOT

__all__ = ["FaeTrainer"]


class FaeTrainer(ParameterServerTrainer):
    """One FAE trainer: dense replica, hot-row replica, and the cold path to the servers."""

    fuses_rows = True  # a hot step sums the replica's gradient with the dense one

    def __init__(
        self, rank: int, group: Rendezvous, servers: list[RoleRef], spec: TrainerSpec
    ) -> None:
        super().__init__(rank, group, servers, spec)
        schema, dim = spec.schema, table_dim(spec.model)
        self.dim = dim
        self.total_rows = schema.total_rows
        self.hot_ids = torch.empty(0, dtype=torch.int64)
        self.slot_of = torch.full((schema.total_rows,), -1, dtype=torch.int64, device=self.device)
        self.replica = torch.empty(0, dim, device=self.device)
        self.mode = COLD
        self.tables = ShardedTables(servers)

    def set_hot_rows(self, hot_ids: torch.Tensor) -> int:
        """Adopt the hot set (sorted global ids); allocate the replica. Returns its bytes."""
        self.hot_ids = hot_ids
        self.slot_of.fill_(-1)
        self.slot_of[hot_ids.to(self.device)] = torch.arange(len(hot_ids), device=self.device)
        self.replica = torch.zeros(len(hot_ids), self.dim, device=self.device)
        return self.replica.numel() * self.replica.element_size()

    # -- swaps -----------------------------------------------------------------------------

    def swap(self, to: str) -> None:
        """Switch to ``to`` (``hot``/``cold``), syncing the hot rows between replica and servers."""
        if to == self.mode:
            return
        meter = runtime.current().meter
        with meter.phase("swap"):
            # The swaps' rows are charged as h2d by the pulls and pushes themselves: FAE's hot
            # replica lives where the trainer computes, and the shards stand for host memory.
            if to == HOT:
                self.replica = self.tables.pull(self.hot_ids, LinkKind.H2D).to(self.device)
            elif self.rank == 0:
                rows = self.replica.cpu()
                wait_acks(self.tables.push_rows(self.hot_ids, rows, LinkKind.H2D))
        meter.count("fae_swap_rows", len(self.hot_ids))
        self.mode = to

    # -- one step --------------------------------------------------------------------------

    def train_step(
        self, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord]:
        """One step on this trainer's slice in the current mode (``ids``: global ``[b, F]``)."""
        meter = runtime.current().meter
        with meter.phase(Phase.FETCH_WAIT):  # getting the step's rows, as every system times it
            keys, inverse = unique_rows(ids)
        if self.mode == HOT:
            with meter.phase(Phase.FETCH_WAIT):
                slots = self.slot_of[move(keys, self.device, meter)]
                if bool((slots < 0).any()):
                    raise RuntimeError("fae: a hot step looked up a row outside the hot set")
                rows = self.replica[slots]
            grads = forward_backward(
                self.ddp_model,
                dense,
                rows,
                inverse,
                labels,
                self.global_batch_size,
                meter,
                fuse=self.fuse,
                extra=lambda row_grads: torch.zeros_like(self.replica).index_add_(
                    0, slots, row_grads
                ),
            )
            assert self.fuse is not None
            replica_grad = self.fuse.take().view_as(self.replica)  # summed over the trainers
            with meter.phase(Phase.OPTIMIZER):
                self.replica.add_(replica_grad, alpha=-self.optim.embedding_lr)
                sgd_dense_(self.model, self.optim.dense_lr)
        else:
            with meter.phase(Phase.FETCH_WAIT):
                rows = self.tables.pull(keys)
            grads = forward_backward(
                self.ddp_model, dense, rows, inverse, labels, self.global_batch_size, meter,
                fuse=self.fuse,
            )
            with meter.phase(Phase.OPTIMIZER):
                sgd_dense_(self.model, self.optim.dense_lr)
                wait_acks(
                    self.tables.push_gradients(keys, grads.row_grads, self.optim.embedding_lr)
                )
        return grads.loss, meter.end_step()

    def embedding_state(self) -> dict[str, torch.Tensor]:
        return {"hot_replica": self.replica}

    def replica_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(hot ids, replica)`` while hot (the servers' copies of them are then stale)."""
        return (self.hot_ids, host_copy(self.replica)) if self.mode == HOT else None
