"""Hydra sweeper ``blocks`` (``hydra/sweeper=blocks``): Hydra's basic sweeper, run in randomised,
interleaved blocks (:mod:`bagpipe.harness.run.blocks`). Hydra loads sweepers only from the
``hydra_plugins`` package; the ordering itself lives with the harness."""

# No ``from __future__ import annotations``: Hydra executes plugin modules outside sys.modules,
# where a dataclass with string annotations cannot resolve them, and OmegaConf reads the types.
from dataclasses import dataclass
from typing import Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.types import Override

from bagpipe.harness.run.blocks import interleaved_blocks


@dataclass
class BlockSweeperConf:
    _target_: str = "hydra_plugins.bagpipe_sweeper.BlockSweeper"
    max_batch_size: Optional[int] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    params: Optional[dict[str, str]] = None  # noqa: UP045
    block_key: str = "seed"  # one block per value of this override
    order_seed: int = 0  # seeds the shuffle within each block
    pair_key: str = "model"  # within a block, runs of one value of this override back to back


ConfigStore.instance().store(group="hydra/sweeper", name="blocks", node=BlockSweeperConf,
                             provider="bagpipe")


class BlockSweeper(BasicSweeper):
    """The basic sweeper's jobs in :func:`interleaved_blocks` order, batched as it batches."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None,
                 block_key: str = "seed", order_seed: int = 0, pair_key: str = "model") -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.block_key = block_key
        self.order_seed = order_seed
        self.pair_key = pair_key

    def split_arguments(  # type: ignore[override]
        self, overrides: list[Override], max_batch_size: int | None
    ) -> list[list[list[str]]]:
        (jobs,) = BasicSweeper.split_arguments(overrides, None)
        ordered = interleaved_blocks(jobs, self.block_key, self.order_seed, self.pair_key)
        size = max_batch_size or len(ordered) or 1
        return [ordered[i:i + size] for i in range(0, len(ordered), size)]
