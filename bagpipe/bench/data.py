"""Data benchmarks: generator and Criteo TSV reader throughput, then the full-size run.

Each rate is given per wall second and per CPU second of this process (all its threads): on a
shared, oversubscribed machine the CPU-second figure is the one that compares across runs.

The reader figure is end to end: a generated Criteo TSV (500k rows; quick: 50k) is read, validated,
hex-decoded, hash-mod mapped and dense-transformed into ``Examples`` (``files.mapped_blocks``).

Then ``data_scale``: a Kaggle-size file prepared into shards and trained on by Bagpipe (preparing
speed, launch to first step, every role's peak memory, step time against the synthetic source),
and two Terabyte day files streamed with their day-based evaluation split. It takes long (the full
file alone is minutes to write); see ``data_scale`` for where its data goes.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bagpipe.bench import data_scale
from bagpipe.bench.data_scale import data_row
from bagpipe.data.examples import Examples
from bagpipe.data.files import hash_mod_columns, mapped_blocks
from bagpipe.data.generator import GeneratorConfig, SyntheticGenerator
from bagpipe.data.presets import get_preset
from bagpipe.data.readers import ReadStats
from bagpipe.data.writers import write_criteo_tsv

GEN_BATCH = 4096


def run(quick: bool) -> list[dict]:
    preset = get_preset("criteo_kaggle")
    gen = SyntheticGenerator(preset, GeneratorConfig(scale=0.001))
    gen_batches = 10 if quick else 60
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(gen_batches):
        gen.examples("train", i, GEN_BATCH)
    gen_s, gen_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    rows = [
        data_row("generator_rows_per_s", gen_batches * GEN_BATCH / gen_s, "rows/s",
             preset="criteo_kaggle", batch_size=GEN_BATCH),
        data_row("generator_rows_per_cpu_s", gen_batches * GEN_BATCH / gen_cpu_s, "rows/cpu-s",
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
        read = sum(len(block) for block in mapped_blocks(
            "criteo_tsv", path, hash_mod_columns("criteo_tsv", gen.table_sizes), gen.table_sizes,
            len(preset.dense), False, ReadStats()))
        read_s, read_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    assert read == file_rows
    rows.append(data_row("criteo_tsv_read_rows_per_s", file_rows / read_s, "rows/s", rows=file_rows,
                     file_mb=round(file_mb, 1)))
    rows.append(data_row("criteo_tsv_read_rows_per_cpu_s", file_rows / read_cpu_s, "rows/cpu-s",
                     rows=file_rows, file_mb=round(file_mb, 1)))
    rows.append(data_row("criteo_tsv_write_rows_per_s", file_rows / write_s, "rows/s", rows=file_rows,
                     file_mb=round(file_mb, 1)))
    return rows + data_scale.run(quick)
