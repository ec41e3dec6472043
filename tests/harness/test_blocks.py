"""A sweep runs in randomised, interleaved blocks: every block is one run of every other
combination, blocks run one after another, and the order within a block is shuffled (seeded)."""

from __future__ import annotations

import itertools

from hydra import compose, initialize_config_dir

from bagpipe.harness.run.blocks import interleaved_blocks
from bagpipe.harness.run.schema import register_configs
from bagpipe.harness.run.train import SUITES_DIR

SYSTEMS = ["local", "sync_ps", "fae", "het", "torchrec", "bagpipe"]
JOBS = [[f"system={s}", f"seed={k}"] for s, k in itertools.product(SYSTEMS, range(3))]


def _value(job: list[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in job if o.startswith(f"{key}="))


def test_every_block_holds_every_system_once_and_blocks_do_not_overlap() -> None:
    ordered = interleaved_blocks(JOBS, "seed", order_seed=0)
    assert sorted(map(tuple, ordered)) == sorted(map(tuple, JOBS))
    seeds = [_value(job, "seed") for job in ordered]
    assert seeds == sorted(seeds)  # block 0, then 1, then 2
    for block in range(3):
        systems = [_value(j, "system") for j in ordered if _value(j, "seed") == str(block)]
        assert sorted(systems) == sorted(SYSTEMS)


def test_the_order_within_blocks_is_shuffled_reproducibly() -> None:
    first = interleaved_blocks(JOBS, "seed", order_seed=0)
    assert first == interleaved_blocks(JOBS, "seed", order_seed=0)
    assert first != interleaved_blocks(JOBS, "seed", order_seed=1)
    orders = {tuple(_value(j, "system") for j in first if _value(j, "seed") == str(b))
              for b in range(3)}
    assert len(orders) > 1  # not the same permutation in every block
    assert [_value(j, "system") for j in first[:6]] != SYSTEMS  # not the listed order


MODELS = ["dlrm", "wdl", "deepfm", "dcn"]
SWEEP = [[f"model={m}", f"system={s}", f"seed={k}"]
         for m, s, k in itertools.product(MODELS, SYSTEMS, range(3))]


def test_within_a_block_the_runs_of_one_model_go_back_to_back() -> None:
    ordered = interleaved_blocks(SWEEP, "seed", order_seed=0)
    assert sorted(map(tuple, ordered)) == sorted(map(tuple, SWEEP))
    per_block = len(MODELS) * len(SYSTEMS)
    model_orders = []
    for start in range(0, len(ordered), per_block):
        block = ordered[start:start + per_block]
        assert {_value(j, "seed") for j in block} == {str(start // per_block)}
        models = [_value(j, "model") for j in block]
        runs = [models[i:i + len(SYSTEMS)] for i in range(0, per_block, len(SYSTEMS))]
        assert all(len(set(run)) == 1 for run in runs)  # one model's runs contiguous
        assert sorted(_value(j, "system") for j in block[:len(SYSTEMS)]) == sorted(SYSTEMS)
        model_orders.append(tuple(run[0] for run in runs))
    assert len(set(model_orders)) > 1  # the models' order is shuffled per block


def test_a_sweep_without_the_pair_key_shuffles_its_whole_block() -> None:
    ordered = interleaved_blocks(SWEEP, "seed", order_seed=0, pair_key="nothing")
    first_block = [_value(j, "model") for j in ordered[:len(MODELS) * len(SYSTEMS)]]
    changes = sum(a != b for a, b in itertools.pairwise(first_block))
    assert changes > len(MODELS)  # models interleave instead of running in four runs


def test_jobs_without_the_block_key_form_one_block() -> None:
    jobs = [["system=a"], ["system=b"], ["system=c"]]
    assert sorted(map(tuple, interleaved_blocks(jobs, "seed"))) == sorted(map(tuple, jobs))


def test_suites_sweep_in_blocks_of_seeds() -> None:
    from bagpipe.harness.run.sweep import sweep_jobs

    register_configs()
    with initialize_config_dir(config_dir=str(SUITES_DIR), version_base="1.3"):
        fig7 = compose("config", overrides=["suite=fig7"], return_hydra_config=True)
    assert fig7.hydra.sweeper._target_ == "hydra_plugins.bagpipe_sweeper.BlockSweeper"
    jobs = sweep_jobs(fig7)
    seeds = [_value(job, "seed") for job in jobs]
    assert seeds == sorted(seeds) and len(jobs) == 7 * 4 * 6  # systems, models, blocks
