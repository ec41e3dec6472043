"""``DatasetConfig`` -> ``Dataset``: the one entry point other packages use for data.

Kinds:

* ``synthetic``: the calibrated generator for a preset (``criteo_kaggle``, ``avazu``,
  ``criteo_terabyte``). Train and eval are independent streams (different split seeds). Default
  sizes: ``scale * full_rows`` examples, 6/7 train and 1/7 eval (as below).
* ``criteo_tsv`` (Kaggle ``train.txt`` or Terabyte ``day_N[.gz]``; ``path`` may be a glob),
  ``avazu_csv``, ``jsonl`` (Bagpipe's format): the files are prepared once into binary shards
  (``bagpipe.data.prepare``, cached by a fingerprint of the files and the mapping), then streamed
  from them with bounded memory and split by row position (``splits``), so train and eval never
  share an example.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.source import BatchSource
from bagpipe.data.config import KINDS, DatasetConfig
from bagpipe.data.examples import Examples
from bagpipe.data.generator import GeneratorConfig, SyntheticGenerator
from bagpipe.data.prepare import prepare
from bagpipe.data.presets import get_preset
from bagpipe.data.shard_set import ShardSet
from bagpipe.data.skew import id_skew_report
from bagpipe.data.sources import RowSource, SyntheticSource
from bagpipe.data.splits import eval_start

__all__ = ["KINDS", "Dataset", "DatasetConfig", "FileDataset", "SyntheticDataset", "make_dataset"]

DESCRIBE_ROWS = 65536  # examples sampled for the realised skew (and, synthetic, the CTR)


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
    """Raw files prepared once into shards (``prepare``), streamed from them, split by position.

    Train and eval are ``RowSource``s over the shards: memory O(batch), not O(dataset). The split
    is fixed: Terabyte (``preset=criteo_terabyte``) evaluates on its last day file, as MLPerf
    does; any other dataset on its last ``eval_fraction`` of rows (1/7 by default: DLRM's Kaggle
    "day 7"). Train rows come in file order, or (``shuffle``) in the seeded block shuffle.
    """

    def __init__(self, cfg: DatasetConfig, progress: bool = True) -> None:
        preset = get_preset(cfg.preset)
        self.cfg = cfg
        prepared = prepare(cfg, progress=progress)
        self.manifest = prepared.manifest
        self.shards = ShardSet(prepared.directory, self.manifest)
        sizes = tuple(self.manifest.table_sizes)
        self.schema = _schema(f"{cfg.kind}_{preset.name}", len(preset.dense), sizes)
        self.eval_start = eval_start(self.manifest, cfg)

    def train(self, batch_size: int, num_batches: int | None = None) -> RowSource:
        return RowSource(self.shards, self.schema, batch_size, num_batches,
                         shuffle_seed=self.cfg.seed if self.cfg.shuffle else None,
                         span=(0, self.eval_start))

    def eval(self, batch_size: int, num_batches: int | None = None) -> RowSource:
        return RowSource(self.shards, self.schema, batch_size, num_batches,
                         span=(self.eval_start, len(self.shards)))

    @property
    def train_examples(self) -> Examples:
        """Every train row in memory (O(train rows): for reports on small files)."""
        return self.shards.take(slice(0, self.eval_start))

    def describe(self) -> dict[str, float]:
        """Realised skew over ``DESCRIBE_ROWS`` train rows spread evenly, CTR and bad rows of the
        whole input, sizes."""
        spread = np.linspace(0, self.eval_start - 1, min(DESCRIBE_ROWS, self.eval_start))
        sample = self.shards.take_ids(np.unique(spread.astype(np.int64)))
        rows = len(self.shards)
        return {
            **id_skew_report(sample, self.schema.table_sizes, self.schema.feature_names),
            "ctr": self.manifest.positives / rows if rows else float("nan"),
            "rows": float(rows),
            "table_rows": float(self.schema.total_rows),
            "bad_rows_skipped": float(self.manifest.bad_rows),
        }


def make_dataset(cfg: DatasetConfig, progress: bool = True) -> SyntheticDataset | FileDataset:
    """Build the dataset ``cfg`` describes (see the module docstring); ``progress``: show the
    preparation's progress bar when raw files are prepared."""
    return SyntheticDataset(cfg) if cfg.kind == "synthetic" else FileDataset(cfg, progress)



