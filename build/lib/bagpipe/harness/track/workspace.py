"""Facts about where a run happens: the commit, the machine, the scheduler job."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def git_sha(directory: Path) -> str:
    """The checked-out commit, or ``unknown``; ``-dirty`` when tracked files differ, except the
    harness's own outputs under ``results/`` and ``reports/`` (a report is written after its CSV,
    which would otherwise mark every report dirty)."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
            check=True, timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", ":(top,exclude)results",
             ":(top,exclude)reports"], cwd=directory, capture_output=True,
            check=False, timeout=10,
        ).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def slurm_job_id() -> str:
    """The SLURM job (array task) id, or ``none`` outside SLURM."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID", "none")


def machine() -> str:
    """One line: CPU model, core count, memory, OS: what a report names as the platform."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.system()} {platform.release()}"
