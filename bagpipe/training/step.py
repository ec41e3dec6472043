"""The per-example math every system shares, so that "same work" is the same code.

Conventions (every system follows them; the equivalence tests rely on them):

* **Rows by global id.** A batch's ids are mapped into the flat global row space
  (``DatasetSchema.table_offsets``), deduplicated with :func:`unique_rows`, fetched (from wherever
  the system keeps them) as ``rows [U, table_dim]`` in ``unique_ids`` order, and expanded back to
  pooled embeddings with :func:`pooled_from_rows`. Datasets are one-hot, so sum pooling of one id
  is the row itself.
* **Loss.** Each process computes ``bce_loss_sum(its slice) / GLOBAL batch size``
  (:func:`slice_loss`). Summed over trainers that is the mean BCE over the global batch, and its
  gradients, **all-reduced with SUM** (never averaged), are exactly the gradients of one process
  on the whole batch. The reported loss is likewise the sum over trainers of their slice losses.
* **Optimizer.** Plain SGD, no momentum or weight decay: :func:`sgd_rows_` for embedding rows
  (sparse: only rows in ``unique_ids`` change) and :func:`sgd_dense_` for the dense part.
* **Dense replicas** are ``DistributedDataParallel`` modules (:func:`replicate_dense`), as PyTorch
  trainers train them: DDP's bucketed all-reduce overlaps backward, through the wire, summing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel

from bagpipe.core.collectives import FusedTail, ddp_hook
from bagpipe.core.device import move
from bagpipe.core.meter import Meter, Phase


def unique_rows(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids [B, F]`` -> ``(unique_ids [U] sorted, inverse [B, F])`` with ``unique_ids[inverse] == ids``."""
    unique_ids, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return unique_ids, inverse


def pooled_from_rows(rows: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """``rows [U, D]`` (one per unique id) and ``inverse [B, F]`` -> pooled ``[B, F, D]``.

    If ``rows`` requires grad, backward leaves in ``rows.grad`` the per-row gradient summed over
    every use of that row in the batch, which is what the sparse update needs.
    """
    return rows[inverse]


def bce_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) of binary cross-entropy with logits over the examples given."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="sum")


def slice_loss(logits: torch.Tensor, labels: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """This slice's share of the global mean loss: ``bce_loss_sum / global_batch_size``."""
    return bce_loss_sum(logits, labels) / global_batch_size


@dataclass
class SliceGradients:
    """What :func:`forward_backward` leaves: the slice loss and the fetched rows' gradients.

    Dense gradients stay in the model's ``.grad`` fields (to be all-reduced with SUM, then applied).
    """

    loss: float
    row_grads: torch.Tensor  # [U, table_dim], aligned with the unique ids the rows were fetched for


def forward_backward(
    model: nn.Module,
    dense: torch.Tensor,
    rows: torch.Tensor,
    inverse: torch.Tensor,
    labels: torch.Tensor,
    global_batch_size: int,
    meter: Meter,
    fuse: FusedTail | None = None,
    extra: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> SliceGradients:
    """Forward and backward of one slice, charging ``forward``, ``backward`` and the wait for the
    dense all-reduce at backward's end as ``sync`` on ``meter`` (:func:`backward_timing_sync`).

    ``model`` is the dense part, usually wrapped in ``DistributedDataParallel`` (its gradients are
    then summed over the trainers during backward). ``rows`` are the fetched rows (not modified);
    gradients flow into a detached copy. With ``fuse``, ``extra(row gradients)`` rides in DDP's
    last bucket (``fuse.take()`` after this returns): a system's row gradients summed over the
    trainers in the same collective as the dense part.

    The dense gradients start from none: a step that failed after its backward (a shard died
    before acknowledging its push) is trained again from its start, not on top of what it left.

    Inputs and rows that live elsewhere than the model (host rows, a GPU model) are moved to the
    model's device, and the row gradients come back to where the rows live, every byte charged
    (``bagpipe.core.device.move``): the one place every system's copies happen. ``extra`` sees
    the gradients on the model's device.
    """
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    with meter.phase(Phase.FORWARD):
        leaf = move(rows, device, meter).detach().requires_grad_(True)
        dense, inverse, labels = (move(t, device, meter) for t in (dense, inverse, labels))
    if fuse is not None and extra is not None:
        fuse.expect(leaf, extra)
    with meter.phase(Phase.FORWARD):
        logits = model(dense, pooled_from_rows(leaf, inverse))
        loss = slice_loss(logits, labels, global_batch_size)
    backward_timing_sync(loss, meter)
    with meter.phase(Phase.BACKWARD):
        assert leaf.grad is not None
        row_grads = move(leaf.grad, rows.device, meter)
    return SliceGradients(loss=float(loss.detach()), row_grads=row_grads)


def backward_timing_sync(loss: torch.Tensor, meter: Meter) -> None:
    """``loss.backward()``, its wall time split where the graph's own compute ended: the time
    before charged as ``backward``, the time after as ``sync``.

    DDP waits for its buckets' all-reduce inside ``backward()`` (its reducer's final callback), so
    a replica's backward wall time holds the network time of the dense synchronisation, and of any
    rows riding in its last bucket (:class:`~bagpipe.core.collectives.FusedTail`). Charging that
    wait as sync, by this one rule for every system, keeps ``backward`` the dense work that is the
    same everywhere: what the CPU-share check compares across systems. The split is an autograd
    final callback queued from the graph's first node, so it runs before DDP's (queued once a
    parameter's gradient is ready), as soon as the last gradient is computed. Without a
    collective, the sync share is the few microseconds between the two callbacks.

    The calling thread's CPU is split at the same point. On a CPU graph the callback runs on the
    calling thread; where it runs on another (an accelerator's autograd thread), that thread's
    CPU clock says nothing about the caller's, so all of the caller's CPU is charged to backward.
    """
    caller = threading.get_ident()
    computed: list[tuple[float, float | None]] = []  # wall, and the caller's CPU, at the split

    def mark() -> None:
        on_caller = threading.get_ident() == caller
        computed.append((time.perf_counter(), time.thread_time() if on_caller else None))

    def queue_mark(grad: torch.Tensor) -> None:
        Variable._execution_engine.queue_callback(mark)

    handle = loss.register_hook(queue_mark)
    started, started_cpu = time.perf_counter(), time.thread_time()
    try:
        loss.backward()
    finally:
        handle.remove()
    ended, ended_cpu = time.perf_counter(), time.thread_time()
    split, split_cpu = computed[0] if computed else (ended, ended_cpu)
    split_cpu = ended_cpu if split_cpu is None else split_cpu
    meter.add_phase_time(Phase.BACKWARD, split - started, split_cpu - started_cpu)
    meter.add_phase_time(Phase.SYNC, ended - split, ended_cpu - split_cpu)


def replicate_dense(model: nn.Module, fuse: FusedTail | None = None) -> DistributedDataParallel:
    """``model``, a data-parallel replica over the trainers' group, its gradients SUM-reduced.

    Every trainer builds its replica from the same seeded (or resumed) weights, so DDP's initial
    broadcast is skipped (``init_sync=False``): the replicas are equal by construction, as the
    equivalence tests check. ``fuse`` lets the system's extra gradients ride in the last bucket.
    """
    replica = DistributedDataParallel(model, init_sync=False, forward_sync_buffers=False)
    replica.register_comm_hook(None, fuse.hook if fuse is not None else ddp_hook())
    return replica


@torch.no_grad()
def sgd_rows_(table: torch.Tensor, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> None:
    """``table[ids] -= lr * grads`` in place (``ids`` unique; rows not in ``ids`` are untouched)."""
    table.index_add_(0, ids, grads, alpha=-lr)


@torch.no_grad()
def sgd_dense_(model: nn.Module, lr: float) -> None:
    """``p -= lr * p.grad`` for every dense parameter, then clear the gradients."""
    for param in model.parameters():
        if param.grad is not None:
            param.add_(param.grad, alpha=-lr)
            param.grad = None
