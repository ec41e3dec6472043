"""The wire's one rule for counting (in-process, no roles): what lands in a trainer's Meter and in
every role's NIC ledger, and what the driver's control path leaves out."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from bagpipe.core.meter import LinkKind, Meter
from bagpipe.core.net import NetworkConfig, Topology
from bagpipe.core.net.fairshare import SharedNics
from bagpipe.core.net.wire import Ledger, Wire, payload

ROWS = torch.zeros(5, 4)  # 5 embedding rows of 4 floats: 80 bytes
IDS = torch.arange(5)  # 40 bytes


@dataclass
class Reply:
    positions: torch.Tensor
    rows: torch.Tensor
    wire_kinds: ClassVar[dict[str, str]] = {"rows": LinkKind.EMB_PULL}


def _wire(role: str) -> Wire:
    return Wire(role, NetworkConfig("real", Topology.uniform(10.0, servers=2)), Meter())


def test_payload_walks_containers_and_books_dataclass_fields_under_their_kinds() -> None:
    sizes = payload(({"a": IDS}, [Reply(IDS, ROWS)]), LinkKind.EMB_META)
    assert sizes == {"emb_meta": (80, 0), "emb_pull": (80, 5)}  # rows: 2-D floats of a row kind
    assert payload((IDS, ROWS), LinkKind.DATA) == {"data": (120, 0)}  # data rows are not rows


def test_a_trainer_counts_both_directions_and_its_ledger_the_nic() -> None:
    trainer = _wire("trainer_0")
    sent = trainer.outgoing("server_1", LinkKind.EMB_PULL, (IDS,), {})
    trainer.replied("server_1", LinkKind.EMB_PULL, ROWS)
    record = trainer.meter.end_step()
    assert sent == 40
    assert record.bytes_sent == {"emb_pull": 120}
    assert record.rows_sent == {"emb_pull": 5}
    assert trainer.ledger.tx == {"emb_pull": 40} and trainer.ledger.rx == {"emb_pull": 80}


def test_a_server_keeps_a_ledger_and_never_counts() -> None:
    server = _wire("server_1")
    server.incoming("trainer_0", LinkKind.EMB_PULL, (IDS,), {})
    server.reply("trainer_0", LinkKind.EMB_PULL, ROWS)
    assert server.meter.end_step().bytes_sent == {}
    assert (server.ledger.rx_bytes, server.ledger.tx_bytes) == (40, 80)


def test_a_trainer_counts_what_a_non_trainer_sends_it() -> None:
    trainer = _wire("trainer_1")
    trainer.incoming("oracle", LinkKind.DATA, (IDS,), {})  # plans pushed by the oracle
    assert trainer.meter.end_step().bytes_sent == {"data": 40}
    assert trainer.ledger.rx_bytes == 40


def test_the_drivers_control_path_is_off_the_nics_and_counted_only_when_tagged() -> None:
    trainer = _wire("trainer_0")
    trainer.incoming("driver", LinkKind.DATA, (IDS,), {})  # its batch slice: a local read
    trainer.incoming("driver", LinkKind.CONTROL, (ROWS,), {})  # e.g. a constructor argument
    trainer.reply("driver", LinkKind.CONTROL, ROWS)  # e.g. a state gathered for evaluation
    assert trainer.meter.end_step().bytes_sent == {"data": 40}
    assert trainer.ledger.tx_bytes == trainer.ledger.rx_bytes == 0
    assert not trainer.delays("driver")


def test_two_roles_of_one_host_talk_over_loopback() -> None:
    shard = _wire("server_3")  # with 2 server hosts, shards 1 and 3 share host server_1
    shard.reply("server_1", LinkKind.EMB_PULL, ROWS)
    assert shard.ledger.tx_bytes == 0


def test_collectives_count_payload_in_the_meter_and_wire_bytes_in_the_ledger() -> None:
    trainer = _wire("trainer_0")
    trainer.collective(LinkKind.ALLREDUCE, payload_bytes=1000, sends={"trainer_1": 1500},
                       receives=1500)
    assert trainer.meter.end_step().bytes_sent == {"allreduce": 1000}
    assert (trainer.ledger.tx_bytes, trainer.ledger.rx_bytes) == (1500, 1500)


def test_a_ledger_adds_up_each_kind_and_refuses_an_unknown_direction() -> None:
    ledger = Ledger()
    ledger.add("tx", "emb_pull", 40)
    ledger.add("tx", "emb_pull", 2)
    ledger.add("rx", "data", 7)
    assert (ledger.tx, ledger.rx) == ({"emb_pull": 42}, {"data": 7})
    with pytest.raises(KeyError):
        ledger.add("sideways", "data", 1)


def test_payload_skips_what_is_not_a_tensor_and_books_plain_dataclasses_under_the_call_kind() -> None:
    @dataclass
    class Plain:
        ids: torch.Tensor
        note: str

    sizes = payload((3, "x", None, Plain, [Plain(IDS, "y")], {"k": 1.5}), LinkKind.EMB_META)
    assert sizes == {"emb_meta": (40, 0)}


def test_every_direction_of_an_rpc_lands_in_its_ledger_book_by_kind() -> None:
    trainer, server = _wire("trainer_0"), _wire("server_1")
    trainer.outgoing("server_1", LinkKind.EMB_PUSH, (ROWS,), {})
    trainer.replied("server_1", LinkKind.EMB_PUSH, IDS)
    server.incoming("trainer_0", LinkKind.EMB_PUSH, (ROWS,), {})
    server.reply("trainer_0", LinkKind.EMB_PUSH, IDS)
    assert (trainer.ledger.tx, trainer.ledger.rx) == ({"emb_push": 80}, {"emb_push": 40})
    assert (server.ledger.rx, server.ledger.tx) == ({"emb_push": 80}, {"emb_push": 40})


def test_a_trainer_counts_calls_between_trainers_only_as_their_caller() -> None:
    trainer = _wire("trainer_0")
    trainer.reply("oracle", LinkKind.CONTROL, IDS)
    trainer.incoming("trainer_1", LinkKind.EMB_PULL, (IDS,), {})  # trainer_1 counts both ways
    trainer.reply("trainer_1", LinkKind.EMB_PULL, ROWS)
    assert trainer.meter.end_step().bytes_sent == {"control": 40}
    assert (trainer.ledger.tx, trainer.ledger.rx) == ({"control": 40, "emb_pull": 80},
                                                      {"emb_pull": 40})


def test_collectives_book_their_wire_bytes_under_their_kind() -> None:
    trainer = _wire("trainer_0")
    trainer.collective(LinkKind.ALLTOALL, payload_bytes=0, sends={"trainer_1": 30, "trainer_2": 20},
                       receives=60)
    assert trainer.meter.end_step().bytes_sent == {}
    assert (trainer.ledger.tx, trainer.ledger.rx) == ({"alltoall": 50}, {"alltoall": 60})


# --------------------------------------------------------------------------- what a message costs
class RecordingNics(SharedNics):
    """The model back-end's NICs, recording each transfer instead of emulating its time."""

    def __init__(self) -> None:  # no shared table: nothing is emulated
        self.transfers: list[tuple[str, list[tuple[str, float]]]] = []

    def transfer(self, src: str, dsts: Sequence[tuple[str, float]]) -> float:
        self.transfers.append((src, list(dsts)))
        return 0.0


LATENCY_US = 20_000.0  # 20 ms a message: well above a loaded machine's timer noise


def _shaped(role: str, backend: str = "model", latency_us: float = LATENCY_US,
            dilation: float = 1.0) -> tuple[Wire, RecordingNics]:
    nics = RecordingNics()
    network = NetworkConfig(backend, Topology.uniform(10.0, latency_us, servers=2), dilation)
    return Wire(role, network, Meter(), nics if backend == "model" else None), nics


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def test_network_config_names_the_bad_key() -> None:
    with pytest.raises(ValueError, match=r"network\.backend: 'wifi'"):
        NetworkConfig("wifi")
    with pytest.raises(ValueError, match=r"network\.dilation must be > 0, got 0"):
        NetworkConfig("model", dilation=0)


def test_the_emulated_topology_is_dilated() -> None:
    topology = Topology.uniform(10.0, 50.0)
    assert NetworkConfig("model", topology).emulated is topology
    nic = NetworkConfig("model", topology, dilation=4.0).emulated.trainer_nic
    assert (nic.egress_gbps, nic.ingress_gbps, nic.latency_us) == (2.5, 2.5, 200.0)


def test_the_model_back_end_needs_shared_nics_except_in_the_driver() -> None:
    network = NetworkConfig("model", Topology.uniform(10.0))
    with pytest.raises(ValueError, match="trainer_0: the model back-end needs"):
        Wire("trainer_0", network, Meter())
    assert Wire("driver", network, Meter()).host == "driver"


def test_only_a_shaped_back_end_delays_and_only_across_hosts() -> None:
    trainer, _ = _shaped("trainer_0")
    assert trainer.delays("server_1") and trainer.delays("trainer_1")
    assert not trainer.delays("driver")
    assert not _shaped("server_1")[0].delays("server_3")  # one host
    assert not _wire("trainer_0").delays("server_1")  # real


def test_a_message_pays_the_senders_latency_then_one_flow_to_the_receivers_host() -> None:
    trainer, nics = _shaped("trainer_0")
    assert _seconds(lambda: trainer.hold("server_3", 100)) >= LATENCY_US * 1e-6
    trainer.hold("server_1", 0)  # latency only: no flow of no bytes
    assert nics.transfers == [("trainer_0", [("server_1", 100)])]  # shard 3 lives on server_1


def test_latency_is_dilated_and_the_netns_back_end_leaves_the_bytes_to_the_kernel() -> None:
    trainer, _ = _shaped("trainer_0", backend="netns", latency_us=LATENCY_US / 4, dilation=4.0)
    assert _seconds(lambda: trainer.hold("server_1", 100)) >= LATENCY_US * 1e-6


def test_no_delay_on_loopback_the_control_path_or_the_real_back_end() -> None:
    shard, nics = _shaped("server_1", latency_us=2e6)  # 2 s a message, were it paid
    trainer, _ = _shaped("trainer_0", latency_us=2e6)
    unshaped = Wire("trainer_0", NetworkConfig("real", Topology.uniform(10.0, 2e6)), Meter())

    def unpaid() -> None:
        shard.hold("server_3", 100)
        trainer.hold("driver", 100)
        unshaped.hold("server_1", 100)

    assert _seconds(unpaid) < 1.0 and nics.transfers == []


def test_a_reply_pays_for_itself_on_the_way_back() -> None:
    server, nics = _shaped("server_1")
    assert _seconds(lambda: server.reply("trainer_0", LinkKind.EMB_PULL, ROWS)) >= LATENCY_US * 1e-6
    assert nics.transfers == [("server_1", [("trainer_0", 80)])]


def test_a_collective_pays_one_latency_per_message_then_its_flows() -> None:
    trainer, nics = _shaped("trainer_0")
    seconds = _seconds(lambda: trainer.hold_collective(
        {"trainer_1": 100, "trainer_2": 50}, messages=3, then_receives={"trainer_1": 70}))
    assert seconds >= 3 * LATENCY_US * 1e-6
    assert nics.transfers == [("trainer_0", [("trainer_1", 100), ("trainer_2", 50)]),
                              ("trainer_1", [("trainer_0", 70)])]


def test_a_collective_of_no_bytes_or_on_the_real_back_end_costs_nothing() -> None:
    trainer, nics = _shaped("trainer_0", latency_us=2e6)
    unshaped = Wire("trainer_0", NetworkConfig("real", Topology.uniform(10.0, 2e6)), Meter())

    def unpaid() -> None:
        trainer.hold_collective({"trainer_1": 0}, messages=1)
        unshaped.hold_collective({"trainer_1": 100}, messages=1)

    assert _seconds(unpaid) < 1.0 and nics.transfers == []
