"""Where a trainer computes, and the one rule for moving tensors between host and device.

The ``device`` option (``cpu``, ``cuda`` or ``auto``) is resolved once, by the runner, into the
device every trainer of the run computes on (:func:`resolve_device`). Embedding-server shards
keep their tables in host memory, as in the paper, so rows, dense features and labels reach a
trainer on the host; :func:`move` moves them and charges every byte that crosses to the Meter
(``h2d`` / ``d2h``), so all systems pay copies by the same rule. A tensor
already where it is asked to be is returned as is, uncharged: a CPU run copies nothing.

Trainers that share a GPU (one GPU, T trainers) all compute on ``cuda:0`` and sum over gloo,
which takes device tensors; trainers with a GPU each use ``cuda:<rank>`` and NCCL for device
tensors (NCCL refuses two ranks on one GPU), gloo still carrying host tensors
(:func:`collective_backend`).
"""

from __future__ import annotations

import torch

from bagpipe.core.batch import Batch
from bagpipe.core.meter import LinkKind, Meter

DEVICE_OPTIONS = ("auto", "cpu", "cuda")
#: Host memory, where servers keep their shards and RPC carries tensors.
HOST = torch.device("cpu")


def resolve_device(option: str, key: str = "device") -> str:
    """``auto`` -> ``cuda`` where torch sees a GPU, else ``cpu``; ``cuda`` without one is an error
    that names the config ``key``."""
    if option not in DEVICE_OPTIONS:
        raise ValueError(f"{key}: {option!r} is not one of {', '.join(DEVICE_OPTIONS)}")
    if option == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if option == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{key}: 'cuda' asked for, but torch {torch.__version__} sees no CUDA device")
    return option


def own_gpus(world: int) -> bool:
    """Whether each of ``world`` trainers gets a GPU of its own on this host."""
    return torch.cuda.is_available() and torch.cuda.device_count() >= world


def trainer_device(device: str, rank: int, world: int) -> torch.device:
    """The device trainer ``rank`` of ``world`` computes on: ``cuda:rank`` when every trainer has
    a GPU of its own, ``cuda:0`` when they share one, the CPU for ``device='cpu'``."""
    if device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", rank if own_gpus(world) else 0)


def collective_backend(device: str, world: int) -> str:
    """The trainer group's ``init_process_group`` backend (module docstring)."""
    if device != "cpu" and own_gpus(world):
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def move(
    tensor: torch.Tensor, device: torch.device, meter: Meter, non_blocking: bool = False
) -> torch.Tensor:
    """``tensor`` on ``device``; its bytes are charged as ``h2d`` or ``d2h`` when it crossed
    between host and device. One rule for every copy, so every system pays copies alike.
    ``non_blocking``: queue the copy on the current stream and return (from pinned memory)."""
    if tensor.device == device:
        return tensor
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.device.type == "cpu":
        meter.add_traffic(LinkKind.H2D, nbytes)
    elif device.type == "cpu":
        meter.add_traffic(LinkKind.D2H, nbytes)
    return tensor.to(device, non_blocking=non_blocking)


def move_batch(batch: Batch, device: torch.device, meter: Meter) -> Batch:
    """``batch`` on ``device``, every tensor's bytes charged like :func:`move` (for a system that
    trains on whole batches: TorchRec)."""
    charge_batch_copy(batch, device, meter)
    return batch.to(device)


def charge_batch_copy(batch: Batch, device: torch.device, meter: Meter) -> None:
    """Charge as ``h2d`` the copy of host ``batch`` to ``device`` (dense features, ids, lengths,
    labels), for a batch a library copies itself (TorchRec's pipeline); nothing on the host."""
    if device.type == "cpu":
        return
    kjt = batch.sparse_features
    tensors = (batch.dense_features, kjt.values(), kjt.lengths(), batch.labels)
    meter.add_traffic(LinkKind.H2D, sum(t.numel() * t.element_size() for t in tensors))


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy in host memory: what a trainer hands the driver (state, checkpoints),
    since RPC carries host tensors."""
    return tensor.detach().to(HOST, copy=True)
