"""What a person sees in the terminal: a good run of every system prints its results and nothing
else (no warning from TensorPipe, gloo, torch or Python, also none written by a role process to its
file descriptors, and no role had to be ended); a bad run prints one line and exits non-zero.

Output is captured at the file-descriptor level: every run is a subprocess of its own, whose role
processes inherit its stdout and stderr.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TINY = ["run.steps=4", "run.eval_every=2", "run.warmup_steps=1", "run.batch_size=64",
        "run.eval_batches=1", "run.progress=false", "tracking.enabled=false"]
SYSTEMS = ["local", "sync_ps", "bagpipe", "fae", "het", "torchrec"]


def run(*overrides: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bagpipe.harness.run", *overrides, f"hydra.run.dir={cwd}/run"],
        cwd=cwd, capture_output=True, text=True, timeout=300, check=False,
    )


@pytest.mark.parametrize("system", SYSTEMS)
def test_a_good_run_prints_its_results_and_nothing_else(system: str, tmp_path: Path) -> None:
    done = run(f"system={system}", *TINY, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for noise in ("warning", "pipe closed", "traceback", "terminated"):
        assert noise not in output.lower(), output  # "terminated": a role had to be ended
    assert done.stderr == "", done.stderr
    assert done.stdout.startswith(f"[harness] {system}-dlrm-s0: auc "), output


def tiny_criteo_file(path: Path, rows: int) -> Path:
    """A Criteo-format TSV of ``rows`` examples (label, 13 counts, 26 hex categories)."""
    lines = ["\t".join([str(i % 2), *map(str, range(13)), *(f"{i * 31 + j:08x}" for j in range(26))])
             for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["system=bagpipe", "system.lookahead=-3"], "lookahead=-3"),
        (["system=bagpipe", "system.cleanup_fraction=0.9"], "cleanup_fraction=0.9"),
        (["system=sync_ps", "run.eval_every=-1"], "run.eval_every"),
        (["system=sync_ps", "dataset=criteo_tsv", "dataset.path={data}"], "do not fill one batch"),
        (["hydra.mode=MULTIRUN", "system=bagpipe", "system.lookahead=20,-3", "launcher=inprocess"],
         "lookahead=-3"),
    ],
    ids=["lookahead", "cleanup_fraction", "eval_every", "dataset_too_small", "sweep"],
)
def test_a_bad_run_prints_one_line_and_exits_non_zero(
    overrides: list[str], says: str, tmp_path: Path
) -> None:
    data = tiny_criteo_file(tmp_path / "tiny.tsv", rows=5)
    done = run(*TINY, *[o.format(data=data) for o in overrides], cwd=tmp_path)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode != 0
    assert len(lines) == 1, lines
    assert says in lines[0]


def test_a_run_that_fails_names_its_record(tmp_path: Path) -> None:
    data = tiny_criteo_file(tmp_path / "tiny.tsv", rows=5)
    done = run("dataset=criteo_tsv", f"dataset.path={data}", *TINY, cwd=tmp_path)
    record = tmp_path / "run" / "record" / "run.json"
    assert f"(traceback in {record})" in done.stderr
    assert "Traceback" in record.read_text()


def test_a_refused_config_starts_nothing(tmp_path: Path) -> None:
    done = run("system=bagpipe", "system.lookahead=-3", *TINY, cwd=tmp_path)
    assert done.returncode != 0
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run's directory
