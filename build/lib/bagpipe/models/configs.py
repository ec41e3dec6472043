"""The paper's architectures (bagpipe.md §3.3), as :class:`ModelConfig` values.

Embedding dim 48 everywhere. Where the Bagpipe artifact does not fix a width, the choice is marked:

* DLRM: the artifact run script's bottom 13-512-256-64-48 and top 399-1024-1024-1024-256-128-1;
* W&D: deep tower 13-256-256-256, head ``Linear(26*48 + 256 -> 1)``;
* DeepFM: MLP [64, 64, 64] -> 1 with dropout 0.5 (BatchNorm left out, see ``DeepFM``); the dense
  features enter as one extra FM field through DLRM's bottom MLP (our choice: the artifact does not
  say how its DeepFM treats the 13 dense features);
* DCN: DenseArch 13-1024-512-256-64-48, 2 low-rank cross layers of rank 8, over-arch
  1024-512-256-1 (the TorchRec baseline's, which Bagpipe's DCN trainer copied).
"""

from __future__ import annotations

from bagpipe.core.interface import ModelConfig

PAPER_EMBEDDING_DIM = 48

_PAPER: dict[str, ModelConfig] = {
    "dlrm": ModelConfig(
        name="dlrm",
        embedding_dim=PAPER_EMBEDDING_DIM,
        bottom_mlp=(512, 256, 64, 48),
        top_mlp=(1024, 1024, 1024, 256, 128, 1),
    ),
    "wdl": ModelConfig(
        name="wdl",
        embedding_dim=PAPER_EMBEDDING_DIM,
        bottom_mlp=(256, 256, 256),
        top_mlp=(1,),
    ),
    "deepfm": ModelConfig(
        name="deepfm",
        embedding_dim=PAPER_EMBEDDING_DIM,
        bottom_mlp=(512, 256, 64, 48),
        top_mlp=(64, 64, 64, 1),
        dropout=0.5,
    ),
    "dcn": ModelConfig(
        name="dcn",
        embedding_dim=PAPER_EMBEDDING_DIM,
        bottom_mlp=(1024, 512, 256, 64, 48),
        top_mlp=(1024, 512, 256, 1),
        cross_layers=2,
        cross_rank=8,
    ),
}


def paper_config(name: str) -> ModelConfig:
    """The paper's architecture for ``name`` (``dlrm``, ``wdl``, ``deepfm``, ``dcn``)."""
    if name not in _PAPER:
        raise ValueError(f"model.name: no paper config for {name!r}; known: {sorted(_PAPER)}")
    return _PAPER[name]
