"""The mutation benchmark's results: each mutant's verdict, read from its target's work folder,
and ``reports/mutants.md``, the table and every surviving mutant with its diff.

Survivors known to be equivalent are listed with their reason (``mutants_targets.EQUIVALENT``);
the others are the gaps left in the tests, each shown as the change mutmut made.
"""

from __future__ import annotations

import json
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pandas as pd

from bagpipe.bench.mutants_targets import ACCEPTED, EQUIVALENT, TARGETS, Target

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / ".mutants"
#: mutmut's exit codes (``mutmut.stats.status_by_exit_code``) by the column they count in; a
#: crash (segfault, SIGKILL) fails the tests and counts as killed
STATUS = {
    1: "killed", 3: "killed", -11: "killed", -9: "killed",
    0: "survived",
    36: "timeouts", 24: "timeouts", -24: "timeouts", 152: "timeouts", 255: "timeouts",
    5: "no_tests", 33: "no_tests",
}

COLUMNS = ["module", "mutants", "killed", "survived", "timeouts", "no_tests", "not_run",
           "equivalent", "caught_pct"]
GOAL_PCT = 85.0


def report(frame: pd.DataFrame, reports_dir: Path) -> list[Path]:
    """Write ``reports/mutants.md`` from the benchmark's rows and the work folders' results.

    A ``mutants_before.csv`` beside the table (the rows of an earlier run, kept by hand) adds a
    table of the percentages then and now."""
    by_module = {target.module: target for target in TARGETS}
    path = reports_dir / "mutants.md"
    kept = _sections(path.read_text()) if path.exists() else {}
    sections = [_survivors(by_module[module]) if work_dir(by_module[module]).is_dir()
                else kept.get(module, f"## {module}\n\nNo work folder here, no earlier section.\n")
                for module in frame.module]
    before = ROOT / "results" / "bench" / "mutants_before.csv"
    then = _then_and_now(pd.read_csv(before), frame) if before.exists() else ""
    reports_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([_header(frame), then, *sections]))
    return [path]


def _sections(page: str) -> dict[str, str]:
    """The survivors' sections of an earlier report by module: a module whose work folder is not
    here (measured on another checkout, or by an earlier run) keeps its section as written then,
    beside its row of the table, which is kept the same way (``mutants.main``)."""
    sections = {}
    for part in page.split("\n## ")[1:]:
        heading = part.split("\n", 1)[0]
        if " (`" in heading:  # "<module> (`<source>`)"; other headings are not modules
            sections[heading.split(" (`")[0]] = "## " + part.rstrip("\n") + "\n"
    return sections


def _markdown(frame: pd.DataFrame) -> str:
    return "\n".join(
        ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
        + ["| " + " | ".join(str(value) for value in row) + " |"
           for row in frame.itertuples(index=False)]
    )


def _then_and_now(before: pd.DataFrame, after: pd.DataFrame) -> str:
    noted = ["measured"] if "measured" in after.columns else []
    both = before[["module", "mutants", "caught_pct"]].merge(
        after[["module", "mutants", "caught_pct", *noted]], on="module", how="outer",
        suffixes=("_before", "_after"))
    return f"""## Before and after

`caught_pct` of the run kept in `results/bench/mutants_before.csv` (each module against its
test selection before the tests were added) and of the table above; `measured` (when the table
has it) says whether a module was measured again after its tests were added.

{_markdown(both)}
"""


def _header(frame: pd.DataFrame) -> str:
    below = frame[frame.caught_pct < GOAL_PCT].module.tolist()
    verdict = (f"Below the goal of {GOAL_PCT:.0f}%: {', '.join(below)}." if below
               else f"Every module is at or above the goal of {GOAL_PCT:.0f}%.")
    table = _markdown(frame[COLUMNS])
    return f"""# Mutation testing

`nox -s mutants` (`python -m bagpipe.bench --only mutants`, mutmut) plants one small bug at a
time into each module below and runs the tests that cover it. `caught_pct` is (killed +
timeouts) / (mutants - equivalent - not_run); `no_tests` counts mutants that no selected test
reaches, `not_run` those a stopped run never reached (a row with any measures only part of its
module). {verdict}

{table}
"""


def work_dir(target: Target) -> Path:
    return WORK / target.module.replace(" ", "_")


def mutant_globs(target: Target) -> list[str]:
    """mutmut's name patterns for the target's functions (none: every mutant of the file)."""
    module = target.source.removesuffix(".py").replace("/", ".")
    return [f"{module}.{function}__mutmut_*" for function in target.functions]


def mutant_results(target: Target) -> dict[str, str]:
    """Each of the target's mutants (mutmut's name) with its column in ``STATUS`` (``not_run`` if
    mutmut never ran it), read from the work folder."""
    meta = work_dir(target) / "mutants" / f"{target.source}.meta"
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    globs = mutant_globs(target)
    return {
        name: STATUS.get(code, "not_run")
        for name, code in sorted(codes.items())
        if not globs or any(fnmatch(name, glob) for glob in globs)
    }


def _survivors(target: Target) -> str:
    """The target's surviving mutants: equivalent ones with their reason, the others' diffs."""
    survived = [name for name, status in mutant_results(target).items() if status == "survived"]
    lines = [f"## {target.module} (`{target.source}`)", ""]
    if not survived:
        return "\n".join([*lines, "No survivors.", ""])
    for name in survived:
        if name in EQUIVALENT:
            verdict = f"equivalent. {EQUIVALENT[name]}"
        elif name in ACCEPTED:
            verdict = f"not caught, accepted (counted as surviving). {ACCEPTED[name]}"
        else:
            verdict = "not caught."
        lines.append(f"* `{name}`: {verdict}")
        diff = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name], cwd=work_dir(target),
            capture_output=True, text=True, check=False,
        ).stdout
        body = "\n".join(line for line in diff.splitlines() if line[:1] in "+-@ " and line)
        lines += ["", "  ```diff", *(f"  {line}" for line in body.splitlines()), "  ```", ""]
    return "\n".join(lines)
