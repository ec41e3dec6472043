"""HET's role processes: embedding-server shards with version clocks, and cache-holding trainers.

Rows live on the ``S`` shards in the shared layout (:class:`~bagpipe.paramserver.ShardLayout`).
The wire counts and delays every message (``bagpipe.core.net.wire``); HET's traffic has three
Meter columns:

* ``emb_pull``: row values the server sends (``rows`` counts them);
* ``emb_push``: deltas the trainer pushes;
* ``emb_meta``: keys and versions of every read (sent even when every key hits, as HET's client
  does), positions and versions of the reply, keys and counts of every push.

The communication thread sends and receives, so a step's record holds the traffic that crossed
while it ran; a background pull for the next step lands in the step that sent it.

Trainer step (mode ``asp``, HET's default; the pull for step ``i+1`` runs on the trainer's one
communication thread while step ``i`` computes, and is answered before step ``i``'s push)::

    wait pull(i) -> install -> request + send pull(i+1) [background] -> forward/backward
    -> all-reduce dense grads -> local SGD on cache lines -> send push(i) [background]

Mode ``bsp`` (HET's ``bsp=0`` cache path): pull, compute, push, and the driver's per-step wait on
every trainer is the barrier between one step's pushes and the next step's pulls.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from bagpipe.core import runtime
from bagpipe.core.interface import TrainerSpec
from bagpipe.core.meter import LinkKind, Phase, StepRecord
from bagpipe.core.roles import Rendezvous, RoleRef
from bagpipe.models import table_dim
from bagpipe.paramserver import EmbeddingServer, ParameterServerTrainer, ShardLayout
from bagpipe.training.step import forward_backward, sgd_dense_, unique_rows
from baselines.het.cache import HetCache, PullReply, PullRequest, PushBatch, table_capacities
from baselines.het.clocks import VersionedRows

__all__ = ["HetServerShard", "HetSettings", "HetTrainer", "NextSlice"]

MODES = ("asp", "bsp")


@dataclass(frozen=True)
class NextSlice:
    """The ids of a trainer's slice of the next batch, sent ahead for HET's prefetch.

    A trainer reads them from its own data ahead of time on the target cluster, and reads them
    again as its batch a step later: they are not data traffic (``control``, never counted).
    """

    ids: torch.Tensor
    wire_kinds: ClassVar[dict[str, str]] = {"ids": LinkKind.CONTROL}


@dataclass(frozen=True)
class HetSettings:
    """HET's knobs. Defaults: HET's ``CacheSparseTable`` (bound 100, 10% of rows, LFUOpt)."""

    bound: int = 100
    policy: str = "lfuopt"
    cache_fraction: float = 0.1
    cache_rows_per_table: int | None = None
    mode: str = "asp"
    prefetch: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"het.mode: unknown {self.mode!r}; choose one of {MODES}")
        if self.bound < 0:
            raise ValueError(f"het.bound must be >= 0, got {self.bound}")


class HetServerShard(EmbeddingServer):
    """An :class:`EmbeddingServer` shard whose rows carry HET's version clocks.

    Its rows are the base class's (same seeded start, same ``id % S`` layout, same ``state()``);
    reads and writes go through :class:`~baselines.het.clocks.VersionedRows` over that very
    tensor, under the shard's lock, so a pull, a push and a state read never interleave. HET's
    trainers use only :meth:`pull` and :meth:`push` (the inherited plain SGD methods would skip the
    clocks).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Arguments as :class:`EmbeddingServer`'s (shard, num_shards, schema, dim, seed, resume)."""
        super().__init__(*args, **kwargs)
        self.store = VersionedRows(self.rows)

    def pull(self, ids: torch.Tensor, local_versions: torch.Tensor, bound: int) -> PullReply:
        """HET's bounded-staleness read of global ``ids`` (the rows are sent only where stale)."""
        local = self.local_index(ids)
        with self.lock:
            return self.store.pull(local, local_versions, bound)

    def push(self, push: PushBatch) -> None:
        """Add the deltas of the push's global keys and advance their clocks by its counts."""
        local = self.local_index(push.keys)
        with self.lock:
            self.store.push(local, push.deltas, push.counts)

    def staleness_hist(self) -> torch.Tensor:
        with self.lock:
            return self.store.staleness_hist.clone()


class HetTrainer(ParameterServerTrainer):
    """One HET worker: dense replica, :class:`HetCache`, and a FIFO channel to the servers."""

    def __init__(
        self,
        rank: int,
        group: Rendezvous,
        servers: list[RoleRef],
        spec: TrainerSpec,
        settings: HetSettings,
    ) -> None:
        super().__init__(rank, group, servers, spec)
        self.settings = settings
        schema, dim = spec.schema, table_dim(spec.model)
        capacities = table_capacities(
            schema.table_sizes, settings.cache_fraction, settings.cache_rows_per_table
        )
        self.cache = HetCache(
            schema.table_sizes, capacities, dim, settings.bound, settings.policy,
            device=self.device, meter=runtime.current().meter,
        )
        self.dim = dim
        self.layout = ShardLayout(len(servers))
        # Behind the step only with prefetch in asp mode; otherwise a step waits for its pulls
        # (and, in bsp, its pushes), and critical-path work keeps the step's priority.
        behind = settings.mode == "asp" and settings.prefetch
        self._channel = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="het-channel",
            initializer=runtime.run_in_background if behind else None,
        )
        self._prefetched: tuple[PullRequest, Future[PullReply]] | None = None
        self._last_push: Future[None] | None = None

    # -- communication (runs on the channel thread, in submission order) ---------------------

    def _pull(self, request: PullRequest) -> PullReply:
        where = self.layout.split(request.keys)
        futures = []
        for s, positions in enumerate(where):
            keys, versions = request.keys[positions], request.local_versions[positions]
            futures.append(
                self.servers[s]
                .rpc_async(kind=LinkKind.EMB_META)
                .pull(keys, versions, self.settings.bound)
            )
        parts = [f.wait() for f in futures]
        return PullReply(
            positions=torch.cat([where[s][p.positions] for s, p in enumerate(parts)]),
            rows=torch.cat([p.rows for p in parts]),
            versions=torch.cat([p.versions for p in parts]),
        )

    def _push(self, push: PushBatch) -> None:
        if not len(push.keys):
            return
        futures = [
            self.servers[s].rpc_async(kind=LinkKind.EMB_META).push(push.part(mine))
            for s, mine in enumerate(self.layout.split(push.keys))
            if len(mine)
        ]
        for future in futures:
            future.wait()

    # -- the step's side of the channel ----------------------------------------------------

    def _send_pull(self, request: PullRequest) -> Future[PullReply]:
        return self._channel.submit(self._pull, request)

    def _install(self, request: PullRequest, reply: Future[PullReply]) -> torch.Tensor:
        return self.cache.install(request, reply.result())

    def _send_push(self, push: PushBatch) -> Future[None]:
        return self._channel.submit(self._push, push)

    # -- one step --------------------------------------------------------------------------

    def _read(self, keys: torch.Tensor) -> torch.Tensor:
        """Values of ``keys`` for this step: the prefetched pull if it matches, else a pull now."""
        meter = runtime.current().meter
        with meter.phase(Phase.FETCH_WAIT):
            if self._prefetched is not None:
                request, future = self._prefetched
                self._prefetched = None
                values = self._install(request, future)
                if torch.equal(request.keys, keys):
                    return values
                meter.count("het_prefetch_mismatch")
            request = self.cache.request(keys)
            return self._install(request, self._send_pull(request))

    def train_step(
        self,
        dense: torch.Tensor,
        ids: torch.Tensor,
        labels: torch.Tensor,
        ahead: NextSlice | None,
    ) -> tuple[float, StepRecord]:
        """One step on this trainer's slice (``ids`` are global row ids ``[b, F]``)."""
        meter = runtime.current().meter
        with meter.phase(Phase.FETCH_WAIT):  # getting the step's rows, as every system times it
            keys, inverse = unique_rows(ids)
        misses_before, lookups_before = self.cache.stats["misses"], self.cache.stats["lookups"]
        values = self._read(keys)
        if ahead is not None and self.settings.mode == "asp" and self.settings.prefetch:
            with meter.phase(Phase.FETCH_WAIT):  # issuing the next step's pull is fetch work
                request = self.cache.request(torch.unique(ahead.ids))
                self._prefetched = (request, self._send_pull(request))
        grads = forward_backward(
            self.ddp_model, dense, values, inverse, labels, self.global_batch_size, meter
        )
        with meter.phase(Phase.OPTIMIZER):
            sgd_dense_(self.model, self.optim.dense_lr)
            push = self.cache.update(keys, -self.optim.embedding_lr * grads.row_grads)
        with meter.phase(Phase.SYNC):  # sending the push is sync work, as waiting for it is
            if self._last_push is not None:
                self._last_push.result()  # surface a failed earlier push
            self._last_push = self._send_push(push)
            if self.settings.mode == "bsp":
                self._last_push.result()
        for trigger, rows in push.rows_by_trigger.items():
            meter.count(f"het_push_rows_{trigger}", rows)
        lookups = self.cache.stats["lookups"] - lookups_before
        misses = self.cache.stats["misses"] - misses_before
        meter.add_cache(hits=lookups - misses, misses=misses)
        return grads.loss, meter.end_step()

    def drain(self) -> None:
        """Wait until every push sent so far has been applied by the servers."""
        if self._last_push is not None:
            self._last_push.result()

    def unpushed(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.drain()
        return self.cache.unpushed()

    def embedding_state(self) -> dict[str, torch.Tensor]:
        return {"cache": self.cache.values.rows}

    def cache_stats(self) -> dict[str, int]:
        return dict(self.cache.stats)

    def close(self) -> None:
        self.drain()
        self._channel.shutdown(wait=True)
