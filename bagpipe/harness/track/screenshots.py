"""``python -m bagpipe.harness.track.screenshots``: pictures of a suite's latest sweep in the MLflow UI.

    python -m bagpipe.harness.track.screenshots --store sqlite:///$PWD/mlflow.db --suite fig7 \\
        --out reports/ui/

Serves the store (``mlflow server``), opens it in headless chromium the way the browser test does
(:mod:`bagpipe.harness.track.browser`) and writes ``runs.png`` (the experiment's runs with the
speedup column), ``compare.png`` (one model and seed's runs compared, the speedup on the plot) and
``parent.png`` (the sweep's parent run, its figure previewed), so the pictures in a report show what a
person will see.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from bagpipe.harness.track.browser import ExperimentUI, browser_missing, browser_page
from bagpipe.harness.track.sweeps import speedup_key
from bagpipe.harness.track.ui import DEFAULT_EXPERIMENT, MlflowServer, find_experiment


def latest_sweep(client: MlflowClient, experiment_id: str, suite: str) -> tuple[Run, list[Run]]:
    """The newest parent run of ``suite`` (a run of the suite without a ``system`` tag) and its
    child runs."""
    runs = client.search_runs([experiment_id], f"tags.suite = '{suite}'",
                              order_by=["attributes.start_time DESC"], max_results=1000)
    parents = [run for run in runs if "system" not in run.data.tags]
    if not parents:
        raise LookupError(f"no sweep of suite {suite!r} in experiment {experiment_id}")
    parent = parents[0]
    children = [run for run in runs
                if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, children


def compared(children: list[Run]) -> list[str]:
    """The run names of the first model and seed: every system on the same work."""
    def work(run: Run) -> tuple[str, str]:
        return run.data.tags.get("model", ""), run.data.params.get("seed", "")

    first = min(work(run) for run in children)
    return [str(run.info.run_name) for run in children if work(run) == first]


def take(store: str, suite: str, out: Path, experiment: str = DEFAULT_EXPERIMENT) -> list[Path]:
    """The three screenshots of ``suite``'s latest sweep in ``store``, written under ``out``."""
    experiment_id = find_experiment(store, experiment)
    if experiment_id is None:
        raise LookupError(f"no experiment {experiment!r} in {store}")
    parent, children = latest_sweep(MlflowClient(tracking_uri=store), experiment_id, suite)
    reference = children[0].data.params.get("tracking.reference_system", "sync_ps")
    metric = speedup_key(reference)
    with MlflowServer(store) as server, browser_page(height=1100) as page:
        ui = ExperimentUI(page, server.url, experiment_id)
        ui.open_runs(str(parent.info.run_name))
        ui.show_column(metric)
        shots = [ui.screenshot(out / "runs.png")]
        ui.select(compared(children))
        ui.compare(metric)
        shots.append(ui.screenshot(out / "compare.png"))
        ui.open_artifacts(parent.info.run_id)
        figure = page.get_by_text(re.compile(r"\.png$")).locator("visible=true")
        if figure.count():  # the report's figure, once a report was drawn from the sweep
            figure.first.click()
            page.wait_for_timeout(3000)  # the preview loads the image
        shots.append(ui.screenshot(out / "parent.png"))
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bagpipe.harness.track.screenshots",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="tracking store, e.g. sqlite:///$PWD/mlflow.db")
    parser.add_argument("--suite", default="fig7")
    parser.add_argument("--out", type=Path, default=Path("reports/ui"))
    parser.add_argument("--experiment", default=DEFAULT_EXPERIMENT)
    args = parser.parse_args(argv)
    missing = browser_missing()
    if missing is not None:
        print(f"cannot take screenshots: {missing}", file=sys.stderr)
        return 2
    for path in take(args.store, args.suite, args.out, args.experiment):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
