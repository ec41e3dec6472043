"""The parts of a step's "other" time (issue #16's network-off check): they add up to it."""

from __future__ import annotations

import pytest

from bagpipe.bench.systems import NETWORKS, SYSTEMS, measure
from bagpipe.core.interface import OptimConfig, TrainContext
from bagpipe.data import DatasetConfig, make_dataset
from tests.conftest import TINY_MODEL

PARTS = ("other_between_phases_s", "other_slower_peer_s", "other_driver_rpc_s")


@pytest.mark.parametrize("label", ["sync_ps", "bagpipe"])
def test_other_time_splits_into_parts_that_add_up(label: str) -> None:
    dataset = make_dataset(DatasetConfig(scale=0.0002))
    spec = next(s for s in SYSTEMS if s.label == label)
    ctx = TrainContext(schema=dataset.schema, model=TINY_MODEL, optim=OptimConfig(),
                       global_batch_size=64, seed=0, source=dataset.train(64, 10),
                       network=NETWORKS["off"])
    got = measure(spec, ctx, steps=6)
    assert sum(got[part] for part in PARTS) == pytest.approx(got["other_s"], abs=1e-9)
    assert got["other_between_phases_s"] >= 0 and got["other_slower_peer_s"] >= 0
    # the driver sees more than the slowest trainer's step: the RPCs there and back at least
    assert 0 < got["other_driver_rpc_s"] < got["iter_time_mean_s"]
