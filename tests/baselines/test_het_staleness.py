"""HET's staleness bound with two or three workers (hypothesis): no value a worker is served is more
than ``bound`` clocks behind the server, whatever the interleaving, and no update is lost.

Each worker is a real :class:`HetCache`; the server is one :class:`VersionedRows` over every row.
Workers talk to it over FIFO channels as HET's trainers do (asp: the pull for step ``i+1`` is sent
before step ``i``'s push; sync: pull, compute, push and wait), and hypothesis picks when the server
serves each worker's channel. Every update adds exactly ``1`` to its row, so a row's value counts
the updates it reflects and the server's value equals its clock. When a pull is answered the test
notes the server's clocks and how many of the worker's own updates they hold; the value served
must then reflect all the worker's own updates and all but at most ``bound`` of the others' that
the server had.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines.het.cache import HetCache, PullReply, PullRequest, PushBatch
from baselines.het.clocks import VersionedRows

PROPERTY = settings(max_examples=80, deadline=None, derandomize=True, database=None)
TABLE_SIZES = (5, 4, 3)
ROWS = sum(TABLE_SIZES)
DIM = 2


@dataclass
class _Answer:
    """A pull's reply and what the server held when it answered."""

    reply: PullReply
    clocks: torch.Tensor  # every row's server clock
    own_applied: torch.Tensor  # the asking worker's updates among them


@dataclass
class _Worker:
    """One HET worker: its cache, its steps' keys, its channel to the server and its own counts."""

    cache: HetCache
    steps: list[torch.Tensor]
    prefetch: bool
    done: int = 0
    channel: deque[tuple[PullRequest | PushBatch, list[_Answer]]] = field(default_factory=deque)
    prefetched: tuple[PullRequest, list[_Answer]] | None = None
    updates: torch.Tensor = field(default_factory=lambda: torch.zeros(ROWS, dtype=torch.int64))
    applied: torch.Tensor = field(default_factory=lambda: torch.zeros(ROWS, dtype=torch.int64))

    @property
    def finished(self) -> bool:
        return self.done == len(self.steps)

    def send_pull(self, keys: torch.Tensor) -> tuple[PullRequest, list[_Answer]]:
        request, answer = self.cache.request(keys), []
        self.channel.append((request, answer))
        return request, answer


def _serve(server: VersionedRows, worker: _Worker, bound: int) -> None:
    """The server handles the oldest message on ``worker``'s channel."""
    message, answer = worker.channel.popleft()
    if isinstance(message, PullRequest):
        reply = server.pull(message.keys, message.local_versions, bound)
        answer.append(_Answer(reply, server.versions.clone(), worker.applied.clone()))
    else:
        assert torch.equal(message.deltas, message.counts[:, None].expand(-1, DIM).float())
        server.push(message.keys, message.deltas, message.counts)
        worker.applied.index_add_(0, message.keys, message.counts)


def _step(server: VersionedRows, worker: _Worker, bound: int) -> None:
    """One training step of ``worker``: read (checking what it is served), then update and push."""
    keys = worker.steps[worker.done]
    request, answer = worker.prefetched or worker.send_pull(keys)
    worker.prefetched = None
    while not answer:  # the trainer waits for its pull; the channel is FIFO
        _serve(server, worker, bound)
    values = worker.cache.install(request, answer[0].reply)
    assert torch.equal(values[:, 0], values[:, 1])
    known = answer[0].clocks[keys] - answer[0].own_applied[keys] + worker.updates[keys]
    behind = known - values[:, 0].round().long()
    assert torch.equal(values[:, 0], values[:, 0].round())
    assert (behind >= 0).all(), f"keys {keys[behind < 0].tolist()} count an update twice"
    assert (behind <= bound).all(), (
        f"keys {keys[behind > bound].tolist()} served {behind.max().item()} clocks behind"
    )
    worker.done += 1
    if worker.prefetch and not worker.finished:
        worker.prefetched = worker.send_pull(worker.steps[worker.done])
    push = worker.cache.update(keys, torch.ones(len(keys), DIM))
    worker.updates[keys] += 1
    worker.channel.append((push, []))
    if not worker.prefetch:  # pull, compute, push and wait for it
        while worker.channel:
            _serve(server, worker, bound)


keys_of_a_step = st.sets(st.integers(0, ROWS - 1), min_size=1, max_size=6).map(
    lambda keys: torch.tensor(sorted(keys), dtype=torch.int64)
)


@PROPERTY
@given(
    workers=st.integers(2, 3),
    bound=st.integers(0, 3),
    policy=st.sampled_from(["lru", "lfu", "lfuopt"]),
    lines=st.integers(0, 4),
    prefetch=st.booleans(),
    steps=st.lists(st.lists(keys_of_a_step, min_size=1, max_size=6), min_size=3, max_size=3),
    schedule=st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=60),
)
def test_no_value_served_is_more_than_bound_clocks_behind(
    workers: int, bound: int, policy: str, lines: int, prefetch: bool,
    steps: list[list[torch.Tensor]], schedule: list[tuple[int, bool]],
) -> None:
    server = VersionedRows(torch.zeros(ROWS, DIM))
    capacities = [min(lines, rows) for rows in TABLE_SIZES]
    team = [
        _Worker(HetCache(TABLE_SIZES, capacities, DIM, bound, policy), steps[w], prefetch)
        for w in range(workers)
    ]
    for index, train in schedule:  # hypothesis interleaves steps and the server's work
        worker = team[index % workers]
        if train and not worker.finished:
            _step(server, worker, bound)
        elif worker.channel:
            _serve(server, worker, bound)
    for worker in team:
        while not worker.finished:
            _step(server, worker, bound)
    for worker in team:
        while worker.channel:
            _serve(server, worker, bound)
    # nothing lost, nothing counted twice: the server's rows plus every worker's unpushed deltas
    # hold every update made, and the clocks count the pushed ones
    model = server.weights.clone()
    for worker in team:
        keys, deltas = worker.cache.unpushed()
        model.index_add_(0, keys, deltas)
    made = sum(worker.updates for worker in team)
    assert torch.equal(model, made[:, None].expand(-1, DIM).float())
    assert torch.equal(server.versions, sum(worker.applied for worker in team))
    assert torch.equal(server.weights[:, 0], server.versions.float())


def test_the_server_counts_each_cached_reads_lag_in_int64_buckets() -> None:
    server = VersionedRows(torch.zeros(4, DIM))
    assert server.staleness_hist.dtype == torch.int64 and len(server.staleness_hist) == 33
    server.push(torch.tensor([0, 1, 1]), torch.ones(3, DIM), torch.tensor([1, 1, 1]))
    # row 0 one behind, row 1 two behind, row 2 never pulled, row 3 ahead of the server (a
    # worker whose push is still in flight): counted as fresh, not as a negative lag
    reply = server.pull(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 0, -1, 5]), bound=1)
    assert server.staleness_hist[:3].tolist() == [1, 1, 1]
    assert int(server.staleness_hist.sum()) == 3
    assert reply.positions.tolist() == [1, 2]  # two behind > bound 1, and never pulled
