"""Calibrated synthetic generator with Criteo/Avazu shapes and teacher labels (data.md §3.3-§3.4).

Random access by row: each split (``train``, ``eval``, ...) is an endless stream of examples cut
into chunks of ``CHUNK_ROWS``; chunk ``c`` is drawn from an RNG seeded by ``(seed, split, c)`` alone.
Rows ``start .. stop`` of a split are made from the chunks they overlap, and nothing else, so any
batch, or any trainer's slice of one, can be made without making anything before it or beside it,
in any process, and the train, eval and calibration streams are independent draws. A global batch
``i`` of ``B`` examples is rows ``i*B .. (i+1)*B``; trainer ``k``'s slice of it generates only the
chunks under its own rows (about ``1/T`` of the batch's cost while the slice is at least a chunk).

Per chunk, in this order from its RNG: one uniform per (table, row) for the ids, then the dense
draws, then one uniform per row for the label; the ids alone (``ids``) stop after the first draw.
Table ``f``'s ids come from its ``TablePopularity`` (inverse CDF); dense values are raw integers
(missing with the preset's rate, else ``max(0, round(expm1(y)))`` with ``y ~ N(mean, sd)`` on the
log1p scale, plus a few small negatives for Kaggle's I2), then the DLRM transform; labels are
Bernoulli draws from the teacher.

(Before chunking, a block was drawn from one RNG seeded by its index and size, so the data made for
a seed changed with this layout; the calibrated statistics did not.)
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
CHUNK_ROWS = 256  # rows per independently seeded chunk: the granularity of random access
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
        calib, _ = self._unlabelled("calibration", 0, CALIBRATION_ROWS)
        self.teacher.calibrate(calib.dense, calib.ids, preset.ctr)

    @property
    def num_features(self) -> int:
        return len(self.table_sizes)

    def _chunk_rng(self, split: str, chunk: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, SPLITS[split], chunk])

    def _chunks(self, split: str, start: int, stop: int) -> tuple[range, slice]:
        """The chunks rows ``start .. stop`` of ``split`` overlap, and where those rows are in
        the chunks' rows laid end to end."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {sorted(SPLITS)}")
        if not 0 <= start < stop:
            raise IndexError(f"rows {start}..{stop}: need 0 <= start < stop")
        first = start // CHUNK_ROWS
        return range(first, -(-stop // CHUNK_ROWS)), slice(start - first * CHUNK_ROWS,
                                                           stop - first * CHUNK_ROWS)

    def _sample_ids(self, uniforms: np.ndarray) -> np.ndarray:
        """``[F, N]`` uniforms -> ``[N, F]`` int64 row ids."""
        ids = np.empty(uniforms.shape[::-1], dtype=np.int64)
        for f, table in enumerate(self.tables):
            ids[:, f] = table.sample(uniforms[f])
        return ids

    def _dense_draws(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One chunk's raw dense integers and missing flags (``[CHUNK_ROWS, Dd]`` each)."""
        shape = (CHUNK_ROWS, self._mean.size)
        missing = rng.random(shape) < self._missing
        log_values = np.minimum(rng.normal(self._mean, self._sd, shape), _MAX_LOG1P)
        raw = np.maximum(0.0, np.rint(np.expm1(log_values))).astype(np.int64)
        negative = rng.random(shape) < self._negative
        raw[negative] = -rng.integers(1, 4, int(negative.sum()))
        return raw, missing

    def _unlabelled(self, split: str, start: int, stop: int) -> tuple[Examples, np.ndarray]:
        """Rows ``start .. stop`` without labels, and each row's label uniform."""
        chunks, cut = self._chunks(split, start, stop)
        uniforms, raws, missings, label_uniforms = [], [], [], []
        for chunk in chunks:
            rng = self._chunk_rng(split, chunk)
            uniforms.append(rng.random((self.num_features, CHUNK_ROWS)))
            raw, missing = self._dense_draws(rng)
            raws.append(raw)
            missings.append(missing)
            label_uniforms.append(rng.random(CHUNK_ROWS))
        block = Examples.from_raw(
            None, np.concatenate(raws)[cut], np.concatenate(missings)[cut],
            self._sample_ids(np.concatenate(uniforms, axis=1)[:, cut]))
        return block, np.concatenate(label_uniforms)[cut]

    def rows(self, split: str, start: int, stop: int) -> Examples:
        """Rows ``start .. stop`` of ``split`` (``"train"`` / ``"eval"``): labelled examples."""
        block, label_uniforms = self._unlabelled(split, start, stop)
        labels = (label_uniforms < self.teacher_probs(block)).astype(np.int8)
        return Examples(labels, block.dense, block.ids, block.dense_raw, block.dense_missing)

    def ids(self, split: str, start: int, stop: int) -> np.ndarray:
        """``rows(split, start, stop).ids`` ([N, F] int64), drawing only the ids."""
        chunks, cut = self._chunks(split, start, stop)
        uniforms = [self._chunk_rng(split, c).random((self.num_features, CHUNK_ROWS)) for c in chunks]
        return self._sample_ids(np.concatenate(uniforms, axis=1)[:, cut])

    def examples(self, split: str, index: int, size: int) -> Examples:
        """Block ``index`` of ``size`` rows of ``split``: rows ``index*size .. (index+1)*size``."""
        if index < 0:
            raise IndexError(f"block index {index} is negative")
        return self.rows(split, index * size, (index + 1) * size)

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
