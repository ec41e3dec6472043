"""Kill a role process of a running multi-process system (SIGKILL), recover, and end bit-identical.

The driver notices the death (``RoleFailedError``), tears the job down, restarts it from the last
checkpoint and trains on; the final model must equal, bit for bit, that of an uninterrupted run
with the same seed. Bagpipe is checked with a killed trainer and a killed embedding-server shard,
sync_ps with a killed server shard, TorchRec with a killed rank.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path

import pytest

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.checkpoint import CheckpointStore, state_digest
from bagpipe.core.interface import ModelState, OptimConfig, System, TrainContext
from bagpipe.harness.run.faults import KillRoles
from bagpipe.harness.run.recovery import run_with_recovery
from bagpipe.harness.run.runner import RunConfig, run_training
from bagpipe.lrpp import Bagpipe
from tests.conftest import TINY_MODEL, TinySource, assert_states_equal

SCHEMA = DatasetSchema(
    name="fault", num_dense=3, table_sizes=(40, 300, 12, 500), feature_names=("a", "b", "c", "d")
)
STEPS, BATCH, EVERY = 14, 16, 5  # checkpoints after steps 5 and 10
CFG = RunConfig(num_steps=STEPS, eval_every=0, warmup_steps=0, checkpoint_every=EVERY,
                progress=False)


def _context() -> TrainContext:
    return TrainContext(
        schema=SCHEMA,
        model=TINY_MODEL,
        optim=OptimConfig(embedding_lr=0.5, dense_lr=0.3),
        global_batch_size=BATCH,
        seed=3,
        source=TinySource(SCHEMA, BATCH, STEPS, seed=3),
    )


def _eval_source() -> TinySource:
    return TinySource(SCHEMA, BATCH, 1, seed=4, teacher_seed=3)


class Digest:
    """Callback: the final model and its digest (taken before the runner closes the system)."""

    def __init__(self, systems: list[System]) -> None:
        self.systems = systems
        self.value = ""
        self.state: ModelState | None = None

    def on_run_end(self, result: object) -> None:
        self.state = self.systems[-1].full_state()
        self.value = state_digest(self.state)


def _maker(factory: Callable[[], System]) -> tuple[Callable[[], System], list[System]]:
    systems: list[System] = []

    def make() -> System:
        systems.append(factory())
        return systems[-1]

    return make, systems


def _kill_and_recover(
    factory: Callable[[], System], kills: dict[int, str], tmp_path: Path
) -> list[tuple[str, int]]:
    """Train uninterrupted, then again with ``kills`` under ``run_with_recovery``.

    Asserts what every such run must show (each kill noticed as a death, every step reported,
    no role process left, the final models equal bit for bit); returns the restarts'
    ``(role, resumed step)``.
    """
    make, systems = _maker(factory)
    reference = Digest(systems)
    run_training(make(), _context(), _eval_source(), CFG, [reference])

    make, systems = _maker(factory)
    digest, killer = Digest(systems), KillRoles(kills)
    result, restarts = run_with_recovery(
        make, _context(), _eval_source(), CFG, CheckpointStore(tmp_path), [killer, digest]
    )
    assert [role for role, _ in killer.killed] == list(kills.values())
    assert all("died" in r.reason for r in restarts)
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]
    assert digest.state is not None and reference.state is not None
    assert_states_equal(digest.state, reference.state)
    assert digest.value == reference.value
    return [(r.role, r.resumed_step) for r in restarts]



@pytest.mark.slow  # four deployments of five role processes start (~30 s on two idle cores)
def test_bagpipe_recovers_bit_identical_from_trainer_and_server_kills(tmp_path: Path) -> None:
    def factory() -> System:
        return Bagpipe(num_trainers=2, num_servers=2, lookahead=8)

    restarts = _kill_and_recover(factory, {7: "trainer_1", 11: "server_0"}, tmp_path)
    assert restarts == [("trainer_1", 5), ("server_0", 10)]


@pytest.mark.slow
def test_sync_ps_recovers_bit_identical_from_a_server_kill(tmp_path: Path) -> None:
    """Bit for bit: the shards sum each step's pushes in trainer order, not in arrival order."""
    from baselines.sync_ps import SyncPS

    def factory() -> System:
        return SyncPS(num_trainers=2, num_servers=2)

    assert _kill_and_recover(factory, {6: "server_1"}, tmp_path) == [("server_1", 5)]


def test_torchrec_recovers_bit_identical_from_a_trainer_kill(tmp_path: Path) -> None:
    """A killed TorchRec rank takes its shards with it: the job restarts from the checkpoint."""
    from baselines.torchrec_sharding import TorchRecSharding

    def factory() -> System:
        return TorchRecSharding(num_trainers=2, sharding="row_wise", kernel="fused")

    assert _kill_and_recover(factory, {7: "trainer_1"}, tmp_path) == [("trainer_1", 5)]
