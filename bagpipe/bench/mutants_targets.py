"""What the mutation benchmark mutates, against which tests, and the survivors known to be harmless.

A target is one file, optionally narrowed to some of its functions (mutmut's names: ``x_name`` for
a function, ``xǁClassǁmethod`` for a method), and the test files that cover it. Only code that the
tests call in the pytest process is mapped to them by mutmut: the roles' methods that run in spawned
processes (Bagpipe's trainer step, HET's trainer) are covered by the system tests but left out
here, their logic being mutated where it lives (``lrpp.trainer``'s sync helpers, ``het.cache``,
``het.clocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACCEPTED", "EQUIVALENT", "TARGETS", "Target"]


@dataclass(frozen=True)
class Target:
    """One row of the table: ``source`` mutated (only ``functions`` if given) against ``tests``."""

    module: str
    source: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()


TARGETS: tuple[Target, ...] = (
    Target("meter", "bagpipe/core/meter.py", ("tests/core/test_step_record.py",)),
    Target("network charging", "bagpipe/core/net/wire.py", ("tests/core/test_wire.py",)),
    Target(
        "oracle planner",
        "bagpipe/oracle/cacher.py",
        ("tests/oracle/test_against_reference.py", "tests/oracle/test_hand_streams.py",
         "tests/oracle/test_parts.py", "tests/oracle/test_properties.py"),
        functions=(*(f"xǁOracleCacherǁ{method}" for method in (
            "_record", "_step_plan", "_round_plan", "_round_rows", "_victims", "_check_capacity",
            "_make_room", "_prefetch", "_commit", "_furthest", "_evict", "_flush_plan")),
            "x__sorted_with_owner"),
    ),
    Target("bagpipe cache", "bagpipe/lrpp/cache.py", ("tests/lrpp/test_cache.py",)),
    Target(
        "bagpipe trainer sync",
        "bagpipe/lrpp/trainer.py",
        ("tests/lrpp/test_reclassify.py",),
        functions=("x_scatter_rows", "x__merged", "x_reclassify", "xǁ_Boardǁ*"),
    ),
    Target("het cache", "baselines/het/cache.py",
           ("tests/baselines/test_het_cache.py", "tests/baselines/test_het_staleness.py")),
    Target("het clocks and server read", "baselines/het/clocks.py",
           ("tests/baselines/test_het_cache.py", "tests/baselines/test_het_staleness.py")),
    Target("fae threshold search", "baselines/fae/hotset.py",
           ("tests/baselines/test_fae_layout.py",)),
    Target("fae scheduler", "baselines/fae/scheduler.py",
           ("tests/baselines/test_fae_layout.py",)),
    Target("checkpoint store", "bagpipe/core/checkpoint.py",
           ("tests/fault/test_checkpoint_store.py",)),
    Target(
        "checkpoint fingerprint",
        "bagpipe/harness/run/train.py",
        ("tests/fault/test_fingerprint.py",),
        functions=("x__checkpoint_store", "x__flat_params"),
    ),
    Target(
        "runner statistics",
        "bagpipe/harness/run/runner.py",
        ("tests/harness/test_runner.py", "tests/harness/test_statistics.py"),
        functions=("x_summarize", "x__quantile", "xǁ_TrainingLoopǁsummary"),
    ),
    Target(
        "readers error paths",
        "bagpipe/data/readers.py",
        ("tests/data/test_bad_input.py", "tests/data/test_roundtrip.py",
         "tests/data/test_reader_properties.py"),
        functions=("xǁ_RowCheckerǁ*", "x__read_segment", "x__parse_ints", "x__parse_label",
                   "x__keep", "x__read_blocks", "x__jsonl_record", "x_iter_jsonl",
                   "x_avazu_header"),
    ),
    Target(
        "reader segments",
        "bagpipe/data/segments.py",
        ("tests/data/test_segments.py", "tests/data/test_bad_input.py",
         "tests/data/test_roundtrip.py", "tests/data/test_reader_properties.py"),
        functions=("x_iter_segments", "xǁSegmentǁ*"),
    ),
)

#: Surviving mutants that cannot change what the code does, by mutmut's name, with the reason.
#: They are left out of ``caught_pct``'s denominator.
EQUIVALENT: dict[str, str] = {
    "bagpipe.lrpp.trainer.xǁ_Boardǁ__init____mutmut_4": (
        "`closed = None` for `False`: it is only tested for truth."),
    **{f"bagpipe.data.readers.x__jsonl_record__mutmut_{n}": (
        "`zip(sparse, table_sizes, strict=...)` right after `len(sparse) != len(table_sizes)` "
        "was refused: the two are equally long.") for n in (50, 53, 54)},
    "bagpipe.data.segments.x_iter_segments__mutmut_36": (
        "The one-copy shortcut disabled: a segment that is a whole chunk is copied instead of "
        "handed on, the same bytes."),
    **{f"bagpipe.core.net.wire.xǁWireǁhold_collective__mutmut_{n}": (
        "The server count dropped from `host_of` for a collective's peers: they are trainers, "
        "whose host is their own name whatever the count.") for n in (9, 15, 24)},
    "bagpipe.core.net.wire.x__sleep__mutmut_4": (
        "`>= 0` for `> 0`: at exactly 0 s left it sleeps 0 s once more."),
    **{f"bagpipe.oracle.cacher.x__sorted_with_owner__mutmut_{n}": (
        "int64 sort keys where int32 keys would fit (or a cast that copies where it need not): "
        "the same sorted ids and owners, more slowly.")
       for n in (1, 6, 11, 20, 22, 23, 29, 31, 33, 37, 39, 45)},
    **{f"bagpipe.oracle.cacher.xǁOracleCacherǁ_record__mutmut_{n}": (
        "The reserve thread's ready buffers not handed to `cover`: it allocates them itself (a "
        "stall, counted in `stalls`), the same rows in the same arrays.") for n in (6, 8)},
    **{f"bagpipe.oracle.cacher.xǁOracleCacherǁ_record__mutmut_{n}": (
        "`np.arange(..., dtype=np.int64)` without the dtype: numpy 2's default integer is int64 "
        "on every platform.") for n in (47, 49)},
    **{f"bagpipe.oracle.cacher.xǁOracleCacherǁ_evict__mutmut_{n}": reason for n, reason in (
        (17, "`/` for `//` in the spread of write-back owners: the quotient of non-negative "
             "ints, stored into an int64 array, is truncated to the same floor."),
        (24, "`max(2, n)` for `max(1, n)`: they differ only at n = 1, where the one owner is "
             "0 * T // n = 0 either way."),
        (25, "`None` for `False` stored into a bool array: numpy stores False."))},
    **{f"bagpipe.oracle.cacher.xǁOracleCacherǁ_flush_plan__mutmut_{n}": (
        "The resident rows after the flush plan, the last plan of a stream: nothing reads them "
        "again.") for n in (3, 4)},
    "bagpipe.oracle.cacher.xǁOracleCacherǁ_furthest__mutmut_1": (
        "`count > size` for `>=`: at count = size the selection path picks every row as well "
        "(threshold = the smallest next use; every row is beyond or tied at it)."),
    "bagpipe.oracle.cacher.xǁOracleCacherǁ_commit__mutmut_5": (
        "`nxt >= last` also records a use whose next use is the round's last step; that later "
        "use is committed after it and overwrites all three of the row's fields."),
    "bagpipe.data.readers.x__parse_ints__mutmut_6": (
        "`zero_copy_only=None` for `False`: pyarrow tests it for truth, and a null mask is "
        "copied either way."),
    "bagpipe.data.readers.x__parse_ints__mutmut_40": (
        "`int(text)` for `int(text, 10)`: base 10 is int's default."),
    **{f"bagpipe.data.readers.x__read_segment__mutmut_{n}": (
        "The int64 fast path never taken (or its parsed types never handed in): every segment "
        "parses on the checked path, which gives the same values and errors "
        "(test_criteo_checked_path_matches_fast_path), more slowly.") for n in (46, 50)},
    "bagpipe.data.readers.x__read_blocks__mutmut_7": (
        "The int64 fast path's types not handed in: as `_read_segment` mutants 46 and 50."),
    **{f"bagpipe.data.readers.x__read_segment__mutmut_{n}": (
        "pyarrow's block size (one block per segment, its default 1 MB, or one byte more): read "
        "with `use_threads=False`, pyarrow numbers invalid rows across its blocks, so only the "
        "count of blocks changes (a 3 MB segment reports the same lines: "
        "test_errors_map_to_lines_past_pyarrows_own_block_size).") for n in (16, 20, 25)},
    "bagpipe.data.readers.xǁ_RowCheckerǁfinish__mutmut_12": (
        "`None` stored into a bool array: numpy stores False."),
    "bagpipe.data.readers.xǁ_RowCheckerǁfinish__mutmut_16": (
        "`is_row[0] = ...` for `&=`: they differ only when the segment's first line is itself an "
        "invalid row, which is then the earliest problem and the one reported either way."),
    "bagpipe.data.readers.xǁ_RowCheckerǁfinish__mutmut_38": (
        "An all-True mask for None when only invalid rows were dropped: pyarrow left those rows "
        "out already, so keeping every parsed row is what None does."),
    "bagpipe.data.readers.xǁ_RowCheckerǁflag__mutmut_13": (
        "\"UTF-8\" for \"utf-8\": Python's codec names are case-insensitive."),
    **{f"bagpipe.data.readers.x_iter_jsonl__mutmut_{n}": (
        "The ids' `dtype=np.int64` dropped: numpy 2 makes Python ints int64 on every platform.")
       for n in (34, 36)},
    "baselines.fae.scheduler.xǁShuffleSchedulerǁ_new_epoch__mutmut_8": (
        "The first run's length computed for the cold kind: an epoch starts hot only when there "
        "is no cold batch, and then no run ever ends in a swap, whatever its length."),
    **{f"baselines.het.cache.xǁHetCacheǁ__init____mutmut_{n}": (
        "`dtype=torch.int64` dropped where the values are Python ints: torch infers int64.")
       for n in (13, 15, 40, 43, 54, 57)},
    **{f"baselines.het.cache.xǁHetCacheǁkey_of_slot__mutmut_{n}": (
        "`dtype=torch.int64` dropped where the fill is the Python int -1: torch infers int64.")
       for n in (5, 8)},
    **{f"baselines.het.cache.xǁHetCacheǁ{name}__mutmut_{n}": (
        "An empty line or uncached key marked -2 instead of -1: every test of it is `>= 0` "
        "/ `< 0`.") for name, n in (("__init__", 62), ("_evict", 3))},
    **{f"baselines.het.cache.xǁHetCacheǁ__init____mutmut_{n}": (
        "The version of a line that holds no key: `install` writes a line's version before "
        "any read of it.") for n in (44, 45)},
    "baselines.het.cache.xǁHetCacheǁ__init____mutmut_63": (
        "The eviction queue as None until the first update: only dirty lines are queued, a "
        "line is dirty only after an update, and the first update sets the queue to []; "
        "`not None` reads as empty meanwhile."),
    **{f"baselines.het.cache.xǁHetCacheǁrequest__mutmut_{n}": (
        "`PullRequest.misses`: nothing reads it (the cache counts misses in `stats`).")
       for n in (30, 35)},
    **{f"bagpipe.lrpp.cache.xǁTrainerCacheǁ__init____mutmut_{n}": (
        "`_fetched_unread` as floats instead of bools: it is only set to True/False and summed "
        "(`int(...sum())`), never used as a mask, so the miss counts are the same.")
       for n in (41, 43)},
    **{f"bagpipe.lrpp.cache.xǁTrainerCacheǁ__init____mutmut_{n}": (
        "The empty id map's dtype: a lookup in an empty map reads nothing, and the first "
        "install replaces the map with an int32 one (`_map`).") for n in (46, 48)},
    "bagpipe.lrpp.cache.xǁTrainerCacheǁ_lookup__mutmut_2": (
        "A lookup keeps int32 ids as they are: clamping and `index_select` take them, and the "
        "slots come back int64 either way."),
    "baselines.fae.hotset.x_choose_hot_rows__mutmut_4": (
        "61 bisection steps for the default 60: after 60 halvings the log-t interval is 2.4e-17 "
        "wide, so a 61st step moves t = exp(high) by less than a double's relative precision "
        "(2.2e-16): the same threshold and hot set."),
    "baselines.het.cache.xǁHetCacheǁ_evicted_tensors__mutmut_10": (
        "An empty eviction queue's deltas as `(0,)` instead of `(0, dim)`: `torch.cat` skips "
        "1-D empty tensors (its legacy rule), so the joined push and unpushed lists are the same."),
    **{f"baselines.het.cache.xǁHetCacheǁ_evicted_tensors__mutmut_{n}": (
        "`zip(..., strict=)` over the queue's (keys, deltas, counts) triples: every entry has "
        "three parts, so the three lists are always equally long.") for n in (18, 20, 21)},
    "baselines.het.cache.xǁHetCacheǁupdate__mutmut_58": (
        "`PushBatch.concat`'s `dim` shapes only an empty push of no parts; `update` always "
        "passes its three parts (bound, eviction, uncached)."),
    "baselines.fae.hotset.x_choose_hot_rows__mutmut_59": (
        "Code mode's fill for rows that are not candidates, -2 for -1: any negative value sorts "
        "them below every candidate (candidates have a count of at least 1)."),
    "baselines.fae.hotset.x_choose_hot_rows__mutmut_12": (
        "`torch.repeat_interleave(repeats)` alone repeats `arange(len(repeats))`: the same "
        "table index per row as the two-argument call."),
    **{f"bagpipe.harness.run.runner.x_summarize__mutmut_{n}": (
        "`float` parses `\"NAN\"` and `\"INF\"` as it does `\"nan\"` and `\"inf\"` (case-insensitive).")
       for n in (49, 94, 108, 116, 124)},
    **{f"bagpipe.core.checkpoint.xǁCheckpointStoreǁload__mutmut_{n}": (
        "`weights_only=None` or left out is torch's default, True since torch 2.6 (2.14 here).")
       for n in (27, 29, 36, 38, 45, 47)},
    **{f"bagpipe.core.checkpoint.xǁCheckpointStoreǁsave__mutmut_{n}": (
        "The manifest's JSON indentation; it is read back with json.loads.")
       for n in (45, 47, 48)},
    **{f"bagpipe.core.checkpoint.x_state_digest__mutmut_{n}": (
        "Another label for one kind of tensor: digests are only compared with digests of the "
        "same code, and the two labels stay distinct, so equal states still digest equal and "
        "different ones still differ.") for n in (2, 3, 4, 5)},
}

#: Surviving mutants that can change what the code does, but only in a case not worth a test
#: (named in the reason). They still count as surviving.
ACCEPTED: dict[str, str] = {
    **{f"bagpipe.lrpp.cache.xǁTrainerCacheǁ__init____mutmut_{n}": (
        "The cache's row store without the trainer's meter: it charges host <-> device copies, "
        "which a cache on the host (every CPU test) never makes; the GPU check's device tests "
        "count them.") for n in (18, 23)},
    **{f"bagpipe.lrpp.cache.xǁTrainerCacheǁinstall__mutmut_{n}": (
        "An install on the store's side stream or not: only a GPU store has one, and a host "
        "store writes the same rows either way (the GPU check's device tests cover it).")
       for n in (1, 25, 28)},
    "bagpipe.data.readers.x_iter_jsonl__mutmut_2": (
        "The default block size of the JSON-lines reader (65536 rows): it shows only in files of "
        "more rows, which the test data (a few rows per file) never has."),
    "bagpipe.data.readers.x_avazu_header__mutmut_7": (
        "`rstrip(\"XX\\r\\nXX\")` also strips trailing `X`s: it differs only for a header whose "
        "last name ends in X (Avazu's ends in C21), which it would then accept."),
    "bagpipe.harness.run.train.x__flat_params__mutmut_9": (
        "`rstrip(\"XX.XX\")` strips trailing `X`s as well as the dot: it differs only for a "
        "config key ending in a capital X, which no composed config has."),
    **{f"bagpipe.core.checkpoint.xǁCheckpointStoreǁload_latest__mutmut_{n}": (
        "The warning's `stacklevel` (which caller it names): mutmut's trampoline adds a frame "
        "between the caller and the store, so a test of it fails on the unmutated code there.")
       for n in (11, 12)},
    **{f"bagpipe.core.checkpoint.xǁCheckpointStoreǁ{method}__mutmut_{n}": (
        "`shutil.rmtree(..., ignore_errors=True)` dropped or negated: it differs only when "
        "deleting a directory the store just listed or made fails (permissions, another "
        "process deleting it first).")
       for method, numbers in (("clear", (2, 4, 5)), ("_prune", (3, 5, 6)),
                               ("_publish", (12, 14, 15)),
                               ("_remove_stale_temporaries", (5, 7, 8)),
                               ("save", (55, 57, 58)))
       for n in numbers},
}
