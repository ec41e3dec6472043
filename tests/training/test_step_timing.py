"""backward_timing_sync: backward's wall time and its thread's CPU, split where the graph ended."""

from __future__ import annotations

import time

import torch

from bagpipe.core.meter import Meter
from bagpipe.training.step import backward_timing_sync

SPIN_S = 0.03
#: A thread's CPU clock and the wall clock are different clocks: read around the same span, the CPU
#: one may come out a few microseconds longer (seen in the full suite: 30.4371 ms of CPU in 30.4354
#: ms of wall).
CLOCKS_APART_S = 1e-4


class _SpinningBackward(torch.autograd.Function):
    """Identity whose backward burns ``SPIN_S`` of CPU on the thread that runs it."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        until = time.thread_time() + SPIN_S
        while time.thread_time() < until:
            pass
        return grad


def test_the_graphs_cpu_is_charged_to_backward_and_nothing_after_it_to_sync() -> None:
    meter = Meter()
    x = torch.ones(4, requires_grad=True)
    backward_timing_sync(_SpinningBackward.apply(x).sum(), meter)
    record = meter.end_step()
    assert x.grad is not None and x.grad.tolist() == [1.0] * 4
    assert SPIN_S <= record.phase_cpu_s["backward"] <= record.phase_s["backward"] + CLOCKS_APART_S
    # no collective after the graph: the split leaves sync a sliver of wall and of CPU
    assert record.phase_s["sync"] < SPIN_S / 10
    assert record.phase_cpu_s["sync"] < SPIN_S / 10
