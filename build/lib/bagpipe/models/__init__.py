"""The four models (DLRM, Wide&Deep, DeepFM, DCN v2), their paper configs and seeded init.

Each model is a :class:`RecModel`, the dense part after the embedding lookup; systems supply the
pooled embeddings ``[B, F, table_dim(cfg)]`` their own way. :class:`ReferenceModel` puts a torchrec
``EmbeddingBagCollection`` in front of the dense part, for evaluation and as the single-process
ground truth.
"""

from bagpipe.core.interface import ModelConfig
from bagpipe.models.base import RecModel
from bagpipe.models.configs import PAPER_EMBEDDING_DIM, paper_config
from bagpipe.models.dcn import DCN
from bagpipe.models.deepfm import DeepFM
from bagpipe.models.dlrm import DLRM
from bagpipe.models.factory import (
    MODELS,
    build_dense_model,
    derived_generator,
    initial_table,
    initial_tables,
    table_dim,
)
from bagpipe.models.reference import ReferenceModel
from bagpipe.models.wdl import WideDeep

__all__ = [
    "DCN",
    "DLRM",
    "MODELS",
    "PAPER_EMBEDDING_DIM",
    "DeepFM",
    "ModelConfig",
    "RecModel",
    "ReferenceModel",
    "WideDeep",
    "build_dense_model",
    "derived_generator",
    "initial_table",
    "initial_tables",
    "paper_config",
    "table_dim",
]
