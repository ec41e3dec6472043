"""Data benchmarks: generator throughput (Kaggle preset) and Criteo TSV reader throughput.

Each rate is given per wall second and per CPU second of this process (all its threads): on a
shared, oversubscribed machine the CPU-second figure is the one that compares across runs.

The reader figure is end to end: a generated Criteo TSV (500k rows; quick: 50k) is read, validated,
hex-decoded, hash-mod mapped and dense-transformed into ``Examples`` (``files.read_examples``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bagpipe.data.examples import Examples
from bagpipe.data.files import read_examples
from bagpipe.data.generator import GeneratorConfig, SyntheticGenerator
from bagpipe.data.presets import get_preset
from bagpipe.data.writers import write_criteo_tsv

GEN_BATCH = 4096


def _row(metric: str, value: float, unit: str, **config: object) -> dict:
    return {"benchmark": "data", "metric": metric, "value": value, "unit": unit, **config}


def run(quick: bool) -> list[dict]:
    preset = get_preset("criteo_kaggle")
    gen = SyntheticGenerator(preset, GeneratorConfig(scale=0.001))
    gen_batches = 10 if quick else 60
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(gen_batches):
        gen.examples("train", i, GEN_BATCH)
    gen_s, gen_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    rows = [
        _row("generator_rows_per_s", gen_batches * GEN_BATCH / gen_s, "rows/s",
             preset="criteo_kaggle", batch_size=GEN_BATCH),
        _row("generator_rows_per_cpu_s", gen_batches * GEN_BATCH / gen_cpu_s, "rows/cpu-s",
             preset="criteo_kaggle", batch_size=GEN_BATCH),
    ]
    file_rows = 50_000 if quick else 500_000
    examples = Examples.concat(
        [gen.examples("train", 1000 + i, 50_000) for i in range(file_rows // 50_000)],
        len(preset.dense), len(gen.table_sizes))
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "train.txt")
        start = time.perf_counter()
        write_criteo_tsv(path, examples, gen.table_sizes)
        write_s = time.perf_counter() - start
        file_mb = Path(path).stat().st_size / 1e6
        start, cpu_start = time.perf_counter(), time.process_time()
        read, _, _ = read_examples("criteo_tsv", path, table_sizes=gen.table_sizes,
                                   num_dense=len(preset.dense))
        read_s, read_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    assert len(read) == file_rows
    rows.append(_row("criteo_tsv_read_rows_per_s", file_rows / read_s, "rows/s", rows=file_rows,
                     file_mb=round(file_mb, 1)))
    rows.append(_row("criteo_tsv_read_rows_per_cpu_s", file_rows / read_cpu_s, "rows/cpu-s",
                     rows=file_rows, file_mb=round(file_mb, 1)))
    rows.append(_row("criteo_tsv_write_rows_per_s", file_rows / write_s, "rows/s", rows=file_rows,
                     file_mb=round(file_mb, 1)))
    return rows
