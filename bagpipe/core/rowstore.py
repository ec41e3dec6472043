"""Embedding rows kept where a trainer computes, addressed by host-side slot numbers.

A trainer's cache (Bagpipe's LRPP cache, HET's cache) has two kinds of state: bookkeeping (which
id sits in which slot, flags, versions), small and read by host threads that plan and look up,
and the rows ``[slots, D]``, which the forward pass reads. :class:`RowStore` holds the rows on
the trainer's device and the caches keep their bookkeeping on the host, so a lookup never waits
for the GPU and the rows never leave it except to be written back.

Every crossing goes through here, so each is charged once (``bagpipe.core.device.move``: slot
numbers and rows in, rows out). Rows a background thread installs (Bagpipe's prefetch) may go on
a side stream (``background=True``): the copy and the scatter into the store run there, after
the work already queued on the compute stream (whose reads of a slot may still be pending when
the slot is freed and refilled), and every later access on the compute stream first waits for
them on the GPU, by CUDA events, never by sleeping. On the CPU all of this is plain indexing.
"""

from __future__ import annotations

import threading

import torch

from bagpipe.core.device import HOST, move
from bagpipe.core.meter import Meter


class RowStore:
    """``slots`` rows of width ``dim`` on ``device``.

    Args:
        slots: rows to allocate (:meth:`grow` adds more).
        dim: row width.
        dtype: row dtype.
        device: where the rows live (the trainer's device).
        meter: where copies are charged (the trainer process's Meter; a private one by default,
            for a store used outside a role).
    """

    def __init__(
        self, slots: int, dim: int, dtype: torch.dtype = torch.float32,
        device: torch.device = HOST, meter: Meter | None = None,
    ) -> None:
        self.device = device
        self.rows = torch.zeros(slots, dim, dtype=dtype, device=device)
        self.meter = meter if meter is not None else Meter()
        on_gpu = device.type == "cuda"
        #: The side stream background installs run on (``None`` on the CPU).
        self.copy_stream = torch.cuda.Stream(device) if on_gpu else None
        self._installed: list[torch.cuda.Event] = []
        self._events_lock = threading.Lock()

    @property
    def num_slots(self) -> int:
        return self.rows.shape[0]

    @property
    def dim(self) -> int:
        return self.rows.shape[1]

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """Copies of the rows at host ``slots`` ``[N, D]``, on the device."""
        self._after_installs()
        return self.rows.index_select(0, self._slots(slots))

    def read_to_host(self, slots: torch.Tensor) -> torch.Tensor:
        """The rows at ``slots``, in host memory (a write-back, a log, a snapshot)."""
        return move(self.read(slots), HOST, self.meter)

    def write(self, slots: torch.Tensor, rows: torch.Tensor, background: bool = False) -> None:
        """``rows`` (host or device) into ``slots``; ``background``: on the side stream."""
        if background and self.copy_stream is not None:
            self._write_on_side_stream(slots, rows)
            return
        self._after_installs()
        values = move(rows, self.device, self.meter).to(self.rows.dtype)
        self.rows.index_copy_(0, self._slots(slots), values)

    def add_(self, slots: torch.Tensor, values: torch.Tensor, alpha: float = 1.0) -> None:
        """``rows[slots] += alpha * values`` (``slots`` unique)."""
        self._after_installs()
        values = move(values, self.device, self.meter).to(self.rows.dtype)
        self.rows.index_add_(0, self._slots(slots), values, alpha=alpha)

    def zero_(self, slots: torch.Tensor) -> None:
        """``rows[slots] = 0`` (only the slot numbers cross)."""
        self._after_installs()
        self.rows[self._slots(slots)] = 0.0

    def grow(self, extra_slots: int) -> None:
        self._after_installs()
        self.rows = torch.cat([self.rows, self.rows.new_zeros(extra_slots, self.dim)])

    def _slots(self, slots: torch.Tensor) -> torch.Tensor:
        return move(slots, self.device, self.meter)

    def _write_on_side_stream(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        assert self.copy_stream is not None
        compute = torch.cuda.current_stream(self.device)
        # Pinned, so that the copies are queued and this thread goes on (a pageable copy would
        # wait here for everything queued on the side stream before it).
        slots, rows = (t.pin_memory() if t.device.type == "cpu" else t for t in (slots, rows))
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_stream(compute)  # reads of these slots queued before
            on_device = move(slots, self.device, self.meter, non_blocking=True)
            values = move(rows, self.device, self.meter, non_blocking=True)
            self.rows[on_device] = values.to(self.rows.dtype)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        # The compute stream allocated self.rows; the side stream used it: keep it until then.
        self.rows.record_stream(self.copy_stream)
        with self._events_lock:
            self._installed.append(done)

    def _after_installs(self) -> None:
        """Make the compute stream wait (on the GPU) for every background install so far."""
        with self._events_lock:
            pending, self._installed = self._installed, []
        if pending:
            compute = torch.cuda.current_stream(self.device)
            for event in pending:
                compute.wait_event(event)
