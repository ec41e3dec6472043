"""fig7 in the paper's regime (#16): the projection beside each measured speedup, Bagpipe's window
checks that refuse a report, and the base rate every model's logloss must beat.

Runs are synthetic records (no training); expected projections are priced on a topology dilated
by hand, not through :meth:`Topology.dilated`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

from bagpipe.core.net import Topology
from bagpipe.harness.report.costmodel import Workload, predict
from bagpipe.harness.report.fig7 import summary_table
from bagpipe.harness.report.head_to_head import head_to_head_lines
from bagpipe.harness.report.profile import profile_lines
from bagpipe.harness.report.regime import projected_iter_ms, run_workload, window_checks
from bagpipe.harness.run.evaluate import base_rate_logloss
from bagpipe.harness.run.train import _flat_params
from bagpipe.harness.track.record import RunRecord
from bagpipe.harness.track.sweeps import add_speedups, runs_frame

from .test_report import _report

GBPS, LATENCY_US, DILATION, COMPUTE_MS = 10.0, 50.0, 4.0, 20.0
TOPOLOGY = Topology.uniform(GBPS, LATENCY_US, trainers=2, servers=1, name="tiny")
#: Bytes per iteration each system moved (summed over trainers).
BYTES = {"sync_ps": {"emb_pull": 4e6, "emb_push": 4e6, "allreduce": 1e5},
         "torchrec": {"alltoall": 1e6, "allreduce": 1e5}}


def _topology_params(topology: Topology) -> dict[str, str]:
    """``topology.*`` params as the runner records them (its own flattening of the config)."""
    return _flat_params(OmegaConf.create({"topology": dataclasses.asdict(topology)}))


def _record(system: str, iter_s: float, *, seed: int = 0, **summary: float) -> RunRecord:
    params = {"seed": str(seed), "trainers": "2", "model.embedding_dim": "8",
              "run.target_auc": "0.65", "dilation.factor": str(DILATION),
              "dilation.compute_here_ms": str(COMPUTE_MS), **_topology_params(TOPOLOGY)}
    return RunRecord(
        run_name=f"{system}-dlrm-s{seed}", experiment="e", params=params,
        tags={"system": system, "model": "dlrm", "dataset": "d", "suite": "fig7",
              "git_sha": "abc123", "cluster": "tiny"},
        summary={"iter_time_mean_s": iter_s, "iter_time_p50_s": iter_s, "auc": 0.7,
                 "logloss": 0.5, "base_rate_logloss": 0.6,
                 **{f"bytes_per_iter_{k}": v for k, v in BYTES.get(system, {}).items()},
                 **summary},
        status="FINISHED",
    )


def _by_hand(system: str, compute_s: float = COMPUTE_MS / 1000, server_cpu_s: float = 0.0) -> float:
    """The projected iteration time on the tiny topology dilated by hand."""
    slow = Topology.uniform(GBPS / DILATION, LATENCY_US * DILATION, trainers=2, servers=1)
    work = Workload(system, BYTES[system], {}, compute_s, trainers=2, servers=1,
                    row_bytes=4 * 8, server_cpu_s=server_cpu_s)
    return predict(work, slow).iter_s


def test_the_projection_stands_beside_the_measurement_with_its_agreement() -> None:
    projected = _by_hand("sync_ps") / _by_hand("torchrec")
    assert projected > 1.0  # the example means something: all-to-all is cheaper here
    agreeing = [_record("sync_ps", 1.0, seed=seed) for seed in range(2)] + [
        _record("torchrec", 1.0 / (1.1 * projected), seed=seed) for seed in range(2)]
    add_speedups(agreeing, "sync_ps")
    table = summary_table(runs_frame(agreeing), "sync_ps").set_index("system")
    assert table.loc["torchrec", "projected_speedup_vs_sync_ps"] == pytest.approx(projected)
    assert table.loc["torchrec", "agrees_within_20pct"] == "yes"  # measured 1.1x the projection
    assert table.loc["sync_ps", "projected_speedup_vs_sync_ps"] == pytest.approx(1.0)
    far = [_record("sync_ps", 1.0), _record("torchrec", 1.0 / (1.3 * projected))]
    add_speedups(far, "sync_ps")
    table = summary_table(runs_frame(far), "sync_ps").set_index("system")
    assert table.loc["torchrec", "agrees_within_20pct"] == "no"


def test_the_projection_charges_each_runs_own_cpu_else_the_calibration() -> None:
    """Compute is the run's trainer CPU per iteration and the servers' CPU rides with the pulls;
    a run that did not record its CPU falls back to the calibrated ``compute_here_ms``."""
    def row(record: RunRecord) -> dict[Any, Any]:
        return runs_frame([record]).to_dict("records")[0]

    def with_cpu() -> RunRecord:
        return _record("sync_ps", 1.0, per_iter_trainer_cpu_s=0.031, per_iter_helpers_cpu_s=0.007)

    measured = row(with_cpu())
    work = run_workload(measured)
    assert work is not None
    assert (work.compute_s, work.server_cpu_s) == (pytest.approx(0.031), pytest.approx(0.007))
    # sync_ps waits for its pulls: compute + wire + the servers' CPU, all on the critical path
    assert projected_iter_ms(measured) == pytest.approx(1000 * _by_hand("sync_ps", 0.031, 0.007))
    assert projected_iter_ms(measured) == pytest.approx(
        1000 * _by_hand("sync_ps", COMPUTE_MS / 1000) + 31 + 7 - COMPUTE_MS)
    uncalibrated = with_cpu()
    del uncalibrated.params["dilation.compute_here_ms"]  # the run's CPU is enough on its own
    assert projected_iter_ms(row(uncalibrated)) == pytest.approx(projected_iter_ms(measured))

    for old in (_record("sync_ps", 1.0), _record("sync_ps", 1.0, per_iter_trainer_cpu_s=0.0)):
        work = run_workload(row(old))  # not recorded (or no trainer role measured): calibration
        assert work is not None
        assert (work.compute_s, work.server_cpu_s) == (pytest.approx(COMPUTE_MS / 1000), 0.0)
        assert projected_iter_ms(row(old)) == pytest.approx(1000 * _by_hand("sync_ps"))


def test_runs_without_what_a_projection_needs_leave_the_column_empty() -> None:
    records = [_record("sync_ps", 1.0), _record("torchrec", 0.5), _record("local", 0.2)]
    for record in records:
        del record.params["dilation.compute_here_ms"]  # a fixed dilation, or an old record
    add_speedups(records, "sync_ps")
    table = summary_table(runs_frame(records), "sync_ps").set_index("system")
    assert table["projected_speedup_vs_sync_ps"].isna().all()
    assert set(table["agrees_within_20pct"]) == {""}


def test_bagpipe_without_write_backs_in_its_timed_window_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [_record("sync_ps", 1.0), _record("local", 0.2),
               _record("bagpipe", 0.5, per_iter_rows_written_back=0.0,
                       per_iter_rows_evicted=3.0, per_iter_rows_prefetched=9.0)]
    assert _report(tmp_path, records) == 1
    error = capsys.readouterr().err
    assert "bagpipe-dlrm-s0: write-backs (per_iter_rows_written_back = 0.0)" in error
    assert "evictions" not in error  # only the failed check is named
    assert not (tmp_path / "reports" / "fig7.md").exists()
    assert _report(tmp_path, records, "--allow-unclean") == 0
    page = (tmp_path / "reports" / "fig7.md").read_text()
    assert page.startswith("> **Draft:**")
    assert ("bagpipe-dlrm-s0: write-backs in the timed window (`per_iter_rows_written_back`) "
            "= 0 rows/iteration: FAIL") in page
    assert "evictions in the timed window (`per_iter_rows_evicted`) = 3 rows/iteration: PASS" in page
    assert "* Topology: tiny (tag `cluster`); trainers: 2;" in page
    assert "* dlrm: time to target = time to AUC 0.65 (`run.target_auc`" in page


def test_a_check_names_the_dilation_scale_of_runs_off_d() -> None:
    """fig7_dilation's runs share fig7's run names: their checks say at which d they ran."""
    frame = pd.DataFrame({"system": ["bagpipe"] * 3, "status": ["FINISHED"] * 3,
                          "run_name": ["bagpipe-dlrm-s0"] * 3, "dilation.scale": [1.0, 0.5, 2.0],
                          "per_iter_rows_evicted": [3.0] * 3})
    runs = {check.run for check in window_checks(frame)}
    assert runs == {"bagpipe-dlrm-s0", "bagpipe-dlrm-s0 at 0.5 d", "bagpipe-dlrm-s0 at 2 d"}


def test_the_page_says_whether_each_model_beats_the_base_rate(tmp_path: Path) -> None:
    records = [_record("sync_ps", 1.0), _record("local", 0.2, logloss=0.7)]
    assert _report(tmp_path, records) == 0
    page = (tmp_path / "reports" / "fig7.md").read_text()
    assert "* dlrm / sync_ps: logloss 0.5000 vs base rate 0.6000: yes." in page
    assert "* dlrm / local: logloss 0.7000 vs base rate 0.6000: no." in page


@pytest.mark.parametrize(("p", "want"), [
    (0.5, math.log(2)),
    (0.25, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))),
    (0.0, 0.0),  # one class: the constant predictor is exact
    (1.0, 0.0),
])
def test_base_rate_logloss(p: float, want: float) -> None:
    assert base_rate_logloss(p) == pytest.approx(want, abs=1e-15)
    assert math.isnan(base_rate_logloss(math.nan))


def test_the_rescaled_runs_stand_beside_fig7s_at_each_dilation() -> None:
    """fig7_dilation's d/2 and 2d runs are reported per scale beside fig7's own (scale 1)."""
    from bagpipe.harness.report.fig7 import rescaled_lines

    def runs(scale: float, torchrec_s: float) -> list[RunRecord]:
        made = [_record("sync_ps", 1.0, seed=s) for s in range(2)] + [
            _record("torchrec", torchrec_s, seed=s) for s in range(2)]
        for record in made:
            record.params["dilation.scale"] = str(scale)
        add_speedups(made, "sync_ps")
        return made

    fig7 = runs_frame(runs(1.0, 0.5))
    rescaled = runs_frame(runs(0.5, 0.8) + runs(2.0, 0.25))
    lines = rescaled_lines(fig7, rescaled, "sync_ps", "sweep x")
    rows = [line for line in lines if line.startswith("| ") and "torchrec" in line]
    assert [row.split(" | ")[0] for row in rows] == ["| 0.5 d (4)", "| 1 d (4)", "| 2 d (4)"]
    assert [row.split(" | ")[2].split("x")[0] for row in rows] == ["1.25", "2.00", "4.00"]


def test_bagpipe_against_the_bound_is_stated_at_each_dilation() -> None:
    """With the bound in fig7_dilation, Bagpipe / bound at d/2, d and 2d, each paired within its
    own scale's blocks: how it moves with d tells traffic from CPU."""
    from bagpipe.harness.report.fig7 import rescaled_lines

    def runs(scale: float, bagpipe_s: float) -> list[RunRecord]:
        made = [_record(system, seconds, seed=s) for s in range(2)
                for system, seconds in (("sync_ps", 1.0), ("embedding_free", 0.5),
                                        ("bagpipe", bagpipe_s))]
        for record in made:
            record.params["dilation.scale"] = str(scale)
        return made

    lines = rescaled_lines(runs_frame(runs(1.0, 0.6)), runs_frame(runs(0.5, 0.55) + runs(2.0, 0.7)),
                           "sync_ps", "sweep x")
    table = lines[lines.index("| d | Bagpipe / bound |") + 2:]
    assert table[:3] == ["| 0.5 d | 1.10x [1.10, 1.10] |", "| 1 d | 1.20x [1.20, 1.20] |",
                         "| 2 d | 1.40x [1.40, 1.40] |"]
    no_bound = runs_frame([r for r in runs(2.0, 0.7) if r.tags["system"] != "embedding_free"])
    assert "| d | Bagpipe / bound |" not in rescaled_lines(no_bound, no_bound, "sync_ps", "x")


def test_the_profile_shows_each_systems_cpu_and_its_compute_against_the_reference() -> None:
    """Cores busy = (trainers x a trainer's CPU + helpers' + driver's) / iteration; trainer 0's
    forward + backward against the reference's of the same block, a geometric mean over blocks,
    in wall time and in its thread's CPU (here the same work, waiting longer for a core)."""
    cpu = {"per_iter_trainer_cpu_s": 0.03, "per_iter_helpers_cpu_s": 0.01,
           "per_iter_driver_cpu_s": 0.002, "cpu_forward_s": 0.008, "cpu_backward_s": 0.016}
    records = [
        _record("sync_ps", 0.04, seed=0, time_forward_s=0.010, time_backward_s=0.020, **cpu),
        _record("sync_ps", 0.05, seed=1, time_forward_s=0.020, time_backward_s=0.030, **cpu),
        _record("bagpipe", 0.04, seed=0, time_forward_s=0.012, time_backward_s=0.024, **cpu),
        _record("bagpipe", 0.05, seed=1, time_forward_s=0.030, time_backward_s=0.030, **cpu),
    ]
    lines = profile_lines(runs_frame(records), "sync_ps")
    row = next(line for line in lines if line.startswith("| dlrm | bagpipe |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:7] == ["45.0", "30.0", "10.0", "2.0", "1.60"]  # 72 ms CPU in 45 ms
    assert cells[7] == "48.0"  # forward + backward, mean over blocks
    assert cells[8] == f"{math.sqrt(1.2 * 1.2):.2f}x"  # 36/30 and 60/50
    assert cells[9] == "1.00x"  # the same CPU in both
    assert "* Forward + backward within 15% of sync_ps's in the same blocks: 0 of 1 (model, " \
           "system) pairs; outside: bagpipe on dlrm (1.20x)." in lines
    whole_batch = profile_lines(runs_frame([*records, _record(
        "local", 0.03, time_forward_s=0.02, time_backward_s=0.04, **cpu)]), "sync_ps")
    local_row = next(line for line in whole_batch if line.startswith("| dlrm | local |"))
    assert local_row.rstrip(" |").endswith("| 60.0 | – | –")  # a whole batch is not a trainer's
    without = profile_lines(runs_frame([_record("sync_ps", 0.04)]), "sync_ps")
    assert any("did not record their CPU" in line for line in without)


def test_the_profile_sets_server_traffic_beside_the_trainers_collectives() -> None:
    """Rows pulled + pushed against all-reduce and all-to-all bytes, MB per iteration."""
    cpu = {"per_iter_trainer_cpu_s": 0.03, "per_iter_helpers_cpu_s": 0.01,
           "per_iter_driver_cpu_s": 0.002}
    records = [_record(system, 0.04, **cpu, **{f"bytes_per_iter_{link}": value
                                               for link, value in BYTES[system].items()})
               for system in ("sync_ps", "torchrec")]
    lines = profile_lines(runs_frame(records), "sync_ps")
    assert "| dlrm | sync_ps | 8.00 | 0.10 | – |" in lines  # no all-to-all recorded
    assert "| dlrm | torchrec | – | 0.10 | 1.00 |" in lines


def test_bagpipe_stands_against_every_baseline_paired_within_blocks() -> None:
    """baseline time / Bagpipe's per block, geometric mean and interval; HET with its AUC."""
    records = [
        _record(system, seconds * scale, seed=seed)
        for seed, scale in ((0, 1.0), (1, 1.1), (2, 0.9))
        for system, seconds in (("sync_ps", 0.05), ("fae", 0.06), ("torchrec", 0.03),
                                ("het", 0.04), ("bagpipe", 0.04))
    ]
    lines = head_to_head_lines(runs_frame(records))
    assert lines[lines.index("| model | vs sync_ps | vs fae | vs torchrec | vs het |") + 2] == (
        "| dlrm | 1.25x [1.25, 1.25] faster | 1.50x [1.50, 1.50] faster | "
        "0.75x [0.75, 0.75] slower | 1.00x [1.00, 1.00] within noise; AUC 0.7000 vs 0.7000 |")
    assert head_to_head_lines(runs_frame([_record("sync_ps", 0.05)])) == []
