"""Each ``launcher`` option configures the Hydra launcher we expect; the SLURM one renders an sbatch
script compared with a golden file.

The parameters go through the same mapping the hydra-submitit-launcher plugin applies before it
calls ``submitit`` (``hydra_plugins/hydra_submitit_launcher/submitit_launcher.py``, ``launch``),
then submitit writes the sbatch script, as submitit's own ``test_make_sbatch_string`` does.
Regenerate a golden file with ``BAGPIPE_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import submitit
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR

GOLDEN = Path(__file__).parent / "golden"


def launcher_config(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        return cfg.hydra


def render_sbatch(params: dict, folder: Path, jobs: int) -> str:
    """The sbatch script the plugin would submit for a sweep of ``jobs`` jobs."""
    init_keys = {"submitit_folder", "max_num_timeout"}
    executor = submitit.AutoExecutor(cluster="slurm", folder=folder,
                                     slurm_max_num_timeout=params["max_num_timeout"])
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(
        **{k if k in base else f"slurm_{k}": v for k, v in params.items() if k not in init_keys}
    )
    slurm = executor._executor
    slurm.parameters["map_count"] = jobs
    text = slurm._make_submission_file_text("python -u -m submitit.core._submit <folder>", "uid")
    return text.replace(str(folder), "<folder>").replace(sys.executable, "<python>")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("BAGPIPE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; regenerate with BAGPIPE_UPDATE_GOLDEN=1"


def test_slurm_launcher_renders_the_golden_sbatch_script(tmp_path: Path):
    hydra_cfg = launcher_config(["launcher=slurm"])
    assert hydra_cfg.launcher._target_.endswith("SlurmLauncher")
    assert hydra_cfg.sweeper.max_batch_size is None
    params = OmegaConf.to_container(hydra_cfg.launcher, resolve=True)
    params.pop("_target_")
    check_golden("sbatch_slurm.txt", render_sbatch(params, tmp_path, jobs=4))


def test_slurm_knobs_reach_the_sbatch_script(tmp_path: Path):
    hydra_cfg = launcher_config(
        ["launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=8",
         "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=8",
         "hydra.launcher.timeout_min=90"]
    )
    params = OmegaConf.to_container(hydra_cfg.launcher, resolve=True)
    params.pop("_target_")
    text = render_sbatch(params, tmp_path, jobs=2)
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=8", "#SBATCH --nodes=2",
                 "#SBATCH --ntasks-per-node=8", "#SBATCH --time=90", "#SBATCH --array=0-1%2",
                 "export OMP_NUM_THREADS=1"):
        assert line in text


@pytest.mark.parametrize(("launcher", "launcher_class", "batch"),
                         [("local", "LocalLauncher", 1), ("inprocess", "BasicLauncher", None)])
def test_local_launchers_bound_concurrency(launcher: str, launcher_class: str, batch: int | None):
    hydra_cfg = launcher_config([f"launcher={launcher}"])
    assert hydra_cfg.launcher._target_.endswith(launcher_class)
    assert hydra_cfg.sweeper.max_batch_size == batch
