"""HET's cache logic on hand-checked cases: policies, the staleness rule, push triggers, eviction."""

from __future__ import annotations

import pytest
import torch

from baselines.het.cache import HetCache, PullReply, PullRequest, PushBatch, table_capacities
from baselines.het.clocks import VersionedRows, stale_mask
from baselines.het.policies import (
    CachePolicy,
    LFUOptPolicy,
    LFUPolicy,
    LRUPolicy,
    TablePolicies,
    make_policy,
)
from tests.baselines.het_reference import (
    REFERENCE_POLICIES,
    ReferenceHetCache,
    ReferenceLFU,
    ReferenceLFUOpt,
    ReferencePolicy,
)

# -- policies ----------------------------------------------------------------------------------


def test_lru_evicts_least_recently_used() -> None:
    lru = LRUPolicy(2)
    assert lru.insert(1).victim is None
    assert lru.insert(2).victim is None
    lru.touch(1)  # order now 2, 1
    admission = lru.insert(3)
    assert admission.admitted and admission.victim == 2
    assert 1 in lru and 3 in lru and 2 not in lru


def test_lfu_evicts_oldest_of_lowest_count() -> None:
    lfu = LFUPolicy(3)
    for key in (1, 2, 3):
        lfu.insert(key)
    lfu.touch(1)
    lfu.touch(1)
    lfu.touch(3)  # counts: 1 -> 3, 2 -> 1, 3 -> 2
    assert lfu.insert(4).victim == 2
    # 4 (count 1) is now the only count-1 key: it goes next, not older keys with higher counts
    assert lfu.insert(5).victim == 4
    lfu.touch(5)  # 5 -> 2; bucket 2 holds 3 (older) then 5
    assert lfu.insert(6).victim == 3
    assert lfu.use_count(1) == 3


def test_lfuopt_promotes_to_permanent_and_refuses_when_full_of_permanent() -> None:
    policy = LFUOptPolicy(2, levels=3)
    policy.insert(1)
    policy.insert(2)
    policy.touch(1)
    policy.touch(1)  # levels 0 -> 1 -> 2
    assert policy.permanent == set()
    policy.touch(1)  # a hit at the top level (2 of 0..2) makes it permanent, as in HET
    assert policy.permanent == {1}
    assert policy.insert(3).victim == 2  # the only evictable key
    for _ in range(3):
        policy.touch(3)
    assert policy.permanent == {1, 3}
    refused = policy.insert(4)
    assert not refused.admitted and refused.victim is None
    assert len(policy) == 2 and 4 not in policy


def test_lfuopt_evicts_lowest_level_oldest_first() -> None:
    policy = LFUOptPolicy(3, levels=10)
    for key in (1, 2, 3):
        policy.insert(key)
    policy.touch(1)
    assert policy.insert(4).victim == 2
    assert policy.insert(5).victim == 3


def test_zero_capacity_and_unknown_policy() -> None:
    assert not LRUPolicy(0).insert(1).admitted
    with pytest.raises(ValueError, match=r"het.policy.*'fifo'"):
        make_policy("fifo", 3)


def test_table_capacities_follow_het_rows_div_10() -> None:
    assert table_capacities([100, 9, 55], fraction=0.1) == [10, 0, 5]
    assert table_capacities([100, 9], rows_per_table=20) == [20, 9]
    with pytest.raises(ValueError, match="cache_fraction"):
        table_capacities([10], fraction=1.5)


def test_table_capacities_at_their_bounds() -> None:
    assert table_capacities([100, 9], rows_per_table=0) == [0, 0]  # no cache: every key uncached
    assert table_capacities([100, 9], fraction=0.0) == [0, 0]
    assert table_capacities([100, 9], fraction=1.0) == [100, 9]  # every row cached
    with pytest.raises(ValueError, match=r"^het\.cache_rows_per_table must be >= 0, got -1$"):
        table_capacities([10], rows_per_table=-1)
    with pytest.raises(ValueError, match=r"^het\.cache_fraction must be in \[0, 1\], got None$"):
        table_capacities([10])


def test_a_push_split_by_shard_keeps_keys_deltas_and_counts_together() -> None:
    push = PushBatch(torch.tensor([3, 8, 5]), torch.arange(6.0).view(3, 2), torch.tensor([1, 2, 3]))
    part = push.part(torch.tensor([2, 0]))
    assert part.keys.tolist() == [5, 3] and part.counts.tolist() == [3, 1]
    assert part.deltas.tolist() == [[4.0, 5.0], [0.0, 1.0]]


def test_an_empty_push_and_a_request_without_keys() -> None:
    empty = PushBatch.concat([], dim=3)
    assert empty.keys.dtype == torch.int64 and empty.keys.shape == (0,)
    assert empty.deltas.shape == (0, 3) and empty.rows_by_trigger == {}
    assert empty.counts.dtype == torch.int64 and empty.counts.shape == (0,)
    request = PullRequest(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64),
                          torch.empty(0, 3), torch.empty(0, dtype=torch.int64))
    request.absorb(PushBatch(torch.tensor([4]), torch.ones(1, 3), torch.tensor([1])))
    assert request.pushed_delta.shape == (0, 3)


def test_key_of_slot_marks_empty_lines() -> None:
    cache = HetCache([4, 3], [2, 2], dim=2, bound=0, policy="lru")
    _read(cache, VersionedRows(torch.zeros(7, 2)), [1, 5])
    lines = cache.key_of_slot()
    assert lines.dtype == torch.int64 and sorted(lines.tolist()) == [-1, -1, 1, 5]


# -- server rule -------------------------------------------------------------------------------


def test_stale_mask_rule() -> None:
    server = torch.tensor([5, 5, 5, 5])
    local = torch.tensor([-1, 5, 3, 2])
    assert stale_mask(server, local, bound=2).tolist() == [True, False, False, True]
    assert stale_mask(server, local, bound=0).tolist() == [True, False, True, True]


def test_server_pull_push_and_staleness_histogram() -> None:
    store = VersionedRows(torch.arange(8.0).view(4, 2), staleness_buckets=4)
    store.push(torch.tensor([1, 1, 2]), torch.ones(3, 2), torch.tensor([2, 3, 1]))
    assert store.versions.tolist() == [0, 5, 1, 0]
    assert store.weights[1].tolist() == [4.0, 5.0]
    reply = store.pull(torch.tensor([0, 1, 2]), torch.tensor([-1, 0, 1]), bound=3)
    assert reply.positions.tolist() == [0, 1]  # 0 never pulled, 1 five behind; 2 up to date
    assert reply.versions.tolist() == [0, 5]
    assert torch.equal(reply.rows, store.weights[torch.tensor([0, 1])])
    assert store.staleness_hist.tolist() == [1, 0, 0, 1]  # lags 0 and 5 (clipped into last)


# -- cache: one worker against one server ------------------------------------------------------


def _read(
    cache: HetCache, store: VersionedRows, keys: list[int]
) -> tuple[PullRequest, torch.Tensor]:
    request = cache.request(torch.tensor(keys))
    reply = store.pull(request.keys, request.local_versions, cache.bound)
    return request, cache.install(request, reply)


def _write(cache: HetCache, store: VersionedRows, keys: list[int], delta: float):
    push = cache.update(torch.tensor(keys), torch.full((len(keys), 2), delta))
    store.push(push.keys, push.deltas, push.counts)
    return push


def test_first_read_misses_then_hits_without_transfer() -> None:
    store = VersionedRows(torch.arange(12.0).view(6, 2))
    cache = HetCache([6], [4], dim=2, bound=1, policy="lru")
    request, values = _read(cache, store, [1, 4])
    assert request.local_versions.tolist() == [-1, -1]
    assert torch.equal(values, store.weights[[1, 4]])
    request, values = _read(cache, store, [1, 4])
    assert request.local_versions.tolist() == [0, 0]
    assert cache.stats["lookups"] == 4 and cache.stats["misses"] == 2


def test_push_after_more_than_bound_updates_and_versions_advance() -> None:
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [4], dim=2, bound=2, policy="lru")
    _read(cache, store, [0])
    for step in range(3):
        push = _write(cache, store, [0], -1.0)
        # bound 2: the line is pushed only once it holds 3 updates
        assert len(push.keys) == (1 if step == 2 else 0)
    assert push.counts.tolist() == [3]
    assert push.deltas.tolist() == [[-3.0, -3.0]]
    assert push.rows_by_trigger["bound"] == 1
    assert store.versions[0] == 3 and store.weights[0].tolist() == [-3.0, -3.0]
    slot = int(cache.slot_of[0])
    assert cache.version[slot] == 3 and cache.updates[slot] == 0
    assert cache.values.rows[slot].tolist() == [-3.0, -3.0]


def test_a_pushed_line_starts_again_from_no_pending_delta() -> None:
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [4], dim=2, bound=0, policy="lru")
    assert HetCache([4], [4], dim=2, bound=0).policies[0].name == "lfuopt"  # HET's default
    _read(cache, store, [1])
    assert _write(cache, store, [1], -1.0).deltas.tolist() == [[-1.0, -1.0]]
    assert _write(cache, store, [1], -2.0).deltas.tolist() == [[-2.0, -2.0]]
    keys, deltas = cache.unpushed()
    assert keys.tolist() == [] and deltas.shape == (0, 2)
    assert store.weights[1].tolist() == [-3.0, -3.0]


def test_read_refreshes_only_beyond_bound_and_keeps_pending_delta() -> None:
    """Another worker's updates become visible once the server is > bound versions ahead."""
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [4], dim=2, bound=1, policy="lru")
    _read(cache, store, [2])
    _write(cache, store, [2], -1.0)  # one local update, not pushed (bound 1)
    store.push(torch.tensor([2]), torch.full((1, 2), 10.0), torch.tensor([1]))  # other worker
    _, values = _read(cache, store, [2])
    assert values.tolist() == [[-1.0, -1.0]]  # 1 version behind: served stale, locally updated
    store.push(torch.tensor([2]), torch.full((1, 2), 10.0), torch.tensor([1]))
    _, values = _read(cache, store, [2])  # 2 behind > bound: refreshed, own pending re-applied
    assert values.tolist() == [[19.0, 19.0]]
    assert cache.version[int(cache.slot_of[2])] == 2
    assert store.staleness_hist[:3].tolist() == [0, 1, 1]


def test_dirty_eviction_is_pushed_with_next_update_and_clean_one_is_not() -> None:
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [1], dim=2, bound=5, policy="lru")
    _read(cache, store, [0])
    _write(cache, store, [0], -1.0)  # dirty, under the bound
    _read(cache, store, [1])  # evicts dirty 0
    assert cache.stats["evictions_dirty"] == 1
    assert store.weights[0].tolist() == [0.0, 0.0]  # not yet pushed
    push = _write(cache, store, [1], -2.0)
    assert push.rows_by_trigger == {"bound": 0, "eviction": 1, "uncached": 0}
    assert store.weights[0].tolist() == [-1.0, -1.0] and store.versions[0] == 1
    _read(cache, store, [2])  # evicts 1, which holds the -2 update
    push = _write(cache, store, [2], 0.0)
    assert push.keys.tolist() == [1] and push.rows_by_trigger["eviction"] == 1
    assert cache.stats["evictions_dirty"] == 2 and cache.stats["evictions_clean"] == 0


def test_clean_eviction_and_keys_evicted_within_one_batch() -> None:
    store = VersionedRows(torch.arange(8.0).view(4, 2))
    cache = HetCache([4], [1], dim=2, bound=0, policy="lru")
    _, values = _read(cache, store, [0, 1, 2])  # three misses through one line
    assert torch.equal(values, store.weights[:3])  # served from the reply regardless
    assert cache.resident_keys().tolist() == [2]
    assert cache.stats["evictions_clean"] == 2  # freshly inserted lines are clean
    push = _write(cache, store, [0, 1, 2], -1.0)
    assert push.rows_by_trigger == {"bound": 1, "eviction": 0, "uncached": 2}
    assert store.versions.tolist() == [1, 1, 1, 0]


def test_lfuopt_full_of_permanent_rows_serves_uncached_keys_from_server() -> None:
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [1], dim=2, bound=3, policy="lfuopt")
    cache.policies[0] = LFUOptPolicy(1, levels=2)
    for _ in range(3):
        _read(cache, store, [0])  # inserted at level 0; hits at levels 0 and 1: permanent
    assert cache.policies[0].permanent == {0}
    _read(cache, store, [3])
    assert cache.stats["not_admitted"] == 1 and cache.resident_keys().tolist() == [0]
    push = _write(cache, store, [3], -1.0)
    assert push.rows_by_trigger["uncached"] == 1 and store.weights[3].tolist() == [-1.0, -1.0]


def test_in_flight_request_gets_own_push_added_back() -> None:
    """A pull answered before this worker's push must not lose that push (HET's prefetch)."""
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [4], dim=2, bound=0, policy="lru")
    _read(cache, store, [1])
    request = cache.request(torch.tensor([1, 3]))  # next batch's pull...
    reply_before_push = store.pull(request.keys, request.local_versions, cache.bound)
    _write(cache, store, [1, 3], -1.0)  # ...then this step's push (3 is uncached: direct push)
    values = cache.install(request, reply_before_push)
    assert values.tolist() == [[-1.0, -1.0], [-1.0, -1.0]]
    assert cache.version[int(cache.slot_of[3])] == 1 == store.versions[3]


def test_multi_table_keys_use_their_own_table_policy() -> None:
    store = VersionedRows(torch.zeros(7, 2))
    cache = HetCache([4, 3], [1, 2], dim=2, bound=0, policy="lru")
    _read(cache, store, [0, 1, 4, 5, 6])
    assert cache.resident_keys().tolist() == [1, 5, 6]


def test_unpushed_lists_dirty_lines_and_evicted_queue() -> None:
    store = VersionedRows(torch.zeros(4, 2))
    cache = HetCache([4], [1], dim=2, bound=5, policy="lru")
    _read(cache, store, [0])
    _write(cache, store, [0], -1.0)
    _read(cache, store, [1])  # 0 evicted dirty, queued
    keys, deltas = cache.unpushed()
    assert keys.tolist() == [0] and deltas.tolist() == [[-1.0, -1.0]]
    _write(cache, store, [1], -2.0)  # flushes 0; 1 is dirty now
    keys, deltas = cache.unpushed()
    assert keys.tolist() == [1] and deltas.tolist() == [[-2.0, -2.0]]


# -- the tensors against the per-key spec (tests/baselines/het_reference.py) ---------------------

LEVELS = (1, 2, 3, 10)


def _policy_pair(name: str, capacity: int, levels: int) -> tuple[CachePolicy, ReferencePolicy]:
    if name == "lfuopt":
        return LFUOptPolicy(capacity, levels=levels), ReferenceLFUOpt(capacity, levels=levels)
    return make_policy(name, capacity), REFERENCE_POLICIES[name](capacity)


def _reference_admit(
    references: list[ReferencePolicy], keys: list[int], tables: list[int]
) -> tuple[list[int], list[int], int, int]:
    """Insert ``keys`` one by one: (old victims, their trigger indices, new keys evicted, refused)."""
    victims: list[int] = []
    triggers: list[int] = []
    refused = 0
    for index, (key, table) in enumerate(zip(keys, tables, strict=True)):
        admission = references[table].insert(key)
        refused += not admission.admitted
        if admission.victim is not None and admission.victim not in keys:
            victims.append(admission.victim)
            triggers.append(index)
    resident = set().union(*(r.resident() for r in references))
    return victims, triggers, len(keys) - refused - len(set(keys) & resident), refused


def _counts(policy: CachePolicy) -> dict[int, int]:
    """LFU counts / LFUOpt levels of the table's unpinned keys."""
    lines = policy.state.table_lines(policy.table)
    live = ~policy.state.pinned[lines]
    keys, counts = policy.state.keys[lines][live], policy.state.counts[lines][live]
    return dict(zip(keys.tolist(), counts.tolist(), strict=True))


def test_batched_policies_match_one_key_at_a_time() -> None:
    """Hits and inserts of a batch over tables of every policy at once = HET's one key at a time
    in batch order, each table on its own: victims (in order), their triggers, residency, counts."""
    rng = torch.Generator().manual_seed(7)
    names = ["lru", "lfu", "lfuopt"]
    for trial in range(40):
        pairs = [
            _policy_pair(names[(trial + t) % 3], (trial + 2 * t) % 6, LEVELS[(trial + t) % 4])
            for t in range(3)
        ]
        state = TablePolicies([policy for policy, _ in pairs]).state
        references = [reference for _, reference in pairs]
        for _ in range(20):
            draw = torch.rand(int(torch.randint(1, 16, (1,), generator=rng)), generator=rng)
            batch = torch.unique((48 * draw**2).long()).tolist()  # table = key // 16
            hits = [k for k in batch if k in references[k // 16].resident()]
            for key in hits:
                references[key // 16].touch(key)
            hit_lines = [state.line_of(k // 16, k) for k in hits]
            state.hit(torch.cat(hit_lines) if hit_lines else torch.empty(0, dtype=torch.int64))
            shuffled = [batch[i] for i in torch.randperm(len(batch), generator=rng).tolist()]
            misses = [k for k in shuffled if k not in hits]  # in no particular order
            tables = [k // 16 for k in misses]
            victims, triggers, evicted_new, refused = _reference_admit(references, misses, tables)
            placement = state.admit(
                torch.tensor(misses, dtype=torch.int64), torch.tensor(tables, dtype=torch.int64)
            )
            assert placement.victims.tolist() == victims
            assert placement.triggers.tolist() == triggers
            assert (placement.evicted_new, placement.refused) == (evicted_new, refused)
            for (policy, _), reference in zip(pairs, references, strict=True):
                lines = state.table_lines(policy.table)
                assert set(state.keys[lines].tolist()) == reference.resident()
                assert policy.permanent == reference.permanent
                if isinstance(reference, ReferenceLFU | ReferenceLFUOpt):
                    assert _counts(policy) == reference.counts.count_of


def _sharded_pull(store: VersionedRows, request: PullRequest, bound: int) -> PullReply:
    """A pull answered by two shards (``key % 2``), as the trainer joins it: not in key order."""
    reply = store.pull(request.keys, request.local_versions, bound)
    order = torch.argsort(request.keys[reply.positions] % 2, stable=True)
    return PullReply(reply.positions[order], reply.rows[order], reply.versions[order])


def _same_push(got: PushBatch, want: PushBatch) -> None:
    assert got.rows_by_trigger == want.rows_by_trigger
    assert torch.equal(got.keys, want.keys) and torch.equal(got.counts, want.counts)
    assert torch.equal(got.deltas, want.deltas)


def _same_cache(got: HetCache, want: ReferenceHetCache) -> None:
    assert got.stats == want.stats
    assert torch.equal(got.resident_keys(), want.resident_keys())
    resident = got.resident_keys()
    got_rows = got.values.rows[got.slot_of[resident]]
    assert torch.equal(got_rows, want.values.rows[want.slot_of[resident]])
    assert torch.equal(got.version[got.slot_of[resident]], want.version[want.slot_of[resident]])
    for policy, reference in zip(got.policies, want.reference, strict=True):
        assert policy.permanent == reference.permanent
    (got_keys, got_deltas), (want_keys, want_deltas) = got.unpushed(), want.unpushed()
    got_order, want_order = torch.argsort(got_keys), torch.argsort(want_keys)
    assert torch.equal(got_keys[got_order], want_keys[want_order])
    assert torch.equal(got_deltas[got_order], want_deltas[want_order])


def _random_keys(rng: torch.Generator, rows: int) -> torch.Tensor:
    draw = torch.rand(int(torch.randint(1, 14, (1,), generator=rng)), generator=rng)
    return torch.unique((rows * draw**3).long())


@pytest.mark.parametrize("name", ["lru", "lfu", "lfuopt"])
def test_vectorised_cache_matches_per_key_reference(name: str) -> None:
    """Random streams through small caches with prefetch, another worker's pushes, evictions and
    pinned lines: every read, push, residency, victim count and unpushed delta as the spec's."""
    rng = torch.Generator().manual_seed(11)
    sizes = [7, 12, 3, 20]
    for trial in range(8):
        capacities = [int(torch.randint(0, 5, (1,), generator=rng)) for _ in sizes]
        bound = trial % 3
        caches = (
            HetCache(sizes, capacities, 2, bound, name),
            ReferenceHetCache(sizes, capacities, 2, bound, name),
        )
        if name == "lfuopt":
            levels = LEVELS[trial % len(LEVELS)]
            for table, capacity in enumerate(capacities):
                caches[0].policies[table] = LFUOptPolicy(capacity, levels=levels)
            caches[1].reference = [ReferenceLFUOpt(c, levels=levels) for c in capacities]
        stores = [VersionedRows(torch.zeros(sum(sizes), 2)) for _ in caches]
        keys = _random_keys(rng, sum(sizes))
        requests = [cache.request(keys) for cache in caches]
        replies = [_sharded_pull(s, r, bound) for s, r in zip(stores, requests, strict=True)]
        for _ in range(30):
            values = [c.install(r, p) for c, r, p in zip(caches, requests, replies, strict=True)]
            assert torch.equal(values[0], values[1])
            next_keys = _random_keys(rng, sum(sizes))
            requests = [cache.request(next_keys) for cache in caches]
            assert torch.equal(requests[0].local_versions, requests[1].local_versions)
            replies = [_sharded_pull(s, r, bound) for s, r in zip(stores, requests, strict=True)]
            deltas = torch.randn(len(keys), 2, generator=rng)
            pushes = [cache.update(keys, deltas) for cache in caches]
            _same_push(pushes[0], pushes[1])
            other = _random_keys(rng, sum(sizes))  # another worker's pushes
            for store, push in zip(stores, pushes, strict=True):
                store.push(push.keys, push.deltas, push.counts)
                store.push(other, torch.ones(len(other), 2), torch.ones_like(other))
            _same_cache(*caches)
            keys = next_keys


def test_cache_settings_and_a_short_server_reply_are_named_errors() -> None:
    with pytest.raises(ValueError, match=r"^2 capacities for 3 tables$"):
        HetCache([4, 3, 2], [2, 2], dim=2, bound=0)
    with pytest.raises(ValueError, match=r"^het\.bound must be >= 0, got -1$"):
        HetCache([4], [2], dim=2, bound=-1)
    cache = HetCache([4], [2], dim=2, bound=0, policy="lru")
    request = cache.request(torch.tensor([0, 1]))
    short = PullReply(torch.tensor([0]), torch.zeros(1, 2), torch.tensor([0]))
    with pytest.raises(RuntimeError,
                       match=r"^het server did not return every row this worker does not cache$"):
        cache.install(request, short)
