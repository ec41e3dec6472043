"""``python -m bagpipe.harness.report <suite> [options]``: one command for every report.

Suites (bagpipe.md §5.3), each writing ``results/<suite>/`` and ``reports/<suite>.{png,md}``:

* ``fig7`` (E1): iteration time and speedup by system and model, from the latest ``multirun/fig7``
  sweep, an MLflow store (``--from-mlflow URI``) or a tidy CSV (``--csv``); ``fig7_paper``: the
  same at the paper's scale (DLRM, batch 16384, 8 trainers), by the same rules;
* ``datasets`` (E2): iteration time and speedup by system on the three datasets, each dataset's
  runs from its newest ``multirun/datasets`` sweep;
* ``skew`` (E4, pure data): share of lookups against share of rows (``--file kind:path[:preset]``
  adds a real file);
* ``breakdown`` (E3): where an iteration's time goes, per system;
* ``bound_split``: Bagpipe's time over the embedding-free bound, split into our layout of row
  gradients, LRPP's row synchronisation and the rest of its implementation (#16);
* ``convergence`` (E13): AUC against steps and wall time, HET at several bounds beside;
* ``costmodel``: every system's exact bytes priced on described topologies (``--topology FILE``);
* ``lookahead``, ``capacity``, ``cleanup``, ``skew_sensitivity``, ``scaling``, ``ablation``: one
  swept knob each.

A suite that needs a sweep reads the latest one under ``--multirun-root`` unless ``--sweep-dir``
names one; ``nox -s reproduce -- <suite>`` runs the sweeps first. The figure and the page are then
attached to the MLflow parent run of every sweep read (if it was tracked), beside its ``runs.csv``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from mlflow.exceptions import MlflowException

from bagpipe.harness.report import (
    bound_split,
    breakdown,
    convergence,
    datasets,
    fig7,
    projection,
    sensitivity,
    skew,
)
from bagpipe.harness.report.loading import (
    RunsTable,
    UncleanResultsError,
    sweeps,
    table_from_csv,
    table_from_mlflow,
    table_from_sweep,
)
from bagpipe.harness.report.plotting import Outputs
from bagpipe.harness.track.mlflow_runs import TrackingUnavailableError, log_to_parent

#: Draws a suite's report; returns the sweep directories it read (none: a CSV, a store, pure data).
Draw = Callable[[argparse.Namespace], list[Path]]


def _outputs(args: argparse.Namespace) -> Outputs:
    return Outputs(args.results_dir, args.reports_dir)


def _sweep(args: argparse.Namespace) -> Path:
    """``--sweep-dir``, or the latest sweep of the suite being reported."""
    (sweep,) = sweeps(args.multirun_root, args.suite, args.sweep_dir)
    return sweep


def _fig7(args: argparse.Namespace) -> list[Path]:
    runs: RunsTable
    if args.csv is not None:
        runs = table_from_csv(args.csv)
    elif args.from_mlflow:
        runs = table_from_mlflow(args.from_mlflow, args.experiment, args.suite)
    else:
        runs = table_from_sweep(_sweep(args), args.reference)
    # the d/2 and 2d check belongs to fig7's own regime, not to the paper-scale set
    rescaled = _rescaled(args) if runs.sweep is not None and args.suite == fig7.SUITE else None
    fig7.report(runs, args.reference, _outputs(args), allow_unclean=args.allow_unclean,
                rescaled=rescaled, suite=args.suite)
    return [table.sweep for table in (runs, rescaled) if table is not None and table.sweep]


def _rescaled(args: argparse.Namespace) -> RunsTable | None:
    """The newest ``fig7_dilation`` sweep (DLRM at d/2 and 2d), if one has run."""
    if args.sweep_dir is not None or not (args.multirun_root / fig7.RESCALED_SUITE).is_dir():
        return None
    (sweep,) = sweeps(args.multirun_root, fig7.RESCALED_SUITE)
    return table_from_sweep(sweep, args.reference)


def _datasets(args: argparse.Namespace) -> list[Path]:
    records, used = datasets.newest_runs(args.multirun_root, args.sweep_dir)
    datasets.report(records, used, args.reference, _outputs(args), args.allow_unclean)
    return used


def _skew(args: argparse.Namespace) -> list[Path]:
    skew.report(_outputs(args), args.scale, args.samples, args.file)
    return []


def _breakdown(args: argparse.Namespace) -> list[Path]:
    sweep = _sweep(args)
    breakdown.report(sweep, _outputs(args))
    return [sweep]


def _bound_split(args: argparse.Namespace) -> list[Path]:
    sweep = _sweep(args)
    bound_split.report(sweep, _outputs(args), args.allow_unclean)
    return [sweep]


def _convergence(args: argparse.Namespace) -> list[Path]:
    found = sweeps(args.multirun_root, convergence.SUITE, args.sweep_dir, convergence.COMPANIONS)
    convergence.report(found, _outputs(args))
    return found


def _costmodel(args: argparse.Namespace) -> list[Path]:
    sweep = _sweep(args)
    projection.report(sweep, _outputs(args), args.topology or projection.DEFAULT_TOPOLOGIES)
    return [sweep]


def _sensitivity(args: argparse.Namespace) -> list[Path]:
    sweep = _sweep(args)
    sensitivity.report(args.suite, sweep, _outputs(args))
    return [sweep]


def attach_to_sweeps(sweep_dirs: Sequence[Path], files: Sequence[Path]) -> None:
    """``files`` (a report's figure and page) as artifacts of each sweep's MLflow parent run, so
    the sweep's page in the UI shows what was drawn from it; a sweep run without tracking, or a
    store that does not answer, is said and skipped."""
    present = [path for path in files if path.exists()]
    for sweep in sweep_dirs:
        try:
            run_id = log_to_parent(sweep, present)
        except (TrackingUnavailableError, MlflowException, OSError) as err:
            print(f"[report] not attached to the MLflow parent run of {sweep}: {err}")
            continue
        if run_id is None:
            print(f"[report] {sweep} has no MLflow parent run (tracking was off); nothing attached")
        else:
            print(f"[report] {', '.join(p.name for p in present)} attached to MLflow run {run_id} "
                  f"(the parent of {sweep})")


def parser() -> argparse.ArgumentParser:
    """One sub-command per suite, each with only the options it reads."""
    written = argparse.ArgumentParser(add_help=False)
    written.add_argument("--results-dir", type=Path, default=Path("results"))
    written.add_argument("--reports-dir", type=Path, default=Path("reports"))
    swept = argparse.ArgumentParser(add_help=False, parents=[written])
    swept.add_argument("--sweep-dir", type=Path, help="default: the latest under --multirun-root")
    swept.add_argument("--multirun-root", type=Path, default=Path("multirun"))
    unclean = argparse.ArgumentParser(add_help=False)
    unclean.add_argument("--allow-unclean", action="store_true",
                         help="draw runs from several commits or a dirty tree, marked as a draft")
    compared = argparse.ArgumentParser(add_help=False, parents=[unclean])
    compared.add_argument("--reference", default="sync_ps",
                          help="system speedups are measured against")

    top = argparse.ArgumentParser(prog="python -m bagpipe.harness.report", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    suites = top.add_subparsers(dest="suite", required=True, metavar="suite")

    def suite(name: str, draw: Draw, summary: str,
              parents: Sequence[argparse.ArgumentParser] = (swept,)) -> argparse.ArgumentParser:
        command = suites.add_parser(name, parents=list(parents), help=summary, description=summary)
        command.set_defaults(draw=draw)
        return command

    for name, summary in ((fig7.SUITE, "E1: iteration time and speedup by system and model"),
                          (fig7.PAPER_SUITE, "E1 at the paper's scale (DLRM, batch 16384)")):
        headline = suite(name, _fig7, summary, parents=(swept, compared))
        headline.add_argument("--csv", type=Path, help="re-render from a tidy CSV written earlier")
        headline.add_argument("--from-mlflow", metavar="TRACKING_URI",
                              help="read runs from MLflow")
        headline.add_argument("--experiment", default="bagpipe-harness")
    suite("datasets", _datasets, "E2: iteration time and speedup by system and dataset (each "
          "dataset's newest sweep)", parents=(swept, compared))
    data = suite("skew", _skew, "E4: share of lookups against share of rows", parents=[written])
    data.add_argument("--scale", type=float, default=0.001, help="synthetic scale")
    data.add_argument("--samples", type=int, default=65536, help="examples per dataset")
    data.add_argument("--file", action="append", default=[], metavar="KIND:PATH[:PRESET]",
                      help="also a real file (kind criteo_tsv, avazu_csv, jsonl)")
    suite("breakdown", _breakdown, "E3: where an iteration's time goes, per system")
    suite(bound_split.SUITE, _bound_split, "Bagpipe over the embedding-free bound: our row layout, "
          "LRPP's row synchronisation and the rest", parents=(swept, unclean))
    suite("convergence", _convergence, "E13: AUC against steps and against wall time")
    priced = suite("costmodel", _costmodel, "every system's exact bytes priced on a topology")
    priced.add_argument("--topology", action="append", type=Path, metavar="YAML",
                        help="a topology file to project onto (repeatable; default: "
                             + " and ".join(str(p) for p in projection.DEFAULT_TOPOLOGIES) + ")")
    for name, spec in sensitivity.SENSITIVITIES.items():
        suite(name, _sensitivity, f"{spec.family}: {spec.title}")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        read = args.draw(args)
    except UncleanResultsError as err:
        print(f"[report] refused: {err}", file=sys.stderr)
        return 1
    out = _outputs(args)
    attach_to_sweeps(read, [out.figure(args.suite), out.page(args.suite)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
