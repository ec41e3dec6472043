"""Replace a dead role in place (path ``replace``) or restart the job (``rollback``), bit-identical.

``sync_ps`` with a standby trainer: a killed trainer is replaced by the standby with no step
redone, a killed server shard still restarts the whole job from the checkpoint (and says why),
both in one run; the final model equals an uninterrupted run's bit for bit, and nothing is left
behind (role processes, the roles' temporary files, network namespaces). The run is on the
``netns`` back-end where it exists, so the standby lives in a namespace of its own.

The fast-path test can fail only on the fast path: rollback is bit-identical too, so it asserts
that the ``replace`` path ran, that it redid 0 steps, and that the run trained every step once.
Kills land at random steps, drawn anew on every run (``kill_steps``: the seed is in pytest's
header and each failure names its kills).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from bagpipe.core.batch import Batch
from bagpipe.core.checkpoint import CheckpointStore
from bagpipe.core.interface import ModelState, StepResult, System, TrainContext
from bagpipe.core.net import NetworkConfig, Topology, netns_available
from bagpipe.core.net.netns import Switch
from bagpipe.core.recovery import LOGS_PAUSED, REPLACE, ROLLBACK, PausableRecoveryLogs
from bagpipe.harness.run.faults import KillRoles
from bagpipe.harness.run.recovery import run_with_recovery
from bagpipe.harness.run.runner import run_training
from tests.fault.kill_steps import draw, killable, resumed_step
from tests.fault.test_kill_roles import (
    CFG,
    EVERY,
    SCHEMA,
    STEPS,
    Digest,
    _context,
    _eval_source,
    _maker,
)

KILLABLE = killable(STEPS, EVERY)
NETWORK = (
    NetworkConfig("netns", Topology.uniform(100.0, servers=2))
    if netns_available() is None else NetworkConfig("model", Topology.uniform(100.0, servers=2))
)


def _children() -> set[int]:
    """This process's child processes (role processes, namespace holders, the fork server)."""
    mine = str(os.getpid())
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if stat.read_text().rsplit(")", 1)[1].split()[1] == mine:
                found.add(int(stat.parent.name))
    return found


def _leftovers(tmp: Path) -> tuple[set[int], set[str], list[Path]]:
    """What a run could leave behind: child processes (a namespace lives as long as its holder
    process), this process's network interfaces (named for its switch: other processes on the
    machine have their own), the roles' temporary files."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    tag = Switch._instance.tag if Switch._instance is not None else None
    return _children(), {n for n in names if tag and n.startswith(tag)}, sorted(tmp.iterdir())


def _network_context() -> TrainContext:
    return replace(_context(), network=NETWORK)


def _trainer_then_server(test: str) -> tuple[int, int]:
    """A trainer kill, then a server kill after the first checkpoint (so its rollback resumes
    from a checkpoint), at steps drawn for ``test`` (``kill_steps``)."""
    rng = draw(test)
    server = rng.choice([step for step in KILLABLE if step >= EVERY])
    return rng.choice([step for step in KILLABLE if step < server]), server


def _kills(test: str, roles: tuple[str, ...]) -> dict[int, str]:
    """``roles`` killed in a random order, one each at distinct random steps."""
    rng = draw(test)
    return dict(zip(sorted(rng.sample(KILLABLE, len(roles))), rng.sample(roles, len(roles)),
                    strict=True))


def test_sync_ps_replaces_a_dead_trainer_without_redoing_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from baselines.sync_ps import SyncPS

    make, systems = _maker(lambda: SyncPS(num_trainers=2, num_servers=2))
    reference = Digest(systems)
    run_training(make(), _network_context(), _eval_source(), CFG, [reference])
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = _leftovers(tmp_path / "tmp")  # the switch and the fork server stay: per process

    make, systems = _maker(lambda: SyncPS(num_trainers=2, num_servers=2, standby_trainers=1))
    t, s = _trainer_then_server("sync_ps_replaces")
    digest, killer = Digest(systems), KillRoles({t: "trainer_1", s: "server_0"})
    result, recoveries = run_with_recovery(
        make, _network_context(), _eval_source(), CFG, CheckpointStore(tmp_path / "ckpt"),
        [killer, digest],
    )
    trainer, server = recoveries
    kills = f"kills: trainer_1 after step {t}, server_0 after step {s}"
    assert (trainer.role, trainer.path, trainer.failed_step, trainer.steps_redone) == (
        "trainer_1", REPLACE, t + 1, 0), kills
    assert trainer.recovery_s > 0
    assert (server.role, server.path, server.resumed_step) == (
        "server_0", ROLLBACK, resumed_step(s, EVERY)), kills
    assert server.fallback == "no standby server left"
    assert len(systems) == 2  # the trainer's death did not restart the job
    assert result.summary["steps_redone"] == server.steps_redone
    assert [r["path"] for r in result.stats["recoveries"]] == [REPLACE, ROLLBACK]
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert digest.value == reference.value, kills

    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]
    assert _leftovers(tmp_path / "tmp") == before


def test_sync_ps_rebuilds_dead_shards_in_place_from_the_logged_pushes(tmp_path: Path) -> None:
    """Both shards and a trainer die, in a random order at random steps: a shard rebuilt before
    the first checkpoint starts from the start rows, one after it from its rows, one after a
    trainer was replaced from the rebuilt trainers' logs, which start there. Every death takes the
    ``replace`` path, no step is redone, the job is never restarted, and the final model is
    bit-identical to an uninterrupted run's."""
    from baselines.sync_ps import SyncPS

    make, systems = _maker(lambda: SyncPS(num_trainers=2, num_servers=2))
    reference = Digest(systems)
    run_training(make(), _network_context(), _eval_source(), CFG, [reference])

    make, systems = _maker(
        lambda: SyncPS(num_trainers=2, num_servers=2, standby_trainers=1, standby_servers=2)
    )
    digest = Digest(systems)
    kills = _kills("sync_ps_rebuilds", ("server_1", "trainer_1", "server_0"))
    result, recoveries = run_with_recovery(
        make, _network_context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [KillRoles(kills), digest],
    )
    assert [(r.role, r.path, r.failed_step, r.steps_redone, r.fallback) for r in recoveries] == [
        (role, REPLACE, step + 1, 0, "") for step, role in kills.items()], kills
    assert len(systems) == 1  # never restarted
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert digest.value == reference.value, kills
    assert result.summary["per_iter_recovery_log_cpu_s"] > 0  # the push log's cost is counted
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]


class _ArmShard:
    """Callback: after step ``step - 1``, arm ``server_0`` to die in ``step``'s ``call``."""

    def __init__(self, systems: list[System], call: str, step: int) -> None:
        self.systems, self.call, self.step = systems, call, step

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.step - 1:
            self.systems[-1].arm(0, self.call, self.step)  # type: ignore[attr-defined]


@pytest.mark.parametrize("call", ["pull", "push"])
def test_sync_ps_rebuilds_a_shard_that_died_inside_a_step(call: str, tmp_path: Path) -> None:
    """The shard serves one trainer's pull (or push) of a step and dies before the other's: the
    first trainer would wait in the dense all-reduce for the other (or apply the step alone). The
    second goes on through the step's collectives on zero rows, and the trainers' agreement after
    the acks (``SyncPSTrainer``) makes both leave the step, so the shard is rebuilt in place,
    quickly, with no step redone, and the run ends bit-identical."""
    from baselines.sync_ps import SyncPS
    from tests.fault.dying_shard import SyncPSWithDyingShards

    make, systems = _maker(lambda: SyncPS(num_trainers=2, num_servers=2))
    reference = Digest(systems)
    run_training(make(), _network_context(), _eval_source(), CFG, [reference])

    timeout_s = 30.0  # what a trainer left waiting in the all-reduce would cost the driver
    make, systems = _maker(lambda: SyncPSWithDyingShards(
        num_trainers=2, num_servers=2, step_timeout_s=timeout_s, standby_servers=1))
    digest = Digest(systems)
    step = draw(f"sync_ps_inside_{call}").randrange(1, STEPS)
    result, recoveries = run_with_recovery(
        make, _network_context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [_ArmShard(systems, call, step), digest],
    )
    where = f"server_0 died in the second {call} of step {step}"
    assert [(r.role, r.path, r.failed_step, r.steps_redone, r.fallback) for r in recoveries] == [
        ("server_0", REPLACE, step, 0, "")], where
    assert recoveries[0].recovery_s < timeout_s / 2, where
    assert len(systems) == 1  # never restarted
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert digest.value == reference.value, where
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]


class _PauseLogs:
    """Callback: the system's recovery logs off after step ``off`` and on again after ``on``."""

    def __init__(self, systems: list[System], off: int, on: int) -> None:
        self.systems, self.off, self.on = systems, off, on

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if step in (self.off, self.on):
            system = self.systems[-1]
            assert isinstance(system, PausableRecoveryLogs)
            system.pause_recovery_logs(step == self.off)


@pytest.mark.parametrize("name", ["sync_ps", "bagpipe"])
def test_paused_recovery_logs_cost_nothing_and_refuse_the_fast_path_after(
    name: str, tmp_path: Path
) -> None:
    """What the fault bench's A/B relies on: while paused, no step spends anything on the logs;
    once resumed they do again; and since a paused log misses steps, a later death rolls back
    (bit-identical) and says why, instead of replacing from a log with a hole in it."""
    from bagpipe.lrpp import Bagpipe
    from baselines.sync_ps import SyncPS

    def build(**standbys: int) -> System:
        if name == "sync_ps":
            return SyncPS(num_trainers=2, num_servers=2, **standbys)
        return Bagpipe(num_trainers=2, num_servers=2, lookahead=8, **standbys)

    make, systems = _maker(build)
    reference = Digest(systems)
    run_training(make(), _context(), _eval_source(), CFG, [reference])

    make, systems = _maker(lambda: build(standby_trainers=1, standby_servers=1))
    digest = Digest(systems)
    off, on, kill = 1, 3, 7  # paused for steps 2 and 3; a shard killed after the checkpoint
    result, (recovery,) = run_with_recovery(
        make, _context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [_PauseLogs(systems, off, on), KillRoles({kill: "server_0"}), digest],
    )
    logged = [m.get("recovery_log_cpu_s", 0.0) > 0 for m in result.steps[: kill + 1]]
    assert logged == [True, True, False, False, True, True, True, True]
    assert (recovery.path, recovery.resumed_step, recovery.fallback) == (
        ROLLBACK, resumed_step(kill, EVERY), LOGS_PAUSED)
    assert digest.value == reference.value


def test_bagpipe_rebuilds_dead_shards_in_place_from_the_logged_write_backs(
    tmp_path: Path,
) -> None:
    """As sync_ps's test, for Bagpipe: a dead shard's rows come back from the base model (the
    start's, then the checkpoint's) and the trainers' logged write-backs
    (``bagpipe.lrpp.writebacklog``), the rows the trainers cache from their caches. Both shards
    may be found dead at once (a shard's death is met at the next round that calls it): both are
    then rebuilt in one replacement. (A trainer
    kill is not added here: when it lands before the dead trainer's share of the step's
    sync-later all-reduce arrived, the replacement rightly falls back to the checkpoint.)"""
    from bagpipe.lrpp import Bagpipe

    make, systems = _maker(lambda: Bagpipe(num_trainers=2, num_servers=2, lookahead=8))
    reference = Digest(systems)
    run_training(make(), _network_context(), _eval_source(), CFG, [reference])

    make, systems = _maker(lambda: Bagpipe(
        num_trainers=2, num_servers=2, lookahead=8, standby_servers=2))
    digest = Digest(systems)
    kills = _kills("bagpipe_rebuilds", ("server_1", "server_0"))
    result, recoveries = run_with_recovery(
        make, _network_context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [KillRoles(kills), digest],
    )
    # Kills a step apart can both be met at the next round, and are then replaced together.
    assert sorted((r.role, r.path, r.steps_redone, r.fallback) for r in recoveries) == sorted(
        (role, REPLACE, 0, "") for role in kills.values()), kills
    assert len(systems) == 1  # never restarted
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert digest.value == reference.value, kills
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]


def test_standby_servers_are_refused_where_shards_cannot_be_rebuilt() -> None:
    from bagpipe.paramserver import ParameterServerSystem

    class Plain(ParameterServerSystem):  # shards that apply pushes as they come (HET, FAE)
        name = "plain"

        def train_step(self, step: int, batch: Batch) -> StepResult:
            raise NotImplementedError

        def full_state(self) -> ModelState:
            raise NotImplementedError

    with pytest.raises(ValueError, match=r"system\.standby_servers: plain cannot rebuild"):
        Plain(2, 2, 60.0, standby_servers=1)


def test_without_a_standby_a_trainer_death_rolls_back_and_says_why(tmp_path: Path) -> None:
    from baselines.sync_ps import SyncPS

    def make() -> System:
        return SyncPS(num_trainers=2, num_servers=2)

    _, (recovery,) = run_with_recovery(
        make, _context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [KillRoles({6: "trainer_0"})],
    )
    assert (recovery.path, recovery.resumed_step, recovery.fallback) == (
        ROLLBACK, 5, "no standby trainer left")


def test_bagpipe_replaces_a_dead_trainer_without_redoing_a_step(tmp_path: Path) -> None:
    """The dead trainer held partitioned singletons with updates not yet written back: they come
    back from its update log (``bagpipe.lrpp.updatelog``), the rest from the survivor's cache and
    the servers, with no step redone; a server shard killed later restarts the job from the
    checkpoint, and the run ends bit-identical."""
    from bagpipe.lrpp import Bagpipe

    make, systems = _maker(lambda: Bagpipe(num_trainers=2, num_servers=2, lookahead=8))
    reference = Digest(systems)
    run_training(make(), _network_context(), _eval_source(), CFG, [reference])

    class FoldingBagpipe(Bagpipe):
        log_fold_min_rows = 1  # the driver folds its update logs in this short run too

    make, systems = _maker(
        lambda: FoldingBagpipe(num_trainers=2, num_servers=2, lookahead=8, standby_trainers=1)
    )
    digest = Digest(systems)
    t, s = _trainer_then_server("bagpipe_replaces")
    result, (recovery, server) = run_with_recovery(
        make, _network_context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [KillRoles({t: "trainer_1", s: "server_0"}, after_s=0.2), digest],
    )
    kills = f"kills: trainer_1 after step {t}, server_0 after step {s}"
    assert (recovery.role, recovery.path, recovery.failed_step, recovery.steps_redone) == (
        "trainer_1", REPLACE, t + 1, 0), (kills, recovery.fallback)
    # a checkpoint taken after the replacement was taken from the rebuilt roles
    assert (server.role, server.path, server.resumed_step) == (
        "server_0", ROLLBACK, resumed_step(s, EVERY)), kills
    assert len(systems) == 2
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert digest.value == reference.value, kills
    # the log's own CPU cost is counted, on the trainers and the driver (``bench.fault``)
    assert result.summary["per_iter_recovery_log_cpu_s"] > 0
    assert result.summary["per_iter_recovery_log_record_cpu_s"] > 0
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]


class _ArmWriter:
    """Callback: after step ``step``, arm ``trainer_0`` to hold back round ``round_index``'s
    write-backs (``slow_writer``)."""

    def __init__(self, systems: list[System], step: int, round_index: int) -> None:
        self.systems, self.step, self.round_index = systems, step, round_index

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.step:
            self.systems[-1].arm(0, self.round_index)  # type: ignore[attr-defined]


def test_bagpipe_replaces_a_trainer_that_died_before_its_write_backs_left(tmp_path: Path) -> None:
    """trainer_0 evicts a round's rows and dies before its write-backs reach a server, while
    trainer_1 has evicted the round's replicated rows that trainer_0 writes back: their values
    live on only in the replicas trainer_1 kept, and trainer_0's evicted singletons only in its
    log, which an unacknowledged eviction has not cleared (``bagpipe.lrpp.updatelog``). The round
    is one where that happens (replayed from the oracle's plans). The replacement takes both,
    redoes no step, and the run ends bit-identical."""
    from bagpipe.lrpp import Bagpipe
    from bagpipe.training.start import TrainingStream
    from tests.fault.slow_writer import BagpipeWithSlowWriters, rounds_evicting_replicas_of

    make, systems = _maker(lambda: Bagpipe(num_trainers=2, num_servers=2, lookahead=8))
    reference = Digest(systems)
    run_training(make(), _network_context(), _eval_source(), CFG, [reference])

    config = Bagpipe(num_trainers=2, num_servers=2, lookahead=8).oracle_config
    stream = TrainingStream(_context().source, 0, STEPS)
    # Round r evicts while steps (r-1)*ci.. run: armed before it starts, killed once it evicted.
    steps = [(r - 1) * config.ci for r in rounds_evicting_replicas_of(0, 1, SCHEMA, config, stream)]
    step = draw("bagpipe_unwritten").choice([s for s in steps if s in KILLABLE and s > 0])
    make, systems = _maker(lambda: BagpipeWithSlowWriters(
        num_trainers=2, num_servers=2, lookahead=8, standby_trainers=1))
    digest = Digest(systems)
    result, recoveries = run_with_recovery(
        make, _network_context(), _eval_source(), CFG, CheckpointStore(tmp_path),
        [_ArmWriter(systems, step - 1, step // config.ci + 1),
         KillRoles({step: "trainer_0"}, after_s=0.3), digest],
    )
    where = f"trainer_0 killed after step {step}, its round {step // config.ci + 1} not written back"
    assert [(r.role, r.path, r.failed_step, r.steps_redone, r.fallback) for r in recoveries] == [
        ("trainer_0", REPLACE, step + 1, 0, "")], where
    assert len(systems) == 1
    assert [int(m["step"]) for m in result.steps] == list(range(STEPS))
    assert digest.value == reference.value, where
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("bagpipe-")]
