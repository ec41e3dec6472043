"""HET's per-worker embedding cache with per-row version clocks (bounded staleness).

One :class:`HetCache` per trainer covers every table of the model, addressed by *global row id*
(``DatasetSchema.table_offsets``); each table has its own capacity and replacement policy, as HET
keeps one cache per embedding table. A cache line holds::

    value    [d]   the row as this worker sees it (server value + its own unpushed updates)
    pending  [d]   the sum of local deltas not yet pushed
    version        the server clock last seen for the row (``-1``: never pulled)
    updates        local updates not yet pushed (one per step in which the key appeared)

The life of one batch (the HET client's read and write paths)::

    request = cache.request(keys)           # unique keys; hits touch the policy; local versions
    reply   = server.pull(request.keys, request.local_versions, bound)   # rows only where stale
    values  = cache.install(request, reply) # refresh stale lines, insert misses (may evict)
    ...forward / backward -> deltas = -lr * grad...
    push    = cache.update(keys, deltas)    # apply locally; lines with updates > bound are due,
    server.push(push.keys, push.deltas, push.counts)   # plus dirty evicted lines and uncached keys

A pull request may be *in flight* while the worker pushes (HET overlaps the next batch's pull with
the current step). The server answers the pull before it sees the push (the trainer sends them in
that order on one channel), so the reply lacks the worker's own pushed deltas; ``update`` records
them on every open request and ``install`` adds them back. A worker therefore never loses or
double-counts its own updates.

The lines' ``value`` and ``pending`` rows live on the worker's device
(:class:`~bagpipe.core.rowstore.RowStore`), the clocks and the key -> line map on the host,
where the policies run; the rows the servers send and receive cross once, charged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from bagpipe.core.device import HOST, move
from bagpipe.core.meter import LinkKind, Meter
from bagpipe.core.rowstore import RowStore
from baselines.het.policies import TablePolicies, make_policy

__all__ = ["HetCache", "PullReply", "PullRequest", "PushBatch", "table_capacities"]


@dataclass
class PullRequest:
    """The keys of one batch (sorted, unique global ids) and this worker's versions of them.

    ``pushed_delta`` / ``pushed_count`` collect what this worker pushed for these keys after the
    request was made (see the module docstring); they are zero for a request answered at once.
    """

    keys: torch.Tensor
    local_versions: torch.Tensor
    pushed_delta: torch.Tensor
    pushed_count: torch.Tensor
    misses: int = 0

    def absorb(self, push: PushBatch) -> None:
        """Record ``push`` (sent after this request) for the keys it shares with this request."""
        if not len(push.keys) or not len(self.keys):
            return
        positions = torch.searchsorted(self.keys, push.keys).clamp(max=len(self.keys) - 1)
        shared = self.keys[positions] == push.keys
        positions = positions[shared]
        self.pushed_delta.index_add_(0, positions, push.deltas[shared])
        self.pushed_count.index_add_(0, positions, push.counts[shared])


@dataclass
class PullReply:
    """The server's answer: rows for ``positions`` (indices into the request's keys) only.

    On the wire its rows count as ``emb_pull`` and its positions and versions as the metadata
    column of the call (``emb_meta``).
    """

    positions: torch.Tensor
    rows: torch.Tensor
    versions: torch.Tensor
    wire_kinds: ClassVar[dict[str, str]] = {"rows": LinkKind.EMB_PULL}


@dataclass
class PushBatch:
    """Deltas to add on the server (``W[k] += delta``, ``version[k] += count``), by trigger.

    On the wire its deltas count as ``emb_push``, its keys and counts as metadata (``emb_meta``).
    """

    keys: torch.Tensor
    deltas: torch.Tensor
    counts: torch.Tensor
    rows_by_trigger: dict[str, int] = field(default_factory=dict)
    wire_kinds: ClassVar[dict[str, str]] = {"deltas": LinkKind.EMB_PUSH}

    def part(self, positions: torch.Tensor) -> PushBatch:
        """The keys at ``positions`` (e.g. one shard's), with their deltas and counts."""
        return PushBatch(self.keys[positions], self.deltas[positions], self.counts[positions])

    @classmethod
    def concat(
        cls, parts: Sequence[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]], dim: int
    ) -> PushBatch:
        """Join ``(trigger, keys, deltas, counts)`` parts into one push."""
        keys = [p[1] for p in parts]
        return cls(
            keys=torch.cat(keys) if keys else torch.empty(0, dtype=torch.int64),
            deltas=torch.cat([p[2] for p in parts]) if parts else torch.empty(0, dim),
            counts=torch.cat([p[3] for p in parts]) if parts else torch.empty(0, dtype=torch.int64),
            rows_by_trigger={trigger: len(k) for trigger, k, _, _ in parts},
        )


def table_capacities(
    table_sizes: Sequence[int], fraction: float | None = None, rows_per_table: int | None = None
) -> list[int]:
    """Cache lines per table: ``rows_per_table`` (capped by the table), else ``floor(fraction*rows)``.

    HET hard-codes ``rows // 10`` per table; ``fraction=0.1`` reproduces that (tables under 10 rows
    then get no cache at all, as in HET).
    """
    if rows_per_table is not None:
        if rows_per_table < 0:
            raise ValueError(f"het.cache_rows_per_table must be >= 0, got {rows_per_table}")
        return [min(rows_per_table, rows) for rows in table_sizes]
    if fraction is None or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"het.cache_fraction must be in [0, 1], got {fraction}")
    return [int(rows * fraction) for rows in table_sizes]


class HetCache:
    """The embedding cache of one HET worker, over the flat global row space of all tables.

    Args:
        table_sizes: rows per table; global id ``offset[t] + row`` addresses row ``row`` of table t.
        capacities: cache lines per table (see :func:`table_capacities`).
        dim: embedding width.
        bound: the staleness bound ``s``: a line is pushed once it holds more than ``s`` updates.
        policy: ``lru``, ``lfu`` or ``lfuopt``, one instance per table.
        device: where the lines' rows live (the worker's device).
        meter: where host<->device copies are charged (the worker's Meter).

    Cache lines are the policies' lines (``policies.state``: table t owns a block of ``capacities[t]``
    of them). No operation loops over keys in Python: like HET's C++ cache, this one must cost little
    next to a training step, or HET would look slow for a reason of ours (see ``policies.py``).
    """

    def __init__(
        self,
        table_sizes: Sequence[int],
        capacities: Sequence[int],
        dim: int,
        bound: int,
        policy: str = "lfuopt",
        device: torch.device = HOST,
        meter: Meter | None = None,
    ) -> None:
        if len(capacities) != len(table_sizes):
            raise ValueError(f"{len(capacities)} capacities for {len(table_sizes)} tables")
        if bound < 0:
            raise ValueError(f"het.bound must be >= 0, got {bound}")
        self.dim = dim
        self.bound = bound
        self.offsets = torch.tensor([0, *list(table_sizes)], dtype=torch.int64).cumsum(0)
        self.policies = TablePolicies([make_policy(policy, c) for c in capacities])
        lines = sum(capacities)
        self.values = RowStore(lines, dim, device=device, meter=meter)
        self.pending = RowStore(lines, dim, device=device, meter=meter)
        self.device = device
        self.version = torch.full((lines,), -1, dtype=torch.int64)
        self.updates = torch.zeros(lines, dtype=torch.int64)
        self.slot_of = torch.full((int(self.offsets[-1]),), -1, dtype=torch.int64)
        # dirty evicted lines awaiting a push, as (keys, pending deltas, update counts) chunks
        self._evicted: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._open_requests: list[PullRequest] = []
        self.stats: dict[str, int] = {
            k: 0
            for k in (
                "lookups",
                "misses",
                "evictions_clean",
                "evictions_dirty",
                "not_admitted",
            )
        }

    @property
    def capacity(self) -> int:
        return self.values.num_slots

    def resident_keys(self) -> torch.Tensor:
        return torch.nonzero(self.slot_of >= 0).flatten()

    def key_of_slot(self) -> torch.Tensor:
        """The key on each line (``-1``: empty)."""
        resident = self.resident_keys()
        key_of_slot = torch.full((self.capacity,), -1, dtype=torch.int64)
        key_of_slot[self.slot_of[resident]] = resident
        return key_of_slot

    def _table_of(self, keys: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.offsets, keys, right=True) - 1

    # -- read path -------------------------------------------------------------------------

    def request(self, keys: torch.Tensor) -> PullRequest:
        """Open a pull for the sorted unique ``keys``: hits touch their policy (HET's lookup)."""
        slots = self.slot_of[keys]
        hit = slots >= 0
        versions = torch.full_like(keys, -1)
        versions[hit] = self.version[slots[hit]]
        self._touch(slots[hit])
        misses = len(keys) - int(hit.sum())
        self.stats["lookups"] += len(keys)
        self.stats["misses"] += misses
        request = PullRequest(
            keys=keys,
            local_versions=versions,
            pushed_delta=torch.zeros(len(keys), self.dim),
            pushed_count=torch.zeros(len(keys), dtype=torch.int64),
            misses=misses,
        )
        self._open_requests.append(request)
        return request

    def _touch(self, slots: torch.Tensor) -> None:
        """Record hits on the lines ``slots``, given in key order (the order HET visits them)."""
        self.policies.state.hit(slots)

    def install(self, request: PullRequest, reply: PullReply) -> torch.Tensor:
        """Apply the server's reply; return ``[U, d]`` values for every key of the request.

        Returned rows of cached lines are overwritten with the server's value plus the worker's
        pending delta (local writes are never lost); misses are then inserted, which may evict.
        """
        self._open_requests.remove(request)
        fresh_rows = reply.rows + request.pushed_delta[reply.positions]
        fresh_versions = reply.versions + request.pushed_count[reply.positions]
        slots = self.slot_of[request.keys]
        returned_slots = slots[reply.positions]
        cached = returned_slots >= 0
        refreshed = returned_slots[cached]
        self.values.write(refreshed, self._here(fresh_rows[cached]) + self.pending.read(refreshed))
        self.version[refreshed] = fresh_versions[cached]

        out = torch.empty(len(request.keys), self.dim, device=self.device)
        hit = slots >= 0
        out[self._here(hit)] = self.values.read(slots[hit])
        missed = ~cached
        miss_positions, miss_rows = reply.positions[missed], fresh_rows[missed]
        if len(miss_positions) != int((~hit).sum()):
            raise RuntimeError("het server did not return every row this worker does not cache")
        out[self._here(miss_positions)] = self._here(miss_rows)
        self._insert(request.keys[miss_positions], miss_rows, fresh_versions[missed])
        return out

    def _insert(self, keys: torch.Tensor, rows: torch.Tensor, versions: torch.Tensor) -> None:
        """Cache the non-resident ``keys`` (as HET would one by one, in the order given)."""
        if not len(keys):
            return
        placement = self.policies.state.admit(keys, self._table_of(keys))
        self.stats["evictions_clean"] += placement.evicted_new  # never updated: clean
        self.stats["not_admitted"] += placement.refused
        self._evict(placement.victims, placement.victim_lines)
        slots = placement.lines
        self.slot_of[keys[placement.resident]] = slots
        self.values.write(slots, rows[placement.resident])
        self.version[slots] = versions[placement.resident]
        self.pending.zero_(slots)
        self.updates[slots] = 0

    def _evict(self, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Drop evicted lines; queue the dirty ones' pending deltas for the next push."""
        self.slot_of[keys] = -1
        dirty = self.updates[slots] > 0
        dirty_slots = slots[dirty]
        if len(dirty_slots):
            self._evicted.append(
                (keys[dirty], self.pending.read_to_host(dirty_slots), self.updates[dirty_slots])
            )
        self.stats["evictions_dirty"] += len(dirty_slots)
        self.stats["evictions_clean"] += len(slots) - len(dirty_slots)

    # -- write path ------------------------------------------------------------------------

    def update(self, keys: torch.Tensor, deltas: torch.Tensor) -> PushBatch:
        """Apply ``deltas`` (``-lr * grad``) of unique ``keys``; return what is due for a push.

        Due: cached lines with more than ``bound`` unpushed updates (trigger ``bound``), dirty
        lines evicted since the last push (``eviction``), and keys this worker does not cache
        (``uncached``, HET's data-less lines). Pushed lines advance their version by their update
        count, as the server's does. ``deltas`` may be on the device; the push is on the host.
        """
        slots = self.slot_of[keys]
        cached = slots >= 0
        touched, touched_deltas = slots[cached], deltas[self._here(cached)]
        self.values.add_(touched, touched_deltas)
        self.pending.add_(touched, touched_deltas)
        updates = self.updates[touched] + 1
        self.updates[touched] = updates
        is_due = updates > self.bound
        due, due_updates = touched[is_due], updates[is_due]
        parts = [("bound", keys[cached][is_due], self.pending.read_to_host(due), due_updates)]
        self.version.index_add_(0, due, due_updates)
        self.updates[due] = 0
        self.pending.zero_(due)
        parts.append(("eviction", *self._evicted_tensors()))
        self._evicted = []
        uncached = ~cached
        ones = torch.ones(int(uncached.sum()), dtype=torch.int64)
        uncached_deltas = move(deltas[self._here(uncached)], HOST, self.values.meter)
        parts.append(("uncached", keys[uncached], uncached_deltas, ones))
        push = PushBatch.concat(parts, self.dim)
        for request in self._open_requests:
            request.absorb(push)
        return push

    def _evicted_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dirty evicted lines awaiting a push, as ``(keys, pending deltas, update counts)``."""
        if not self._evicted:
            return (
                torch.empty(0, dtype=torch.int64),
                torch.empty(0, self.dim),
                torch.empty(0, dtype=torch.int64),
            )
        keys, deltas, counts = zip(*self._evicted, strict=True)
        return torch.cat(keys), torch.cat(deltas), torch.cat(counts)

    def unpushed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, deltas)`` this worker has applied but not pushed (dirty lines + evicted queue).

        The server's tables plus every worker's unpushed deltas are the model as training left it:
        what ``full_state`` materialises without forcing a push that would change the run.
        """
        dirty = torch.nonzero(self.updates > 0).flatten()
        evicted_keys, evicted_deltas, _ = self._evicted_tensors()
        return (
            torch.cat([self.key_of_slot()[dirty], evicted_keys]),
            torch.cat([self.pending.read_to_host(dirty), evicted_deltas]),
        )

    def _here(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (an index or rows from the host) on the lines' device, charged."""
        return move(tensor, self.device, self.values.meter)
