"""FAE's offline logic on hand-checked cases: counts, hot-row choice, classification, scheduling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bagpipe.core.batch import DatasetSchema, ids_matrix, split_batch
from bagpipe.data import ArraySource
from bagpipe.data.examples import Examples
from baselines.fae.hotset import choose_hot_rows, sample_access_counts
from baselines.fae.layout import (
    FaeSettings,
    FaeSource,
    build_layout,
    cached_layout,
    chunk,
    sample_counts,
)
from baselines.fae.scheduler import ShuffleScheduler

ROW_BYTES_DIM4 = 16


def test_sample_access_counts_full_sample_is_exact_bincount() -> None:
    ids = torch.tensor([[0, 3], [1, 3], [0, 4]])
    counts, sampled = sample_access_counts(ids, total_rows=5, sample_rate=1.0, seed=0)
    assert counts.tolist() == [2, 1, 0, 2, 1] and sampled == 3
    counts, sampled = sample_access_counts(ids, total_rows=5, sample_rate=0.34, seed=0)
    assert sampled == 2 and int(counts.sum()) == 4


def test_sample_access_counts_is_seeded_sizes_its_sample_and_checks_its_rate() -> None:
    ids = torch.arange(20).view(10, 2)
    torch.manual_seed(1)
    first, sampled = sample_access_counts(ids, total_rows=30, sample_rate=0.3, seed=5)
    torch.manual_seed(2)  # the global RNG plays no part: the sample follows ``seed`` only
    again, _ = sample_access_counts(ids, total_rows=30, sample_rate=0.3, seed=5)
    assert torch.equal(first, again) and sampled == 3 and len(first) == 30
    assert any(not torch.equal(first, sample_access_counts(ids, 30, 0.3, seed)[0])
               for seed in range(6, 10))
    counts, sampled = sample_access_counts(ids, total_rows=30, sample_rate=0.01, seed=0)
    assert sampled == 1 and int(counts.sum()) == 2  # at least one example, however small x
    for rate in (0.0, 1.5):
        with pytest.raises(ValueError, match=rf"^fae\.sample_rate must be in \(0, 1\], got {rate}$"):
            sample_access_counts(ids, total_rows=30, sample_rate=rate, seed=0)


def test_choose_hot_rows_defaults_are_the_papers() -> None:
    """Paper mode, FAE's 5% sample, 60 bisection steps."""
    kwargs = {"accesses_per_table": [200, 200], "min_table_bytes": 0}
    default = choose_hot_rows(_counts(), [4, 4], 4, budget_bytes=3 * ROW_BYTES_DIM4, **kwargs)
    spelled = choose_hot_rows(_counts(), [4, 4], 4, budget_bytes=3 * ROW_BYTES_DIM4,
                              mode="paper", sample_rate=0.05, search_iterations=60, **kwargs)
    assert default.mode == "paper" and default.rows.tolist() == spelled.rows.tolist()
    assert default.threshold == spelled.threshold


def _counts() -> torch.Tensor:
    #                  table 0          table 1
    return torch.tensor([10, 5, 1, 0, 8, 0, 3, 2])


def test_code_mode_takes_global_top_n_of_sampled_rows() -> None:
    hot = choose_hot_rows(
        _counts(), [4, 4], 4, budget_bytes=3 * ROW_BYTES_DIM4, mode="code", min_table_bytes=0
    )
    assert hot.rows.tolist() == [0, 1, 4]
    # a budget beyond the sampled rows never makes unsampled rows hot
    hot = choose_hot_rows(
        _counts(), [4, 4], 4, budget_bytes=100 * ROW_BYTES_DIM4, mode="code", min_table_bytes=0
    )
    assert hot.rows.tolist() == [0, 1, 2, 4, 6, 7]


def test_paper_mode_threshold_search_fits_budget_with_eq1_scale() -> None:
    # T_z = 20 accesses per table, x = 0.5: the cutoff in sampled counts is t * 20 * 0.5 = 10 t
    kwargs = {
        "mode": "paper",
        "sample_rate": 0.5,
        "accesses_per_table": [20, 20],
        "min_table_bytes": 0,
    }
    hot = choose_hot_rows(_counts(), [4, 4], 4, budget_bytes=3 * ROW_BYTES_DIM4, **kwargs)
    assert hot.rows.tolist() == [0, 1, 4]  # counts >= 4 or 5; count 3 would make 4 rows
    assert 0.3 < hot.threshold <= 0.5  # the smallest t that fits: 10 t in (3, 5]
    hot = choose_hot_rows(_counts(), [4, 4], 4, budget_bytes=4 * ROW_BYTES_DIM4, **kwargs)
    assert hot.rows.tolist() == [0, 1, 4, 6]
    hot = choose_hot_rows(_counts(), [4, 4], 4, budget_bytes=0, **kwargs)
    assert hot.rows.tolist() == []


def test_small_tables_are_all_hot_and_use_budget_first() -> None:
    # table 0 (4 rows * 16 B = 64 B) is under min_table_bytes = 100 B; table 1 (8 rows) is not
    counts = torch.tensor([0, 0, 0, 9, 7, 0, 0, 0, 0, 0, 0, 1])
    hot = choose_hot_rows(
        counts, [4, 8], 4, budget_bytes=5 * ROW_BYTES_DIM4, mode="code", min_table_bytes=100
    )
    assert hot.rows.tolist() == [0, 1, 2, 3, 4]  # table 0 whole, then the top-1 of table 1
    assert hot.bytes == 5 * ROW_BYTES_DIM4


def test_a_table_exactly_at_the_bar_is_searched_and_a_spent_budget_ends_the_pick() -> None:
    counts = torch.tensor([0, 0, 0, 9, 7, 0, 0, 0, 0, 0, 0, 1])
    paper = {"mode": "paper", "accesses_per_table": [10, 10], "sample_rate": 1.0}
    # table 0 is exactly 64 B: not under a 64 B bar, so it competes like table 1
    hot = choose_hot_rows(counts, [4, 8], 4, budget_bytes=2 * ROW_BYTES_DIM4,
                          min_table_bytes=64, **paper)
    assert hot.rows.tolist() == [3, 4] and hot.threshold is not None
    # table 0 under a 65 B bar takes the whole budget: no search, nothing else hot
    hot = choose_hot_rows(counts, [4, 8], 4, budget_bytes=4 * ROW_BYTES_DIM4,
                          min_table_bytes=65, **paper)
    assert hot.rows.tolist() == [0, 1, 2, 3] and hot.threshold is None
    assert (hot.mode, hot.row_bytes, hot.bytes) == ("paper", 16, 64)
    # one byte left: the search runs and finds no row small enough to fit
    hot = choose_hot_rows(counts, [4, 8], 4, budget_bytes=4 * ROW_BYTES_DIM4 + 1,
                          min_table_bytes=65, **paper)
    assert hot.rows.tolist() == [0, 1, 2, 3] and hot.threshold is not None


def test_code_mode_breaks_ties_by_row_id_and_never_picks_an_unsampled_row() -> None:
    counts = torch.zeros(600, dtype=torch.int64)
    counts[100:600] = 1  # 500 rows tied at one access, after 100 never sampled
    counts[50] = 5
    hot = choose_hot_rows(counts, [600], 4, budget_bytes=40 * ROW_BYTES_DIM4, mode="code",
                          min_table_bytes=0)
    assert hot.rows.tolist() == [50, *range(100, 139)]
    assert (hot.mode, hot.threshold, hot.row_bytes) == ("code", None, 16)


def test_paper_mode_at_the_ends_of_its_search() -> None:
    counts = torch.tensor([0, 0, 0, 0, 10, 4, 0, 1])  # row 4 takes every access of table 1
    paper = {"mode": "paper", "accesses_per_table": [10, 10], "sample_rate": 1.0,
             "min_table_bytes": 0}
    # a budget for every sampled row: all of them, at the search's lowest t
    hot = choose_hot_rows(counts, [4, 4], 4, budget_bytes=10 * ROW_BYTES_DIM4, **paper)
    assert hot.rows.tolist() == [4, 5, 7] and hot.threshold == pytest.approx(1e-12)
    assert (hot.mode, hot.row_bytes) == ("paper", 16)
    # no room for one row, and one row is hot at t = 1: no t fits, none is hot
    hot = choose_hot_rows(counts, [4, 4], 4, budget_bytes=ROW_BYTES_DIM4 - 1, **paper)
    assert hot.rows.tolist() == [] and hot.threshold == math.inf
    with pytest.raises(ValueError, match=r"^fae paper mode needs accesses_per_table \(T_z of Eq\. 1\)$"):
        choose_hot_rows(counts, [4, 4], 4, budget_bytes=ROW_BYTES_DIM4, mode="paper",
                        min_table_bytes=0)


def test_unknown_mode_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"fae\.threshold_mode"):
        choose_hot_rows(_counts(), [4, 4], 4, budget_bytes=10, mode="clt")


SCHEMA = DatasetSchema("tiny", num_dense=1, table_sizes=(4, 3), feature_names=("a", "b"))


def _source(batch_size: int = 4) -> ArraySource:
    """Eight examples: ids as below, dense value = position, label = position % 2."""
    ids = np.array([[0, 0], [1, 0], [0, 1], [2, 2], [0, 0], [3, 0], [0, 0], [1, 1]])
    examples = Examples((np.arange(8) % 2).astype(np.int8),
                        np.arange(8, dtype=np.float32).reshape(8, 1), ids)
    return ArraySource(examples, SCHEMA, batch_size)


def test_classification_marks_an_input_hot_only_if_all_lookups_are_hot() -> None:
    # hot budget 3 rows with dim 4: top-3 sampled rows of the full sample are a0, b0 (global 4), a1
    settings = FaeSettings(
        sample_rate=1.0,
        hot_budget_bytes=3 * ROW_BYTES_DIM4,
        threshold_mode="code",
        min_table_bytes=0,
    )
    layout = build_layout(_source(), SCHEMA, 4, settings)
    assert layout.hot.rows.tolist() == [0, 1, 4]
    assert layout.hot_examples.tolist() == [0, 1, 4, 6]
    assert layout.cold_examples.tolist() == [2, 3, 5, 7]
    assert layout.hot_input_share == 0.5


def test_repacked_source_runs_pure_batches_in_fixed_schedule_order() -> None:
    settings = FaeSettings(
        sample_rate=1.0,
        hot_budget_bytes=3 * ROW_BYTES_DIM4,
        threshold_mode="code",
        min_table_bytes=0,
        scheduler="fixed",
    )
    original = _source()
    layout = build_layout(original, SCHEMA, 4, settings)
    source = FaeSource(original, SCHEMA, batch_size=2, layout=layout, settings=settings)
    assert len(source) == 4
    order = [source.example_indices(i).tolist() for i in range(4)]
    assert order == [[2, 3], [5, 7], [0, 1], [4, 6]]  # all cold, then all hot
    batch = source[2]
    assert ids_matrix(batch).tolist() == [[0, 0], [1, 0]]
    assert batch.dense_features.flatten().tolist() == [0.0, 1.0]
    with pytest.raises(IndexError):
        source[4]


def test_source_without_repacking_keeps_original_batches() -> None:
    settings = FaeSettings(sample_rate=1.0, repack=False, min_table_bytes=0, hot_budget_bytes=16)
    original = _source(2)
    source = FaeSource(original, SCHEMA, 2, build_layout(original, SCHEMA, 4, settings), settings)
    assert [source.example_indices(i).tolist() for i in range(len(source))] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]
    assert torch.equal(source[3].dense_features, original[3].dense_features)


def test_chunk_drops_partial_batch_only_when_asked() -> None:
    assert [c.tolist() for c in chunk(torch.arange(5), 2, drop_last=True)] == [[0, 1], [2, 3]]
    assert len(chunk(torch.arange(5), 2, drop_last=False)) == 3


def test_scheduler_r50_alternates_half_runs_starting_cold() -> None:
    scheduler = ShuffleScheduler(num_hot=4, num_cold=4, mode="adaptive", initial_rate=50)
    kinds = [scheduler.next_batch() for _ in range(8)]
    assert kinds == [
        ("cold", 0),
        ("cold", 1),
        ("hot", 0),
        ("hot", 1),
        ("cold", 2),
        ("cold", 3),
        ("hot", 2),
        ("hot", 3),
    ]
    assert scheduler.swaps == 3
    assert scheduler.next_batch() == ("cold", 0)  # a new epoch starts cold again


def test_scheduler_finishes_the_remaining_kind_when_one_runs_out() -> None:
    scheduler = ShuffleScheduler(num_hot=3, num_cold=1, initial_rate=50)
    assert [k for k, _ in (scheduler.next_batch() for _ in range(4))] == [
        "cold",
        "hot",
        "hot",
        "hot",
    ]


def test_adaptive_rate_halves_on_rise_and_doubles_after_four_falls() -> None:
    scheduler = ShuffleScheduler(num_hot=10, num_cold=10, initial_rate=50)
    for loss in (0.7, 0.8):
        scheduler.observe_loss(loss)
    assert scheduler.rate == 25
    for loss in (0.6, 0.5, 0.4):
        scheduler.observe_loss(loss)
    assert scheduler.rate == 25  # three falls: not yet
    scheduler.observe_loss(0.3)
    assert scheduler.rate == 50
    assert scheduler.rate_trace == [50, 50, 25, 25, 25, 25, 50]
    fixed = ShuffleScheduler(num_hot=1, num_cold=1, mode="fixed")
    fixed.observe_loss(1.0)
    fixed.observe_loss(2.0)
    assert fixed.rate == 100


def _kinds(scheduler: ShuffleScheduler, steps: int) -> str:
    return "".join(scheduler.next_batch()[0][0] for _ in range(steps))  # "c" / "h"


def test_scheduler_runs_are_a_share_of_each_kind_and_epochs_repeat() -> None:
    # R(50) over 2 cold and 8 hot batches: runs of 1 cold and 4 hot
    scheduler = ShuffleScheduler(num_hot=8, num_cold=2, initial_rate=50)
    assert _kinds(scheduler, 20) == "chhhhchhhh" * 2
    # R(25) over 4 cold and 8 hot batches: runs of 1 cold and 2 hot, to the end of both
    assert _kinds(ShuffleScheduler(num_hot=8, num_cold=4, initial_rate=25), 12) == "chh" * 4
    # R(100) over 202 cold batches: every cold batch before the hot one
    assert _kinds(ShuffleScheduler(num_hot=1, num_cold=202, mode="fixed"), 203) == "c" * 202 + "h"
    # only hot batches: it starts hot
    assert _kinds(ShuffleScheduler(num_hot=1, num_cold=0), 3) == "hhh"


def test_scheduler_settings_are_checked_at_their_bounds() -> None:
    for rate in (1, 100):
        assert ShuffleScheduler(num_hot=1, num_cold=1, initial_rate=rate).rate == rate
    for rate in (0, 101):
        with pytest.raises(ValueError, match=rf"^fae\.initial_rate must be in \[1, 100\], got {rate}$"):
            ShuffleScheduler(num_hot=1, num_cold=1, initial_rate=rate)
    with pytest.raises(ValueError, match=r"^fae\.scheduler: unknown 'random'; choose one of "):
        ShuffleScheduler(num_hot=1, num_cold=1, mode="random")
    with pytest.raises(ValueError, match=r"^fae: the re-packed data set has no full mini-batch$"):
        ShuffleScheduler(num_hot=0, num_cold=0)


def test_adaptive_rate_floor_cap_and_ties() -> None:
    scheduler = ShuffleScheduler(num_hot=10, num_cold=10, initial_rate=25)
    for loss in (0.9,) * 6:  # neither a rise nor a fall, however often
        scheduler.observe_loss(loss)
    assert scheduler.rate == 25
    scheduler.observe_loss(1.0)
    assert scheduler.rate == 12 and isinstance(scheduler.rate, int)  # halved, whole batches
    for loss in (2.0, 3.0, 4.0, 5.0):
        scheduler.observe_loss(loss)
    assert scheduler.rate == 1  # 12 -> 6 -> 3 -> 1 -> 1: never below one batch
    falling = ShuffleScheduler(num_hot=10, num_cold=10, initial_rate=16)
    for loss in (0.9, 0.8, 0.7, 0.6):  # three falls from the start: not yet
        falling.observe_loss(loss)
    assert falling.rate == 16
    for loss in (0.5, 0.4, 0.3, 0.2, 0.1):  # the fourth doubles; four more are needed again
        falling.observe_loss(loss)
    assert falling.rate_trace[-5:] == [32, 32, 32, 32, 64]
    capped = ShuffleScheduler(num_hot=10, num_cold=10, initial_rate=64)
    for loss in (0.9, 0.8, 0.7, 0.6, 0.5):
        capped.observe_loss(loss)
    assert capped.rate == 100  # doubled, capped at R(100)


def test_layout_is_cached_per_data_and_settings(tmp_path: Path) -> None:
    settings = FaeSettings(sample_rate=1.0, min_table_bytes=0, hot_budget_bytes=48)
    first, cached = cached_layout(_source(), SCHEMA, 4, settings, tmp_path)
    assert not cached
    again, cached = cached_layout(_source(), SCHEMA, 4, settings, tmp_path)
    assert cached and torch.equal(again.hot.is_hot, first.hot.is_hot)
    assert torch.equal(again.cold_examples, first.cold_examples)
    other = FaeSettings(sample_rate=1.0, min_table_bytes=0, hot_budget_bytes=32)
    _, cached = cached_layout(_source(), SCHEMA, 4, other, tmp_path)
    assert not cached and len(list(tmp_path.glob("fae-layout-*.pt"))) == 2


def test_sampled_counts_are_a_uniform_sample_of_the_stream() -> None:
    source = _source(2)
    offsets = SCHEMA.table_offsets
    full, sampled = sample_counts(source, SCHEMA.total_rows, offsets, 1.0, seed=0)
    assert sampled == 8 and full.tolist() == [4, 2, 1, 1, 5, 2, 1]
    half, sampled = sample_counts(source, SCHEMA.total_rows, offsets, 0.5, seed=3)
    assert sampled == 4 and int(half.sum()) == 8 and bool((half <= full).all())
    again, _ = sample_counts(source, SCHEMA.total_rows, offsets, 0.5, seed=3)
    assert torch.equal(again, half)


def test_repacked_source_reads_slices_and_ids_from_the_original() -> None:
    settings = FaeSettings(sample_rate=1.0, hot_budget_bytes=3 * ROW_BYTES_DIM4,
                           threshold_mode="code", min_table_bytes=0, scheduler="fixed")
    original = _source(2)
    reads: list[int] = []

    class Counting(ArraySource):
        def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
            reads.append(index)
            return super().__getitem__(index)

    counted = Counting(original.store, SCHEMA, 2)
    source = FaeSource(counted, SCHEMA, 4, build_layout(original, SCHEMA, 4, settings), settings)
    for index in range(len(source)):
        whole = source[index]
        for part in range(2):
            reads.clear()
            piece = source.slice(index, part, 2)
            want = split_batch(whole, 2)[part]
            assert torch.equal(ids_matrix(piece), ids_matrix(want))
            assert torch.equal(piece.dense_features, want.dense_features)
            assert torch.equal(piece.labels, want.labels)
            positions = source.example_indices(index)[2 * part: 2 * part + 2]
            assert set(reads) <= set((positions // 2).tolist())  # only originals holding it
        assert torch.equal(source.ids(index), ids_matrix(whole))
