"""``fae``: the FAE plugin (driver side). Roles: ``S`` server shards, ``T`` trainers.

``prepare_dataset`` runs FAE's offline pass (profile a sample, choose the hot rows under the
budget, classify and re-pack the inputs, streaming the source's ids with bounded memory; cached per
data and settings under ``ctx.workdir``) and returns the re-packed source, so the run records that
FAE changes the sample order (``reorders_samples``). Each step's kind is decided from the batch
itself (hot iff every lookup hits a hot row); when it differs from the previous step's, the driver
has every trainer swap first. The shards are plain :class:`~bagpipe.paramserver.EmbeddingServer`
shards; starting, driving and closing the roles is
:class:`~bagpipe.paramserver.ParameterServerSystem`'s.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bagpipe.core.batch import Batch, global_ids
from bagpipe.core.interface import ModelState, PhaseInfo, StepResult, cache_budget_rows
from bagpipe.core.meter import LinkKind
from bagpipe.core.source import BatchSource
from bagpipe.models import table_dim
from bagpipe.paramserver import EmbeddingServer, ParameterServerSystem, gather_rows, split_tables
from baselines.fae.layout import FaeLayout, FaeSettings, FaeSource, cached_layout
from baselines.fae.roles import FaeTrainer
from baselines.fae.scheduler import COLD, HOT

__all__ = ["FAE"]


class FAE(ParameterServerSystem):
    """Hot-embedding aware data layout (FAE, VLDB'22).

    Args:
        num_trainers: ``T`` data-parallel trainers, each with a replica of the hot rows.
        num_servers: ``S`` embedding-server shards (the master copy of every row).
        sample_rate, hot_budget_bytes, threshold_mode, min_table_bytes, scheduler, initial_rate,
            window, repack, drop_last, seed: FAE's knobs, see :class:`FaeSettings`.
        hot_budget_fraction: the hot replica's budget as a share of the dataset's rows (the rule
            every caching system's budget follows; replaces ``hot_budget_bytes`` when given).
        epochs: how many passes over the re-packed data the source offers.
        cache_dir: where layouts are cached (default ``ctx.workdir / "fae_cache"``).
        step_timeout_s: how long the driver waits for one step before failing the run.
    """

    name = "fae"
    reorders_samples = True
    server_class = EmbeddingServer
    trainer_class = FaeTrainer

    def __init__(
        self,
        num_trainers: int = 2,
        num_servers: int = 1,
        sample_rate: float = FaeSettings.sample_rate,
        hot_budget_bytes: int = FaeSettings.hot_budget_bytes,
        threshold_mode: str = FaeSettings.threshold_mode,
        min_table_bytes: int = FaeSettings.min_table_bytes,
        scheduler: str = FaeSettings.scheduler,
        initial_rate: int = FaeSettings.initial_rate,
        window: int = FaeSettings.window,
        repack: bool = FaeSettings.repack,
        drop_last: bool = FaeSettings.drop_last,
        seed: int = FaeSettings.seed,
        hot_budget_fraction: float | None = None,
        epochs: int = 1,
        cache_dir: str | None = None,
        step_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(num_trainers, num_servers, step_timeout_s)
        self.settings = FaeSettings(
            sample_rate=sample_rate,
            hot_budget_bytes=hot_budget_bytes,
            threshold_mode=threshold_mode,
            min_table_bytes=min_table_bytes,
            scheduler=scheduler,
            initial_rate=initial_rate,
            window=window,
            repack=repack,
            drop_last=drop_last,
            seed=seed,
        )
        self.hot_budget_fraction = hot_budget_fraction
        self.epochs = epochs
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._source: FaeSource | None = None
        self._layout_from_cache = False
        self._mode = COLD
        self._swaps = 0
        self._time_s = {HOT: 0.0, COLD: 0.0}
        self._steps = {HOT: 0, COLD: 0}

    def prepare_dataset(self, source: BatchSource) -> BatchSource:
        """FAE's offline pass; returns the re-packed source and hands the hot set to the trainers."""
        ctx, _ = self._require_setup()
        cache_dir = self.cache_dir or Path(ctx.workdir) / "fae_cache"
        dim = table_dim(ctx.model)
        if self.hot_budget_fraction is not None:  # the shared budget: rows at this table width
            rows = cache_budget_rows(ctx.schema, self.hot_budget_fraction)
            self.settings = replace(self.settings, hot_budget_bytes=rows * dim * 4)
        layout, self._layout_from_cache = cached_layout(
            source, ctx.schema, dim, self.settings, cache_dir
        )
        self._source = FaeSource(
            source, ctx.schema, source.batch_size, layout, self.settings, self.epochs
        )
        hot_ids = layout.hot.rows
        self._wait([t.rpc_async().set_hot_rows(hot_ids) for t in self._trainers])
        return self._source

    def train_step(self, step: int, batch: Batch) -> StepResult:
        ctx, _ = self._require_setup()
        layout = self._require_layout()
        start = time.perf_counter()
        ids = global_ids(batch, ctx.schema)
        kind = HOT if bool(layout.hot.is_hot[ids].all()) else COLD
        if kind != self._mode:
            self._wait([t.rpc_async().swap(kind) for t in self._trainers])
            self._mode = kind
            self._swaps += 1
        result = self._collect(
            [
                trainer.rpc_async(kind=LinkKind.DATA).train_step(
                    part.dense_features, global_ids(part, ctx.schema), part.labels
                )
                for trainer, part in self._slices(batch)
            ]
        )
        result.record.counters["fae_hot_step"] = float(kind == HOT)
        self._time_s[kind] += time.perf_counter() - start
        self._steps[kind] += 1
        return result

    def on_phase_boundary(self, info: PhaseInfo) -> None:
        """The adaptive Shuffle Scheduler reacts to each evaluation's test loss."""
        if (
            self._source is not None
            and self._source.scheduler is not None
            and info.eval_logloss is not None
        ):
            self._source.scheduler.observe_loss(info.eval_logloss)

    def full_state(self) -> ModelState:
        """Server rows, with the replica's hot rows over them while a hot phase is running."""
        ctx, _ = self._require_setup()
        rows = gather_rows(self._shard_states(), ctx.schema.total_rows)
        replica = self._wait(self._trainers[0].rpc_async().replica_rows())
        if replica is not None:
            rows[replica[0]] = replica[1]
        return ModelState(tables=split_tables(rows, ctx.schema), dense=self._dense_state())

    def stats(self) -> dict[str, Any]:
        """The paper's FAE metrics: hot-input share, hot rows/bytes, swaps, rates, time split."""
        ctx, _ = self._require_setup()
        layout = self._require_layout()
        offsets = [0, *torch.tensor(ctx.schema.table_sizes).cumsum(0).tolist()]
        hot_rows_per_table = {
            name: int(layout.hot.is_hot[offsets[t] : offsets[t + 1]].sum())
            for t, name in enumerate(ctx.schema.table_names)
        }
        scheduler = self._source.scheduler if self._source is not None else None
        return {
            "fae_hot_input_share": layout.hot_input_share,
            "fae_hot_rows": layout.hot.num_rows,
            "fae_hot_bytes": layout.hot.bytes,
            "fae_replica_bytes": layout.hot.bytes,  # per trainer: device memory on a GPU
            "fae_hot_rows_per_table": hot_rows_per_table,
            "fae_threshold": layout.hot.threshold,
            "fae_threshold_mode": layout.hot.mode,
            "fae_size_method": layout.hot.size_method,
            "fae_sampled_examples": layout.sampled_examples,
            "fae_profile_time_s": layout.profile_time_s,
            "fae_layout_from_cache": self._layout_from_cache,
            "fae_swaps": self._swaps,
            "fae_rate_trace": list(scheduler.rate_trace) if scheduler is not None else [],
            "fae_hot_steps": self._steps[HOT],
            "fae_cold_steps": self._steps[COLD],
            "fae_iter_time_hot_s": self._time_s[HOT] / max(1, self._steps[HOT]),
            "fae_iter_time_cold_s": self._time_s[COLD] / max(1, self._steps[COLD]),
        }

    def _require_layout(self) -> FaeLayout:
        if self._source is None:
            raise RuntimeError(
                "fae: call prepare_dataset(source) before training (it builds the hot set)"
            )
        return self._source.layout
