"""What every report shares: matplotlib without a display, where tables and figures go, and the
markdown page that puts a figure beside the paper's claim and says how it was made.

Every page ends with the same provenance (how to regenerate it, the machine, the commit, when), so
a figure copied out of ``reports/`` can always be traced back to the code and host that drew it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from bagpipe.harness.track.workspace import git_sha, machine

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bagpipe.harness.track.record import RunRecord


@dataclass(frozen=True)
class Outputs:
    """Where a report writes: its tables under ``results/<suite>/``, its page and figure as
    ``reports/<suite>.{md,png}``."""

    results_dir: Path
    reports_dir: Path

    def table(self, suite: str, name: str) -> Path:
        return self.results_dir / suite / name

    def figure(self, suite: str) -> Path:
        return self.reports_dir / f"{suite}.png"

    def page(self, suite: str) -> Path:
        return self.reports_dir / f"{suite}.md"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: reports are drawn on hosts without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (130 dpi) and close it; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    pyplot().close(fig)
    return path


def save_csv(frame: pd.DataFrame, path: Path) -> Path:
    """Write ``frame`` without its index (the tidy tables reports and readers share)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def provenance(suite: str, commit: str) -> list[str]:
    """The closing lines of every page: how to regenerate it, the machine, the commit, when."""
    return [
        f"Regenerate: `nox -s reproduce -- {suite}` (its sweeps, then this report); the report "
        f"alone: `python -m bagpipe.harness.report {suite}`.",
        f"Machine: {machine()}",
        f"Commit: {commit}",
        f"Written: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
    ]


def network_note(records: Sequence[RunRecord]) -> str:
    """Which emulated cluster the runs measured: topology (tag ``cluster``), the back-end that
    ran and the dilation, as each run recorded them."""

    def distinct(values: Sequence[str]) -> str:
        return ", ".join(dict.fromkeys(values)) or "not recorded"

    clusters = [r.tags["cluster"] for r in records if "cluster" in r.tags]
    backends = [r.params.get("network.backend_used") or r.params.get("network.backend", "")
                for r in records]
    factors = [r.params["dilation.factor"] for r in records if "dilation.factor" in r.params]
    return (f"Network: the {distinct(clusters)} topology on the "
            f"{distinct([b for b in backends if b])} back-end, dilated {distinct(factors)}x "
            "(README, *The emulated cluster*).")


def write_report(out: Outputs, suite: str, title: str, figure: Path, table: Sequence[str],
                 claim: str, notes: Sequence[str], records: Sequence[RunRecord] = ()) -> Path:
    """``reports/<suite>.md``: the figure, the table, the paper's claim, the setting (``notes``;
    with ``records``, the network they ran on) and the provenance, with the commit the records
    name (the working directory's without them)."""
    commits = ", ".join(sorted({r.tags["git_sha"] for r in records if "git_sha" in r.tags}))
    notes = [*notes, network_note(records)] if records else list(notes)
    text = [f"# {suite}: {title}", "", f"![{suite}]({figure.name})", "", *table, "",
            "## The paper's claim", "", f"* {claim}.", "", "## Setting and provenance", "",
            *[f"* {line}" for line in [*notes, *provenance(suite, commits or git_sha(Path.cwd()))]],
            ""]
    path = out.page(suite)
    path.write_text("\n".join(text))
    print(f"wrote {figure}, {path}, {out.results_dir / suite}/")
    return path
