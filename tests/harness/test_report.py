"""The report turns run records into the tidy CSV, the figure and the markdown."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bagpipe.harness.report.cli import main as report_main
from bagpipe.harness.track.record import RunRecord
from bagpipe.harness.track.sweeps import add_speedups, runs_frame


def make_record(system: str, model: str, seed: int, iter_s: float) -> RunRecord:
    return RunRecord(
        run_name=f"{system}-{model}-s{seed}", experiment="e", params={"seed": str(seed)},
        tags={"system": system, "model": model, "dataset": "synthetic_kaggle", "suite": "fig7",
              "git_sha": "abc123"},
        summary={"iter_time_mean_s": iter_s, "iter_time_p50_s": iter_s, "iter_time_p90_s": iter_s,
                 "auc": 0.7, "logloss": 0.5, "time_to_target_s": 10.0 + seed,
                 "bytes_per_iter_emb_pull": 100.0, "hit_rate": float("nan")},
        status="FINISHED",
    )


def test_speedups_pair_runs_of_the_same_model_and_seed():
    records = [make_record("sync_ps", "dlrm", 0, 0.4), make_record("bagpipe", "dlrm", 0, 0.1),
               make_record("bagpipe", "dlrm", 1, 0.1), make_record("sync_ps", "wdl", 0, 0.2)]
    assert add_speedups(records, "sync_ps") == 3
    assert records[1].summary["speedup_vs_sync_ps"] == pytest.approx(4.0)
    assert "speedup_vs_sync_ps" not in records[2].summary  # no sync_ps run with seed 1
    frame = runs_frame(records)
    assert list(frame.columns[:4]) == ["system", "model", "dataset", "seed"]


def test_report_writes_csv_figure_and_markdown(tmp_path: Path):
    records = [make_record(system, model, seed, base * (1 + 0.1 * seed))
               for model in ("dlrm", "dcn") for seed in range(3)
               for system, base in (("sync_ps", 0.5), ("bagpipe", 0.1), ("local", 0.08))]
    add_speedups(records, "sync_ps")
    csv = tmp_path / "in.csv"
    runs_frame(records).to_csv(csv, index=False)
    code = report_main(["fig7", "--csv", str(csv), "--results-dir",
                        str(tmp_path / "results"), "--reports-dir", str(tmp_path / "reports")])
    assert code == 0
    out = pd.read_csv(tmp_path / "results" / "fig7" / "runs.csv")
    assert len(out) == 18
    assert (tmp_path / "reports" / "fig7.png").stat().st_size > 10_000
    text = (tmp_path / "reports" / "fig7.md").read_text()
    assert "up to 5.6x" in text
    assert "Bagpipe is up to 5.00x faster per iteration (over sync_ps on dlrm)" in text
    assert "| dlrm | bagpipe | 3 |" in text and "abc123" in text


def test_an_unknown_suite_is_refused_naming_the_valid_ones(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        report_main(["fig8"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "'fig8'" in error
    for suite in ("fig7", "skew", "breakdown", "convergence", "costmodel", "ablation"):
        assert f"'{suite}'" in error
