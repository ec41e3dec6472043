"""Every system on the full-size Kaggle-format file, with each process's peak memory.

The ``data`` benchmark measures Bagpipe on the 45.8M-row file (``data_scale``); this one checks
that every system of the suites trains on the same prepared shards with bounded memory. The file
(``data_scale.kaggle_file``: the same name, so ``$BAGPIPE_BENCH_DATA`` reuses the ``data``
benchmark's file) is prepared once into a cache; then each system, configured as the suites
configure it (``suites/system/<name>.yaml``, the suites' DLRM, 2 trainers), is trained for
``STEPS`` steps and evaluated through the harness's runner, in a process of its own
(``data_probe system``). Rows, per system:

* ``peak_rss_gb`` of the driver and of every role process, read after the last step while the
  roles still run (goal: <= 2 GB; an embedding server: its table shard + <= 1 GB);
* ``iter_time_mean_s`` and ``auc`` (a run this short only shows that it trains);
* ``init_time_s``: the system's ``setup`` (starting its roles).

Also ``cached_prepare_s``: a second ``prepare`` of the same file and key, which finds the shards.
"""

from __future__ import annotations

from bagpipe.bench.data_scale import (
    BATCH,
    config_json,
    data_dir,
    data_row,
    kaggle_dataset,
    kaggle_file,
    kaggle_generator,
    probe,
)

SYSTEMS = ("local", "sync_ps", "fae", "het", "torchrec", "bagpipe")
STEPS = 50


def run(quick: bool) -> list[dict]:
    rows, gen_cfg = kaggle_generator(quick)
    steps = 10 if quick else STEPS
    with data_dir() as directory:
        path, _ = kaggle_file(directory, rows, gen_cfg)
        files = config_json(kaggle_dataset(path, gen_cfg, directory / "cache-systems"))
        config = {"rows": rows, "file_gb": round(path.stat().st_size / 1e9, 2), "batch": BATCH}
        probe("prepare", files)  # once; every system then opens the cached shards
        out = [data_row("cached_prepare_s", probe("prepare", files)["seconds"], "s", **config)]
        for name in SYSTEMS:
            trained = probe("system", name, files, str(BATCH), str(steps))
            each = {"system": name, "steps": steps, **config}
            out += [data_row("peak_rss_gb", peak / 1e9, "GB", role=role, **each)
                    for role, peak in trained["peak_rss"].items()]
            out += [data_row("iter_time_mean_s", trained["iter_time_mean_s"], "s", **each),
                    data_row("init_time_s", trained["init_time_s"], "s", **each),
                    data_row("auc", trained["auc"], "", **each)]
        out.append(data_row("embedding_table_gb", trained["table_bytes"] / 1e9, "GB", **config))
    return out
