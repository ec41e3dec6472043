"""Unit tests of the LRPP trainer cache: install, evict, gather, update, stale rows, write-back split."""

from __future__ import annotations

import pytest
import torch

from bagpipe.lrpp.cache import CacheError, TrainerCache
from bagpipe.oracle.plan import RoundPlan


def _rows(ids: torch.Tensor, dim: int = 3) -> torch.Tensor:
    return ids.to(torch.float32).unsqueeze(1).repeat(1, dim)


def test_install_then_gather_returns_the_installed_rows_in_request_order() -> None:
    cache = TrainerCache(capacity=8, dim=3)
    ids = torch.tensor([5, 40, 7])
    cache.install(ids, _rows(ids))
    got = cache.gather(torch.tensor([7, 5, 40, 7]))
    assert torch.equal(got, _rows(torch.tensor([7, 5, 40, 7])))
    assert len(cache) == 3
    assert cache.contains(torch.tensor([5, 6, 40])).tolist() == [True, False, True]


def test_gather_of_a_missing_row_is_an_error() -> None:
    cache = TrainerCache(capacity=4, dim=3)
    cache.install(torch.tensor([1]), _rows(torch.tensor([1])))
    with pytest.raises(CacheError, match="not resident"):
        cache.gather(torch.tensor([1, 2]))


def test_install_of_a_resident_row_is_an_error() -> None:
    cache = TrainerCache(capacity=4, dim=3)
    cache.install(torch.tensor([1, 2]), _rows(torch.tensor([1, 2])))
    with pytest.raises(CacheError, match="already resident"):
        cache.install(torch.tensor([2, 3]), _rows(torch.tensor([2, 3])))


def test_evict_frees_slots_for_reuse_and_returns_writeback_rows() -> None:
    cache = TrainerCache(capacity=3, dim=3)
    cache.install(torch.tensor([1, 2, 3]), _rows(torch.tensor([1, 2, 3])))
    rows, dropped = cache.evict(torch.tensor([1, 3, 99]), writeback=torch.tensor([3]))
    assert torch.equal(rows, _rows(torch.tensor([3])))
    assert sorted(dropped.tolist()) == [1, 3]  # 99 was not resident
    assert len(cache) == 1
    cache.install(torch.tensor([10, 11]), _rows(torch.tensor([10, 11])))
    assert torch.equal(cache.gather(torch.tensor([2, 10, 11])), _rows(torch.tensor([2, 10, 11])))


def test_bounded_capacity_overflow_is_an_error_and_unbounded_grows() -> None:
    bounded = TrainerCache(capacity=2, dim=3)
    with pytest.raises(CacheError, match="capacity 2"):
        bounded.install(torch.tensor([1, 2, 3]), _rows(torch.tensor([1, 2, 3])))
    unbounded = TrainerCache(capacity=None, dim=3)
    ids = torch.arange(3000)
    unbounded.install(ids, _rows(ids))
    assert torch.equal(unbounded.gather(ids[::7]), _rows(ids[::7]))


def test_apply_sgd_updates_only_the_given_rows() -> None:
    cache = TrainerCache(capacity=4, dim=2)
    ids = torch.tensor([4, 8])
    cache.install(ids, torch.ones(2, 2))
    cache.apply_sgd(torch.tensor([8]), torch.tensor([[2.0, 4.0]]), lr=0.5)
    assert torch.equal(cache.gather(ids), torch.tensor([[1.0, 1.0], [0.0, -1.0]]))


def test_stale_rows_cannot_be_read_or_written_back_but_can_be_evicted() -> None:
    cache = TrainerCache(capacity=4, dim=2)
    ids = torch.tensor([1, 2])
    cache.install(ids, torch.zeros(2, 2))
    assert cache.mark_stale(torch.tensor([2, 77])) == 1
    with pytest.raises(CacheError, match="stale"):
        cache.gather(torch.tensor([2]))
    with pytest.raises(CacheError, match="stale"):
        cache.evict(torch.tensor([2]), writeback=torch.tensor([2]))
    resident_ids, _ = cache.resident()
    assert resident_ids.tolist() == [1]
    cache.evict(torch.tensor([2]))
    cache.install(torch.tensor([2]), torch.ones(1, 2))
    assert torch.equal(cache.gather(torch.tensor([2])), torch.ones(1, 2))


def test_first_read_after_fetch_is_a_miss_later_reads_hit() -> None:
    cache = TrainerCache(capacity=4, dim=2)
    cache.install(torch.tensor([1, 2]), torch.zeros(2, 2))
    _, hits, misses = cache.read_for_step(torch.tensor([1]))
    assert (hits, misses) == (0, 1)
    _, hits, misses = cache.read_for_step(torch.tensor([1, 2]))
    assert (hits, misses) == (1, 1)


def test_writeback_split_writes_every_evicted_row_exactly_once_with_its_final_value() -> None:
    """Item 10 of the reference: a row that became trainer 1's singleton is stale on trainer 0.

    Both trainers held rows 1..4; row 3's last use was a singleton of trainer 1 (trainer 0 has a
    stale copy); row 9 was fetched by trainer 1 only. The union of the write-backs must be each
    evicted row once, with the owner's final value.
    """
    caches = [TrainerCache(capacity=8, dim=2) for _ in range(2)]
    shared = torch.tensor([1, 2, 3, 4])
    for cache in caches:
        cache.install(shared, torch.zeros(4, 2))
    caches[1].install(torch.tensor([9]), torch.zeros(1, 2))
    for cache in caches:  # a step's summed gradient, applied on both replicas
        cache.apply_sgd(shared, torch.ones(4, 2), lr=1.0)
    caches[1].apply_sgd(torch.tensor([3, 9]), torch.ones(2, 2), lr=1.0)  # trainer 1's singletons
    caches[0].mark_stale(torch.tensor([3, 9]))
    plan = RoundPlan(
        round_index=1,
        first_step=4,
        last_step=7,
        evict=torch.tensor([1, 2, 3, 4, 9]),
        writeback_owner=torch.tensor([0, 0, 1, 1, 1]),
        prefetch=torch.empty(0, dtype=torch.int64),
        prefetch_owner=torch.empty(0, dtype=torch.int64),
    )
    written: dict[int, torch.Tensor] = {}
    for k, cache in enumerate(caches):
        mine = plan.writeback_for(k)
        rows, _ = cache.evict(plan.evict, writeback=mine)
        for row_id, row in zip(mine.tolist(), rows, strict=True):
            assert row_id not in written
            written[row_id] = row
        assert len(cache) == 0
    assert sorted(written) == [1, 2, 3, 4, 9]
    assert torch.equal(written[3], torch.full((2,), -2.0))
    assert torch.equal(written[9], torch.full((2,), -1.0))
    assert torch.equal(written[1], torch.full((2,), -1.0))


def test_errors_name_the_operation_and_at_most_five_missing_ids() -> None:
    cache = TrainerCache(capacity=8, dim=3)
    cache.install(torch.tensor([1]), _rows(torch.tensor([1])))
    missing = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    calls = {
        "gather": lambda: cache.gather(missing),
        "read": lambda: cache.read_for_step(missing),
        "update": lambda: cache.apply_sgd(missing, torch.ones(7, 3), 0.1),
        "write back": lambda: cache.evict(missing, writeback=missing),
    }
    for what, call in calls.items():
        with pytest.raises(CacheError) as error:
            call()
        assert str(error.value) == (
            f"{what}: ids not resident, e.g. [2, 3, 4, 5, 6] (plan not followed?)"
        )
    bounded = TrainerCache(capacity=1, dim=3)
    with pytest.raises(CacheError) as error:
        bounded.install(torch.tensor([1, 2]), _rows(torch.tensor([1, 2])))
    assert str(error.value) == (
        "cache capacity 1 rows exceeded by 1 rows (the oracle's plan should never need more; "
        "is cache_capacity the planner's?)"
    )


def test_reads_resident_lists_and_evictions_by_value() -> None:
    cache = TrainerCache(capacity=4, dim=3)
    cache.install(torch.tensor([4, 2, 9]), _rows(torch.tensor([4, 2, 9])))
    rows, hits, misses = cache.read_for_step(torch.tensor([2, 9]))
    assert torch.equal(rows, _rows(torch.tensor([2, 9]))) and (hits, misses) == (0, 2)
    cache.mark_stale(torch.tensor([4]))
    ids, rows = cache.resident()
    assert ids.tolist() == [2, 9] and torch.equal(rows, _rows(torch.tensor([2, 9])))
    ids, rows = cache.resident(include_stale=True)
    assert ids.tolist() == [2, 4, 9] and torch.equal(rows, _rows(torch.tensor([2, 4, 9])))
    rows, dropped = cache.evict(torch.tensor([4]))
    assert rows.shape == (0, 3) and dropped.tolist() == [4]


def test_fresh_leaves_out_absent_and_stale_rows() -> None:
    cache = TrainerCache(capacity=4, dim=3)
    cache.install(torch.tensor([4, 2, 9]), _rows(torch.tensor([4, 2, 9])))
    cache.mark_stale(torch.tensor([4]))
    ids, rows = cache.fresh(torch.tensor([9, 4, 7, 2]))
    assert ids.tolist() == [9, 2] and torch.equal(rows, _rows(torch.tensor([9, 2])))


def test_an_eviction_is_journaled_when_the_caller_says_and_a_stale_mark_never() -> None:
    """A logging trainer journals an eviction only once its write-back is acknowledged; the log
    learns a stale mark from the peer's entry (``updatelog``)."""
    cache = TrainerCache(capacity=4, dim=3, journal=True)
    cache.install(torch.tensor([1, 2, 3]), _rows(torch.tensor([1, 2, 3])))
    cache.mark_stale(torch.tensor([1]))
    _, dropped = cache.evict(torch.tensor([2, 8]))
    assert cache.drain_dropped().tolist() == []
    cache.journal_dropped(dropped)
    assert cache.drain_dropped().tolist() == [2]


def test_a_cache_of_another_dtype_takes_float32_gradients() -> None:
    cache = TrainerCache(capacity=2, dim=3, dtype=torch.float64)
    cache.install(torch.tensor([1]), _rows(torch.tensor([1])))
    cache.apply_sgd(torch.tensor([1]), torch.ones(1, 3, dtype=torch.float32), 0.5)
    assert cache.gather(torch.tensor([1])).tolist() == [[0.5, 0.5, 0.5]]


def test_an_unbounded_cache_doubles_or_grows_by_what_it_needs() -> None:
    cache = TrainerCache(capacity=None, dim=1)
    first = cache.num_slots
    ids = torch.arange(first + 1)
    cache.install(ids, ids.to(torch.float32).unsqueeze(1))
    assert cache.num_slots == 2 * first  # doubled: one row more than it had
    more = torch.arange(first + 1, 5 * first)
    cache.install(more, more.to(torch.float32).unsqueeze(1))
    assert cache.num_slots == 5 * first  # exactly what the rows need, beyond a doubling
    assert torch.equal(cache.gather(torch.tensor([0, first, 5 * first - 1])).flatten(),
                       torch.tensor([0.0, first, 5 * first - 1]))


def test_a_fresh_cache_and_the_capacity_it_accepts() -> None:
    cache = TrainerCache(capacity=1, dim=3, dtype=torch.float64)
    ids, rows = cache.resident(include_stale=True)
    assert ids.dtype == torch.int64 and ids.shape == (0,) and rows.shape == (0, 3)
    assert cache.store.rows.dtype == torch.float64
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"^cache capacity must be a positive number of rows, got {bad}$"):
            TrainerCache(capacity=bad, dim=3)


def test_install_and_stale_errors_list_five_ids_and_the_shapes() -> None:
    cache = TrainerCache(capacity=8, dim=3)
    ids = torch.arange(1, 8)
    cache.install(ids, _rows(ids))
    with pytest.raises(CacheError) as error:
        cache.install(ids, _rows(ids))
    assert str(error.value) == "install: ids already resident, e.g. [1, 2, 3, 4, 5]"
    cache.mark_stale(ids)
    with pytest.raises(CacheError) as error:
        cache.gather(ids)
    assert str(error.value) == (
        "gather: stale copies of other trainers' singletons, e.g. [1, 2, 3, 4, 5]"
    )
    with pytest.raises(ValueError) as shape_error:
        cache.install(torch.tensor([20, 21]), torch.zeros(2, 4))
    assert str(shape_error.value) == "install: rows (2, 4) for 2 ids, dim 3"


def test_the_id_map_stays_the_resident_rows_through_installs_and_evictions() -> None:
    """The incremental map (entries set on install, cleared on evict, grown past the largest id)
    points every resident id at its slot and nothing else anywhere, whatever the order of installs
    and evictions."""
    generator = torch.Generator().manual_seed(7)
    cache = TrainerCache(capacity=64, dim=2)
    for _ in range(200):
        resident, _ = cache.resident(include_stale=True)
        if resident.numel() and (resident.numel() > 48 or torch.rand(1, generator=generator) < 0.4):
            picked = resident[torch.randperm(resident.numel(), generator=generator)[:5]]
            cache.evict(torch.cat([picked, torch.tensor([10_000])]))  # an absent id is ignored
        else:
            candidates = torch.randperm(500, generator=generator)[:8]
            new = candidates[~cache.contains(candidates)]
            cache.install(new, new.float().unsqueeze(1).expand(-1, 2).contiguous())
        slots = torch.nonzero(cache.occupied).flatten()
        mapped = torch.nonzero(cache.slot_of >= 0).flatten()
        assert torch.equal(mapped, torch.sort(cache.slot_id[slots]).values)
        assert torch.equal(cache.slot_of[cache.slot_id[slots]].long(), slots)
        ids, rows = cache.resident()
        assert torch.equal(rows[:, 0], ids.float()) and len(cache) == slots.numel()
        assert not cache.contains(torch.tensor([cache.slot_of.numel() + 3])).any()


def test_an_empty_cache_finds_nothing_and_drops_nothing() -> None:
    cache = TrainerCache(capacity=4, dim=2)
    ids = torch.tensor([3, 8])
    assert not cache.contains(ids).any()
    rows, dropped = cache.evict(ids)
    assert rows.shape == (0, 2) and dropped.numel() == 0
    assert cache.mark_stale(ids) == 0 and len(cache) == 0


def test_the_map_covers_the_largest_id_growing_by_doubling_and_minus_one_means_absent() -> None:
    """4 bytes per row of the row space, grown only as far as the ids installed need (ids of
    any integer type)."""
    cache = TrainerCache(capacity=8, dim=1)
    cache.install(torch.tensor([9, 2], dtype=torch.int32), torch.zeros(2, 1))
    assert cache.slot_of.numel() == 10 and cache.slot_of.dtype == torch.int32
    cache.install(torch.tensor([12]), torch.zeros(1, 1))
    assert cache.slot_of.numel() == 20  # doubled: it covers 12
    cache.install(torch.tensor([19]), torch.zeros(1, 1))
    assert cache.slot_of.numel() == 20  # still covered
    cache.evict(torch.tensor([9, 12]))
    held = cache.slot_of >= 0
    assert torch.nonzero(held).flatten().tolist() == [2, 19]
    assert (cache.slot_of[~held] == -1).all()


def test_a_cache_without_a_journal_refuses_to_drain_it_and_ignores_drops() -> None:
    plain = TrainerCache(capacity=4, dim=2)
    plain.journal_dropped(torch.tensor([1, 2]))  # nothing kept, nothing raised
    with pytest.raises(CacheError) as error:
        plain.drain_dropped()
    assert str(error.value) == "drain_dropped: this cache keeps no journal"
    journaled = TrainerCache(capacity=4, dim=2, journal=True)
    drained = journaled.drain_dropped()
    assert drained.numel() == 0 and drained.dtype == torch.int64


def test_evicting_without_a_write_back_gives_no_rows_of_the_caches_dtype() -> None:
    cache = TrainerCache(capacity=4, dim=3, dtype=torch.float64)
    cache.install(torch.tensor([5]), torch.ones(1, 3, dtype=torch.float64))
    rows, dropped = cache.evict(torch.tensor([5]))
    assert rows.shape == (0, 3) and rows.dtype == torch.float64 and dropped.tolist() == [5]
