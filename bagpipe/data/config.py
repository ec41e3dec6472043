"""``DatasetConfig``: what data to train on (the Hydra ``dataset`` group's schema is derived from it).

Kept apart from ``dataset`` so preprocessing (``prepare``), which the datasets call, can read it
without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from bagpipe.data.presets import Preset, get_preset

KINDS: tuple[str, ...] = ("synthetic", "criteo_tsv", "avazu_csv", "jsonl")
MAPPINGS: tuple[str, ...] = ("hash_mod", "vocab")
_FILE_PRESETS = {"criteo_tsv": ("criteo_kaggle", "criteo_terabyte"), "avazu_csv": ("avazu",)}


@dataclass(frozen=True)
class DatasetConfig:
    """What data to train on.

    Args:
        kind: ``synthetic`` | ``criteo_tsv`` | ``avazu_csv`` | ``jsonl``.
        preset: dataset shape (``criteo_kaggle`` | ``avazu`` | ``criteo_terabyte``): table sizes,
            skew, CTR; for file kinds it fixes the schema (and, with ``hash_mod``, the table sizes).
        scale: fraction of the full dataset; big tables shrink by Heaps' law. The default 0.001
            gives the Kaggle shape ~127k table rows and ~46k examples: CPU-sized.
        seed: generator, teacher and shuffle seed.
        skew_target: share of accesses the top 1% of rows take (synthetic; ``None`` = fitted κ=1).
        hot_set: ``(k, u)``: Bagpipe's mode, k of each table's rows take u of the lookups
            (overrides ``skew_target``).
        path: input file (or glob of day files) for the file kinds.
        mapping: ``hash_mod`` or ``vocab`` (see ``bagpipe.data.files``).
        frequency_threshold: ``vocab``: values seen fewer times share one row (DLRM/torchrec's
            frequency threshold; 0 or 1: every value has its own row).
        max_ind_range: cap on every table's rows (DLRM's ``--max-ind-range``).
        table_sizes: explicit per-table rows (overrides preset/scale/max_ind_range; not ``vocab``).
        skip_bad_rows: drop and count malformed rows instead of raising ``DataFormatError``.
        eval_fraction: file kinds other than Terabyte: trailing share of rows used for eval
            (Terabyte evaluates on its last day file); synthetic: default sizes.
        shuffle: file kinds: visit train rows in a seeded block-and-window shuffle per epoch
            (``bagpipe.data.shuffle``), else in file order.
        cache_dir: where prepared (binary, sharded) datasets are kept (``bagpipe.data.cache``).
        full_hash: key the prepared dataset by a hash of every byte of the input, not by size,
            mtime and sampled blocks (``bagpipe.data.fingerprint``).
    """

    kind: str = "synthetic"
    preset: str = "criteo_kaggle"
    scale: float = 0.001
    seed: int = 0
    skew_target: float | None = 0.92
    hot_set: tuple[float, float] | None = None
    path: str | None = None
    mapping: str = "hash_mod"
    frequency_threshold: int = 0
    max_ind_range: int | None = None
    table_sizes: tuple[int, ...] | None = None
    skip_bad_rows: bool = False
    eval_fraction: float = 1 / 7
    shuffle: bool = False
    cache_dir: str | None = None
    full_hash: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown dataset kind {self.kind!r}; valid kinds: {list(KINDS)}")
        get_preset(self.preset)
        if self.kind in _FILE_PRESETS and self.preset not in _FILE_PRESETS[self.kind]:
            raise ValueError(f"kind {self.kind!r} needs preset in {list(_FILE_PRESETS[self.kind])}, "
                             f"got preset={self.preset!r}")
        if self.mapping not in MAPPINGS:
            raise ValueError(f"unknown mapping {self.mapping!r}; valid: {list(MAPPINGS)}")
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"kind {self.kind!r} needs path= (a file or a glob of day files)")
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")
        if not 0 < self.eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        if self.frequency_threshold < 0:
            raise ValueError(f"frequency_threshold must be >= 0, got {self.frequency_threshold}")
        if self.table_sizes is not None and len(self.table_sizes) != len(get_preset(self.preset).tables):
            raise ValueError(f"table_sizes has {len(self.table_sizes)} entries; preset "
                             f"{self.preset!r} has {len(get_preset(self.preset).tables)} tables")

    def resolved_table_sizes(self, preset: Preset) -> tuple[int, ...]:
        if self.table_sizes is not None:
            return tuple(self.table_sizes)
        return preset.table_sizes(self.scale, self.max_ind_range)
