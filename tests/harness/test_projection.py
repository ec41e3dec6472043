"""The projection of recorded runs onto a described cluster: a record becomes the workload the cost
model prices (its measured window, row size, trainers, knobs, the dense model's size), and
speedups are ratios of projected times."""

from __future__ import annotations

import pandas as pd
import pytest

from bagpipe.core.net import Topology
from bagpipe.harness.report.costmodel import predict
from bagpipe.harness.report.projection import dense_params, project, speedups, workload
from bagpipe.harness.track.record import RunRecord
from bagpipe.models import ModelConfig, build_dense_model

PARAMS = {
    "model.name": "dlrm", "model.embedding_dim": "8", "model.bottom_mlp": "[16, 8]",
    "model.top_mlp": "[16, 1]", "model.cross_layers": "2", "model.cross_rank": "4",
    "model.dropout": "0.0", "dataset.kind": "synthetic", "dataset.preset": "criteo_kaggle",
    "dataset.scale": "0.0001", "dataset.seed": "0", "run.warmup_steps": "2",
    "run.batch_size": "512", "trainers": "4", "system.num_servers": "2",
}


def _record(system: str, pull_bytes: float, later_rows: float = 0.0) -> RunRecord:
    steps = [{"step": float(s), "iter_time_s": 0.5, "bytes_emb_pull": pull_bytes * (s + 1),
              "bytes_allreduce": 4000.0, "rows_sync_later": later_rows} for s in range(5)]
    return RunRecord(run_name=system, experiment="x", params=dict(PARAMS),
                     tags={"system": system}, summary={"iter_time_mean_s": 0.5,
                                                       "system_cleanup_interval": 5.0},
                     steps=steps, status="FINISHED")


def test_a_record_becomes_its_measured_window_as_a_workload() -> None:
    count = dense_params(PARAMS)
    work = workload(_record("bagpipe", 1000.0, later_rows=3.0), count)
    # Steps 2, 3, 4 only (past the warm-up): pull bytes 3000, 4000, 5000.
    assert work.bytes_per_iter["emb_pull"] == pytest.approx(4000.0)
    assert work.counters["rows_sync_later"] == pytest.approx(3.0)
    assert (work.trainers, work.servers, work.batch_size) == (4, 2, 512)
    assert work.row_bytes == 4 * 8 and work.knobs == {"cleanup_interval": 5.0}
    from bagpipe.data import DatasetConfig, make_dataset

    schema = make_dataset(DatasetConfig(scale=0.0001)).schema
    model = build_dense_model(ModelConfig(name="dlrm", embedding_dim=8, bottom_mlp=(16, 8),
                                          top_mlp=(16, 1)), schema, seed=0)
    assert count == sum(p.numel() for p in model.parameters())


def test_speedups_are_ratios_of_projected_times() -> None:
    cluster = Topology.uniform(1.0, trainers=4, servers=2, name="c")
    records = [_record("sync_ps", 1e6), _record("bagpipe", 1e4)]
    frame = project(records, [cluster])
    count = dense_params(PARAMS)
    want = {r.tags["system"]: predict(workload(r, count), cluster).iter_s for r in records}
    got = frame.set_index("system")["projected_iter_ms"]
    assert got["sync_ps"] == pytest.approx(1000 * want["sync_ps"])
    ratio = speedups(frame, "projected_iter_ms", ["cluster", "model"])
    assert ratio.loc[("c", "dlrm"), "sync_ps"] == pytest.approx(want["sync_ps"] / want["bagpipe"])
    assert ratio.loc[("c", "dlrm"), "sync_ps"] > 1.0  # 100x fewer bytes pulled


def test_failed_runs_are_not_projected() -> None:
    failed = _record("sync_ps", 1.0)
    failed.status = "FAILED"
    assert project([failed], [Topology()]).equals(pd.DataFrame())
