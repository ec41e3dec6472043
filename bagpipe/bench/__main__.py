"""Run the benchmarks, print one table, and write ``results/bench/<name>.csv``.

A benchmark module that also defines ``report(frame, reports_dir)`` draws its figure and writes
``reports/<name>.{png,md}`` from the same rows.

Usage: ``python -m bagpipe.bench [--quick] [--only data,oracle] [--out results/bench]
[--reports reports] [--device auto]``. A module's ``RESULTS`` directory, where it has one
(``gpu``: ``results/gpu``), replaces ``results/bench`` unless ``--out`` is given; ``--device``
goes to the modules whose ``run`` takes it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from inspect import signature
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from bagpipe.bench import BENCHMARKS, ON_REQUEST


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bagpipe.bench")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke check")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=None, help="default: results/bench")
    parser.add_argument("--reports", type=Path, default=Path("reports"))
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (the GPU check)")
    args = parser.parse_args(argv)
    # Off a terminal (a log, CI) rich would squeeze a wide table into 80 columns of ellipses.
    console = Console() if sys.stdout.isatty() else Console(width=400)
    for name in args.only.split(","):
        if name not in BENCHMARKS + ON_REQUEST:
            parser.error(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS + ON_REQUEST)}")
        console.rule(f"bench: {name}")
        module = importlib.import_module(f"bagpipe.bench.{name}")
        options = {"device": args.device} if "device" in signature(module.run).parameters else {}
        frame = pd.DataFrame(module.run(quick=args.quick, **options))
        out = args.out or getattr(module, "RESULTS", Path("results/bench"))
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / f"{name}.csv", index=False)
        table = Table(*[str(c) for c in frame.columns])
        for record in frame.itertuples(index=False):
            table.add_row(*[f"{v:.4g}" if isinstance(v, float) else str(v) for v in record])
        console.print(table)
        console.print(f"wrote {out / f'{name}.csv'}")
        if hasattr(module, "report"):
            console.print(f"wrote {', '.join(map(str, module.report(frame, args.reports)))}")


if __name__ == "__main__":
    main()
