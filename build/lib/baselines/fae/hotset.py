"""FAE's offline profiling: count sampled accesses per row and pick the hot rows under a budget.

Two ways to choose the hot set (FAE, VLDB'22, §4.1-4.2; and its released code):

* ``"paper"``: one threshold ``t`` (a share of a table's accesses) for every table. A row of table
  ``z`` is hot when its sampled count reaches ``H_z = t * T_z * x`` (Eq. 1: ``T_z`` accesses of the
  table in the full data, ``x`` the sampling rate). ``t`` is searched (bisection on a log scale)
  for the largest hot set whose bytes fit the budget ``L``.
  *Deviation:* the paper estimates each candidate's hot size from 35 random chunks of 1024 logger
  entries with a Student-t interval; counts from ``torch.bincount`` make the exact size cheap, so
  the size is computed exactly (``HotSet.size_method == "exact"``).
* ``"code"``: the released profiler's global top-N: all sampled rows of all tables sorted by
  count, the top ``N = L / row_bytes`` taken.

In both modes tables under ``min_table_bytes`` (1 MiB) are hot entirely, and their bytes come out
of the budget first. Rows are addressed in the flat global row space (``table_offsets``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["HotSet", "choose_hot_rows", "sample_access_counts"]

FP32_BYTES = 4
THRESHOLD_MODES = ("paper", "code")


@dataclass
class HotSet:
    """The chosen hot rows: a flag per global row, and how they were chosen."""

    is_hot: torch.Tensor  # [total_rows] bool
    mode: str
    threshold: float | None  # t of the paper mode
    row_bytes: int
    size_method: str = "exact"

    @property
    def rows(self) -> torch.Tensor:
        """Sorted global ids of the hot rows (the replica's slot order)."""
        return torch.nonzero(self.is_hot).flatten()

    @property
    def num_rows(self) -> int:
        return int(self.is_hot.sum())

    @property
    def bytes(self) -> int:
        return self.num_rows * self.row_bytes


def sample_access_counts(
    global_ids: torch.Tensor, total_rows: int, sample_rate: float, seed: int
) -> tuple[torch.Tensor, int]:
    """Access counts per global row over a uniform ``sample_rate`` sample of the examples.

    Args:
        global_ids: ``[N, F]`` global row ids of every training example.
        total_rows: size of the global row space.
        sample_rate: the share ``x`` of examples profiled (FAE: 5%).
        seed: seeds the sample, so the same data and config always give the same hot set.

    Returns:
        ``(counts [total_rows], sampled_examples)``.
    """
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"fae.sample_rate must be in (0, 1], got {sample_rate}")
    num_examples = len(global_ids)
    sampled = max(1, math.ceil(sample_rate * num_examples))
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(num_examples, generator=generator)[:sampled]
    counts = torch.bincount(global_ids[picks].reshape(-1), minlength=total_rows)
    return counts, sampled


def choose_hot_rows(
    counts: torch.Tensor,
    table_sizes: Sequence[int],
    table_dim: int,
    budget_bytes: int,
    mode: str = "paper",
    sample_rate: float = 0.05,
    accesses_per_table: Sequence[int] | None = None,
    min_table_bytes: int = 1 << 20,
    search_iterations: int = 60,
) -> HotSet:
    """Pick hot rows from sampled ``counts`` so that their bytes fit ``budget_bytes``.

    ``accesses_per_table`` is ``T_z`` of Eq. 1 (accesses in the *full* data); for one-hot data it
    is the number of training examples for every table.
    """
    if mode not in THRESHOLD_MODES:
        raise ValueError(f"fae.threshold_mode: unknown {mode!r}; choose one of {THRESHOLD_MODES}")
    row_bytes = table_dim * FP32_BYTES
    table_of_row = torch.repeat_interleave(
        torch.arange(len(table_sizes)), torch.tensor(list(table_sizes))
    )
    small = torch.tensor([rows * row_bytes < min_table_bytes for rows in table_sizes])
    is_hot = small[table_of_row].clone()
    budget_left = budget_bytes - int(is_hot.sum()) * row_bytes
    candidates = ~is_hot & (counts > 0)
    if budget_left <= 0:
        return HotSet(is_hot, mode, None, row_bytes)
    if mode == "code":
        top_n = budget_left // row_bytes
        order = torch.argsort(torch.where(candidates, counts, -1), descending=True, stable=True)
        chosen = order[: min(top_n, int(candidates.sum()))]
        is_hot[chosen] = True
        return HotSet(is_hot, mode, None, row_bytes)

    if accesses_per_table is None:
        raise ValueError("fae paper mode needs accesses_per_table (T_z of Eq. 1)")
    scale = torch.tensor([float(t) * sample_rate for t in accesses_per_table])[table_of_row]

    def hot_at(t: float) -> torch.Tensor:
        return candidates & (counts >= t * scale)

    def fits(t: float) -> bool:
        return int(hot_at(t).sum()) * row_bytes <= budget_left

    low, high = math.log(1e-12), 0.0  # t in [1e-12, 1]: below every count, at most all accesses
    if fits(math.exp(low)):
        high = low
    for _ in range(search_iterations):
        middle = (low + high) / 2
        if fits(math.exp(middle)):
            high = middle
        else:
            low = middle
    threshold = math.exp(high)
    if not fits(threshold):  # t = 1 still too big: only rows taking every access; none fit
        threshold = math.inf
    is_hot |= hot_at(threshold)
    return HotSet(is_hot, mode, threshold, row_bytes)
