"""Data: readers for Criteo (Kaggle, Terabyte), Avazu and Bagpipe's JSON lines; byte-format writers;
a calibrated synthetic generator with hidden-teacher labels; skew reports; batch sources.

Entry point: ``make_dataset(DatasetConfig(...))`` -> a ``Dataset`` with ``.schema``,
``.train(batch_size, num_batches)``, ``.eval(...)`` (``BatchSource``s of torchrec ``Batch``es) and
``.describe()``. Raw files are prepared once into cached binary shards
(``bagpipe.data.prepare``, also ``python -m bagpipe.data.prepare``) and streamed from them.
"""

from bagpipe.core.source import BatchSource
from bagpipe.data.dataset import (
    KINDS,
    Dataset,
    DatasetConfig,
    FileDataset,
    SyntheticDataset,
    make_dataset,
)
from bagpipe.data.errors import CacheDirError, DataFormatError
from bagpipe.data.examples import Examples, dlrm_dense_transform
from bagpipe.data.generator import GeneratorConfig, SyntheticGenerator
from bagpipe.data.presets import PRESETS, Preset, TableSpec, get_preset
from bagpipe.data.readers import ReadStats, iter_avazu_csv, iter_criteo_tsv, iter_jsonl
from bagpipe.data.skew import id_skew_report, skew_report, top_share
from bagpipe.data.sources import ArraySource, RowSource, SyntheticSource
from bagpipe.data.teacher import roc_auc
from bagpipe.data.writers import write_avazu_csv, write_criteo_tsv, write_jsonl

__all__ = [
    "KINDS",
    "PRESETS",
    "ArraySource",
    "BatchSource",
    "CacheDirError",
    "DataFormatError",
    "Dataset",
    "DatasetConfig",
    "Examples",
    "FileDataset",
    "GeneratorConfig",
    "Preset",
    "ReadStats",
    "RowSource",
    "SyntheticDataset",
    "SyntheticGenerator",
    "SyntheticSource",
    "TableSpec",
    "dlrm_dense_transform",
    "get_preset",
    "id_skew_report",
    "iter_avazu_csv",
    "iter_criteo_tsv",
    "iter_jsonl",
    "make_dataset",
    "roc_auc",
    "skew_report",
    "top_share",
    "write_avazu_csv",
    "write_criteo_tsv",
    "write_jsonl",
]
