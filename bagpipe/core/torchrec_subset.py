"""The four torchrec pieces the harness builds on, for a machine where torchrec does not import.

Why it exists: a bare GPU machine (the check of ``python -m bagpipe.bench --only gpu``) has torch
but neither torchrec nor fbgemm-gpu, and torchrec does not import without fbgemm-gpu. Everywhere
else torchrec is installed and :mod:`bagpipe.core.torchrec_api` hands out torchrec's own classes;
these stand-ins are used only where that import fails.

Each keeps torchrec's name, constructor, parameter names and arithmetic, for the subset used
here, so a model trained with one loads into the other (``tests/core/test_torchrec_subset.py``
checks outputs, gradients and ``state_dict`` keys against torchrec's). Anything else torchrec
offers (sharding, ``EmbeddingBagCollection``) is not here: TorchRec runs and evaluation need
torchrec itself.

The one-hot layout every dataset here uses (``bagpipe.core.batch``)::

    keys    = ["cat_0", "cat_1"]          F = 2 features, B = 3 examples
    values  = [a0 a1 a2 | b0 b1 b2]        F * B ids, feature-major
    lengths = [1  1  1  | 1  1  1 ]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Batch", "InteractionArch", "KeyedJaggedTensor", "LowRankCrossNet"]


class KeyedJaggedTensor:
    """Jagged values per key, laid out key-major: torchrec's ``KeyedJaggedTensor``, the subset
    a one-hot batch needs (``from_lengths_sync``, ``keys``, ``values``, ``lengths``, ``offsets``,
    ``to``, ``pin_memory``)."""

    def __init__(self, keys: list[str], values: torch.Tensor, lengths: torch.Tensor) -> None:
        if lengths.numel() % max(len(keys), 1):
            raise ValueError(f"{lengths.numel()} lengths do not split over {len(keys)} keys")
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths

    @staticmethod
    def from_lengths_sync(
        keys: list[str], values: torch.Tensor, lengths: torch.Tensor
    ) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(keys, values, lengths)

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """``[len(lengths) + 1]``: where each jagged slice starts in ``values``."""
        return torch.cat((self._lengths.new_zeros(1), torch.cumsum(self._lengths, 0)))

    def stride(self) -> int:
        """Examples per key (the batch size)."""
        return self._lengths.numel() // max(len(self._keys), 1)

    def to(self, device: torch.device, non_blocking: bool = False) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            self._keys,
            self._values.to(device=device, non_blocking=non_blocking),
            self._lengths.to(device=device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(self._keys, self._values.pin_memory(), self._lengths.pin_memory())


@dataclass
class Batch:
    """torchrec's ``Batch``: dense features ``[B, D]``, sparse features, labels ``[B]``."""

    dense_features: torch.Tensor
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(
            self.dense_features.to(device=device, non_blocking=non_blocking),
            self.sparse_features.to(device, non_blocking=non_blocking),
            self.labels.to(device=device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        return Batch(
            self.dense_features.pin_memory(),
            self.sparse_features.pin_memory(),
            self.labels.pin_memory(),
        )


class InteractionArch(nn.Module):
    """DLRM's dot interaction (torchrec ``models.dlrm.InteractionArch``).

    ``dense [B, D]`` and ``sparse [B, F, D]`` -> ``[B, D + C(F+1, 2)]``: ``dense`` followed by
    the dot products of every pair among ``[dense, e_1 .. e_F]``, upper triangle row by row.
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.triu_indices: torch.Tensor
        self.register_buffer(
            "triu_indices",
            torch.triu_indices(self.F + 1, self.F + 1, offset=1),
            persistent=False,
        )

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        combined = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        interactions = torch.bmm(combined, combined.transpose(1, 2))
        flat = interactions[:, self.triu_indices[0], self.triu_indices[1]]
        return torch.cat((dense_features, flat), dim=1)


class LowRankCrossNet(nn.Module):
    """DCN v2's low-rank cross network (torchrec ``modules.crossnet.LowRankCrossNet``).

    ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l`` over ``num_layers`` layers, ``W_l``
    ``[N, r]`` and ``V_l`` ``[r, N]`` drawn Xavier-normal in torchrec's order (every ``W``, then
    every ``V``), so one seed gives both implementations the same weights.
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int = 1) -> None:
        super().__init__()
        if low_rank < 1:
            raise ValueError(f"low_rank must be >= 1, got {low_rank}")
        self._num_layers = num_layers
        self._low_rank = low_rank
        self.W_kernels = nn.ParameterList(
            nn.Parameter(nn.init.xavier_normal_(torch.empty(in_features, low_rank)))
            for _ in range(num_layers)
        )
        self.V_kernels = nn.ParameterList(
            nn.Parameter(nn.init.xavier_normal_(torch.empty(low_rank, in_features)))
            for _ in range(num_layers)
        )
        self.bias = nn.ParameterList(
            nn.Parameter(torch.zeros(in_features)) for _ in range(num_layers)
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x_0 = x_l = input
        for layer in range(self._num_layers):
            x_l_v = nn.functional.linear(x_l, self.V_kernels[layer])
            x_l_w = nn.functional.linear(x_l_v, self.W_kernels[layer])
            x_l = x_0 * (x_l_w + self.bias[layer]) + x_l
        return x_l
