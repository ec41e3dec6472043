"""Two deliberately misbehaving ``sync_ps`` plugins, for the network checks to catch.

Each trains exactly as ``sync_ps`` does and then, every step, moves a :data:`SMUGGLED_BYTES`
tensor from its trainer to ``server_0`` in a way the rules forbid:

* :class:`UnchargedSender` sends it by a raw ``torch.distributed.rpc`` call, around the wire: the
  kernel carries the bytes, the Meter and the ledger never see them.
* :class:`ShmSender` charges the transfer through the wire as a real call would be charged, but
  hands the tensor over through ``/dev/shm`` and sends only its file name: the ledger books bytes
  that never crossed a NIC.

Module level, so the role processes can import the classes.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed.rpc as rpc

from bagpipe.core import runtime
from bagpipe.core.meter import LinkKind, StepRecord
from baselines.sync_ps.system import SyncPS
from baselines.sync_ps.trainer import SyncPSTrainer

SMUGGLED_BYTES = 2_000_000
_TARGET = "server_0"


def _numel(payload: torch.Tensor) -> int:
    """The receiving end of the smuggled tensor (a module-level function, as raw RPC needs)."""
    return payload.numel()


def _read_and_remove(path: str) -> int:
    """The receiving end of the shared-memory hand-over."""
    payload = torch.load(path)
    os.unlink(path)
    return int(payload.numel())


def _smuggled() -> torch.Tensor:
    return torch.ones(SMUGGLED_BYTES // 4)


class UnchargedSenderTrainer(SyncPSTrainer):
    """Sends its extra tensor with a raw RPC: bytes on the wire that nothing counts."""

    def train_step(
        self, step: int, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord]:
        loss, record = super().train_step(step, dense, ids, labels)
        rpc.rpc_sync(_TARGET, _numel, args=(_smuggled(),))
        return loss, record


class ShmSenderTrainer(SyncPSTrainer):
    """Charges its extra tensor as a call would be charged, then moves it through /dev/shm."""

    def train_step(
        self, step: int, dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[float, StepRecord]:
        loss, record = super().train_step(step, dense, ids, labels)
        payload = _smuggled()
        wire = runtime.current().wire
        wire.hold(_TARGET, wire.outgoing(_TARGET, LinkKind.EMB_PUSH, (payload,), {}))
        fd, path = tempfile.mkstemp(dir="/dev/shm", prefix="bagpipe-smuggled-")
        os.close(fd)
        torch.save(payload, path)
        rpc.rpc_sync(_TARGET, _read_and_remove, args=(path,))
        return loss, record


class UnchargedSender(SyncPS):
    trainer_class = UnchargedSenderTrainer


class ShmSender(SyncPS):
    trainer_class = ShmSenderTrainer
