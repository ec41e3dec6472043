"""The oracle benchmark's report: drawn from the benchmark's own rows, whatever variants ran."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bagpipe.bench.oracle_report import report


def _row(variant: str, metric: str, value: float, unit: str = "ms") -> dict:
    config = {"batches": 800, "batch_size": 16384, "lookahead": 200, "trainers": 8}
    return {
        "benchmark": "oracle",
        "variant": variant,
        "metric": metric,
        "value": value,
        "unit": unit,
        **config,
    }


def test_report_draws_every_variant_and_both_iterations(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        [
            _row("oracle_cacher", "ms_per_batch_wall", 9.0),
            _row("oracle_cacher", "ms_per_batch_cpu", 12.0),
            _row("oracle_cacher_capacity_10", "capacity_over_uncapped_peak", 0.6, "x"),
            _row("oracle_cacher_capacity_10", "ms_per_batch_wall", 9.5),
            _row("original_dense_numpy_with_unique", "ms_per_batch_wall", 10.0),
            _row("local_dlrm_small_step_b16384_cpu", "iteration_ms", 150.0),
            _row("dlrm_small_dense_fwd_bwd_b16384_cpu", "iteration_ms", 100.0),
        ]
    )
    figure, text = report(frame, tmp_path)
    assert figure.stat().st_size > 10_000
    written = text.read_text()
    assert "| oracle_cacher | ms_per_batch_wall | 9 | ms |" in written
    assert "800 batches of 16384, L = 200, T = 8" in written


def test_report_states_each_target_it_has_a_figure_for(tmp_path: Path) -> None:
    share = "oracle_cacher_wall_per_batch_over_local_dlrm_small_step_b16384_cpu"
    frame = pd.DataFrame(
        [
            _row("oracle_cacher", "ms_per_batch_wall", 9.0),
            _row("ratio", share, 0.047, "x"),
            _row("ratio", f"{share}_min", 0.037, "x"),
            _row("ratio", f"{share}_max", 0.055, "x"),
            _row("ratio", "oracle_cacher_speed_over_original_with_unique_cpu", 0.8, "x"),
        ]
    )
    written = report(frame, tmp_path)[1].read_text()
    assert "is 4.7% of a `local` step (repetitions 3.7% to 5.5%): met." in written
    assert "0.80x the original's speed by cpu time: not met." in written
    assert "by wall time" not in written  # no figure, no claim
