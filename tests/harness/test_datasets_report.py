"""The ``datasets`` suite (E2) composes into its jobs, and its report turns a fake sweep into the
runs table, the figure and the page, each dataset from its newest sweep."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

from bagpipe.harness.report.cli import main as report_main
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR
from bagpipe.harness.track.record import RECORD_FILE, RunRecord

SHAPES = {"synthetic_kaggle": "criteo_kaggle", "synthetic_terabyte": "criteo_terabyte",
          "synthetic_avazu": "avazu"}
SYSTEMS = {"local": 0.08, "sync_ps": 0.5, "fae": 0.3, "het": 0.35, "torchrec": 0.4, "bagpipe": 0.1}


def test_suite_composes_every_system_on_three_datasets_under_fig7s_rules() -> None:
    from bagpipe.harness.run.sweep import sweep_jobs, validate_sweep

    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["suite=datasets"], return_hydra_config=True)
        jobs = {frozenset(job) for job in sweep_jobs(cfg)}
        assert jobs == {frozenset({"suite=datasets", f"dataset={d}", f"system={s}", "model=dlrm",
                                   f"seed={seed}"})
                        for d in SHAPES for s in SYSTEMS for seed in range(3)}
        one_seed = compose("config", return_hydra_config=True,
                           overrides=["suite=datasets", "hydra.sweeper.params.seed=0"])
        assert len(validate_sweep(one_seed)) == 3 * 6  # each job built as at launch (seeds alike)
        fig7 = compose("config", overrides=["suite=fig7"])
        for dataset, preset in SHAPES.items():
            job = compose("config", overrides=["suite=datasets", f"dataset={dataset}"])
            assert job.dataset.preset.name == preset
            for group in ("run", "optim", "topology", "network", "trainers", "cache_budget"):
                assert job[group] == fig7[group], group
        real = ["suite=datasets", "dataset=terabyte_tsv", "dataset.path=/data/day_*"]
        switched = sweep_jobs(compose("config", overrides=real, return_hydra_config=True))
        assert len(switched) == 6 * 3 and all("dataset=terabyte_tsv" in job for job in switched)
        terabyte = compose("config", overrides=real).dataset
        assert terabyte.preset.name == "criteo_terabyte" and terabyte.path == "/data/day_*"


def _save(sweep: Path, dataset: str, system: str, seed: int, iter_s: float,
          git_sha: str = "abc123") -> None:
    record = RunRecord(
        run_name=f"{system}-{dataset}-s{seed}", experiment="e", params={"seed": str(seed)},
        tags={"system": system, "model": "dlrm", "dataset": dataset, "suite": "datasets",
              "git_sha": git_sha},
        summary={"iter_time_mean_s": iter_s, "iter_time_p50_s": iter_s, "auc": 0.7,
                 "logloss": 0.5},
        status="FINISHED")
    directory = sweep / f"{system}_{dataset}_{seed}" / "record"
    directory.mkdir(parents=True)
    (directory / RECORD_FILE).write_text(json.dumps(asdict(record)))


def test_report_takes_each_dataset_from_its_newest_sweep(tmp_path: Path) -> None:
    root = tmp_path / "multirun"
    old, new = root / "datasets" / "2026-01-01_00-00-00", root / "datasets" / "2026-01-02_00-00-00"
    for dataset, scale in (("synthetic_kaggle", 1.0), ("synthetic_avazu", 2.0)):
        for system, base in SYSTEMS.items():
            for seed in range(3):
                _save(old, dataset, system, seed, scale * base * (1 + 0.1 * seed))
    for system, base in SYSTEMS.items():  # a newer sweep of Kaggle alone: it replaces the old
        _save(new, "synthetic_kaggle", system, 0, 0.5 * base)
    out = ["--results-dir", str(tmp_path / "results"), "--reports-dir", str(tmp_path / "reports")]
    assert report_main(["datasets", "--multirun-root", str(root), *out]) == 0
    runs = pd.read_csv(tmp_path / "results" / "datasets" / "runs.csv")
    assert len(runs) == 6 + 18 and set(runs["dataset"]) == {"synthetic_kaggle", "synthetic_avazu"}
    assert runs[runs["dataset"] == "synthetic_kaggle"]["seed"].tolist() == [0] * 6
    assert (tmp_path / "reports" / "datasets.png").stat().st_size > 10_000
    page = (tmp_path / "reports" / "datasets.md").read_text()
    assert "| synthetic_kaggle | bagpipe | 1 | 50.00 ± – | 5.00x [–, –] | one block | 0.7000 |" in page
    assert ("| synthetic_avazu | sync_ps | 3 | 1100.00 ± 100.00 | 1.00x [1.00, 1.00] | reference "
            "| 0.7000 |") in page
    assert "| synthetic_avazu | bagpipe | 3 | 220.00 ± 20.00 | 5.00x [5.00, 5.00] | faster |" in page
    assert page.index("synthetic_kaggle |") < page.index("synthetic_avazu |")  # paper's order
    assert str(new) in page and str(old) in page
    assert report_main(["datasets", "--sweep-dir", str(old), *out]) == 0
    assert len(pd.read_csv(tmp_path / "results" / "datasets" / "runs.csv")) == 36


def test_report_refuses_runs_from_several_commits_unless_drawn_as_a_draft(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun" / "datasets" / "2026-01-01_00-00-00"
    for system, base in SYSTEMS.items():
        for seed in range(2):
            _save(sweep, "synthetic_kaggle", system, seed, base * (1 + 0.1 * seed),
                  git_sha="abc123" if seed == 0 else "def456-dirty")
    out = ["--sweep-dir", str(sweep), "--results-dir", str(tmp_path / "results"),
           "--reports-dir", str(tmp_path / "reports")]
    assert report_main(["datasets", *out]) == 1
    assert not (tmp_path / "reports" / "datasets.md").exists()
    assert report_main(["datasets", *out, "--allow-unclean"]) == 0
    page = (tmp_path / "reports" / "datasets.md").read_text()
    assert page.startswith("> **Draft:** datasets: a result set must come from one clean commit")
