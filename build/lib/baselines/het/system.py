"""``het``: the HET plugin (driver side). Roles: ``S`` versioned server shards, ``T`` trainers.

The driver sends every trainer its slice of the global batch, and (mode ``asp`` with prefetch)
the ids of its slice of the *next* batch, read from the runner's random-access source (wrapping
around at its end, as the runner does), so the trainer can pull them while it computes. Those ids
are not charged as data traffic: the trainer is charged for its batch when it trains on it. Waiting for all T trainers every step is the only
synchronisation besides the dense all-reduce (and, in mode ``bsp``, the barrier between pushes
and pulls). Starting, driving and closing the roles is
:class:`~bagpipe.paramserver.ParameterServerSystem`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from bagpipe.core.batch import Batch, global_ids, split_batch
from bagpipe.core.interface import ModelState, StepResult
from bagpipe.core.meter import LinkKind
from bagpipe.paramserver import ParameterServerSystem, gather_rows, split_tables
from baselines.het.roles import HetServerShard, HetSettings, HetTrainer, NextSlice

__all__ = ["HET"]


class HET(ParameterServerSystem):
    """Per-worker embedding cache with bounded staleness over a parameter server (HET, VLDB'22).

    Args:
        num_trainers: ``T`` worker processes (data parallel; dense all-reduce every step).
        num_servers: ``S`` embedding-server shards.
        bound: staleness bound ``s`` for reads and writes (HET's default 100; its CTR scripts 3).
        policy: ``lru``, ``lfu`` or ``lfuopt``.
        cache_fraction: cache lines per table as a share of its rows (HET: 10%).
        cache_rows_per_table: absolute lines per table instead (overrides the fraction).
        mode: ``asp`` (HET's default) or ``bsp`` (push, barrier, pull every step).
        prefetch: pull the next batch while computing (mode ``asp``).
        step_timeout_s: how long the driver waits for one step before failing the run.
    """

    name = "het"
    server_class = HetServerShard
    trainer_class = HetTrainer
    close_trainers = True  # each trainer's channel thread may still be pushing: drain it first

    def __init__(
        self,
        num_trainers: int = 2,
        num_servers: int = 1,
        bound: int = 100,
        policy: str = "lfuopt",
        cache_fraction: float = 0.1,
        cache_rows_per_table: int | None = None,
        mode: str = "asp",
        prefetch: bool = True,
        step_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(num_trainers, num_servers, step_timeout_s)
        self.settings = HetSettings(
            bound, policy, cache_fraction, cache_rows_per_table, mode, prefetch
        )

    def reads_ahead(self) -> int:
        """The next batch, whose ids the trainers prefetch (mode ``asp`` with prefetch)."""
        return 1 if self.settings.mode == "asp" and self.settings.prefetch else 0

    def _trainer_args(self) -> tuple[HetSettings]:
        return (self.settings,)

    def train_step(self, step: int, batch: Batch) -> StepResult:
        ctx, _ = self._require_setup()
        next_ids: list[NextSlice | None] = [None] * self.num_trainers
        if self.settings.mode == "asp" and self.settings.prefetch:
            upcoming = ctx.source[(step + 1) % len(ctx.source)]  # the runner wraps around too
            next_ids = [
                NextSlice(global_ids(s, ctx.schema))
                for s in split_batch(upcoming, self.num_trainers)
            ]
        return self._collect(
            [
                trainer.rpc_async(kind=LinkKind.DATA).train_step(
                    part.dense_features, global_ids(part, ctx.schema), part.labels, ahead
                )
                for (trainer, part), ahead in zip(self._slices(batch), next_ids, strict=True)
            ]
        )

    def full_state(self) -> ModelState:
        """Server rows plus every trainer's unpushed deltas: the model as training left it."""
        ctx, _ = self._require_setup()
        unpushed = self._wait([t.rpc_async().unpushed() for t in self._trainers])
        rows = gather_rows(self._shard_states(), ctx.schema.total_rows)
        for keys, deltas in unpushed:
            rows.index_add_(0, keys, deltas)
        return ModelState(tables=split_tables(rows, ctx.schema), dense=self._dense_state())

    def stats(self) -> dict[str, Any]:
        """Cache counters summed over trainers, miss rate, and the servers' staleness histogram."""
        per_trainer = self._wait([t.rpc_async().cache_stats() for t in self._trainers])
        totals = {key: sum(s[key] for s in per_trainer) for key in per_trainer[0]}
        hists = self._wait([s.rpc_async().staleness_hist() for s in self._servers])
        staleness = torch.stack(hists).sum(0)
        return {
            **{f"het_{key}": value for key, value in totals.items()},
            "het_miss_rate": totals["misses"] / totals["lookups"] if totals["lookups"] else None,
            "het_staleness_hist": staleness.tolist(),
            "het_bound": self.settings.bound,
            "het_policy": self.settings.policy,
            "het_mode": self.settings.mode,
        }
