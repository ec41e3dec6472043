"""The prepared-data cache: one directory per key, published only when complete.

Layout under the cache root (``dataset.cache_dir``, else ``$BAGPIPE_DATA_CACHE``, else
``$XDG_CACHE_HOME/bagpipe/datasets``, else ``~/.cache/bagpipe/datasets``)::

    <name>/                          complete: holds manifest.json (written before the rename)
    <name>.partial-<host>-<pid>/     being built; never read
    <name>.lock                      held while building, so concurrent jobs build it once
                                     (removed once the directory is published)

A build writes into its partial directory and renames it to ``<name>`` at the end; a crash at any
point leaves only a partial directory, which nothing reads and the next build of that name removes
(or, on a file system without locks, leaves to its owner).
A build that fails with an error removes its partial directory itself. Before building, the root
must be writable and have room for the estimated size, or ``CacheDirError`` says so at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from bagpipe.data.errors import CacheDirError
from bagpipe.data.shard_format import MANIFEST

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def cache_root(configured: str | None) -> Path:
    """Where prepared datasets live (see the module docstring for the order of choices)."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("BAGPIPE_DATA_CACHE"):
        return Path(os.environ["BAGPIPE_DATA_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bagpipe" / "datasets"


def published(root: Path, name: str) -> Path | None:
    """The complete directory of ``name``, if there is one."""
    ready = root / name
    return ready if (ready / MANIFEST).is_file() else None


def build_once(root: Path, name: str, need_bytes: int, build: Callable[[Path], None]) -> Path:
    """The complete directory of ``name``: the published one, or ``build(partial_dir)``'s result
    once renamed into place. ``build`` must write the manifest last."""
    if (ready := published(root, name)) is not None:
        return ready
    check_room(root, need_bytes)
    with _locked(root, name) as exclusive:
        if (ready := published(root, name)) is not None:  # built meanwhile by another job
            return ready
        if exclusive:  # partial directories of this name are a crash's leftovers
            for stale in [*root.glob(f"{name}.partial-*"), root / name]:
                shutil.rmtree(stale, ignore_errors=True)
        partial = root / f"{name}.partial-{socket.gethostname()}-{os.getpid()}"
        try:
            partial.mkdir()
            build(partial)
            partial.rename(root / name)
            (root / f"{name}.lock").unlink(missing_ok=True)  # whoever waits on it re-checks first
        except OSError as err:
            if err.errno in _NO_SPACE:
                raise CacheDirError(str(root), f"ran out of space while preparing {name} "
                                    f"({err.strerror})") from err
            if (ready := published(root, name)) is None:  # else: another build won the rename
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return root / name


def check_room(root: Path, need_bytes: int) -> None:
    """Raise ``CacheDirError`` unless ``root`` can be created, written and has ``need_bytes`` free."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise CacheDirError(str(root), f"not writable ({err.strerror or err})") from err
    free = shutil.disk_usage(root).free
    if free < need_bytes:
        raise CacheDirError(str(root), f"needs about {need_bytes / 1e9:.2f} GB for the prepared "
                            f"dataset, {free / 1e9:.2f} GB free")


@contextlib.contextmanager
def _locked(root: Path, name: str) -> Iterator[bool]:
    """An exclusive lock on ``<name>.lock``; yields False where the file system has no ``flock``
    (some network file systems), and concurrent builds then both run."""
    with open(root / f"{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process preparing {root / name} ...", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            yield False
            return
        yield True
