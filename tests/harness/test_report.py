"""The report turns run records into the tidy CSV, the figure and the markdown."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bagpipe.harness.report.cli import main as report_main
from bagpipe.harness.track.record import RunRecord
from bagpipe.harness.track.sweeps import add_speedups, runs_frame


def make_record(system: str, model: str, seed: int, iter_s: float,
                sha: str = "abc123") -> RunRecord:
    return RunRecord(
        run_name=f"{system}-{model}-s{seed}", experiment="e", params={"seed": str(seed)},
        tags={"system": system, "model": model, "dataset": "synthetic_kaggle", "suite": "fig7",
              "git_sha": sha},
        summary={"iter_time_mean_s": iter_s, "iter_time_p50_s": iter_s, "iter_time_p90_s": iter_s,
                 "auc": 0.7, "logloss": 0.5, "time_to_target_s": 10.0 + seed,
                 "bytes_per_iter_emb_pull": 100.0, "hit_rate": float("nan"),
                 # Bagpipe's window checks pass: its cache cycled after the warm-up
                 "per_iter_rows_evicted": 5.0, "per_iter_rows_written_back": 5.0,
                 "per_iter_rows_prefetched": 7.0},
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


def test_speedups_pair_runs_of_the_same_regime_not_only_the_same_seed():
    """fig7_dilation runs every system at d/2 and at 2d with the same seeds: a run is divided by
    its reference at its own dilation, never by the one at the other (which once reported 2d's
    sync_ps as 0.86x itself)."""
    records = []
    for scale, sync_s, bagpipe_s in (("0.5", 0.030, 0.027), ("2.0", 0.036, 0.029)):
        for system, iter_s in (("sync_ps", sync_s), ("bagpipe", bagpipe_s)):
            record = make_record(system, "dlrm", 0, iter_s)
            record.params.update({"network.dilation_scale": scale, "dilation.scale": scale})
            records.append(record)
    assert add_speedups(records, "sync_ps") == 4
    speedups = {(r.tags["system"], r.params["dilation.scale"]): r.summary["speedup_vs_sync_ps"]
                for r in records}
    assert speedups[("sync_ps", "0.5")] == speedups[("sync_ps", "2.0")] == 1.0
    assert speedups[("bagpipe", "0.5")] == pytest.approx(0.030 / 0.027)
    assert speedups[("bagpipe", "2.0")] == pytest.approx(0.036 / 0.029)


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
    # within every block bagpipe is 5x sync_ps: the paired interval is that, and excludes 1
    assert "| 5.00x [5.00, 5.00] | faster |" in text
    table = pd.read_csv(tmp_path / "results" / "fig7" / "runs.csv")
    assert set(table["git_sha"]) == {"abc123"}


def test_the_paper_scale_set_is_its_own_result_set(tmp_path: Path) -> None:
    records = [make_record(system, "dlrm", seed, base) for seed in range(3)
               for system, base in (("sync_ps", 0.5), ("bagpipe", 0.25))]
    for minute, record in enumerate(records, start=1):  # one after the other, a minute each
        record.start_ms, record.end_ms = 60_000 * minute, 60_000 * (minute + 1)
    assert _report(tmp_path, records, suite="fig7_paper") == 0
    assert len(pd.read_csv(tmp_path / "results" / "fig7_paper" / "runs.csv")) == 6
    text = (tmp_path / "reports" / "fig7_paper.md").read_text()
    assert text.startswith("# fig7_paper: ") and "![fig7_paper](fig7_paper.png)" in text
    assert "| 2.00x [2.00, 2.00] | faster |" in text
    assert "* Wall time: 6.0 min for 6 runs (first start to last end)." in text
    assert not (tmp_path / "reports" / "fig7.md").exists()  # fig7's own set is untouched


def _report(tmp_path: Path, records: list[RunRecord], *extra: str, suite: str = "fig7") -> int:
    add_speedups(records, "sync_ps")
    csv = tmp_path / "in.csv"
    runs_frame(records).to_csv(csv, index=False)
    return report_main([suite, "--csv", str(csv), "--results-dir", str(tmp_path / "results"),
                        "--reports-dir", str(tmp_path / "reports"), *extra])


@pytest.mark.parametrize("shas", [("abc123", "def456"), ("abc123-dirty", "abc123-dirty")])
def test_a_result_set_from_several_commits_or_a_dirty_tree_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shas: tuple[str, str]
) -> None:
    records = [make_record("sync_ps", "dlrm", 0, 0.5, shas[0]),
               make_record("bagpipe", "dlrm", 0, 0.1, shas[1])]
    assert _report(tmp_path, records) == 1
    assert "one clean commit" in capsys.readouterr().err
    assert not (tmp_path / "reports" / "fig7.md").exists()  # nothing drawn
    assert _report(tmp_path, records, "--allow-unclean") == 0
    assert (tmp_path / "reports" / "fig7.md").read_text().startswith("> **Draft:**")


def test_noisy_blocks_give_an_interval_that_spans_one(tmp_path: Path) -> None:
    # bagpipe is faster in two blocks and slower in the third: no verdict either way
    times = {0: (0.5, 0.4), 1: (0.5, 0.45), 2: (0.5, 0.7)}
    records = [make_record(system, "dlrm", seed, pair[k]) for seed, pair in times.items()
               for k, system in enumerate(("sync_ps", "bagpipe"))]
    assert _report(tmp_path, records) == 0
    assert "| within noise |" in (tmp_path / "reports" / "fig7.md").read_text()


def test_an_unknown_suite_is_refused_naming_the_valid_ones(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        report_main(["fig8"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "'fig8'" in error
    for suite in ("fig7", "skew", "breakdown", "convergence", "costmodel", "ablation"):
        assert f"'{suite}'" in error
