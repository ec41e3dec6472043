"""The cost model: hand-computed flow times, overlap rules, topology files, and -- the point of it --
predictions from a network-off run within 15% (HET: 20%) of the iteration time measured on the emulated
network.

The validation runs each networked system once with nothing emulated (its compute time and its
exact bytes) and once per bandwidth on the ``model`` back-end (NICs shared max-min fairly by
concurrent transfers); the bandwidths are low enough that wire time is most of an iteration, so
the check tests the byte accounting and the overlap rules rather than CPU noise. Every system with
a network is validated with the same two shards: ``sync_ps``, ``bagpipe``, ``het``, ``fae`` (with a
hot set small enough that the measured window holds hot steps, cold steps and swaps both ways) and
``torchrec`` (its default planner, which shards these tables table-wise: three all-to-all rounds a
step).

What the model cannot see, and why measured steps run a few percent over it: each emulated message
is a wait, and on a loaded host a trainer waking from one waits for a core (a few ms per message
that the network-off run does not pay); and the Meter sums bytes over trainers, so the model
spreads them evenly over trainers and shards while a step waits for the busiest. The model also
serialises every flow that crosses a trainer's NIC; where trainers' background traffic interleaves
on a shared server NIC in both directions at once, reality is a little faster than that.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from bagpipe.core.batch import DatasetSchema
from bagpipe.core.interface import OptimConfig, System, TrainContext
from bagpipe.core.net import Compute, NetworkConfig, Nic, Topology
from bagpipe.harness.report.costmodel import (
    CRITICAL,
    SYSTEM_RULES,
    Prediction,
    Workload,
    predict,
    server_lane,
)
from bagpipe.harness.run.runner import RunConfig, RunResult, run_training
from bagpipe.models import table_dim
from tests.conftest import TINY_MODEL, TinySource

ROOT = Path(__file__).resolve().parents[2]
#: TCP payload per full Ethernet frame: 1448 of 1514 bytes (the rate the model charges payload at).
PAYLOAD = 1448 / 1514


def _workload(system: str, **kwargs: object) -> Workload:
    base: dict[str, object] = dict(
        system=system, bytes_per_iter={}, counters={}, compute_s=0.010, trainers=2, servers=2,
        row_bytes=64,
    )
    base.update(kwargs)
    return Workload(**base)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- hand-computed


def test_local_is_its_compute_time() -> None:
    topology = Topology.uniform(0.001, 50, trainers=2, servers=2)
    assert predict(_workload("local"), topology).iter_s == pytest.approx(0.010)


def test_sync_ps_puts_every_byte_on_the_critical_path() -> None:
    # 2 trainers, 2 shards, 1 Gbps NICs, 100 us: each trainer pulls 1e6 B through its own NIC,
    # and each shard's NIC serves half of both trainers' pulls: 1e6 B as well.
    work = _workload(
        "sync_ps", bytes_per_iter={"emb_pull": 2e6, "emb_push": 2e6, "allreduce": 4e5}
    )
    got = predict(work, Topology.uniform(1.0, 100, trainers=2, servers=2))
    pull = 2 * 100e-6 + 1e6 * 8 / (1e9 * PAYLOAD)
    push = 100e-6 + 1e6 * 8 / (1e9 * PAYLOAD)
    ring = 2 * 100e-6 + 2 * 2e5 * 8 / 2 / (1e9 * PAYLOAD)  # 2(T-1) steps of bytes/T, per trainer 2e5 B
    assert got.iter_s == pytest.approx(0.010 + pull + push + ring)
    assert got.lanes_s == {}


def test_bagpipe_sync_later_overlaps_compute_but_queues_on_the_nic() -> None:
    # 1000 sync-later rows of 64 B per trainer; the rest of the all-reduce is sync-now + dense.
    later_bytes = 1000 * 64
    work = _workload(
        "bagpipe",
        bytes_per_iter={"allreduce": 2 * (later_bytes + 32_000)},
        counters={"rows_sync_later": 1000.0},
    )
    topology = Topology.uniform(0.01, 0, trainers=2, servers=2)
    now_s = 32_000 * 8 / (0.01e9 * PAYLOAD)  # ring of 2: one step of bytes/2 twice = bytes on the wire
    later_s = later_bytes * 8 / (0.01e9 * PAYLOAD)
    got = predict(work, topology)
    assert got.critical_s == pytest.approx(0.010 + now_s)
    assert got.lanes_s["sync_later"] == pytest.approx(later_s + now_s)
    assert got.iter_s == pytest.approx(now_s + max(0.010, later_s))


def test_bagpipe_rounds_only_cost_when_they_fall_behind() -> None:
    slow = _workload("bagpipe", bytes_per_iter={"emb_pull": 2e6}, knobs={"cleanup_interval": 4})
    fast = dataclasses.replace(slow, bytes_per_iter={"emb_pull": 2e4})
    topology = Topology.uniform(0.1, 50, trainers=2, servers=2)
    assert predict(fast, topology).iter_s == pytest.approx(0.010)
    behind = predict(slow, topology)
    assert behind.iter_s == pytest.approx(behind.lanes_s["rounds"]) and behind.iter_s > 0.010


def test_fae_pulls_from_every_shard_at_once_through_the_shared_client() -> None:
    # 2 trainers pulled 1000 rows of 64 B in all, each row asked for by an 8 B id; FAE's client
    # (the shared parameter-server client, as sync_ps's) asks every shard at once.
    work = _workload("fae", bytes_per_iter={"emb_pull": 1000 * (64 + 8)},
                     counters={"rows_emb_pull": 1000.0})
    got = predict(work, Topology.uniform(0.01, 100, trainers=2, servers=2))
    pull = 2 * 100e-6 + 500 * (64 + 8) * 8 / (0.01e9 * PAYLOAD)  # request + reply; half the rows per trainer
    assert got.flows_s["emb_pull:critical"] == pytest.approx(pull)
    assert got.iter_s == pytest.approx(0.010 + pull)


def test_torchrec_pays_one_latency_per_all_to_all_round() -> None:
    work = _workload("torchrec", bytes_per_iter={"alltoall": 2e4}, trainers=4)
    got = predict(work, Topology.uniform(0.01, 100, trainers=4, servers=1))
    # Each trainer sends 5e3 B to its 3 peers through its one NIC, in 3 rounds, and (gloo) then
    # receives as much.
    assert got.iter_s == pytest.approx(0.010 + 3 * 100e-6 + 2 * 5e3 * 8 / (0.01e9 * PAYLOAD))


def test_shared_nics_charge_the_server_for_every_trainer() -> None:
    work = _workload("sync_ps", bytes_per_iter={"emb_pull": 8e6}, trainers=8, servers=1)
    nics = Topology(trainers=8, servers=1, trainer_nic=Nic(10, 10, 0), server_nic=Nic(25, 25, 0))
    # Each trainer pulls 1e6 B; the one server sends 8e6 B through its 25 Gbps NIC.
    assert predict(work, nics).iter_s == pytest.approx(0.010 + 8e6 * 8 / (25e9 * PAYLOAD))


def test_projection_uses_the_gpu_compute_estimate() -> None:
    work = _workload("local", dense_params=1_000_000, batch_size=64)
    gpu = Topology(trainers=8, compute=Compute("gpu", peak_tflops=10.0, efficiency=0.5,
                                               overhead_ms=1.0), batch_size=16384)
    want = 6 * 1e6 * 16384 / 8 / 5e12 + 1e-3
    assert predict(work, gpu).iter_s == pytest.approx(want)


def test_topology_files_load_and_bad_keys_name_the_file(tmp_path: Path) -> None:
    paper = Topology.load(ROOT / "suites" / "topology" / "paper.yaml")
    assert (paper.trainers, paper.trainer_nic.egress_gbps, paper.server_nic.egress_gbps) == (
        8, 10.0, 25.0
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainers: 8\ntrainer_gbit: 10\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*trainer_gbit"):
        Topology.load(bad)
    bad.write_text("trainers: 0\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*topology\.trainers"):
        Topology.load(bad)
    bad.write_text("server_nic: {egress_gbps: 0}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*egress_gbps"):
        Topology.load(bad)


def test_server_cpu_waits_on_the_lane_of_the_pulls_it_answers() -> None:
    """The servers' CPU goes where each system's own rule puts its pull: on the critical path of a
    step that waits for its pulls, on the background lane of one that prefetches (hidden while
    that lane keeps up), and nowhere for a system that asks no server."""
    assert {name: server_lane(rule) for name, rule in SYSTEM_RULES.items()} == {
        "local": None, "sync_ps": CRITICAL, "fae": CRITICAL, "het": "comm", "bagpipe": "rounds",
        "torchrec": None, "embedding_free": None,
    }
    topology = Topology.uniform(1.0, 100, trainers=2, servers=2)
    traffic = {"emb_pull": 2e5, "emb_push": 2e5, "emb_meta": 2e4, "allreduce": 4e4,
               "alltoall": 2e5}

    def both(system: str, server_cpu_s: float, **kwargs: object) -> tuple[Prediction, Prediction]:
        work = _workload(system, bytes_per_iter=traffic, **kwargs)
        return (predict(work, topology),
                predict(dataclasses.replace(work, server_cpu_s=server_cpu_s), topology))

    for system in ("sync_ps", "fae"):  # the step waits for its pulls, so for the servers too
        without, served = both(system, 0.004)
        assert served.critical_s == pytest.approx(without.critical_s + 0.004), system
        assert served.iter_s == pytest.approx(without.iter_s + 0.004), system
        assert served.compute_s == without.compute_s, system

    without, served = both("het", 0.004)  # the comm thread's lane: its time grows, hidden
    assert served.lanes_s["comm"] == pytest.approx(without.lanes_s["comm"] + 0.004)
    assert served.critical_s == pytest.approx(without.critical_s)
    assert served.iter_s == pytest.approx(without.iter_s) == pytest.approx(without.critical_s)
    without, behind = both("het", 0.030)  # ... until the servers hold the lane back
    assert behind.iter_s == pytest.approx(behind.lanes_s["comm"])
    assert behind.iter_s == pytest.approx(without.lanes_s["comm"] + 0.030)
    assert behind.iter_s > behind.critical_s == pytest.approx(without.critical_s)

    without, served = both("bagpipe", 0.004, knobs={"cleanup_interval": 4})
    assert served.lanes_s["rounds"] == pytest.approx(without.lanes_s["rounds"] + 0.004)
    assert served.lanes_s["sync_later"] == pytest.approx(without.lanes_s["sync_later"])
    assert served.critical_s == pytest.approx(without.critical_s)

    without, served = both("torchrec", 0.004)  # no servers: nothing to charge
    assert served == without


def test_unknown_system_is_named() -> None:
    with pytest.raises(KeyError, match="nope"):
        predict(_workload("nope"), Topology())


# ---------------------------------------------------------------------------- against the emulation

SCHEMA = DatasetSchema(
    name="costmodel", num_dense=3, table_sizes=(400, 3000, 120, 5000),
    feature_names=("a", "b", "c", "d"),
)
MODEL = dataclasses.replace(TINY_MODEL, embedding_dim=32, bottom_mlp=(8, 32))
BATCH, STEPS, WARMUP = 128, 12, 4


@dataclass(frozen=True)
class Validation:
    """How one system is validated: the bandwidths, the steps of each run (data: STEPS), and how
    far the measured iteration may be from the prediction."""

    bandwidths_gbps: tuple[float, ...]
    steps: int = STEPS
    warmup: int = WARMUP
    tolerance: float = 0.15


# 0.5 and 0.2 Mbit/s: wire time >> CPU noise on a shared host (a loaded host adds a few ms to a
# step per emulated transfer). FAE (a cold step pulls and pushes every row it uses; swaps move the
# hot set) and TorchRec (pooled embeddings and their gradients cross every step) move several
# times more bytes per step, so they run fewer, longer steps (the FAE window still holds a swap
# each way) to keep wire time as dominant within ~25 s a case.
VALIDATIONS = {
    "sync_ps": Validation((0.0005, 0.0002)),
    "bagpipe": Validation((0.0005, 0.0002)),
    # HET's communication thread and the other trainer's meet on the shards' NICs at moments the
    # lane sum cannot see (asp: which rows miss, and when, depends on timing); measured 9-16% over
    # the prediction on 2 loaded cores, so its bound is wider.
    "het": Validation((0.0005, 0.0002), tolerance=0.2),
    "fae": Validation((0.0005, 0.0003), steps=8, warmup=2),
    "torchrec": Validation((0.0005, 0.0003), steps=8, warmup=2),
}
LATENCY_US = 50.0
#: FAE with a small hot set so that the run has hot and cold steps and swaps between them.
FAE_SETTINGS: dict[str, object] = dict(
    sample_rate=1.0, min_table_bytes=0, threshold_mode="code", hot_budget_bytes=256 * 128,
    initial_rate=50, epochs=2,
)


def _system(name: str) -> tuple[System, int, dict[str, float]]:
    """The system, its number of shards, and the knobs its rule reads."""
    if name == "sync_ps":
        from baselines.sync_ps import SyncPS

        return SyncPS(num_trainers=2, num_servers=2), 2, {}
    if name == "bagpipe":
        from bagpipe.lrpp import Bagpipe

        system = Bagpipe(num_trainers=2, num_servers=2, lookahead=8)
        return system, 2, {"cleanup_interval": float(system.oracle_config.ci)}
    if name == "het":
        from baselines.het.system import HET

        return HET(num_trainers=2, num_servers=2), 2, {}
    if name == "fae":
        from baselines.fae import FAE

        return FAE(num_trainers=2, num_servers=2, **FAE_SETTINGS), 2, {}
    from baselines.torchrec_sharding import TorchRecSharding

    return TorchRecSharding(num_trainers=2), 1, {}


def _run(name: str, bandwidth_gbps: float | None,
         workdir: Path = Path(".")) -> tuple[RunResult, int, dict[str, float]]:
    system, servers, knobs = _system(name)
    topology = Topology.uniform(bandwidth_gbps or 10.0, LATENCY_US, trainers=2, servers=servers)
    network = NetworkConfig("model" if bandwidth_gbps is not None else "real", topology)
    ctx = TrainContext(
        schema=SCHEMA, model=MODEL, optim=OptimConfig(embedding_lr=0.1, dense_lr=0.1),
        global_batch_size=BATCH, seed=0, source=TinySource(SCHEMA, BATCH, STEPS, seed=0),
        network=network, workdir=workdir,
    )
    plan = VALIDATIONS[name]
    result = run_training(system, ctx, TinySource(SCHEMA, BATCH, 1, seed=9),
                          RunConfig(plan.steps, eval_every=0, warmup_steps=plan.warmup,
                                    progress=False))
    return result, servers, knobs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(VALIDATIONS))
def test_prediction_from_a_network_off_run_within_15_percent(name: str, tmp_path: Path) -> None:
    base, servers, knobs = _run(name, None, tmp_path)
    workload = Workload.from_steps(
        name, base.steps[VALIDATIONS[name].warmup:], base.summary["iter_time_mean_s"], trainers=2,
        servers=servers, row_bytes=table_dim(MODEL) * 4, knobs=knobs,
    )
    assert name in SYSTEM_RULES
    if name == "fae":  # the window must hold hot and cold steps and the swaps between them
        hot = [step["fae_hot_step"] for step in base.steps[VALIDATIONS[name].warmup:]]
        assert 0 < sum(hot) < len(hot) and workload.bytes_per_iter.get("h2d", 0.0) > 0, hot
    errors = {}
    for bandwidth in VALIDATIONS[name].bandwidths_gbps:
        measured = _run(name, bandwidth, tmp_path)[0].summary["iter_time_mean_s"]
        topology = Topology.uniform(bandwidth, LATENCY_US, trainers=2, servers=servers)
        predicted = predict(workload, topology)
        # Wire time must dominate, or the check would only measure CPU noise.
        assert predicted.network_share > 0.5, (name, bandwidth, predicted)
        errors[bandwidth] = (measured, predicted.iter_s, (predicted.iter_s - measured) / measured)
    assert all(math.isfinite(e) and abs(e) <= VALIDATIONS[name].tolerance for *_, e in errors.values()), errors
