"""Calibrated synthetic generator with Criteo/Avazu shapes and teacher labels (data.md §3.3-§3.4).

Random access: example block ``(split, index)`` is drawn from an RNG seeded by
``(seed, split, index, batch_size)`` alone, so any batch can be made without making the ones before
it, in any process, and the train, eval and calibration streams are independent draws.

Per block: table ``f``'s ids come from its ``TablePopularity`` (inverse CDF); dense values are raw
integers (missing with the preset's rate, else ``max(0, round(expm1(y)))`` with
``y ~ N(mean, sd)`` on the log1p scale, plus a few small negatives for Kaggle's I2), then the DLRM
transform; labels are Bernoulli draws from the teacher.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bagpipe.data.examples import Examples
from bagpipe.data.popularity import (
    TablePopularity,
    calibrate_kappa,
    hot_set_rank_probs,
    zipf_rank_probs,
)
from bagpipe.data.presets import Preset
from bagpipe.data.skew import skew_report
from bagpipe.data.teacher import Teacher, roc_auc, sigmoid

SPLITS: dict[str, int] = {"train": 0, "eval": 1, "calibration": 2, "ceiling": 3}
_TAG_PERM = 9001
CALIBRATION_ROWS = 32768
CEILING_ROWS = 65536
_MAX_LOG1P = 20.0  # caps expm1 of the far tail of the dense normal (x <= 4.9e8)


@dataclass(frozen=True)
class GeneratorConfig:
    """What a generator needs beyond its preset.

    ``skew_target``: share of accesses the global top 1% of rows must take (κ calibrated), or ``None``
    for the fitted exponents (κ = 1). ``hot_set = (k, u)``: Bagpipe's mode instead (fractions, e.g.
    ``(0.01, 0.9)``); it overrides ``skew_target``.
    """

    scale: float
    seed: int = 0
    skew_target: float | None = 0.92
    hot_set: tuple[float, float] | None = None
    max_ind_range: int | None = None


class SyntheticGenerator:
    """Deterministic, random-access example blocks for one preset (see the module docstring)."""

    def __init__(self, preset: Preset, cfg: GeneratorConfig) -> None:
        if cfg.scale <= 0:
            raise ValueError(f"scale must be positive, got {cfg.scale}")
        self.preset = preset
        self.cfg = cfg
        self.table_sizes = preset.table_sizes(cfg.scale, cfg.max_ind_range)
        self.kappa = 1.0
        if cfg.hot_set is not None:
            k, u = cfg.hot_set
            if not (0.0 < k <= 1.0 and 0.0 <= u <= 1.0):
                raise ValueError(f"hot_set=(k, u) must be fractions in (0, 1], got {cfg.hot_set}")
            rank_probs = [hot_set_rank_probs(d, k, u) for d in self.table_sizes]
        else:
            if cfg.skew_target is not None:
                self.kappa = calibrate_kappa(preset.tables, self.table_sizes, cfg.skew_target)
            rank_probs = [
                zipf_rank_probs(t, d, self.kappa)
                for t, d in zip(preset.tables, self.table_sizes, strict=True)
            ]
        self.tables = [
            TablePopularity.build(p, np.random.default_rng([cfg.seed, _TAG_PERM, f]),
                                  keep_row0=cfg.hot_set is None)
            for f, p in enumerate(rank_probs)
        ]
        self._mean = np.array([d.log_mean for d in preset.dense])
        self._sd = np.array([d.log_sd for d in preset.dense])
        self._missing = np.array([d.missing_rate for d in preset.dense])
        self._negative = np.array([d.negative_rate for d in preset.dense])
        self.teacher = Teacher(self.table_sizes, len(preset.dense), preset.teacher_sigma_w,
                               preset.teacher_sigma_v, cfg.seed)
        calib = self._features(self._rng("calibration", 0, CALIBRATION_ROWS), CALIBRATION_ROWS)
        self.teacher.calibrate(calib.dense, calib.ids, preset.ctr)

    @property
    def num_features(self) -> int:
        return len(self.table_sizes)

    def _rng(self, split: str, index: int, size: int) -> np.random.Generator:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {sorted(SPLITS)}")
        if index < 0:
            raise IndexError(f"block index {index} is negative")
        return np.random.default_rng([self.cfg.seed, SPLITS[split], index, size])

    def _features(self, rng: np.random.Generator, size: int) -> Examples:
        uniforms = rng.random((self.num_features, size))
        ids = np.empty((size, self.num_features), dtype=np.int64)
        for f, table in enumerate(self.tables):
            ids[:, f] = table.sample(uniforms[f])
        num_dense = self._mean.size
        missing = rng.random((size, num_dense)) < self._missing
        log_values = np.minimum(rng.normal(self._mean, self._sd, (size, num_dense)), _MAX_LOG1P)
        raw = np.maximum(0.0, np.rint(np.expm1(log_values))).astype(np.int64)
        negative = rng.random((size, num_dense)) < self._negative
        raw[negative] = -rng.integers(1, 4, int(negative.sum()))
        return Examples.from_raw(None, raw, missing, ids)

    def examples(self, split: str, index: int, size: int) -> Examples:
        """Block ``index`` of ``split`` (``"train"`` / ``"eval"``): ``size`` labelled examples."""
        rng = self._rng(split, index, size)
        block = self._features(rng, size)
        probs = sigmoid(self.teacher.logits(block.dense, block.ids))
        labels = (rng.random(size) < probs).astype(np.int8)
        return Examples(labels, block.dense, block.ids, block.dense_raw, block.dense_missing)

    def teacher_probs(self, block: Examples) -> np.ndarray:
        """The teacher's click probability for each example (the Bayes-optimal score)."""
        return sigmoid(self.teacher.logits(block.dense, block.ids))

    def teacher_auc(self, rows: int = CEILING_ROWS) -> float:
        """AUC of the teacher's own probabilities on ``rows`` fresh labelled examples: the ceiling."""
        block = self.examples("ceiling", 0, rows)
        assert block.labels is not None
        return roc_auc(block.labels, self.teacher_probs(block))

    def expected_skew(self) -> dict[str, float]:
        """Analytic skew (top 0.1/1/10% shares) from the per-row probabilities, no sampling."""
        report = skew_report([t.row_probs() for t in self.tables],
                             [t.name for t in self.preset.tables])
        return {f"expected_{k}": v for k, v in report.items() if "/" not in k}
