"""The device rule: how ``device`` resolves, which copies are charged, and the row store's
background installs (whose ordering by CUDA events a GPU test checks against a slowed stream)."""

from __future__ import annotations

import pytest
import torch

from bagpipe.core.batch import batch_from_arrays
from bagpipe.core.device import (
    charge_batch_copy,
    collective_backend,
    host_copy,
    move,
    move_batch,
    resolve_device,
    trainer_device,
)
from bagpipe.core.meter import LinkKind, Meter
from bagpipe.core.rowstore import RowStore

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_auto_resolves_to_what_torch_sees_and_bad_options_name_the_key() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"device: 'gpu' is not one of auto, cpu, cuda"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"run\.device: 'cuda' asked for, but torch"):
            resolve_device("cuda", key="run.device")


def test_cpu_trainers_compute_on_the_host_and_sum_over_gloo() -> None:
    assert trainer_device("cpu", 1, 2) == torch.device("cpu")
    assert collective_backend("cpu", 2) == "gloo"


def test_a_copy_is_charged_once_by_direction_and_a_tensor_in_place_costs_nothing() -> None:
    meter = Meter()
    rows = torch.ones(5, 3)
    assert move(rows, torch.device("cpu"), meter) is rows
    # "meta" stands in for a device here: the copy leaves the host, so it is h2d.
    moved = move(rows, torch.device("meta"), meter)
    assert moved.device.type == "meta"
    record = meter.end_step()
    assert record.bytes_sent == {str(LinkKind.H2D): 5 * 3 * 4}


def test_a_whole_batch_s_copy_is_charged_tensor_by_tensor() -> None:
    """TorchRec moves whole batches (or its pipeline does): charged by the same rule."""
    meter = Meter()
    batch = batch_from_arrays(
        torch.ones(4, 3), torch.zeros(4, 2, dtype=torch.int64), torch.ones(4), ["a", "b"]
    )
    assert move_batch(batch, torch.device("cpu"), meter).dense_features is batch.dense_features
    charge_batch_copy(batch, torch.device("meta"), meter)
    lengths = batch.sparse_features.lengths()
    want = 4 * 3 * 4 + 8 * 8 + lengths.numel() * lengths.element_size() + 4 * 4
    assert meter.end_step().bytes_sent == {str(LinkKind.H2D): want}


def test_host_copy_is_detached_and_owns_its_memory() -> None:
    weight = torch.nn.Parameter(torch.ones(2, 2))
    copy = host_copy(weight)
    assert not copy.requires_grad and copy.data_ptr() != weight.data_ptr()


def test_row_store_reads_writes_adds_and_grows_on_the_host_without_charging() -> None:
    meter = Meter()
    store = RowStore(4, 2, meter=meter)
    store.write(torch.tensor([1, 3]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), background=True)
    store.add_(torch.tensor([3]), torch.tensor([[1.0, 1.0]]), alpha=-2.0)
    store.zero_(torch.tensor([1]))
    store.grow(2)
    assert store.num_slots == 6 and store.copy_stream is None
    assert store.read(torch.tensor([3, 1, 5])).tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]
    assert meter.end_step().bytes_sent == {}


@needs_gpu
def test_a_background_install_is_read_after_it_lands_even_behind_a_slow_side_stream() -> None:
    """The side stream sleeps before the install's copy; a read on the compute stream must wait
    for it by event. Without that wait the read sees the zeros the store started with."""
    meter = Meter()
    store = RowStore(1024, 64, device=torch.device("cuda", 0), meter=meter)
    slots = torch.arange(1024)
    rows = torch.randn(1024, 64)
    assert store.copy_stream is not None
    with torch.cuda.stream(store.copy_stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles queued before the install
    store.write(slots, rows, background=True)
    got = store.read(slots).cpu()
    assert torch.equal(got, rows)
    # the rows once, the slot numbers twice (the install's, the read's); nothing back
    assert meter.end_step().bytes_sent == {
        str(LinkKind.H2D): rows.numel() * 4 + 2 * slots.numel() * 8
    }


@needs_gpu
def test_a_copy_back_to_the_host_is_charged_as_d2h() -> None:
    meter = Meter()
    rows = torch.ones(4, 2, device="cuda")
    assert move(rows, torch.device("cpu"), meter).device.type == "cpu"
    assert meter.end_step().bytes_sent == {str(LinkKind.D2H): 4 * 2 * 4}
