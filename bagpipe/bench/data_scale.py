"""Full-size data benchmark: a Kaggle-size Criteo TSV made by the generator, prepared and trained on.

Nothing is downloaded: ``writers.write_criteo_tsv`` writes ``KAGGLE_ROWS`` rows (45.8M, ~11 GB;
``--quick``: 1M) of the Kaggle-shaped generator (tables capped at ``MAX_IND_RANGE`` rows, as the
``criteo_tsv`` dataset config does) as ``train.txt``. Then, each job in a fresh process
(``data_probe``) so its peak memory is its own:

* ``prepare_rows_per_s``: preprocessing into shards (goal >= 500k rows/s on 2 cores), and its
  peak RSS;
* ``launch_to_first_step_s``: a Bagpipe run on the prepared set, from starting the process to the
  end of its first step (goal <= 10 s), and its parts: ``launch_imports_s`` (Python, torch,
  torchrec), ``dataset_open_s`` (fingerprinting the file and opening the prepared set: the data
  layer's share), ``bagpipe_setup_s`` (starting the roles), ``first_step_s``;
* ``peak_rss_<role>``: peak RSS of the driver, the oracle, each trainer (goal <= 2 GB) and each
  embedding server (goal: its table shard + <= 1 GB) in a ``TRAIN_STEPS``-step Bagpipe run;
* ``step_time_p50_s`` on the shards and on the in-memory synthetic source of the same generator
  (the file's rows are that source's rows, so both runs train on identical batches), ``ROUNDS``
  runs of each, alternated, and ``step_time_ratio_shards_vs_synthetic`` of the best round of each
  (goal <= 1.05). Reading the batch is part of the step. The peak RSS rows are the shards runs'
  highest; the launch rows are its first run's.

Terabyte: two day files of ``TERABYTE_DAY_ROWS`` rows each are prepared with
``preset=criteo_terabyte``; one epoch of the training day is streamed in the shuffled order and the
evaluation split is checked to be exactly the last day.

Where the data goes: ``$BAGPIPE_BENCH_DATA`` if set (the generated files are kept there and reused
by the next run; the prepared shards are always rebuilt, since preparing is measured), else a
temporary directory removed at the end. The full run needs about 20 GB of disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bagpipe.data import DatasetConfig, GeneratorConfig, SyntheticGenerator, get_preset
from bagpipe.data.writers import write_criteo_tsv

KAGGLE_ROWS = 45_840_617
MAX_IND_RANGE = 1_000_000
TERABYTE_DAY_ROWS = 3_000_000
TRAIN_STEPS = 200
WARMUP_STEPS = 5  # left out of the step time
ROUNDS = 2  # training runs per source, alternated
BATCH = 2048
_WRITE_ROWS = 1 << 20  # rows generated and written per chunk


def data_row(metric: str, value: float, unit: str, **config: object) -> dict:
    """One row of the ``data`` benchmark's table; its configuration folded into one column
    (``rows=45840617 batch=2048``), so the printed table stays readable."""
    return {"benchmark": "data", "metric": metric, "value": value, "unit": unit,
            "config": " ".join(f"{key}={setting}" for key, setting in config.items())}


@contextmanager
def data_dir() -> Iterator[Path]:
    """Where the generated files go: ``$BAGPIPE_BENCH_DATA`` (kept), else a temporary directory."""
    kept = os.environ.get("BAGPIPE_BENCH_DATA")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        yield Path(kept)
        return
    directory = Path(tempfile.mkdtemp(prefix="bagpipe-bench-data-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def probe(*args: str) -> dict[str, Any]:
    """Run one ``data_probe`` job in a fresh process; its JSON line."""
    done = subprocess.run([sys.executable, "-m", "bagpipe.bench.data_probe", *args],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"data_probe {args[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _write(path: Path, gen: SyntheticGenerator, first: int, rows: int) -> bool:
    """``rows`` generator rows from ``first`` as a Criteo TSV, unless a previous run left it
    (then False)."""
    if path.exists():
        return False
    partial = path.with_suffix(".partial")
    blocks = (gen.rows("train", start, min(first + rows, start + _WRITE_ROWS))
              for start in range(first, first + rows, _WRITE_ROWS))
    write_criteo_tsv(str(partial), blocks, gen.table_sizes)
    partial.rename(path)
    return True


def config_json(cfg: DatasetConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg))


def kaggle_generator(quick: bool) -> tuple[int, GeneratorConfig]:
    """Rows and generator settings of the Kaggle-format file: full size, or 1M small-table rows."""
    if quick:
        return 1_000_000, GeneratorConfig(scale=0.001)
    return KAGGLE_ROWS, GeneratorConfig(scale=1.0, max_ind_range=MAX_IND_RANGE)


def kaggle_file(directory: Path, rows: int, gen_cfg: GeneratorConfig) -> tuple[Path, float | None]:
    """The Kaggle-format TSV of ``rows`` generator rows in ``directory`` and the seconds writing
    it took (None: a previous run left it)."""
    gen = SyntheticGenerator(get_preset("criteo_kaggle"), gen_cfg)
    path = directory / f"train_{rows}_{gen_cfg.scale:g}.txt"
    start = time.perf_counter()
    written = _write(path, gen, 0, rows)
    return path, time.perf_counter() - start if written else None


def kaggle_dataset(path: Path, gen_cfg: GeneratorConfig, cache: Path) -> DatasetConfig:
    """The ``criteo_tsv`` dataset of a file :func:`kaggle_file` wrote, prepared under ``cache``."""
    return DatasetConfig(kind="criteo_tsv", path=str(path), scale=gen_cfg.scale,
                         max_ind_range=gen_cfg.max_ind_range, cache_dir=str(cache))


def kaggle(directory: Path, rows: int, gen_cfg: GeneratorConfig) -> list[dict]:
    path, written_s = kaggle_file(directory, rows, gen_cfg)
    cache = directory / "cache-kaggle"
    shutil.rmtree(cache, ignore_errors=True)  # preparing is measured: never from a cache
    files = config_json(kaggle_dataset(path, gen_cfg, cache))
    config = {"rows": rows, "file_gb": round(path.stat().st_size / 1e9, 2), "batch": BATCH}
    prepared = probe("prepare", files)
    sources = {"shards": files, "synthetic": config_json(DatasetConfig(
        scale=gen_cfg.scale, max_ind_range=gen_cfg.max_ind_range))}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for _ in range(ROUNDS):  # alternated, so a burst of load elsewhere hits both sources alike
        for name, source in sources.items():
            runs[name].append(probe("train", source, str(BATCH), str(TRAIN_STEPS), str(time.time())))
    out = [data_row("tsv_generate_write_s", written_s, "s", **config)] if written_s else []
    out += [
        data_row("prepare_rows_per_s", prepared["rows"] / prepared["seconds"], "rows/s", **config),
        data_row("prepare_rows_per_cpu_s", prepared["rows"] / prepared["cpu_seconds"], "rows/cpu-s",
                 **config),
        data_row("prepare_peak_rss_gb", prepared["peak_rss"] / 1e9, "GB", **config),
    ]
    first = runs["shards"][0]
    out += [data_row(metric, first[key], "s", **config) for metric, key in (
        ("launch_to_first_step_s", "launch_to_first_step_s"), ("launch_imports_s", "imports_s"),
        ("dataset_open_s", "open_s"), ("bagpipe_setup_s", "setup_s"))]
    out.append(data_row("first_step_s", first["step_s"][0], "s", **config))
    for role in first["peak_rss"]:
        peak = max(run["peak_rss"][role] for run in runs["shards"])
        out.append(data_row(f"peak_rss_{role}_gb", peak / 1e9, "GB", steps=TRAIN_STEPS, **config))
    out.append(data_row("embedding_table_gb", first["table_bytes"] / 1e9, "GB", **config))
    best = {}
    for name, source_runs in runs.items():
        p50s = [statistics.median(run["step_s"][WARMUP_STEPS:]) for run in source_runs]
        best[name] = min(p50s)
        out += [data_row("step_time_p50_s", p50, "s", source=name, round=r, steps=TRAIN_STEPS,
                         **config) for r, p50 in enumerate(p50s)]
    out.append(data_row("step_time_ratio_shards_vs_synthetic", best["shards"] / best["synthetic"],
                        "x", of="best round each", steps=TRAIN_STEPS, **config))
    return out


def terabyte(directory: Path, day_rows: int) -> list[dict]:
    gen_cfg = GeneratorConfig(scale=0.001, skew_target=None)
    gen = SyntheticGenerator(get_preset("criteo_terabyte"), gen_cfg)
    for day in range(2):
        _write(directory / f"day_{day}_{day_rows}", gen, day * day_rows, day_rows)
    cache = directory / "cache-terabyte"
    shutil.rmtree(cache, ignore_errors=True)
    cfg = DatasetConfig(kind="criteo_tsv", preset="criteo_terabyte", scale=gen_cfg.scale,
                        skew_target=None, path=str(directory / f"day_*_{day_rows}"), shuffle=True,
                        cache_dir=str(cache))
    prepared = probe("prepare", config_json(cfg))
    streamed = probe("stream", config_json(cfg), str(BATCH))
    config = {"rows": 2 * day_rows, "days": 2, "batch": BATCH}
    if streamed["eval_rows"] != day_rows // BATCH * BATCH:
        raise AssertionError(f"Terabyte eval split has {streamed['eval_rows']} rows, not day 1's")
    return [
        data_row("terabyte_prepare_rows_per_s", prepared["rows"] / prepared["seconds"], "rows/s",
             **config),
        data_row("terabyte_stream_rows_per_s", streamed["train_rows"] / streamed["train_s"], "rows/s",
             shuffled=True, **config),
        data_row("terabyte_stream_peak_rss_gb", streamed["peak_rss"] / 1e9, "GB", **config),
        data_row("terabyte_eval_rows", streamed["eval_rows"], "rows", split="last day", **config),
    ]


def run(quick: bool) -> list[dict]:
    with data_dir() as directory:
        rows = kaggle(directory, *kaggle_generator(quick))
        rows += terabyte(directory, 200_000 if quick else TERABYTE_DAY_ROWS)
    return rows
