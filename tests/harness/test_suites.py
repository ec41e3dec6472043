"""Every figure suite composes into valid jobs before anything runs, and the one-knob figures are
drawn from records: a line per system over the knob's values, a table with every run's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from bagpipe.harness.report.cli import parser as report_parser
from bagpipe.harness.report.plotting import Outputs
from bagpipe.harness.report.sensitivity import SENSITIVITIES, sweep_frame
from bagpipe.harness.report.sensitivity import report as sensitivity_report
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR
from bagpipe.harness.track.record import RunRecord

SWEPT = {"lookahead": 7, "capacity": 5, "cleanup": 4, "skew_sensitivity": 16, "scaling": 12,
         "costmodel": 24, "ablation": 12, "bound_split": 96}


@pytest.fixture(scope="module", autouse=True)
def _hydra():
    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        yield


@pytest.mark.parametrize("suite", sorted(SWEPT))
def test_suite_composes_into_valid_jobs(suite: str) -> None:
    from bagpipe.harness.run.sweep import validate_sweep

    cfg = compose("config", overrides=[f"suite={suite}"], return_hydra_config=True)
    assert len(validate_sweep(cfg)) == SWEPT[suite]
    assert report_parser().parse_args([suite]).suite == suite  # and it has a report


def _record(system: str, params: dict[str, str], iter_s: float) -> RunRecord:
    return RunRecord(run_name=system, experiment="x", params=params, tags={"system": system},
                     summary={"iter_time_mean_s": iter_s, "hit_rate": 0.5,
                              "bytes_per_iter_emb_pull": 2000.0}, status="FINISHED")


def test_skew_figure_draws_the_hot_share_per_system(tmp_path: Path) -> None:
    records = [
        _record(system, {"dataset.hot_set": f"[0.01, {share}]"}, iter_s)
        for system, share, iter_s in [("sync_ps", 0.5, 0.03), ("sync_ps", 0.9, 0.031),
                                      ("bagpipe", 0.5, 0.02), ("bagpipe", 0.9, 0.01)]
    ]
    for index, record in enumerate(records):
        record.save(tmp_path / "sweep" / str(index) / "record")
    failed = _record("het", {"dataset.hot_set": "[0.01, 0.5]"}, 1.0)
    failed.status = "FAILED"
    failed.save(tmp_path / "sweep" / "9" / "record")

    frame = sweep_frame(SENSITIVITIES["skew_sensitivity"], [*records, failed])
    assert sorted(frame["dataset.hot_set"].unique()) == [0.5, 0.9]
    assert "het" not in set(frame["system"])
    sensitivity_report("skew_sensitivity", tmp_path / "sweep",
                       Outputs(results_dir=tmp_path / "results", reports_dir=tmp_path / "reports"))
    report = (tmp_path / "reports" / "skew_sensitivity.md").read_text()
    assert (tmp_path / "reports" / "skew_sensitivity.png").stat().st_size > 0
    assert "| 0.9 | bagpipe | 10 | 0.5 | 2 |" in report  # ms, hit rate, kB
    assert len((tmp_path / "results" / "skew_sensitivity" / "runs.csv").read_text().splitlines()) == 5
