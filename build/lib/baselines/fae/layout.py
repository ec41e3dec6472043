"""FAE's data layout: classify every input as hot or cold and re-pack into pure mini-batches.

An input is *hot* only if all its lookups hit hot rows (FAE §4.2, Input Classifier). Hot inputs
and cold inputs are bundled into separate mini-batches (``FaeSource``), so hot batches can run
entirely on the trainers' replicas of the hot rows. The plan (hot rows, hot/cold example lists) is
cached in a file keyed by a hash of the data and the settings, as FAE stores its "FAE format" once
per data set.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from bagpipe.core.batch import Batch, DatasetSchema, batch_from_arrays, ids_matrix
from bagpipe.core.source import BatchSource
from baselines.fae.hotset import THRESHOLD_MODES, HotSet, choose_hot_rows, sample_access_counts
from baselines.fae.scheduler import COLD, HOT, SCHEDULERS, ShuffleScheduler

__all__ = [
    "Examples",
    "FaeLayout",
    "FaeSettings",
    "FaeSource",
    "build_layout",
    "cached_layout",
    "chunk",
    "layout_key",
    "load_examples",
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
class Examples:
    """Every training example, materialised: ``dense [N, D]``, ``ids [N, F]``, ``labels [N]``."""

    dense: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor

    def batch(self, index: torch.Tensor, keys: tuple[str, ...]) -> Batch:
        return batch_from_arrays(self.dense[index], self.ids[index], self.labels[index], keys)


def load_examples(source: BatchSource) -> Examples:
    """Read the whole source once (FAE needs a pre-pass over the data set)."""
    dense, ids, labels = [], [], []
    for index in range(len(source)):
        batch = source[index]
        dense.append(batch.dense_features)
        ids.append(ids_matrix(batch))
        labels.append(batch.labels)
    return Examples(torch.cat(dense), torch.cat(ids), torch.cat(labels))


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


def build_layout(
    examples: Examples, schema: DatasetSchema, table_dim: int, settings: FaeSettings
) -> FaeLayout:
    """Profile a sample, choose the hot rows, classify every example (vectorised)."""
    start = time.perf_counter()
    global_ids = examples.ids + schema.table_offsets
    counts, sampled = sample_access_counts(
        global_ids, schema.total_rows, settings.sample_rate, settings.seed
    )
    hot = choose_hot_rows(
        counts,
        schema.table_sizes,
        table_dim,
        settings.hot_budget_bytes,
        mode=settings.threshold_mode,
        sample_rate=settings.sample_rate,
        accesses_per_table=[len(examples.ids)] * schema.num_tables,  # one-hot: T_z = N
        min_table_bytes=settings.min_table_bytes,
    )
    hot_input = hot.is_hot[global_ids].all(dim=1)
    return FaeLayout(
        hot=hot,
        hot_examples=torch.nonzero(hot_input).flatten(),
        cold_examples=torch.nonzero(~hot_input).flatten(),
        sampled_examples=sampled,
        profile_time_s=time.perf_counter() - start,
    )


def layout_key(
    examples: Examples, schema: DatasetSchema, table_dim: int, settings: FaeSettings
) -> str:
    """A hash of the data's ids and everything that shapes the layout (the cache file's name)."""
    digest = hashlib.sha256()
    meta = {
        "format": LAYOUT_FORMAT_VERSION,
        "schema": [schema.name, list(schema.table_sizes)],
        "table_dim": table_dim,
        "settings": dataclasses.asdict(settings),
    }
    digest.update(json.dumps(meta, sort_keys=True).encode())
    digest.update(examples.ids.contiguous().numpy().tobytes())
    return digest.hexdigest()[:24]


def cached_layout(
    examples: Examples,
    schema: DatasetSchema,
    table_dim: int,
    settings: FaeSettings,
    cache_dir: Path,
) -> tuple[FaeLayout, bool]:
    """The layout from ``cache_dir`` if one was built for this data and settings, else build it.

    Returns ``(layout, from_cache)``.
    """
    path = cache_dir / f"fae-layout-{layout_key(examples, schema, table_dim, settings)}.pt"
    if path.exists():
        return FaeLayout.from_dict(torch.load(path, weights_only=False)), True
    layout = build_layout(examples, schema, table_dim, settings)
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


class FaeSource:
    """The re-packed data set: all-hot and all-cold mini-batches in the scheduler's order.

    Random access is deterministic for steps already decided; a step is decided when first asked
    for, with the scheduler's rate at that moment (the adaptive scheduler reacts to evaluations).
    With ``settings.repack`` off, the original batches run in their original order (no scheduler):
    the mode the equivalence tests use.
    """

    def __init__(
        self,
        examples: Examples,
        schema: DatasetSchema,
        batch_size: int,
        layout: FaeLayout,
        settings: FaeSettings,
        epochs: int = 1,
    ) -> None:
        self.schema = schema
        self.batch_size = batch_size
        self.layout = layout
        self._examples = examples
        self._keys = schema.feature_names
        self._order: list[torch.Tensor] = []
        self.scheduler: ShuffleScheduler | None = None
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
            self._order = chunk(torch.arange(len(examples.ids)), batch_size, drop_last=True)
            per_epoch = len(self._order)
        self._length = epochs * per_epoch

    def __len__(self) -> int:
        return self._length

    def example_indices(self, index: int) -> torch.Tensor:
        """Indices (into the materialised examples) of the inputs of batch ``index``."""
        if not 0 <= index < self._length:
            raise IndexError(f"FAE source has {self._length} batches, asked for {index}")
        if self.scheduler is None:
            return self._order[index % len(self._order)]
        while len(self._order) <= index:
            kind, position = self.scheduler.next_batch()
            self._order.append(self._batches[kind][position])
        return self._order[index]

    def __getitem__(self, index: int) -> Batch:
        return self._examples.batch(self.example_indices(index), self._keys)

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(len(self)))
