"""Provenance: the commit a result names is dirty only when code or config differs from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bagpipe.harness.track.workspace import git_sha


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_outputs_under_results_and_reports_do_not_make_the_commit_dirty(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    for path in ("code.py", "results/run.csv", "reports/run.md"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("v1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    sha = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "results/run.csv").write_text("v2\n")
    (tmp_path / "reports/run.md").write_text("v2\n")
    assert git_sha(tmp_path) == sha
    assert git_sha(tmp_path / "results") == sha
    (tmp_path / "code.py").write_text("v2\n")
    assert git_sha(tmp_path) == f"{sha}-dirty"
