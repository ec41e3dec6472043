"""One-time preprocessing of raw files into memory-mappable binary shards, cached by key.

``python -m bagpipe.data.prepare --kind criteo_tsv --path '/data/day_*' [--preset criteo_terabyte]
[--mapping vocab --frequency-threshold 3] [--cache-dir DIR] [--full-hash] ...`` (every
``DatasetConfig`` field is an option) prepares a dataset ahead of time; the file kinds of
``make_dataset`` call ``prepare`` themselves, so a run on a dataset not yet prepared prepares it
first and every later run starts from the shards in seconds.

The key (the cache entry's name) is a hash of the input files' fingerprints
(``bagpipe.data.fingerprint``), the kind, the preset and the mapping (its table sizes, or its
frequency threshold), whether bad rows are skipped, and the shard format's version: a changed input
file or mapping gets a new entry, never a stale one. The train/eval split and the shuffle are
decided when reading, so they share one entry.

One pass per input file, in order: parse (``readers``), map values to rows and transform dense
values (``files``), append to shards (``shard_writer``), with a progress bar of rows, rows/s and
the time left. ``mapping=vocab`` first makes one counting pass (``vocab``). The entry appears only
when complete (``cache``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import time
import types
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from bagpipe.core.memory import small_pages
from bagpipe.data.cache import build_once, cache_root, published
from bagpipe.data.config import DatasetConfig
from bagpipe.data.files import (
    ColumnMap,
    estimate_rows,
    expand_paths,
    hash_mod_columns,
    mapped_blocks,
    raw_blocks,
)
from bagpipe.data.fingerprint import file_fingerprint
from bagpipe.data.presets import get_preset
from bagpipe.data.readers import ReadStats
from bagpipe.data.shard_format import FORMAT_VERSION, Manifest, SourceFile, id_dtype
from bagpipe.data.shard_writer import ShardWriter, shard_layout
from bagpipe.data.vocab import Counter

_SPILL_BYTES_PER_VALUE = 4  # vocab: spilled (value, count) pairs, about a quarter of the cells


@dataclass(frozen=True)
class PrepareSpec:
    """Everything that decides a prepared dataset's content besides the input bytes."""

    kind: str
    preset: str
    mapping: str  # "hash_mod" | "vocab" | "rows" (JSON lines hold rows already)
    table_sizes: tuple[int, ...] | None  # None: from the vocabulary
    frequency_threshold: int
    skip_bad_rows: bool
    num_dense: int
    num_features: int

    @classmethod
    def of(cls, cfg: DatasetConfig) -> PrepareSpec:
        preset = get_preset(cfg.preset)
        mapping = "rows" if cfg.kind == "jsonl" else cfg.mapping
        return cls(
            kind=cfg.kind, preset=cfg.preset, mapping=mapping,
            table_sizes=None if mapping == "vocab" else cfg.resolved_table_sizes(preset),
            frequency_threshold=cfg.frequency_threshold if mapping == "vocab" else 0,
            skip_bad_rows=cfg.skip_bad_rows, num_dense=len(preset.dense),
            num_features=len(preset.tables))

    def entry_name(self, fingerprints: Sequence[dict[str, object]]) -> str:
        identity = {"format": FORMAT_VERSION, "spec": dataclasses.asdict(self),
                    "files": list(fingerprints)}
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return f"{self.kind}-{self.preset}-{digest[:16]}"

    def row_bytes(self) -> int:
        width = 8 if self.table_sizes is not None and id_dtype(self.table_sizes).itemsize == 8 else 4
        return 1 + 4 * self.num_dense + width * self.num_features


@dataclass(frozen=True)
class Prepared:
    """A complete prepared dataset: its directory and manifest."""

    directory: Path
    manifest: Manifest


def prepare(cfg: DatasetConfig, progress: bool = True) -> Prepared:
    """The prepared dataset ``cfg`` describes: from the cache, or built now (module docstring)."""
    if cfg.path is None:
        raise ValueError(f"kind {cfg.kind!r} needs path= (a file or a glob of day files)")
    paths = expand_paths(cfg.path)
    spec = PrepareSpec.of(cfg)
    fingerprints = [file_fingerprint(p, full=cfg.full_hash) for p in paths]
    root, name = cache_root(cfg.cache_dir), spec.entry_name(fingerprints)
    ready = published(root, name)
    if ready is None:
        rows = sum(estimate_rows(p) for p in paths)
        spill = rows * spec.num_features * _SPILL_BYTES_PER_VALUE if spec.mapping == "vocab" else 0
        need = int(1.05 * rows * spec.row_bytes()) + spill
        bar = _Bar(paths, rows, progress)
        ready = build_once(root, name, need, lambda directory: _build(
            spec, paths, fingerprints, Manifest(name, dataclasses.asdict(spec), [], spec.num_dense),
            directory, bar))
    return Prepared(ready, Manifest.load(ready))


@small_pages()  # every block's arrays are fresh memory, written once (bagpipe.core.memory)
def _build(spec: PrepareSpec, paths: list[str], fingerprints: list[dict[str, object]],
           manifest: Manifest, directory: Path, bar: _Bar) -> None:
    """Write ``manifest``'s dataset into ``directory``, the manifest last."""
    start = time.perf_counter()
    if spec.mapping == "vocab":
        columns, sizes = _vocabulary(spec, paths, directory, bar)
    else:
        assert spec.table_sizes is not None
        sizes = spec.table_sizes
        columns = hash_mod_columns(spec.kind, sizes)  # JSON lines need none: they hold rows
    manifest.table_sizes = list(sizes)
    writer = ShardWriter(directory, manifest, id_dtype(sizes))
    layout = partial(shard_layout, id_dtype=writer.id_dtype)
    with bar.task("preparing") as advance:
        for index, (path, fingerprint) in enumerate(zip(paths, fingerprints, strict=True)):
            writer.begin_file(index)
            stats = ReadStats()
            for block in mapped_blocks(spec.kind, path, columns, sizes, spec.num_dense,
                                       spec.skip_bad_rows, stats, then=layout):
                writer.append(block)
                advance(len(block))
            manifest.files.append(SourceFile(fingerprint, stats.rows, stats.bad_rows))
    writer.close()
    manifest.prepare_s = time.perf_counter() - start
    manifest.save(directory)  # last: the entry is complete from here on


def _vocabulary(spec: PrepareSpec, paths: list[str], directory: Path,
                bar: _Bar) -> tuple[list[ColumnMap], tuple[int, ...]]:
    """The counting pass: every table's vocabulary, and its lookups and sizes."""
    counter = Counter(spec.num_features, directory / "spill")
    with bar.task("counting values") as advance:
        for path in paths:
            for block in raw_blocks(spec.kind, path, spec.skip_bad_rows, ReadStats()):
                counter.add(block.keys, block.key_missing)
                advance(len(block))
    vocabularies = counter.finish(spec.frequency_threshold, directory / "vocab")
    shutil.rmtree(directory / "spill")
    return [v.lookup for v in vocabularies], tuple(v.rows for v in vocabularies)


class _RowsPerSecond(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed / 1e3:,.0f}k rows/s" if task.speed else "", style="cyan")


class _Bar:
    """A rows progress bar per pass (``rich``), its total estimated from the inputs' sizes."""

    def __init__(self, paths: list[str], rows_estimate: int, enabled: bool) -> None:
        self.paths, self.rows_estimate, self.enabled = paths, rows_estimate, enabled

    @contextmanager
    def task(self, what: str) -> Iterator[Any]:
        if not self.enabled:
            yield lambda rows: None
            return
        total = self.rows_estimate
        columns = (TextColumn(f"{what} {Path(self.paths[0]).name}"
                              + (f" (+{len(self.paths) - 1} files)" if len(self.paths) > 1 else "")),
                   BarColumn(), TextColumn("{task.completed:,.0f} rows"), _RowsPerSecond(),
                   TimeRemainingColumn())
        with Progress(*columns, transient=False, speed_estimate_period=10.0) as progress:
            task: TaskID = progress.add_task(what, total=total)

            def advance(rows: int) -> None:
                progress.advance(task, rows)
                if progress.tasks[0].completed > total:  # an estimate short of the truth
                    progress.update(task, total=progress.tasks[0].completed)

            yield advance
            progress.update(task, total=progress.tasks[0].completed)


# ---------------------------------------------------------------------------------------- CLI
def _option_type(hint: Any) -> Any:
    """The argparse type of a ``DatasetConfig`` field: ``X | None`` -> X; tuples comma-separated."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) and len(args) == 1:
        hint = args[0]
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return lambda text: tuple(item(v) for v in text.split(","))
    return hint


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bagpipe.data.prepare",
                                  description=__doc__.split("\n\n")[0])
    hints = typing.get_type_hints(DatasetConfig)
    for f in dataclasses.fields(DatasetConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if hints[f.name] is bool:
            top.add_argument(flag, action="store_true", help=f"DatasetConfig.{f.name}")
        else:
            top.add_argument(flag, type=_option_type(hints[f.name]), default=f.default,
                             help=f"DatasetConfig.{f.name} (default {f.default})")
    top.add_argument("--quiet", action="store_true", help="no progress bar")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    quiet = args.pop("quiet")
    cfg = DatasetConfig(**args)
    if cfg.kind == "synthetic":
        raise SystemExit("--kind: synthetic data needs no preparation; give a file kind")
    start = time.perf_counter()
    prepared = prepare(cfg, progress=not quiet)
    manifest = prepared.manifest
    print(f"{prepared.directory}: {manifest.rows:,} rows ({manifest.bad_rows:,} bad rows skipped), "
          f"{len(manifest.shard_rows)} shards, table sizes {manifest.table_sizes}; prepared in "
          f"{manifest.prepare_s:.1f} s ({manifest.rows / max(manifest.prepare_s, 1e-9):,.0f} rows/s), "
          f"this call {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
