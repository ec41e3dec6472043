"""Sessions: ``tests`` (default), ``lint``, ``bench``, ``mutants``, ``reproduce``, ``reproduce_fig7``,
``smoke``, ``mlflow_ui``.

All sessions share one environment, ``.nox/harness``, built once by :func:`ensure_env` and rebuilt
only when the install recipe or ``pyproject.toml`` changes. The torch stack is several GB; building it
once per session would triple the cost of a CI run for no isolation gain (every session needs the same
packages).

The torch/torchrec/fbgemm recipe lives here so that no user ever does it by hand:

* ``torch==2.14.1``;
* ``fbgemm-gpu`` when an NVIDIA driver is present, ``fbgemm-gpu-cpu`` otherwise (``fbgemm-gpu`` fails
  to load without ``libnvidia-ml.so.1``), never both;
* ``torchrec==1.9.2`` with ``--no-deps`` (its requirements would pull ``fbgemm-gpu`` back in), then
  the dependencies it really needs.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.options.download_python = "never"
nox.options.sessions = ["tests"]

ROOT = Path(__file__).parent.resolve()
ENV_DIR = ROOT / ".nox" / "harness"
STAMP = ENV_DIR / ".installed"

TORCH = "torch==2.14.1"
TORCHREC = "torchrec==1.9.2"
FBGEMM_GPU = "fbgemm-gpu==1.9.0"
FBGEMM_CPU = "fbgemm-gpu-cpu==1.9.0"
TORCHREC_DEPS = ["tensordict", "torchmetrics==1.0.3", "pyre-extensions", "tqdm", "iopath"]


def has_nvidia_gpu() -> bool:
    """True when an NVIDIA driver answers (the condition under which ``fbgemm-gpu`` loads)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True, check=False).returncode == 0


def _recipe_key(gpu: bool) -> str:
    digest = hashlib.sha256()
    digest.update((ROOT / "pyproject.toml").read_bytes())
    digest.update("|".join([TORCH, TORCHREC, FBGEMM_GPU, FBGEMM_CPU, *TORCHREC_DEPS]).encode())
    digest.update(b"gpu" if gpu else b"cpu")
    digest.update(f"{sys.version_info[:2]}".encode())
    return digest.hexdigest()


def env_bin(name: str) -> str:
    return str(ENV_DIR / "bin" / name)


def ensure_env(session: nox.Session) -> None:
    """Create or refresh the shared environment; a no-op when its stamp matches the recipe."""
    gpu = has_nvidia_gpu()
    key = _recipe_key(gpu)
    if STAMP.exists() and STAMP.read_text() == key:
        session.log(f"reusing {ENV_DIR} ({'gpu' if gpu else 'cpu'} torch stack)")
        return
    if not (ENV_DIR / "bin" / "python").exists():
        session.run(sys.executable, "-m", "venv", str(ENV_DIR), external=True)
    pip = [env_bin("python"), "-m", "pip", "install", "--quiet"]
    session.run(*pip, "--upgrade", "pip", "wheel", external=True)
    session.run(*pip, TORCH, external=True)
    wanted, unwanted = (FBGEMM_GPU, FBGEMM_CPU) if gpu else (FBGEMM_CPU, FBGEMM_GPU)
    session.run(
        env_bin("python"), "-m", "pip", "uninstall", "--yes", "--quiet", unwanted.split("==")[0],
        external=True, success_codes=[0, 1],
    )
    session.run(*pip, wanted, external=True)
    session.run(*pip, "--no-deps", TORCHREC, external=True)
    session.run(*pip, *TORCHREC_DEPS, external=True)
    session.run(*pip, "-e", f"{ROOT}[test,lint,mutants]", external=True)
    STAMP.write_text(key)


def run_in_env(session: nox.Session, *args: str, **kwargs: object) -> None:
    env = {"MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    env.update(kwargs.pop("env", {}) or {})  # type: ignore[arg-type]
    session.run(*args, external=True, env=env, **kwargs)  # type: ignore[arg-type]


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Run the test suite (pytest); arguments after ``--`` go to pytest."""
    ensure_env(session)
    run_in_env(session, env_bin("pytest"), *(session.posargs or ["-q"]))


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff (style, imports, common bugs) and mypy on the packages."""
    ensure_env(session)
    run_in_env(session, env_bin("ruff"), "check", "bagpipe", "baselines", "hydra_plugins", "tests", "noxfile.py")
    run_in_env(session, env_bin("mypy"))


@nox.session(venv_backend="none", default=False)
def bench(session: nox.Session) -> None:
    """Throughput benchmarks (data generator and readers, oracle planning); prints a table."""
    ensure_env(session)
    run_in_env(session, env_bin("python"), "-m", "bagpipe.bench", *session.posargs)


@nox.session(venv_backend="none", default=False)
def gpu_check(session: nox.Session) -> None:
    """The GPU check (``bagpipe.bench.gpu``): the device tests and fig7's DLRM comparison with
    the trainers on the GPU, into ``results/gpu/``; ``-- --device cpu --quick`` on a host. On a
    bare machine without nox: ``python -m bagpipe.bench --only gpu``."""
    ensure_env(session)
    run_in_env(session, env_bin("python"), "-m", "bagpipe.bench", "--only", "gpu",
               *session.posargs)


@nox.session(venv_backend="none", default=False)
def mutants(session: nox.Session) -> None:
    """Mutation testing of the core (about an hour on 2 cores, niced): writes
    ``results/bench/mutants.csv`` and ``reports/mutants.md``; ``-- --quick`` mutates one module."""
    ensure_env(session)
    run_in_env(session, "nice", "-n", "19", env_bin("python"), "-m", "bagpipe.bench", "--only",
               "mutants", *session.posargs)


#: Every suite with a report (``python -m bagpipe.harness.report <suite>``): the Hydra sweeps it
#: needs first (none: pure data).
REPORT_SUITES = {
    "fig7": ("fig7", "fig7_dilation"),
    "fig7_paper": ("fig7_paper",),
    "datasets": ("datasets",),
    "skew": (),
    "breakdown": ("breakdown",),
    "bound_split": ("bound_split",),
    "convergence": ("convergence", "convergence_het"),
    "costmodel": ("costmodel",),
    "lookahead": ("lookahead",),
    "capacity": ("capacity",),
    "cleanup": ("cleanup",),
    "skew_sensitivity": ("skew_sensitivity",),
    "scaling": ("scaling",),
    "ablation": ("ablation",),
}


def reproduce_suite(session: nox.Session, suite: str, overrides: list[str]) -> None:
    """Run the suite's sweeps locally (``overrides`` go to Hydra), then write its report."""
    ensure_env(session)
    for sweep in REPORT_SUITES[suite]:
        run_in_env(session, env_bin("python"), "-m", "bagpipe.harness.run", f"suite={sweep}",
                   *overrides)
    run_in_env(session, env_bin("python"), "-m", "bagpipe.harness.report", suite)


@nox.session(venv_backend="none", default=False, tags=["repro"])
def reproduce_fig7(session: nox.Session) -> None:
    """Run suite=fig7 locally, then write results/fig7/ and reports/fig7.{png,md}.

    Arguments after ``--`` go to Hydra (e.g. ``-- scale=paper``, ``-- launcher=slurm``). The sweep
    itself is defined in ``suites/suite/fig7.yaml`` so that the Hydra CLI alone reproduces it.
    """
    reproduce_suite(session, "fig7", list(session.posargs))


@nox.session(venv_backend="none", default=False, tags=["repro"])
def reproduce(session: nox.Session) -> None:
    """``nox -s reproduce -- <suite> [hydra overrides]``: run a suite's sweeps, then its report.

    Suites: those of ``python -m bagpipe.harness.report`` (fig7 as ``reproduce_fig7``); each writes
    ``results/<suite>/`` and ``reports/<suite>.{png,md}``.
    """
    if not session.posargs:
        session.error(f"name a suite: {', '.join(REPORT_SUITES)}")
    suite, *overrides = session.posargs
    if suite not in REPORT_SUITES:
        session.error(f"unknown suite {suite!r}; known: {', '.join(REPORT_SUITES)}")
    reproduce_suite(session, suite, overrides)


@nox.session(venv_backend="none", default=False)
def smoke(session: nox.Session) -> None:
    """The smoke suite (about two minutes) and the MLPerf compliance check of its logs."""
    ensure_env(session)
    run_in_env(session, env_bin("python"), "-m", "bagpipe.harness.run", "suite=smoke",
               *session.posargs)
    sweeps = sorted((ROOT / "multirun" / "smoke").glob("*/results"))
    run_in_env(session, env_bin("python"), "-m", "bagpipe.harness.track.mlperf", str(sweeps[-1]))


@nox.session(venv_backend="none", default=False)
def mlflow_ui(session: nox.Session) -> None:
    """Serve the MLflow UI on the embedded store (./mlflow.db) and print the URL of the
    experiment's runs page (``bagpipe.harness.track.ui``).

    ``-- --port N`` picks the port (default: a free one); the UI stops with Ctrl-C.
    """
    ensure_env(session)
    run_in_env(session, env_bin("python"), "-m", "bagpipe.harness.track.ui", "--store",
               f"sqlite:///{ROOT}/mlflow.db", *session.posargs)
