"""``network.dilation``: a number or ``auto``; ``auto`` is measured once per sweep and model and
shared by every system of it, and it is the ratio of the two compute times it records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from bagpipe.core.net import Compute, Topology
from bagpipe.harness.run import dilation as dilation_module
from bagpipe.harness.run.build import JobConfigError, check_job, network_config
from bagpipe.harness.run.dilation import Dilation, calibrated, measure_compute_s, parse_dilation
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR
from tests.conftest import TINY_MODEL, TINY_SCHEMA

V100 = Compute(device="V100", peak_tflops=15.7, efficiency=0.35, overhead_ms=2.0)


@pytest.mark.parametrize(("value", "factor"), [(4, 4.0), ("2.5", 2.5), ("auto", None),
                                               (" AUTO ", None)])
def test_a_dilation_is_a_positive_number_or_auto(value: object, factor: float | None) -> None:
    assert parse_dilation(value) == factor


@pytest.mark.parametrize("value", [0, -2, "fast", None])
def test_any_other_dilation_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ValueError, match=r"network\.dilation"):
        parse_dilation(value)


def test_the_config_takes_auto_and_refuses_nonsense_before_a_job_runs() -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        auto = compose("config", overrides=["network.dilation=auto", "network.backend=model"])
        assert network_config(auto).dilation == 1.0  # the job replaces it once measured
        fixed = compose("config", overrides=["network.dilation=8", "network.backend=model"])
        assert network_config(fixed).emulated.trainer_nic.egress_gbps == pytest.approx(10 / 8)
        with pytest.raises(JobConfigError, match=r"network\.dilation"):
            check_job(compose("config", overrides=["network.dilation=fast"]))


def test_auto_is_measured_once_per_sweep_and_model_and_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[str] = []

    def fake_measure(model, schema, batch, trainers, threads, device):  # type: ignore[no-untyped-def]
        measured.append(model.name)
        return 0.040, 1_000_000

    monkeypatch.setattr(dilation_module, "measure_compute_s", fake_measure)
    topology = Topology(trainers=2, compute=V100)
    first = calibrated(TINY_MODEL, TINY_SCHEMA, topology, 512, 1, tmp_path)
    again = calibrated(TINY_MODEL, TINY_SCHEMA, topology, 512, 1, tmp_path)
    target_s = 6 * 1_000_000 * 256 / (15.7e12 * 0.35) + 2e-3
    assert first == again == Dilation(0.040 / target_s, 0.040, target_s)
    assert measured == [TINY_MODEL.name]  # the second job read what the first measured
    (cached,) = tmp_path.glob("*.json")
    assert json.loads(cached.read_text())["factor"] == pytest.approx(0.040 / target_s)
    assert first.as_params()["dilation.compute_target_ms"] == f"{1000 * target_s:.4g}"


def test_auto_needs_a_topology_with_a_compute_estimate(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dilation_module, "measure_compute_s", lambda *args: (0.04, 1000))
    with pytest.raises(ValueError, match="no compute estimate"):
        calibrated(TINY_MODEL, TINY_SCHEMA, Topology(trainers=2), 512, 1, tmp_path)


@pytest.mark.timeout(120)
def test_the_measurement_times_a_real_slice_in_every_trainer_process() -> None:
    seconds, dense_params = measure_compute_s(TINY_MODEL, TINY_SCHEMA, 64, 2, 1)
    assert 0 < seconds < 5.0
    from bagpipe.models import build_dense_model

    model = build_dense_model(TINY_MODEL, TINY_SCHEMA, 0)
    assert dense_params == sum(p.numel() for p in model.parameters())


def test_a_scaled_dilation_moves_the_factor_and_says_by_how_much() -> None:
    """``network.dilation_scale`` (fig7's d/2 and 2d check) multiplies the factor; the compute
    times it came from stay, so the projection still reads them."""
    half = Dilation(4.0, 0.040, 0.010).scaled(0.5)
    assert half == Dilation(2.0, 0.040, 0.010, scale=0.5)
    assert half.as_params()["dilation.scale"] == "0.5"
    assert half.as_params()["dilation.factor"] == "2"
    with pytest.raises(ValueError, match=r"network\.dilation_scale"):
        half.scaled(0.0)
