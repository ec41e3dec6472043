"""Makes this Python a bare GPU machine's: Hydra, OmegaConf, MLflow, submitit, torchrec,
fbgemm-gpu and tensordict cannot be imported, in this process and in every process it starts
(the directory is on their ``PYTHONPATH`` too). ``tests/harness/test_gpu_check.py`` runs the
GPU check under it."""

from __future__ import annotations

import importlib.abc
import sys

ABSENT = frozenset(
    {"hydra", "omegaconf", "mlflow", "submitit", "torchrec", "fbgemm_gpu", "tensordict"}
)


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (a bare GPU machine)", name=name)
        return None


sys.meta_path.insert(0, _Absent())
