"""Building blocks shared by the four dense parts: a plain MLP and config checks.

Plain ``nn.Linear`` stacks (rather than torchrec's ``MLP``) because they take a dropout and can end
without an activation, and because tests set their weights by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(
    in_features: int, widths: Sequence[int], *, activate_last: bool, dropout: float = 0.0
) -> nn.Sequential:
    """``Linear -> ReLU (-> Dropout)`` per width; the last layer is bare unless ``activate_last``.

    Dropout follows hidden activations only (never the output), so ``dropout=0`` gives exactly the
    paper's layer stack. Note that dropout makes the forward pass depend on each process's RNG, so
    cross-system equivalence holds only with ``dropout == 0``.
    """
    if not widths:
        raise ValueError("an MLP needs at least one layer width")
    layers: list[nn.Module] = []
    width_in = in_features
    for index, width in enumerate(widths):
        layers.append(nn.Linear(width_in, width))
        last = index == len(widths) - 1
        if not last or activate_last:
            layers.append(nn.ReLU())
        if not last and dropout > 0.0:
            layers.append(nn.Dropout(dropout))
        width_in = width
    return nn.Sequential(*layers)


def require(condition: bool, key: str, message: str) -> None:
    """Raise a ``ValueError`` naming the config key (``model.<key>``) when ``condition`` fails."""
    if not condition:
        raise ValueError(f"model.{key}: {message}")
