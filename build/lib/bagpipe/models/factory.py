"""Seeded construction: which class serves which model name, its table width and initial weights.

Everything here is a pure function of ``(config, schema, seed)``, so every system, and every process
of a system, builds bit-identical tables and dense weights without communicating. Per-table streams
are derived from ``(seed, table index)`` alone, so a process that owns only some tables (an
embedding-server shard) builds exactly those rows without generating the others.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import ModelConfig
from bagpipe.models.base import RecModel
from bagpipe.models.dcn import DCN
from bagpipe.models.deepfm import DeepFM
from bagpipe.models.dlrm import DLRM
from bagpipe.models.wdl import WideDeep

MODELS: dict[str, type[RecModel]] = {"dlrm": DLRM, "wdl": WideDeep, "deepfm": DeepFM, "dcn": DCN}

# Stream tags keep the dense stream and the table streams apart for the same seed.
_DENSE_STREAM = 0
_TABLE_STREAM = 1


def model_class(cfg: ModelConfig) -> type[RecModel]:
    if cfg.name not in MODELS:
        raise ValueError(f"model.name: unknown model {cfg.name!r}; known: {sorted(MODELS)}")
    return MODELS[cfg.name]


def table_dim(cfg: ModelConfig) -> int:
    """Columns of every embedding table: ``embedding_dim``, plus DeepFM's first-order column."""
    model_class(cfg)
    return cfg.embedding_dim + 1 if cfg.name == "deepfm" else cfg.embedding_dim


def derived_generator(seed: int, *stream: int) -> torch.Generator:
    """A CPU generator for the sub-stream ``stream`` of ``seed`` (numpy ``SeedSequence`` mixing)."""
    words = np.random.SeedSequence([seed, *stream]).generate_state(2, dtype=np.uint32)
    generator = torch.Generator()
    generator.manual_seed((int(words[0]) << 31) ^ int(words[1]))
    return generator


def initial_table(rows: int, dim: int, seed: int, table_index: int) -> torch.Tensor:
    """One table ``[rows, dim]`` drawn from ``U(-sqrt(1/rows), sqrt(1/rows))`` (DLRM's init)."""
    bound = math.sqrt(1.0 / rows)
    generator = derived_generator(seed, _TABLE_STREAM, table_index)
    table = torch.rand(rows, dim, generator=generator, dtype=torch.float32)
    return table.mul_(2.0 * bound).sub_(bound)


def initial_tables(schema: DatasetSchema, table_dim: int, seed: int) -> dict[str, torch.Tensor]:
    """Every table of ``schema``, keyed by table name; see :func:`initial_table`."""
    return {
        name: initial_table(rows, table_dim, seed, index)
        for index, (name, rows) in enumerate(
            zip(schema.table_names, schema.table_sizes, strict=True)
        )
    }


def build_dense_model(cfg: ModelConfig, schema: DatasetSchema, seed: int) -> RecModel:
    """The dense part for ``cfg.name``, initialised from ``seed`` without touching the global RNG.

    Modules draw their default init from torch's global generator, so construction runs inside
    ``fork_rng`` with the global generator set to the dense sub-stream of ``seed``.
    """
    cls = model_class(cfg)
    generator = derived_generator(seed, _DENSE_STREAM)
    with torch.random.fork_rng(devices=[]):
        torch.random.set_rng_state(generator.get_state())
        return cls(cfg, schema)
