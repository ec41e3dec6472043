"""``DatasetConfig`` -> ``Dataset``: the one entry point other packages use for data.

Kinds:

* ``synthetic``: the calibrated generator for a preset (``criteo_kaggle``, ``avazu``,
  ``criteo_terabyte``). Train and eval are independent streams (different split seeds). Default
  sizes: ``scale * full_rows`` examples, 6/7 train and 1/7 eval (as below).
* ``criteo_tsv`` (Kaggle ``train.txt`` or Terabyte ``day_N[.gz]``; ``path`` may be a glob),
  ``avazu_csv``, ``jsonl`` (Bagpipe's format): the file is read (streamed, then held in memory, fine
  at the harness's scales) and split by row position: the last ``eval_fraction`` (default 1/7, like
  DLRM's Kaggle "day 7") is eval, the rest train, so the two never share an example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.source import BatchSource
from bagpipe.data.files import MAPPINGS, read_examples
from bagpipe.data.generator import GeneratorConfig, SyntheticGenerator
from bagpipe.data.presets import Preset, get_preset
from bagpipe.data.skew import id_skew_report
from bagpipe.data.sources import ArraySource, SyntheticSource

KINDS: tuple[str, ...] = ("synthetic", "criteo_tsv", "avazu_csv", "jsonl")
_FILE_PRESETS = {"criteo_tsv": ("criteo_kaggle", "criteo_terabyte"), "avazu_csv": ("avazu",)}
DESCRIBE_ROWS = 65536  # synthetic: examples sampled for the realised skew and CTR


@dataclass(frozen=True)
class DatasetConfig:
    """What data to train on.

    Args:
        kind: ``synthetic`` | ``criteo_tsv`` | ``avazu_csv`` | ``jsonl``.
        preset: dataset shape (``criteo_kaggle`` | ``avazu`` | ``criteo_terabyte``): table sizes,
            skew, CTR; for file kinds it fixes the schema (and, with ``hash_mod``, the table sizes).
        scale: fraction of the full dataset; big tables shrink by Heaps' law. The default 0.001
            gives the Kaggle shape ~127k table rows and ~46k examples: CPU-sized.
        seed: generator, teacher and shuffle seed.
        skew_target: share of accesses the top 1% of rows take (synthetic; ``None`` = fitted κ=1).
        hot_set: ``(k, u)``: Bagpipe's mode, k of each table's rows take u of the lookups
            (overrides ``skew_target``).
        path: input file (or glob of day files) for the file kinds.
        mapping: ``hash_mod`` or ``vocab`` (see ``bagpipe.data.files``).
        max_ind_range: cap on every table's rows (DLRM's ``--max-ind-range``).
        table_sizes: explicit per-table rows (overrides preset/scale/max_ind_range; not ``vocab``).
        skip_bad_rows: drop and count malformed rows instead of raising ``DataFormatError``.
        eval_fraction: file kinds: trailing share of rows used for eval; synthetic: default sizes.
        shuffle: file kinds: visit train rows in a seeded permutation per epoch (else file order).
    """

    kind: str = "synthetic"
    preset: str = "criteo_kaggle"
    scale: float = 0.001
    seed: int = 0
    skew_target: float | None = 0.92
    hot_set: tuple[float, float] | None = None
    path: str | None = None
    mapping: str = "hash_mod"
    max_ind_range: int | None = None
    table_sizes: tuple[int, ...] | None = None
    skip_bad_rows: bool = False
    eval_fraction: float = 1 / 7
    shuffle: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown dataset kind {self.kind!r}; valid kinds: {list(KINDS)}")
        get_preset(self.preset)
        if self.kind in _FILE_PRESETS and self.preset not in _FILE_PRESETS[self.kind]:
            raise ValueError(f"kind {self.kind!r} needs preset in {list(_FILE_PRESETS[self.kind])}, "
                             f"got preset={self.preset!r}")
        if self.mapping not in MAPPINGS:
            raise ValueError(f"unknown mapping {self.mapping!r}; valid: {list(MAPPINGS)}")
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"kind {self.kind!r} needs path= (a file or a glob of day files)")
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")
        if not 0 < self.eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.table_sizes is not None and len(self.table_sizes) != len(get_preset(self.preset).tables):
            raise ValueError(f"table_sizes has {len(self.table_sizes)} entries; preset "
                             f"{self.preset!r} has {len(get_preset(self.preset).tables)} tables")

    def resolved_table_sizes(self, preset: Preset) -> tuple[int, ...]:
        if self.table_sizes is not None:
            return tuple(self.table_sizes)
        return preset.table_sizes(self.scale, self.max_ind_range)


class Dataset(Protocol):
    """A schema, train/eval batch sources and a summary (skew, CTR, teacher ceiling, bad rows)."""

    schema: DatasetSchema

    def train(self, batch_size: int, num_batches: int | None = None) -> BatchSource: ...

    def eval(self, batch_size: int, num_batches: int | None = None) -> BatchSource: ...

    def describe(self) -> dict[str, float]: ...


def _schema(name: str, num_dense: int, sizes: tuple[int, ...]) -> DatasetSchema:
    return DatasetSchema(name, num_dense, sizes, tuple(f"cat_{i}" for i in range(len(sizes))))


class SyntheticDataset:
    """The generator behind ``kind="synthetic"``."""

    def __init__(self, cfg: DatasetConfig) -> None:
        preset = get_preset(cfg.preset)
        self.cfg = cfg
        self.generator = SyntheticGenerator(preset, GeneratorConfig(
            scale=cfg.scale, seed=cfg.seed, skew_target=cfg.skew_target, hot_set=cfg.hot_set,
            max_ind_range=cfg.max_ind_range))
        sizes = self.generator.table_sizes
        self.schema = _schema(f"synthetic_{preset.name}", len(preset.dense), sizes)
        self.rows = preset.rows_at_scale(cfg.scale)

    def _default_batches(self, batch_size: int, share: float) -> int:
        return max(1, math.floor(self.rows * share) // batch_size)

    def train(self, batch_size: int, num_batches: int | None = None) -> SyntheticSource:
        n = num_batches if num_batches is not None else self._default_batches(batch_size, 1 - self.cfg.eval_fraction)
        return SyntheticSource(self.generator, "train", self.schema, batch_size, n)

    def eval(self, batch_size: int, num_batches: int | None = None) -> SyntheticSource:
        n = num_batches if num_batches is not None else self._default_batches(batch_size, self.cfg.eval_fraction)
        return SyntheticSource(self.generator, "eval", self.schema, batch_size, n)

    def describe(self) -> dict[str, float]:
        """Analytic and realised skew, realised CTR, the teacher's AUC ceiling, κ and sizes."""
        sample = self.generator.examples("train", 0, DESCRIBE_ROWS)
        assert sample.labels is not None
        return {
            **id_skew_report(sample.ids, self.schema.table_sizes, self.schema.feature_names),
            **self.generator.expected_skew(),
            "ctr": float(sample.labels.mean()),
            "teacher_auc": self.generator.teacher_auc(),
            "kappa": self.generator.kappa,
            "rows": float(self.rows),
            "table_rows": float(self.schema.total_rows),
            "bad_rows_skipped": 0.0,
        }


class FileDataset:
    """A raw file read into memory and split by position (last ``eval_fraction`` = eval)."""

    def __init__(self, cfg: DatasetConfig) -> None:
        assert cfg.path is not None
        preset = get_preset(cfg.preset)
        self.cfg = cfg
        examples, sizes, self.stats = read_examples(
            cfg.kind, cfg.path, table_sizes=cfg.resolved_table_sizes(preset),
            num_dense=len(preset.dense), mapping=cfg.mapping,  # type: ignore[arg-type]
            skip_bad_rows=cfg.skip_bad_rows)
        self.examples = examples
        self.schema = _schema(f"{cfg.kind}_{preset.name}", len(preset.dense), sizes)
        num_eval = max(1, round(len(examples) * cfg.eval_fraction))
        if len(examples) - num_eval < 1:
            raise ValueError(f"{cfg.path}: {len(examples)} rows are too few to split train/eval")
        self.train_examples = examples.take(slice(0, len(examples) - num_eval))
        self.eval_examples = examples.take(slice(len(examples) - num_eval, len(examples)))

    def train(self, batch_size: int, num_batches: int | None = None) -> ArraySource:
        return ArraySource(self.train_examples, self.schema, batch_size, num_batches,
                           shuffle_seed=self.cfg.seed if self.cfg.shuffle else None)

    def eval(self, batch_size: int, num_batches: int | None = None) -> ArraySource:
        return ArraySource(self.eval_examples, self.schema, batch_size, num_batches)

    def describe(self) -> dict[str, float]:
        """Realised skew over every row read, CTR, sizes and the malformed rows skipped."""
        labels = self.examples.labels
        return {
            **id_skew_report(self.examples.ids, self.schema.table_sizes, self.schema.feature_names),
            "ctr": float(np.mean(labels)) if labels is not None and labels.size else float("nan"),
            "rows": float(len(self.examples)),
            "table_rows": float(self.schema.total_rows),
            "bad_rows_skipped": float(self.stats.bad_rows),
        }


def make_dataset(cfg: DatasetConfig) -> SyntheticDataset | FileDataset:
    """Build the dataset ``cfg`` describes (see the module docstring)."""
    return SyntheticDataset(cfg) if cfg.kind == "synthetic" else FileDataset(cfg)



