"""A run's checkpoint fingerprint, built by the Hydra entry point's own code from composed configs:
a checkpoint directory holding another run's checkpoints (another seed, batch size, model, system
or dataset) is refused; one holding this run's, told to run longer or log differently, is resumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from bagpipe.core.checkpoint import CheckpointError, CheckpointStore
from bagpipe.core.interface import ModelState
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR, RunPaths, _checkpoint_store

BASE = ["run.checkpoint_every=5", "seed=3", "run.batch_size=64"]


@pytest.fixture(autouse=True)
def hydra_suites() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        yield


def _store(tmp_path: Path, *overrides: str, resumable: bool = True) -> CheckpointStore | None:
    cfg: DictConfig = compose("config", overrides=[
        *BASE, f"run.checkpoint_dir={tmp_path / 'shared'}", *overrides
    ])
    paths = RunPaths(run_dir=tmp_path / "run", results_dir=tmp_path, launch_dir=tmp_path)
    return _checkpoint_store(cfg, paths, {"system": "local"}, resumable)


def _save_a_checkpoint(store: CheckpointStore) -> None:
    state = ModelState(tables={"t": torch.arange(6.0).view(3, 2)}, dense={"w": torch.ones(2)})
    store.save(5, state, torch.get_rng_state())


@pytest.mark.parametrize(
    "other_run",
    ["seed=4", "run.batch_size=128", "model=dcn", "system=sync_ps", "dataset=synthetic_avazu",
     "optim.embedding_lr=0.5", "run.warmup_steps=7"],
)
def test_another_runs_checkpoints_are_refused(tmp_path: Path, other_run: str) -> None:
    first = _store(tmp_path)
    assert first is not None
    _save_a_checkpoint(first)
    assert first.root == tmp_path / "shared"
    second = _store(tmp_path, other_run)
    assert second is not None and second.root == first.root
    with pytest.raises(CheckpointError, match="checkpoint of another run"):
        second.load_latest()


def test_the_same_run_told_to_run_longer_or_log_elsewhere_resumes(tmp_path: Path) -> None:
    first = _store(tmp_path)
    assert first is not None
    _save_a_checkpoint(first)
    again = _store(tmp_path, "run.steps=5000", "run.checkpoint_every=50", "run.progress=false",
                   "run.max_restarts=9", "run.eval_every=7", "tracking.enabled=false",
                   "mllog.org=elsewhere")
    assert again is not None
    loaded = again.load_latest()
    assert loaded is not None and loaded.step == 5
    assert torch.equal(loaded.state.tables["t"], torch.arange(6.0).view(3, 2))


def test_the_fingerprint_holds_the_resolved_config_but_not_the_run_length(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store is not None
    fingerprint = store.fingerprint
    assert fingerprint["seed"] == "3" and fingerprint["run.batch_size"] == "64"
    assert fingerprint["run.torch_threads"] == "1"
    assert fingerprint["model.name"] == "dlrm"
    # interpolations resolved: the bottom MLP ends in the embedding width, as a value
    assert fingerprint["model.bottom_mlp"] == f"[64, {fingerprint['model.embedding_dim']}]"
    assert not any(key.startswith(("tracking.", "mllog.")) for key in fingerprint)
    for left_out in ("run.steps", "run.progress", "run.checkpoint_every", "run.max_restarts",
                     "run.eval_every"):
        assert left_out not in fingerprint


def test_the_directory_defaults_to_the_run_directory_and_zero_means_no_store(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path, "run.checkpoint_dir=null")
    assert store is not None and store.root == tmp_path / "run" / "checkpoints"
    assert _store(tmp_path, "run.checkpoint_every=0") is None
    with pytest.raises(ValueError, match=r"run\.checkpoint_every: must be >= 0, got -1"):
        _store(tmp_path, "run.checkpoint_every=-1")
    with pytest.raises(ValueError, match="system 'local' cannot resume"):
        _store(tmp_path, resumable=False)
