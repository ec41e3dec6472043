"""``python -m bagpipe.harness.track.upload <dir>``: send runs recorded while the tracking store was down.

``<dir>`` is a run directory, a sweep directory or any folder above them: every run record below it
is uploaded (records already in the store are only refreshed), each sweep's speedups are
recomputed and its parent run is created if it never was, then closed. The store is the one each
run was configured with, unless ``--tracking-uri`` names another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bagpipe.harness.run.sweep import finalize_sweep
from bagpipe.harness.track.mlflow_runs import is_reachable, upload_all
from bagpipe.harness.track.record import RunRecord, find_records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bagpipe.harness.track.upload", description=__doc__)
    parser.add_argument("directory", type=Path, help="run, sweep or parent directory")
    parser.add_argument("--tracking-uri", help="store to upload to (default: each run's own)")
    args = parser.parse_args(argv)
    directories = find_records(args.directory)
    if not directories:
        print(f"no run records under {args.directory}", file=sys.stderr)
        return 2
    records = {d: RunRecord.load(d) for d in directories}
    uris = {args.tracking_uri or r.tracking_uri for r in records.values()} - {None}
    pending = 0
    for uri in sorted(u for u in uris if u is not None):
        if not is_reachable(uri):
            print(f"tracking store {uri} is still unreachable; nothing uploaded", file=sys.stderr)
            return 1
        mine = [d for d, r in records.items() if (args.tracking_uri or r.tracking_uri) == uri]
        sweeps = {r.sweep_dir: r for d, r in records.items() if d in mine and r.sweep_dir}
        for sweep_dir, record in sweeps.items():
            reference = record.params.get("tracking.reference_system", "sync_ps")
            finalize_sweep(Path(sweep_dir), reference, uri)
        run_ids, failed = upload_all(mine, uri)
        pending += len(failed)
        print(f"uploaded {len(run_ids)} run(s) to {uri}")
    return 1 if pending else 0


if __name__ == "__main__":
    sys.exit(main())
