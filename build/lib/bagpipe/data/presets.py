"""Dataset shapes: per-table cardinality, missing rate and Zipf exponent, dense marginals, CTR.

All numbers come from ``reference/data.md`` (§1.1 missing rates and dense marginals, §2 cardinalities,
row counts and CTRs, §3.2 fitted exponents). A table is either

* ``heaps``: a large table whose distinct count grows with the number of rows (Heaps' law). At scale
  ``f`` it has ``D * f**(1/s)`` rows ("D at scale f", data.md §3.2) and draws ranks from an infinite
  Zipf(s) whose tail beyond the table is folded onto it (as DLRM's ``max_ind_range`` modulo does);
* ``finite``: a small, saturated table that keeps its full vocabulary at every scale and draws from a
  truncated Zipf(s) over its rows.

Row 0 of every table is the missing value (its probability is the missing rate); for Avazu's
``device_id`` it is the one dominant value (``a99f214a``, 89% of rows), modelled the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

TableModel = Literal["heaps", "finite"]


@dataclass(frozen=True)
class TableSpec:
    """One categorical feature at full scale."""

    name: str
    rows: int
    zipf_s: float
    missing_rate: float
    model: TableModel

    def rows_at_scale(self, scale: float) -> int:
        """Table size at ``scale`` (fraction of the full dataset's examples); at least 2 rows."""
        if self.model == "finite" or scale >= 1.0:
            return self.rows
        return max(2, round(self.rows * scale ** (1.0 / self.zipf_s)))


@dataclass(frozen=True)
class DenseSpec:
    """One integer feature: missing rate, and mean/sd of ``log1p(max(x, 0))`` over present values.

    ``negative_rate`` is the share of present values drawn from {-1, -2, -3} (Kaggle I2, data.md §3.3).
    """

    name: str
    missing_rate: float
    log_mean: float
    log_sd: float
    negative_rate: float = 0.0


@dataclass(frozen=True)
class Preset:
    """A dataset shape: tables, dense columns, full-scale row count, click rate, teacher strengths."""

    name: str
    tables: tuple[TableSpec, ...]
    dense: tuple[DenseSpec, ...]
    full_rows: int
    ctr: float
    teacher_sigma_w: float
    teacher_sigma_v: float
    row_cap: int | None = None

    def table_sizes(self, scale: float, max_ind_range: int | None = None) -> tuple[int, ...]:
        """Per-table rows at ``scale``, capped by the preset's ``row_cap`` and by ``max_ind_range``."""
        caps = [c for c in (self.row_cap, max_ind_range) if c is not None]
        cap = min(caps) if caps else None
        sizes = (t.rows_at_scale(scale) for t in self.tables)
        return tuple(sizes if cap is None else (min(size, cap) for size in sizes))

    def rows_at_scale(self, scale: float) -> int:
        return max(1, math.floor(self.full_rows * scale))


def _tables(
    names: list[str], rows: list[int], s: list[float], missing: list[float], heaps: set[int]
) -> tuple[TableSpec, ...]:
    return tuple(
        TableSpec(n, r, e, m, "heaps" if i in heaps else "finite")
        for i, (n, r, e, m) in enumerate(zip(names, rows, s, missing, strict=True))
    )


# data.md §2.1 (DLRM kaggle ln_emb) and §3.2 (fitted s, missing rates in %).
_KAGGLE_ROWS = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
_KAGGLE_S = [1.59, 0.94, 1.11, 1.23, 2.20, 1.69, 0.71, 1.98, 3.35, 1.59, 0.67, 1.12, 0.63,
             1.29, 0.72, 1.15, 1.40, 0.87, 1.85, 0.70, 1.13, 1.43, 1.56, 1.44, 1.32, 1.49]
_KAGGLE_MISSING_PCT = [0, 0, 4.5, 4.5, 0, 16, 0, 0, 0, 0, 0, 4.5, 0,
                       0, 0, 4.5, 0, 0, 41, 41, 4.5, 79.5, 0, 4.5, 41, 41]
_KAGGLE_HEAPS = {2, 3, 9, 11, 15, 20, 23, 25}

# data.md §1.1: missing %, mean and sd of log1p(max(x,0)); I2 has ~7% negative values (§3.3).
_CRITEO_DENSE = (
    DenseSpec("int_0", 0.45, 0.73, 0.86),
    DenseSpec("int_1", 0.0, 2.05, 2.02, negative_rate=0.075),
    DenseSpec("int_2", 0.17, 2.28, 1.34),
    DenseSpec("int_3", 0.175, 1.79, 0.99),
    DenseSpec("int_4", 0.03, 7.13, 2.95),
    DenseSpec("int_5", 0.255, 3.47, 1.83),
    DenseSpec("int_6", 0.05, 1.55, 1.34),
    DenseSpec("int_7", 0.0, 2.04, 1.16),
    DenseSpec("int_8", 0.05, 3.59, 1.72),
    DenseSpec("int_9", 0.45, 0.36, 0.40),
    DenseSpec("int_10", 0.05, 0.89, 0.76),
    DenseSpec("int_11", 0.785, 0.27, 0.48),
    DenseSpec("int_12", 0.175, 1.94, 1.09),
)

CRITEO_KAGGLE = Preset(
    name="criteo_kaggle",
    tables=_tables([f"cat_{i}" for i in range(26)], _KAGGLE_ROWS, _KAGGLE_S,
                   [m / 100 for m in _KAGGLE_MISSING_PCT], _KAGGLE_HEAPS),
    dense=_CRITEO_DENSE,
    full_rows=45_840_617,
    ctr=0.2562,
    teacher_sigma_w=0.2,
    teacher_sigma_v=0.12,
)

# data.md §2.2, raw distinct counts (Terabyte column order); Heaps fits for the big columns, s=1.2 for
# the small ones. Categorical missing rates are not published for Terabyte: none are modelled.
# Sizes are capped at 40M after scaling (torchrec_dlrm / MLPerf v2 cap).
_TB_ROWS = [227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
            2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36]
_TB_HEAPS_S = {0: 1.17, 9: 1.21, 10: 1.52, 11: 1.77, 19: 1.15, 20: 1.29, 21: 1.18, 22: 1.72}

CRITEO_TERABYTE = Preset(
    name="criteo_terabyte",
    tables=_tables([f"cat_{i}" for i in range(26)], _TB_ROWS,
                   [_TB_HEAPS_S.get(i, 1.2) for i in range(26)], [0.0] * 26, set(_TB_HEAPS_S)),
    dense=_CRITEO_DENSE,
    full_rows=4_373_472_329,
    ctr=0.03,
    teacher_sigma_w=0.2,
    teacher_sigma_v=0.12,
    row_cap=40_000_000,
)

# data.md §2.3, Bagpipe's 21 fields (no ``hour``), each count +1 for row 0. device_id: dominant value
# as row 0 (89%), s=1.04 on the rest; device_ip s=1.13; the saturated tables get s=1.2 [I].
AVAZU_FIELDS = ("C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
                "app_domain", "app_category", "device_id", "device_ip", "device_model",
                "device_type", "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20",
                "C21")
AVAZU_HEX_FIELDS = frozenset({"site_id", "site_domain", "site_category", "app_id", "app_domain",
                              "app_category", "device_id", "device_ip", "device_model"})
_AVAZU_ROWS = [8, 8, 4738, 7746, 27, 8553, 560, 37, 2686409, 6729487, 8252, 6, 5, 2627, 9, 10, 436,
               5, 69, 173, 61]
_AVAZU_S = [1.2] * 8 + [1.04, 1.13] + [1.2] * 11
_AVAZU_MISSING = [0.0] * 8 + [0.89] + [0.0] * 12

AVAZU = Preset(
    name="avazu",
    tables=_tables([f"cat_{i}" for i in range(21)], _AVAZU_ROWS, _AVAZU_S, _AVAZU_MISSING, {8, 9}),
    dense=(),
    full_rows=40_428_967,
    ctr=0.1698,
    teacher_sigma_w=0.27,  # Avazu has 21 tables and no dense part: tuned for a ~0.78 ceiling [M]
    teacher_sigma_v=0.14,
)

PRESETS: dict[str, Preset] = {p.name: p for p in (CRITEO_KAGGLE, AVAZU, CRITEO_TERABYTE)}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a clear error listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {sorted(PRESETS)}") from None
