"""FAE's data layout: classify every input as hot or cold and re-pack into pure mini-batches.

An input is *hot* only if all its lookups hit hot rows (FAE §4.2, Input Classifier). Hot inputs
and cold inputs are bundled into separate mini-batches (``FaeSource``), so hot batches can run
entirely on the trainers' replicas of the hot rows. The plan (hot rows, hot/cold example lists) is
cached in a file keyed by a hash of the data and the settings, as FAE stores its "FAE format" once
per data set.

The offline pass streams the original source twice, reading only its id columns
(``BatchSource.ids``): once for the access counts of a uniform sample of the examples, once to
classify every example. What it keeps is the counts (one per table row) and an index of the hot
and the cold examples (their positions in the original stream), never a copy of the data; the
re-packed source reads each batch's examples back from the original source.

Layout of the re-packed source::

    examples (original order)   e0 e1 e2 e3 e4 e5 e6 e7      hot: e0 e2 e3 e5 e6 e7
    hot batches  (B = 2)        [e0 e2] [e3 e5] [e6 e7]      cold: e1 e4
    cold batches                [e1 e4]
    steps (scheduler decides)   cold0 hot0 hot1 hot2  ...    e.g. R(100): all cold, then all hot
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from bagpipe.core.batch import Batch, DatasetSchema, batch_from_arrays, ids_matrix, slice_bounds
from bagpipe.core.source import BatchSource
from baselines.fae.hotset import THRESHOLD_MODES, HotSet, choose_hot_rows
from baselines.fae.scheduler import COLD, HOT, SCHEDULERS, ShuffleScheduler

__all__ = [
    "FaeLayout",
    "FaeSettings",
    "FaeSource",
    "build_layout",
    "cached_layout",
    "chunk",
    "layout_key",
]

LAYOUT_FORMAT_VERSION = 1


@dataclass(frozen=True)
class FaeSettings:
    """FAE's knobs (defaults: the paper's, except where noted)."""

    sample_rate: float = 0.05
    hot_budget_bytes: int = 512 << 20  # the paper's L; the released scripts use 256 MiB
    threshold_mode: str = "paper"  # or "code": global top-N
    min_table_bytes: int = 1 << 20  # tables under this are all hot
    scheduler: str = "adaptive"  # or "fixed": all cold then all hot, every epoch
    initial_rate: int = 50
    window: int = 4
    repack: bool = True  # False: keep the original batches (hot iff all their inputs are)
    drop_last: bool = True  # drop each kind's last partial mini-batch
    seed: int = 0

    def __post_init__(self) -> None:
        if self.threshold_mode not in THRESHOLD_MODES:
            raise ValueError(
                f"fae.threshold_mode: unknown {self.threshold_mode!r}; choose one of {THRESHOLD_MODES}"
            )
        if self.scheduler not in SCHEDULERS:
            raise ValueError(
                f"fae.scheduler: unknown {self.scheduler!r}; choose one of {SCHEDULERS}"
            )
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"fae.sample_rate must be in (0, 1], got {self.sample_rate}")
        if not 1 <= self.initial_rate <= 100:
            raise ValueError(f"fae.initial_rate must be in [1, 100], got {self.initial_rate}")
        if self.hot_budget_bytes < 0:
            raise ValueError(f"fae.hot_budget_bytes must be >= 0, got {self.hot_budget_bytes}")


@dataclass
class FaeLayout:
    """The offline result: the hot rows and which examples go into hot and cold batches."""

    hot: HotSet
    hot_examples: torch.Tensor  # sorted indices into ``Examples``
    cold_examples: torch.Tensor
    sampled_examples: int
    profile_time_s: float

    @property
    def hot_input_share(self) -> float:
        total = len(self.hot_examples) + len(self.cold_examples)
        return len(self.hot_examples) / total if total else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "format": LAYOUT_FORMAT_VERSION,
            "is_hot": self.hot.is_hot,
            "mode": self.hot.mode,
            "threshold": self.hot.threshold,
            "row_bytes": self.hot.row_bytes,
            "hot_examples": self.hot_examples,
            "cold_examples": self.cold_examples,
            "sampled_examples": self.sampled_examples,
            "profile_time_s": self.profile_time_s,
        }

    @classmethod
    def from_dict(cls, saved: dict) -> FaeLayout:
        hot = HotSet(saved["is_hot"], saved["mode"], saved["threshold"], saved["row_bytes"])
        return cls(
            hot,
            saved["hot_examples"],
            saved["cold_examples"],
            saved["sampled_examples"],
            saved["profile_time_s"],
        )


_COUNT_FLUSH_IDS = 1 << 22  # sampled ids gathered before one bincount
_KEY_BATCHES = 16  # batches hashed into the layout's key


def _sample_positions(num_examples: int, sample_rate: float, seed: int,
                      batch_size: int) -> Iterator[tuple[int, np.ndarray]]:
    """A uniform sample of ``ceil(sample_rate * N)`` of ``N`` examples, batch by batch:
    ``(batch index, sampled offsets in it)``. Each batch's share is a hypergeometric draw given
    what is left (selection sampling), so memory is one batch's offsets, not a permutation of N."""
    rng = np.random.default_rng([seed, 31])
    left, wanted = num_examples, max(1, int(np.ceil(sample_rate * num_examples)))
    for index in range(num_examples // batch_size):
        take = int(rng.hypergeometric(wanted, left - wanted, batch_size)) if wanted < left \
            else batch_size
        yield index, np.sort(rng.choice(batch_size, take, replace=False))
        left, wanted = left - batch_size, wanted - take


def sample_counts(source: BatchSource, total_rows: int, offsets: torch.Tensor,
                  sample_rate: float, seed: int) -> tuple[torch.Tensor, int]:
    """Access counts per global row over a uniform ``sample_rate`` sample of the source's
    examples, read batch by batch (ids only): ``(counts [total_rows], sampled examples)``."""
    counts = torch.zeros(total_rows, dtype=torch.int64)
    pending: list[torch.Tensor] = []
    held = sampled = 0
    num_examples = len(source) * source.batch_size
    for index, picks in _sample_positions(num_examples, sample_rate, seed, source.batch_size):
        if picks.size:
            pending.append((source.ids(index)[torch.from_numpy(picks)] + offsets).reshape(-1))
            held, sampled = held + pending[-1].numel(), sampled + picks.size
        if held >= _COUNT_FLUSH_IDS:
            counts += torch.bincount(torch.cat(pending), minlength=total_rows)
            pending, held = [], 0
    if pending:
        counts += torch.bincount(torch.cat(pending), minlength=total_rows)
    return counts, sampled


def build_layout(
    source: BatchSource, schema: DatasetSchema, table_dim: int, settings: FaeSettings
) -> FaeLayout:
    """Profile a sample, choose the hot rows, classify every example: two streaming passes over
    the source's ids (module docstring)."""
    start = time.perf_counter()
    offsets = schema.table_offsets
    counts, sampled = sample_counts(source, schema.total_rows, offsets, settings.sample_rate,
                                    settings.seed)
    num_examples = len(source) * source.batch_size
    hot = choose_hot_rows(
        counts,
        schema.table_sizes,
        table_dim,
        settings.hot_budget_bytes,
        mode=settings.threshold_mode,
        sample_rate=settings.sample_rate,
        accesses_per_table=[num_examples] * schema.num_tables,  # one-hot: T_z = N
        min_table_bytes=settings.min_table_bytes,
    )
    hot_input = torch.cat([hot.is_hot[source.ids(i) + offsets].all(dim=1) for i in range(len(source))])
    return FaeLayout(
        hot=hot,
        hot_examples=torch.nonzero(hot_input).flatten(),
        cold_examples=torch.nonzero(~hot_input).flatten(),
        sampled_examples=sampled,
        profile_time_s=time.perf_counter() - start,
    )


def layout_key(
    source: BatchSource, schema: DatasetSchema, table_dim: int, settings: FaeSettings
) -> str:
    """A hash of everything that shapes the layout (the cache file's name): the settings, the
    source's length and batch size, and the ids of ``_KEY_BATCHES`` batches spread over it (first
    and last included; hashing every id would read the whole data set again)."""
    digest = hashlib.sha256()
    meta = {
        "format": LAYOUT_FORMAT_VERSION,
        "schema": [schema.name, list(schema.table_sizes)],
        "table_dim": table_dim,
        "settings": dataclasses.asdict(settings),
        "batches": [len(source), source.batch_size],
    }
    digest.update(json.dumps(meta, sort_keys=True).encode())
    for index in sorted({(len(source) - 1) * k // (_KEY_BATCHES - 1) for k in range(_KEY_BATCHES)}):
        digest.update(source.ids(index).contiguous().numpy().tobytes())
    return digest.hexdigest()[:24]


def cached_layout(
    source: BatchSource,
    schema: DatasetSchema,
    table_dim: int,
    settings: FaeSettings,
    cache_dir: Path,
) -> tuple[FaeLayout, bool]:
    """The layout from ``cache_dir`` if one was built for this data and settings, else build it.

    Returns ``(layout, from_cache)``.
    """
    path = cache_dir / f"fae-layout-{layout_key(source, schema, table_dim, settings)}.pt"
    if path.exists():
        return FaeLayout.from_dict(torch.load(path, weights_only=False)), True
    layout = build_layout(source, schema, table_dim, settings)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(layout.to_dict(), tmp)
    tmp.replace(path)
    return layout, False


def chunk(examples: torch.Tensor, batch_size: int, drop_last: bool) -> list[torch.Tensor]:
    """Consecutive mini-batches of ``batch_size`` example indices."""
    batches = list(torch.split(examples, batch_size))
    if batches and drop_last and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


_T = TypeVar("_T")
_CACHED_BATCHES = 8  # original batches kept: a re-packed batch spans about B / (its kind's share)


class FaeSource:
    """The re-packed data set: all-hot and all-cold mini-batches in the scheduler's order.

    A batch's examples are read back from the original source (``source[i]`` for a batch,
    ``source.ids(i)`` for its ids), only the original batches that hold them, the last few kept,
    so memory is a few batches whatever the data set's size. Random access is deterministic for
    steps already decided; a step is decided when first asked for, with the scheduler's rate at
    that moment (the adaptive scheduler reacts to evaluations). With ``settings.repack`` off, the
    original batches run in their original order (no scheduler): the mode the equivalence tests
    use.
    """

    def __init__(
        self,
        source: BatchSource,
        schema: DatasetSchema,
        batch_size: int,
        layout: FaeLayout,
        settings: FaeSettings,
        epochs: int = 1,
    ) -> None:
        self.schema = schema
        self.batch_size = batch_size
        self.layout = layout
        self._source = source
        self._order: list[torch.Tensor] = []
        self._batch_cache: OrderedDict[int, Batch] = OrderedDict()
        self._ids_cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.scheduler: ShuffleScheduler | None = None
        self._num_original = len(source)
        if settings.repack:
            self._batches = {
                HOT: chunk(layout.hot_examples, batch_size, settings.drop_last),
                COLD: chunk(layout.cold_examples, batch_size, settings.drop_last),
            }
            self.scheduler = ShuffleScheduler(
                num_hot=len(self._batches[HOT]),
                num_cold=len(self._batches[COLD]),
                mode=settings.scheduler,
                initial_rate=settings.initial_rate,
                window=settings.window,
            )
            per_epoch = self.scheduler.num_hot + self.scheduler.num_cold
        else:
            per_epoch = len(source) * source.batch_size // batch_size
        self._length = epochs * per_epoch

    def __len__(self) -> int:
        return self._length

    def example_indices(self, index: int) -> torch.Tensor:
        """Positions (in the original source's stream) of the inputs of batch ``index``."""
        if not 0 <= index < self._length:
            raise IndexError(f"FAE source has {self._length} batches, asked for {index}")
        if self.scheduler is None:
            first = (index * self.batch_size) % (self._num_original * self._source.batch_size)
            return torch.arange(first, first + self.batch_size)
        while len(self._order) <= index:
            kind, position = self.scheduler.next_batch()
            self._order.append(self._batches[kind][position])
        return self._order[index]

    def __getitem__(self, index: int) -> Batch:
        return self._read(self.example_indices(index))

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(len(self)))

    def slice(self, index: int, part: int, parts: int) -> Batch:
        """``split_batch(self[index], parts)[part]``, reading only the original batches that hold
        that slice's examples."""
        return self._read(self.example_indices(index)[slice(*slice_bounds(self.batch_size, part, parts))])

    def ids(self, index: int) -> torch.Tensor:
        """The ``[B, F]`` ids of batch ``index``, from the original source's ids alone."""
        pieces = _pieces(self.example_indices(index), self._source.batch_size, self._ids_cache,
                         self._source.ids)
        return torch.cat([ids[rows] for ids, rows in pieces])

    def _read(self, positions: torch.Tensor) -> Batch:
        pieces = _pieces(positions, self._source.batch_size, self._batch_cache,
                         self._source.__getitem__)
        return batch_from_arrays(
            torch.cat([b.dense_features[rows] for b, rows in pieces]),
            torch.cat([ids_matrix(b)[rows] for b, rows in pieces]),
            torch.cat([b.labels[rows] for b, rows in pieces]),
            self.schema.feature_names,
        )


def _pieces(positions: torch.Tensor, batch_size: int, cache: OrderedDict[int, _T],
            read: Callable[[int], _T]) -> list[tuple[_T, torch.Tensor]]:
    """``(original batch, its rows)`` covering ascending ``positions`` in order; originals are
    read through ``cache``, which keeps the last ``_CACHED_BATCHES``."""
    originals = torch.div(positions, batch_size, rounding_mode="floor")
    pieces = []
    for original in torch.unique_consecutive(originals).tolist():
        if original not in cache:
            cache[original] = read(original)
            while len(cache) > _CACHED_BATCHES:
                cache.popitem(last=False)
        pieces.append((cache[original], positions[originals == original] - original * batch_size))
    return pieces
