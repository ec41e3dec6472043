"""Benchmarks (``nox -s bench``): each module here exposes ``run(quick: bool) -> list[dict]``.

A row is one measurement: ``{"benchmark": ..., "metric": ..., "value": ..., "unit": ...}`` plus
any configuration columns. Ratios that matter are measured within one run, on one machine.
"""

BENCHMARKS = ("data", "oracle", "systems", "fault", "het_cache")
