"""Preprocessing into cached shards: the cache key, crash safety, the cache directory's errors,
the vocabulary with a threshold, and the command line."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bagpipe.data import (
    CacheDirError,
    DataFormatError,
    DatasetConfig,
    SyntheticGenerator,
    make_dataset,
    write_criteo_tsv,
)
from bagpipe.data.prepare import main as prepare_main
from bagpipe.data.prepare import prepare
from bagpipe.data.shard_writer import ShardWriter
from bagpipe.data.vocab import Counter

ROWS = 5000  # ~1.2 MB of TSV: larger than the 16 sampled 64 KiB blocks of a fingerprint


@pytest.fixture()
def train_file(tmp_path: Path, kaggle_gen: SyntheticGenerator) -> Path:
    path = tmp_path / "train.txt"
    write_criteo_tsv(str(path), kaggle_gen.rows("train", 0, ROWS), kaggle_gen.table_sizes)
    return path


def _cfg(path: Path, cache: Path, **extra: object) -> DatasetConfig:
    return DatasetConfig(kind="criteo_tsv", path=str(path), cache_dir=str(cache), **extra)  # type: ignore[arg-type]


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


def test_same_key_is_reused_and_changes_are_rebuilt(tmp_path: Path, train_file: Path) -> None:
    cache = tmp_path / "cache"
    first = prepare(_cfg(train_file, cache), progress=False)
    again = prepare(_cfg(train_file, cache, eval_fraction=0.5, shuffle=True, seed=4), progress=False)
    assert again.directory == first.directory  # split, shuffle and seed are read-time choices
    assert again.manifest.prepare_s == first.manifest.prepare_s  # not rebuilt
    assert first.manifest.rows == ROWS and first.manifest.bad_rows == 0
    for changed in ({"max_ind_range": 100}, {"mapping": "vocab"},
                    {"mapping": "vocab", "frequency_threshold": 2}):
        assert prepare(_cfg(train_file, cache, **changed), progress=False).directory != first.directory
    # another preset of the same kind (its own table sizes): another entry
    other = tmp_path / "day_0"
    shutil.copy(train_file, other)
    shutil.copy(train_file, tmp_path / "day_1")
    tb = prepare(_cfg(tmp_path / "day_*", cache, preset="criteo_terabyte"), progress=False)
    assert tb.directory != first.directory and len(tb.manifest.files) == 2
    # the input changes (one more row): a new entry, never the old shards
    with open(train_file, "a") as handle:
        handle.write(train_file.read_text().split("\n")[0] + "\n")
    grown = prepare(_cfg(train_file, cache), progress=False)
    assert grown.directory != first.directory and grown.manifest.rows == ROWS + 1
    assert len(_entries(cache)) == 6 and not list(cache.glob("*.partial-*"))


def test_full_hash_sees_an_edit_the_sampled_fingerprint_misses(tmp_path: Path, train_file: Path) -> None:
    cache = tmp_path / "cache"
    before = prepare(_cfg(train_file, cache), progress=False)
    full = prepare(_cfg(train_file, cache, full_hash=True), progress=False)
    stat = train_file.stat()
    data = bytearray(train_file.read_bytes())
    middle = 70_000  # between the first two sampled blocks (0 and ~77 KiB)
    line_start = data.index(b"\n", middle) + 1
    data[line_start] = ord("1") if data[line_start] == ord("0") else ord("0")  # flip one label
    train_file.write_bytes(bytes(data))
    os.utime(train_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert prepare(_cfg(train_file, cache), progress=False).directory == before.directory
    assert prepare(_cfg(train_file, cache, full_hash=True), progress=False).directory != full.directory


_CRASH = """
import os, sys
from bagpipe.data import DatasetConfig
from bagpipe.data.prepare import prepare
from bagpipe.data.shard_format import Manifest
def crash(self, directory):  # every shard written, the manifest not yet: the worst moment
    os._exit(3)
Manifest.save = crash
prepare(DatasetConfig(kind="criteo_tsv", path=sys.argv[1], cache_dir=sys.argv[2]), progress=False)
"""


def test_a_crash_mid_preparation_leaves_nothing_that_looks_complete(tmp_path: Path,
                                                                     train_file: Path) -> None:
    cache = tmp_path / "cache"
    crashed = subprocess.run([sys.executable, "-c", _CRASH, str(train_file), str(cache)],
                             capture_output=True, text=True, check=False)
    assert crashed.returncode == 3, crashed.stderr
    (partial,) = cache.glob("*.partial-*")
    assert list(partial.glob("*.npy"))  # shards were written ...
    assert _entries(cache) == [partial.name]  # ... but only under the partial name
    prepared = prepare(_cfg(train_file, cache), progress=False)  # rebuilt, the leftover removed
    assert _entries(cache) == [prepared.directory.name] and prepared.manifest.rows == ROWS


def test_a_failed_preparation_cleans_up_and_names_the_line(tmp_path: Path, train_file: Path) -> None:
    lines = train_file.read_text().split("\n")
    lines[3000] = lines[3000].replace("\t", "\tx", 1)
    train_file.write_text("\n".join(lines))
    cache = tmp_path / "cache"
    with pytest.raises(DataFormatError, match=r"train\.txt:3001: "):
        prepare(_cfg(train_file, cache), progress=False)
    assert _entries(cache) == []
    skipped = prepare(_cfg(train_file, cache, skip_bad_rows=True), progress=False)
    assert skipped.manifest.bad_rows == 1 and skipped.manifest.rows == ROWS - 1


def test_cache_dir_errors_name_the_directory_before_any_work(
    tmp_path: Path, train_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "a_file"
    blocked.write_text("not a directory")
    with pytest.raises(CacheDirError, match=rf"{blocked}/cache: not writable.*dataset\.cache_dir="):
        prepare(_cfg(train_file, blocked / "cache"), progress=False)

    started: list[int] = []
    monkeypatch.setattr(ShardWriter, "append", lambda self, block: started.append(1))

    class Tiny:
        free = 1000

    monkeypatch.setattr(shutil, "disk_usage", lambda path: Tiny)
    cache = tmp_path / "cache"
    with pytest.raises(CacheDirError, match=rf"{cache}: needs about .* GB .* 0\.00 GB free"):
        prepare(_cfg(train_file, cache), progress=False)
    assert not started  # refused before parsing a row
    monkeypatch.undo()

    def full_disk(self: ShardWriter, block: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ShardWriter, "append", full_disk)  # the estimate was wrong after all
    with pytest.raises(CacheDirError, match=rf"{cache}: ran out of space"):
        prepare(_cfg(train_file, cache), progress=False)
    assert _entries(cache) == []


def test_vocabulary_threshold_and_spilling_agree(tmp_path: Path, train_file: Path) -> None:
    cache = tmp_path / "cache"
    plain = make_dataset(_cfg(train_file, cache, mapping="vocab"))
    rare = make_dataset(_cfg(train_file, cache, mapping="vocab", frequency_threshold=3))
    all_ids = plain.shards.take_ids(slice(None))  # type: ignore[attr-defined]
    rare_ids = rare.shards.take_ids(slice(None))  # type: ignore[attr-defined]
    for f in range(26):
        values, counts = np.unique(all_ids[:, f], return_counts=True)
        kept = values[(counts >= 3) & (values > 0)]
        assert rare.schema.table_sizes[f] == kept.size + 2  # missing, rare, then the kept
        is_rare = np.isin(all_ids[:, f], values[counts < 3]) & (all_ids[:, f] > 0)
        np.testing.assert_array_equal(rare_ids[:, f] == 1, is_rare)
        np.testing.assert_array_equal(rare_ids[:, f] == 0, all_ids[:, f] == 0)
    keys = np.random.default_rng(0).integers(0, 1 << 33, (3000, 2)).astype(np.uint64)
    missing = np.zeros_like(keys, dtype=bool)
    vocabs = []
    for budget in (10, 1 << 20):  # spilled every block, or never before finishing
        counter = Counter(2, tmp_path / f"spill{budget}", budget_pairs=budget)
        for start in range(0, 3000, 500):
            counter.add(keys[start:start + 500] % 700, missing[start:start + 500])
        vocabs.append(counter.finish(2, tmp_path / f"vocab{budget}"))
    for a, b in zip(*vocabs, strict=True):
        np.testing.assert_array_equal(a.keys, b.keys)


def test_the_command_line_prepares_and_reports(tmp_path: Path, train_file: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    assert prepare_main(["--kind", "criteo_tsv", "--path", str(train_file), "--cache-dir",
                         str(cache), "--max-ind-range", "1000", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"{ROWS:,} rows (0 bad rows skipped)" in out and str(cache) in out
    assert prepare(_cfg(train_file, cache, max_ind_range=1000), progress=False).manifest.rows == ROWS
