"""The collectives benchmark (``bagpipe.bench.collectives``) runs two gloo processes and prices
its three comparisons, each with a paired interval from both processes' blocks."""

from __future__ import annotations

import math

from bagpipe.bench import BENCHMARKS, collectives


def test_the_quick_run_prices_every_comparison_in_cpu_and_wall() -> None:
    rows = collectives.run(quick=True)
    assert "collectives" in BENCHMARKS
    got = {(row["metric"], row["pattern"]) for row in rows}
    assert got == {(f"{measure}_ms_{name}", f"{over} - {under}")
                   for measure in ("cpu", "wall")
                   for name, over, under in collectives.COMPARISONS}
    for row in rows:
        assert row["samples"] == 2  # one block, two processes
        assert math.isfinite(row["value"])
        assert row["low"] <= row["value"] <= row["high"]
