"""The GPU check runs on a bare machine: here, with ``--device cpu --quick``, under an import
guard that makes Hydra, OmegaConf, MLflow, submitit, torchrec and fbgemm-gpu unimportable in
every process it starts (``bare_machine/sitecustomize.py``), from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
GUARD = Path(__file__).resolve().parent / "bare_machine"


def _bare_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(GUARD), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # a bare machine has no pytest plugins
    return env


def test_the_guard_really_hides_the_heavy_packages() -> None:
    for module in ("hydra", "omegaconf", "mlflow", "submitit", "torchrec", "fbgemm_gpu"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], env=_bare_env(),
                              capture_output=True, text=True, check=False)
        assert done.returncode != 0 and "a bare GPU machine" in done.stderr, module


@pytest.mark.slow
def test_the_gpu_check_runs_every_system_without_hydra_mlflow_or_torchrec(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bagpipe.bench", "--only", "gpu", "--quick", "--device", "cpu",
         "--out", str(tmp_path)],
        cwd=ROOT, env=_bare_env(), capture_output=True, text=True, check=False, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "gpu.csv")
    assert set(rows["torch"]) == {__import__("torch").__version__}
    assert not rows["torchrec"].any()
    tests = rows[rows["part"] == "device_tests"].set_index("metric")["value"]
    assert tests["tests_failed"] == 0 and tests["tests_error"] == 0
    assert tests["tests_passed"] >= 9  # the cpu cases of every system
    timed = rows[(rows["part"] == "dlrm") & (rows["metric"] == "iter_time_p50_s")]
    assert set(timed["system"]) == {"local", "sync_ps", "bagpipe", "het", "fae"}
    assert (timed["value"] > 0).all() and set(timed["device"]) == {"cpu"}
    skipped = rows[(rows["system"] == "torchrec") & (rows["metric"] == "skipped")]
    assert len(skipped) == 1 and "does not import" in skipped["unit"].iloc[0]
