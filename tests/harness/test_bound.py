"""Bagpipe against the embedding-free bound (#16): paired within blocks, judged against 1.15x.

Runs are synthetic records (no training), made as the fig7 report's tests make them.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from bagpipe.core.net.topology import Topology
from bagpipe.harness.report.bound import bound_lines, priced_ratios
from bagpipe.harness.report.fig7 import markdown, summary_table
from bagpipe.harness.report.head_to_head import head_to_head_lines
from bagpipe.harness.track.sweeps import add_speedups, runs_frame

from .test_fig7_regime import DILATION, GBPS, LATENCY_US, _record

#: The bound's iteration time per block (seed); the machine's speed drifts from block to block.
BOUND_S = (0.10, 0.20, 0.05)


def _lines(ratios: tuple[float, ...]) -> list[str]:
    """The section for runs where Bagpipe took ``ratios[b]`` times the bound's time in block b."""
    records = [_record("embedding_free", BOUND_S[seed], seed=seed) for seed in range(len(ratios))]
    records += [_record("bagpipe", BOUND_S[seed] * ratio, seed=seed)
                for seed, ratio in enumerate(ratios)]
    return bound_lines(runs_frame(records))


def _row(lines: list[str]) -> str:
    return lines[lines.index("| model | Bagpipe / bound [95% CI] | blocks | goal |") + 2]


def test_the_ratio_is_paired_within_blocks_and_meets_the_goal_below_it() -> None:
    # Equal ratios in every block: no spread once paired, though the times differ 4x.
    assert _row(_lines((1.10, 1.10, 1.10))) == "| dlrm | 1.10x [1.10, 1.10] | 3 | met |"
    assert _row(_lines((1.20, 1.20, 1.20))) == "| dlrm | 1.20x [1.20, 1.20] | 3 | missed |"


def test_the_interval_is_a_t_interval_on_the_log_ratios() -> None:
    ratios = (1.05, 1.12, 1.30)
    logs = [math.log(r) for r in ratios]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(logs) / math.sqrt(3)
    centre = statistics.fmean(logs)
    low, high = math.exp(centre - half), math.exp(centre + half)
    assert low < 1.15 < high  # the example straddles the goal
    assert _row(_lines(ratios)) == (f"| dlrm | {math.exp(centre):.2f}x [{low:.2f}, {high:.2f}] | "
                                    "3 | within noise of 1.15x |")


def test_one_block_decides_nothing() -> None:
    assert _row(_lines((1.01,))) == "| dlrm | 1.01x [–, –] | 1 | one block |"


def test_result_sets_without_the_bound_get_no_section() -> None:
    older = runs_frame([_record("sync_ps", 0.05), _record("bagpipe", 0.04)])
    assert bound_lines(older) == []
    assert bound_lines(runs_frame([_record("embedding_free", 0.05)])) == []


def test_the_bound_is_not_a_baseline_bagpipe_is_set_against() -> None:
    frame = runs_frame([_record("sync_ps", 0.05), _record("bagpipe", 0.04),
                        _record("embedding_free", 0.03)])
    assert not any("embedding_free" in line for line in head_to_head_lines(frame))


def test_the_fig7_page_carries_the_section() -> None:
    records = [_record(system, seconds, seed=seed) for seed in range(2)
               for system, seconds in (("sync_ps", 0.05), ("bagpipe", 0.04),
                                       ("embedding_free", 0.035))]
    add_speedups(records, "sync_ps")
    frame = runs_frame(records)
    page = markdown(frame, summary_table(frame, "sync_ps"), "sync_ps", Path("fig7.png"), "test")
    assert "\n".join(bound_lines(frame)) in page


def test_the_gap_to_the_bound_is_split_by_phase_other_time_and_cpu() -> None:
    """Bagpipe's mean minus the bound's, ms per iteration: each phase, what no phase covers (the
    iteration's gap minus the phases'), and a trainer's CPU; a phase no run recorded is left out."""
    phases = ("fetch_wait", "forward", "backward", "sync", "optimizer")
    bound = dict(zip(phases, (0.001, 0.005, 0.008, 0.002, 0.001), strict=True))
    bagpipe = dict(zip(phases, (0.0015, 0.0055, 0.009, 0.005, 0.0015), strict=True))
    records = [_record(system, seconds, per_iter_trainer_cpu_s=cpu,
                       **{f"time_{p}_s": v for p, v in times.items()})
               for system, seconds, cpu, times in (("embedding_free", 0.020, 0.016, bound),
                                                    ("bagpipe", 0.027, 0.020, bagpipe))]
    lines = bound_lines(runs_frame(records))
    header = ("| model | iteration | fetch_wait | forward | backward | sync | optimizer | other | "
              "a trainer's CPU |")
    assert lines[lines.index(header) + 2] == \
        "| dlrm | +7.00 | +0.50 | +0.50 | +1.00 | +3.00 | +0.50 | +1.50 | +4.00 |"


def test_the_cpu_gap_is_split_by_phase_and_outside_the_steps_thread() -> None:
    """Bagpipe's mean minus the bound's of the CPU trainer 0's step thread spent in each phase,
    and of a trainer's CPU beyond them (its background threads, collectives, RPC)."""
    phases = ("forward", "backward", "sync")
    records = [_record(system, seconds, per_iter_trainer_cpu_s=cpu,
                       **{f"time_{p}_s": 0.01 for p in phases},
                       **{f"cpu_{p}_s": v for p, v in zip(phases, step_cpu, strict=True)})
               for system, seconds, cpu, step_cpu in (
                   ("embedding_free", 0.020, 0.016, (0.004, 0.007, 0.0005)),
                   ("bagpipe", 0.027, 0.020, (0.0045, 0.0075, 0.0015)))]
    lines = bound_lines(runs_frame(records))
    header = ("| model | forward | backward | sync | the round thread | other threads "
              "| a trainer's CPU |")
    # no round thread recorded: all 2 ms outside the step's thread are the other threads'
    assert lines[lines.index(header) + 2] == (
        "| dlrm | +0.50 | +0.50 | +1.00 | +0.00 | +2.00 | +4.00 |")
    # runs that did not record their phases' CPU get no such table
    older = [_record(system, seconds, per_iter_trainer_cpu_s=cpu, time_sync_s=0.01)
             for system, seconds, cpu in (("embedding_free", 0.02, 0.016), ("bagpipe", 0.027, 0.02))]
    assert not any("the round thread" in line for line in bound_lines(runs_frame(older)))


def _priced(bagpipe_cpu_s: float, bagpipe_allreduce: float) -> dict[str, float]:
    """:func:`priced_ratios` of a Bagpipe run against a bound run that moved 1e5 all-reduce bytes
    on 16 ms of trainer CPU (compute 2 ms on the target)."""
    pair = {}
    for system, cpu_s, allreduce in (("embedding_free", 0.016, 1e5),
                                     ("bagpipe", bagpipe_cpu_s, bagpipe_allreduce)):
        record = _record(system, 0.02, per_iter_trainer_cpu_s=cpu_s,
                         bytes_per_iter_allreduce=allreduce, per_iter_rows_sync_later=0.0)
        record.params["dilation.compute_target_ms"] = "2.0"
        pair[system] = runs_frame([record]).iloc[0].to_dict()
    return priced_ratios(pair["bagpipe"], pair["embedding_free"])


def _ring_s(allreduce_bytes: float, dilation: float) -> float:
    """A two-trainer ring all-reduce of ``allreduce_bytes`` (summed over both) on the tiny
    topology dilated by ``dilation``, by hand (``costmodel.flow_time_s``)."""
    nic = Topology.uniform(GBPS, LATENCY_US, trainers=2, servers=1).dilated(dilation).trainer_nic
    payload_bps = min(nic.egress_payload_bytes_per_s, nic.ingress_payload_bytes_per_s) * 8
    return 2 * nic.latency_s + 2 * (allreduce_bytes / 2 * 8) / 2 / payload_bps


def test_pricing_at_the_bounds_cpu_leaves_only_the_traffic() -> None:
    # the same bytes: only the 4 ms more CPU separates them, and the bound's CPU erases it
    same = _priced(0.020, 1e5)
    ring = _ring_s(1e5, DILATION)
    assert same["own CPU"] == pytest.approx((0.020 + ring) / (0.016 + ring))
    assert same["the bound's CPU"] == pytest.approx(1.0)
    # 4x the all-reduce bytes (the cached rows'): the traffic's cost, on the run's network and
    # undilated on the target with the target's compute for both
    more = _priced(0.020, 4e5)
    assert more["the bound's CPU"] == pytest.approx(
        (0.016 + _ring_s(4e5, DILATION)) / (0.016 + ring))
    assert more["target"] == pytest.approx((0.002 + _ring_s(4e5, 1.0)) / (0.002 + _ring_s(1e5, 1.0)))


def test_a_set_spanning_two_regimes_pairs_each_run_with_its_own_regimes(tmp_path: Path) -> None:
    """fig7_dilation's d/2 and 2d runs share their seeds: every paired table divides a run by
    its own regime's, also after the table went through a ``runs.csv``."""
    records = []
    for scale, bound_s, bagpipe_s, sync_s in (("0.5", 0.100, 0.110, 0.200),
                                              ("2.0", 0.050, 0.080, 0.060)):
        for system, seconds in (("embedding_free", bound_s), ("bagpipe", bagpipe_s),
                                ("sync_ps", sync_s)):
            record = _record(system, seconds)
            record.params["dilation.scale"] = scale
            records.append(record)
    frame = runs_frame(records)
    csv = tmp_path / "runs.csv"
    frame.to_csv(csv, index=False)
    for table in (frame, pd.read_csv(csv)):
        # Paired within its regime: 1.10x and 1.60x, geometric mean sqrt(1.76). Paired by the
        # seed alone, the bound's 2d run would stand against both of Bagpipe's (1.6x and 2.2x).
        ratio = _row(bound_lines(table))
        assert ratio.startswith(f"| dlrm | {math.sqrt(1.10 * 1.60):.2f}x [")
        assert ratio.endswith("| 2 | within noise of 1.15x |")
        lines = head_to_head_lines(table)
        row = lines[lines.index("| model | vs sync_ps |") + 2]
        assert row.startswith(f"| dlrm | {math.sqrt(0.200 / 0.110 * 0.060 / 0.080):.2f}x [")


def test_a_table_read_from_mlflow_carries_the_regime_its_blocks_pair_by(tmp_path: Path) -> None:
    import mlflow

    from bagpipe.harness.report.loading import table_from_mlflow
    from bagpipe.harness.track.sweeps import BLOCK, with_blocks

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("regimes")
    for scale in ("0.5", "2.0"):
        with mlflow.start_run(experiment_id=experiment):
            mlflow.set_tags({"suite": "fig7_dilation", "sweep_id": "s1", "system": "bagpipe",
                             "model": "dlrm", "dataset": "synthetic", "git_sha": "abc"})
            mlflow.log_params({"seed": "0", "dilation.scale": scale, "run.batch_size": "1024"})
            mlflow.log_metric("iter_time_mean_s", 0.1)
    frame = table_from_mlflow(uri, "regimes", "fig7_dilation").frame
    assert sorted(frame["dilation.scale"].astype(str)) == ["0.5", "2.0"]
    assert "seed" in frame and "run.batch_size" in frame
    assert with_blocks(frame)[BLOCK].nunique() == 2


def test_the_time_no_phase_covers_is_split_into_its_three_parts() -> None:
    """Between trainer 0's phases, a slower trainer, the driver and RPCs: Bagpipe's mean minus
    the bound's of each, adding up to the gap table's "other"; older runs get no such table."""
    records = [_record(system, seconds, time_forward_s=0.010, step_span_s=span,
                       slowest_step_span_s=slowest)
               for system, seconds, span, slowest in (("embedding_free", 0.020, 0.011, 0.0115),
                                                      ("bagpipe", 0.027, 0.012, 0.0140))]
    lines = bound_lines(runs_frame(records))
    header = ("| model | trainer 0 between its phases | a slower trainer | the driver and the "
              "RPCs |")
    assert lines[lines.index(header) + 2] == "| dlrm | +1.00 | +1.50 | +4.50 |"
    older = [_record(system, seconds, time_forward_s=0.01)
             for system, seconds in (("embedding_free", 0.02), ("bagpipe", 0.027))]
    assert header not in bound_lines(runs_frame(older))
