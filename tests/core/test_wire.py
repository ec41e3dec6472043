"""The wire's one rule for counting (in-process, no roles): what lands in a trainer's Meter and in
every role's NIC ledger, and what the driver's control path leaves out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from bagpipe.core.meter import LinkKind, Meter
from bagpipe.core.net import NetworkConfig, Topology
from bagpipe.core.net.wire import Wire, payload

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
