"""Mutation testing of the modules where a silent bug would corrupt a result (``nox -s mutants``).

A test suite that passes says little about the bugs it would catch. This benchmark plants small
bugs (mutmut 3: an operator flipped, a constant changed, a call dropped) into each module of
``mutants_targets.TARGETS``, one at a time, and runs the tests that cover that module against each
one. A mutant is *killed* when a test fails, *survives* when every test still passes, and *times
out* when the tests run past mutmut's CPU-time limit (a hang is a detection too).

Each target runs in its own work folder (``.mutants/<module>/``, git-ignored): links to the
packages, the tests and the suites, and a ``pyproject.toml`` whose ``[tool.mutmut]`` names the one
file to mutate and the test files that cover it, so each module's mutants meet only its own tests
and the whole run fits in about an hour on two cores. mutmut then narrows each mutant's tests to
those that called the mutated function. Folders are made afresh on every run: a result never
comes from tests older than the checkout.

Rows (``results/bench/mutants.csv``), one per target: ``mutants``, ``killed``, ``survived``,
``timeouts``, ``no_tests`` (mutants no selected test reached), ``equivalent`` (survivors that
cannot change behaviour, listed with their reason in ``mutants_targets.EQUIVALENT``) and
``caught_pct`` = (killed + timeouts) / (mutants - equivalent - not_run), ``not_run`` counting the
mutants of a run stopped before it reached them (its row then measures only those it ran).
``mutants_report`` writes
``reports/mutants.md`` from them with every survivor's diff.

Not part of CI or of the default ``nox -s bench``: it takes about an hour. To measure some targets
only (after adding tests that cover them, say), ``python -m bagpipe.bench.mutants "het cache"
meter`` runs those and replaces their rows in the table, keeping the others.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pandas as pd

from bagpipe.bench.mutants_report import (
    COLUMNS,
    ROOT,
    mutant_globs,
    mutant_results,
    report,
    work_dir,
)
from bagpipe.bench.mutants_targets import EQUIVALENT, TARGETS, Target

__all__ = ["report", "run"]

LINKED = ("bagpipe", "baselines", "hydra_plugins", "tests", "suites")
#: mutmut stops a mutant's tests after ``2 * TIMEOUT_MULTIPLIER * (their clean CPU time + 1 s)``
#: (a CPU-time limit, so load elsewhere does not trip it). mutmut's 15 gave the hangs of the
#: readers' loops 30 times the tests' time each, most of a run; 5 still leaves a slowed mutant 10x.
TIMEOUT_MULTIPLIER = 5.0


def run(
    quick: bool, modules: tuple[str, ...] = (), again: bool = False, tests: tuple[str, ...] = ()
) -> list[dict]:
    """Mutate every target (``quick``: the first only; ``modules``: those named) and count what
    its tests caught. ``again``: keep each target's mutants and verdicts, and rerun only those
    that survived or that no test reached (after tests were added: a killed mutant stays killed,
    its tests being still there). ``tests``: this selection instead of the targets' own."""
    chosen = [t for t in TARGETS if t.module in modules] if modules else list(TARGETS)
    if tests:
        chosen = [replace(target, tests=tests) for target in chosen]
    return [_mutate(target, again) for target in (chosen[:1] if quick else chosen)]


def main(argv: list[str] | None = None) -> None:
    """Run the named targets and replace their rows in ``results/bench/mutants.csv``."""
    parser = argparse.ArgumentParser(prog="python -m bagpipe.bench.mutants")
    parser.add_argument("modules", nargs="+", choices=[t.module for t in TARGETS])
    parser.add_argument("--again", action="store_true",
                        help="rerun only the survivors and the mutants no test reached")
    parser.add_argument("--tests", nargs="+", default=[],
                        help="test files to run instead of the targets' own selection")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench")
    parser.add_argument("--reports", type=Path, default=ROOT / "reports")
    parser.add_argument("--no-report", action="store_true",
                        help="the table only (the report runs `mutmut show` on every survivor)")
    args = parser.parse_args(argv)
    path = args.out / "mutants.csv"
    fresh = pd.DataFrame(run(quick=False, modules=tuple(args.modules), again=args.again,
                             tests=tuple(args.tests)))
    kept = pd.read_csv(path) if path.exists() else fresh.iloc[:0]
    order = [t.module for t in TARGETS]
    frame = (pd.concat([kept[~kept.module.isin(fresh.module)], fresh], ignore_index=True)
             .sort_values("module", key=lambda column: column.map(order.index)))
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    print(frame[COLUMNS].to_string(index=False))
    written = [] if args.no_report else report(frame, args.reports)
    print(f"wrote {', '.join(map(str, [path, *written]))}")


def _mutate(target: Target, again: bool = False) -> dict:
    folder = work_dir(target)
    previous = mutant_results(target) if again else {}
    if again:
        names = [name for name, status in previous.items()
                 if status in ("survived", "no_tests", "not_run")]
        meta = folder / "mutants" / f"{target.source}.meta"
        shutil.copyfile(meta, meta.with_suffix(".meta.before"))
    else:
        names = mutant_globs(target)
        shutil.rmtree(folder, ignore_errors=True)
    _link(folder, target)
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    if names or not again:
        with (folder / "mutmut.log").open("a" if again else "w") as out:
            subprocess.run(
                [sys.executable, "-m", "mutmut", "run", "--max-children", "2", *names],
                cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
            )
    if again:
        _keep_verdicts(target, set(previous) - set(names))
    return row(target)


def _keep_verdicts(target: Target, kept: set[str]) -> None:
    """Put back the exit codes of the mutants a rerun did not run: mutmut clears every verdict
    when the test selection changes, though a killed mutant is still killed by the same tests."""
    meta = work_dir(target) / "mutants" / f"{target.source}.meta"
    saved = meta.with_suffix(".meta.before")
    if not saved.exists():
        return
    codes = json.loads(saved.read_text())["exit_code_by_key"]
    data = json.loads(meta.read_text())
    data["exit_code_by_key"].update({name: codes[name] for name in kept})
    meta.write_text(json.dumps(data))


def row(target: Target) -> dict:
    """The target's row of the table, from the verdicts in its work folder."""
    log = work_dir(target) / "mutmut.log"
    results = mutant_results(target)
    if not results:
        raise RuntimeError(f"mutmut made no mutants of {target.source}; see {log}")
    counts = Counter(results.values())
    equivalent = sum(1 for name, status in results.items()
                     if status == "survived" and name in EQUIVALENT)
    caught = counts["killed"] + counts["timeouts"]
    return {
        "module": target.module,
        "source": target.source,
        "mutants": len(results),
        "killed": counts["killed"],
        "survived": counts["survived"],
        "timeouts": counts["timeouts"],
        "no_tests": counts["no_tests"],
        "not_run": counts["not_run"],
        "equivalent": equivalent,
        "caught_pct": round(
            100.0 * caught / max(1, len(results) - equivalent - counts["not_run"]), 1),
    }


def _link(folder: Path, target: Target) -> None:
    """Links to this checkout's code and tests, and the target's mutmut config (mutmut copies the
    tests into its ``mutants/`` folder on every run, so a rerun sees the tests as they are now)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    (folder / "pyproject.toml").write_text(
        (ROOT / "pyproject.toml").read_text() + _mutmut_section(target)
    )


def _mutmut_section(target: Target) -> str:
    """The ``[tool.mutmut]`` table: mutate ``target.source`` only, against ``target.tests``."""
    def strings(values: tuple[str, ...] | list[str]) -> str:
        return "[" + ", ".join(json.dumps(v) for v in values) + "]"

    return "\n".join([
        "",
        "[tool.mutmut]",
        f"source_paths = {strings(['bagpipe', 'baselines'])}",
        f"only_mutate = {strings([target.source])}",
        f"pytest_add_cli_args_test_selection = {strings(target.tests)}",
        f"pytest_add_cli_args = {strings(['-p', 'no:cacheprovider'])}",
        f"also_copy = {strings(['suites', 'hydra_plugins'])}",
        "use_git_change_detection = false",
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
        "process_isolation = \"forkserver\"",
        "",
    ])


if __name__ == "__main__":
    main()
