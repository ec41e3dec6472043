"""The hidden teacher that labels synthetic examples, so that AUC curves mean something (data.md §3.4).

``logit = b + u·z + Σ_i w_i[x_i] + Σ_{i<j} <v_i[x_i], v_j[x_j]>`` with per-row scalars
``w ~ N(0, σ_w²)``, per-row factors ``v ∈ R^k ~ N(0, σ_v² I)`` (k = 4), dense weights
``u ~ N(0, 0.3²)`` on standardised dense values ``z``, and the bias ``b`` bisected so the mean click
probability equals the target CTR. Labels are ``Bernoulli(sigmoid(logit))``. The teacher's own AUC on
sampled labels is the ceiling any student can reach.

Parameters are drawn per table from an RNG keyed by (seed, table), so they are the same in every
process. They are stored (5 floats per row): fine at the harness's scales (~10^5-10^6 rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

TEACHER_RANK = 4
DENSE_WEIGHT_SD = 0.3
_TAG_ROWS, _TAG_DENSE = 7001, 7002


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties counted half)."""
    labels = np.asarray(labels).astype(bool)
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs both positive and negative labels")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts  # 0-based rank where each distinct score starts
    mean_rank = starts + (counts + 1) / 2.0  # 1-based average rank of each tie group
    rank_sum = float(mean_rank[inverse][labels].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


class Teacher:
    """Per-row effects + FM pair terms + a dense term; call ``calibrate`` before ``logits``."""

    def __init__(
        self,
        table_sizes: Sequence[int],
        num_dense: int,
        sigma_w: float,
        sigma_v: float,
        seed: int,
        rank: int = TEACHER_RANK,
    ) -> None:
        self.w: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        for f, rows in enumerate(table_sizes):
            rng = np.random.default_rng([seed, _TAG_ROWS, f])
            self.w.append(rng.normal(0.0, sigma_w, rows))
            self.v.append(rng.normal(0.0, sigma_v, (rows, rank)))
        self.u = np.random.default_rng([seed, _TAG_DENSE]).normal(0.0, DENSE_WEIGHT_SD, num_dense)
        self.dense_mean = np.zeros(num_dense)
        self.dense_sd = np.ones(num_dense)
        self.bias = 0.0

    def _raw_logits(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        logit = ((dense - self.dense_mean) / self.dense_sd) @ self.u if self.u.size else 0.0
        linear = np.zeros(ids.shape[0])
        v_sum = np.zeros((ids.shape[0], self.v[0].shape[1]))
        v_sq = np.zeros(ids.shape[0])
        for f in range(ids.shape[1]):
            linear += self.w[f][ids[:, f]]
            vf = self.v[f][ids[:, f]]
            v_sum += vf
            v_sq += np.einsum("bk,bk->b", vf, vf)
        pairs = 0.5 * (np.einsum("bk,bk->b", v_sum, v_sum) - v_sq)
        return logit + linear + pairs

    def logits(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """``[N]`` float64 logits for ``dense [N, Dd]`` (transformed) and ``ids [N, F]``."""
        return self.bias + self._raw_logits(dense, ids)

    def calibrate(self, dense: np.ndarray, ids: np.ndarray, target_ctr: float) -> None:
        """Fix the dense standardisation and bisect the bias so the mean probability is the CTR."""
        if dense.shape[1]:
            self.dense_mean = dense.mean(axis=0).astype(np.float64)
            self.dense_sd = np.maximum(dense.std(axis=0), 1e-6).astype(np.float64)
        base = self._raw_logits(dense, ids)
        lo, hi = -30.0, 30.0
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if sigmoid(base + mid).mean() < target_ctr:
                lo = mid
            else:
                hi = mid
        self.bias = 0.5 * (lo + hi)
