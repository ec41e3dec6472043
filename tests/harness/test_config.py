"""The suites/ tree composes, validates values against the schemas, and builds systems."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from bagpipe.core.interface import OptimConfig
from bagpipe.core.net import Nic, Topology
from bagpipe.core.registry import registered_systems
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR, optional_tags, run_params
from bagpipe.models import paper_config


@pytest.fixture(autouse=True)
def hydra_suites():
    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        yield


def test_default_config_builds_the_local_system():
    cfg = compose("config")
    system = instantiate(cfg.system, _convert_="all")
    assert type(system).__name__ == "LocalSystem"
    assert cfg.model.bottom_mlp[-1] == cfg.model.embedding_dim
    assert OmegaConf.to_container(cfg.network, enum_to_str=True) == {
        "backend": "auto", "dilation": 1.0, "dilation_scale": 1.0
    }
    assert cfg.topology.name == "paper-8xV100"
    assert cfg.topology.server_nic.egress_gbps == 25.0


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("run.stepz=3", "stepz"),                      # misspelt key
        ("run.steps=many", "run.steps"),               # wrong type
        ("model.name=dlrn", "dlrm, wdl, deepfm, dcn"),  # not a valid choice: the choices are listed
        ("dataset.kind=parquet", "synthetic, criteo_tsv"),
        ("model=dlrn", "Available options"),           # unknown group option
        ("system.cache_rows=5", "cache_rows"),         # a knob the local system does not take
        ("network.backend=ns3", "auto, netns, model, real"),   # the network back-ends
        ("topology.trainer_nic.egress=5", "egress"),   # the schemas derived from Topology...
        ("topology.server_nic.latency_us=low", "topology.server_nic.latency_us"),
        ("optim.dense_lr=fast", "optim.dense_lr"),     # ... and OptimConfig
    ],
)
def test_bad_values_fail_at_composition_naming_the_key(override: str, expected: str):
    with pytest.raises(ConfigCompositionException) as info:
        cfg = compose("config", overrides=[override])
        OmegaConf.to_container(cfg, resolve=True)
    message = str(info.value) + str(info.value.__cause__)
    assert expected in message


def test_topology_and_optim_schemas_follow_their_dataclasses():
    """Every field of Topology (its NICs too) and OptimConfig is a config key, and a composed
    topology is the one its file describes, overrides included."""
    cfg = compose("config", overrides=["topology.server_nic.latency_us=7"])
    for group, cls in (("topology", Topology), ("optim", OptimConfig), ("topology.trainer_nic", Nic)):
        assert set(OmegaConf.select(cfg, group)) == {f.name for f in dataclasses.fields(cls)}
    topology = Topology.from_dict(OmegaConf.to_container(cfg.topology, resolve=True))
    paper = Topology.load(SUITES_DIR / "topology" / "paper.yaml")
    assert topology == dataclasses.replace(paper, server_nic=Nic(25.0, 25.0, 7.0))


@pytest.mark.parametrize("model", ["dlrm", "wdl", "deepfm", "dcn"])
def test_scale_paper_uses_the_papers_architecture(model: str):
    cfg = compose("config", overrides=[f"model={model}", "scale=paper"])
    paper = paper_config(model)
    assert cfg.run.batch_size == 16384
    assert cfg.trainers == 8
    assert cfg.model.embedding_dim == 48
    assert tuple(cfg.model.bottom_mlp) == paper.bottom_mlp
    assert tuple(cfg.model.top_mlp) == paper.top_mlp


def test_every_system_option_names_its_registered_class():
    """Each suites/system/<name>.yaml whose system is installed composes and builds that class."""
    from bagpipe.core.registry import load_system

    options = sorted(p.stem for p in (SUITES_DIR / "system").glob("*.yaml"))
    installed = [name for name in options if name in registered_systems()]
    assert "local" in installed
    for name in installed:
        cfg = compose("config", overrides=[f"system={name}"])
        assert cfg.system._target_ == f"{load_system(name).__module__}.{load_system(name).__name__}"


def test_a_bad_value_late_in_a_sweep_fails_before_any_job_runs(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "bagpipe.harness.run", "-m", "launcher=inprocess",
         "run.steps=2,three", "tracking.enabled=false", f"hydra.sweep.dir={tmp_path}/sweep"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )
    assert done.returncode != 0
    output = done.stderr + done.stdout
    assert "sweep job #1 (launcher=inprocess run.steps=three" in output
    assert "full_key: run.steps" in output
    assert not list(tmp_path.rglob("run.json"))


def test_smoke_suite_jobs_are_valid_and_fig7_covers_every_system_and_model():
    from bagpipe.harness.run.sweep import sweep_jobs, validate_sweep

    smoke = compose("config", overrides=["suite=smoke"], return_hydra_config=True)
    assert len(validate_sweep(smoke)) == 4
    fig7 = compose("config", overrides=["suite=fig7"], return_hydra_config=True)
    jobs = sweep_jobs(fig7)
    assert len(jobs) == 7 * 4 * 6  # six systems and the embedding-free bound, four models, six blocks
    for value in {o for job in jobs for o in job if o.startswith(("system=", "model="))}:
        cfg = compose("config", overrides=["suite=fig7", value])
        OmegaConf.to_container(cfg, resolve=True)


def test_ablation_suite_runs_the_full_design_and_each_single_ablation():
    from bagpipe.harness.run.sweep import validate_sweep

    ablation = compose("config", overrides=["suite=ablation"], return_hydra_config=True)
    jobs = validate_sweep(ablation)
    designs = set()
    for job in jobs:
        cfg = compose("config", overrides=["suite=ablation", *job])
        assert cfg.system._target_ == "bagpipe.lrpp.system.Bagpipe"
        assert cfg.system.lookahead == 20  # the variants extend bagpipe.yaml
        designs.add((cfg.system.sync_later, cfg.system.prefetch, cfg.system.partition))
    assert len(jobs) == 4 * 3  # three seeds each
    assert designs == {
        (True, True, True), (False, True, True), (True, False, True), (True, True, False)
    }
    with pytest.raises(ConfigCompositionException, match=r"system\.prefetch"):
        compose("config", overrides=["system=bagpipe", "system.prefetch=sometimes"])


def test_params_name_the_system_and_leave_hydra_keys_out() -> None:
    cfg = OmegaConf.create({"system": {"_target_": "baselines.sync_ps.system.SyncPS",
                                       "num_servers": 2}, "seed": 0})
    params = run_params(cfg, {"system": "sync_ps"})
    assert params == {"system": "sync_ps", "system.num_servers": "2", "seed": "0"}


def test_cluster_and_dilation_tags_only_where_the_config_has_them() -> None:
    assert optional_tags(OmegaConf.create({"seed": 0})) == {}
    described = OmegaConf.create({"topology": {"name": "paper"}, "network": {"dilation": 4.0}})
    assert optional_tags(described) == {"cluster": "paper", "dilation": "4.0"}
