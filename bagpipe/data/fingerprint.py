"""Fingerprints of raw input files: what the prepared-shard cache is keyed by.

A prepared dataset may only be reused for the same bytes. Hashing an 11 GB file takes longer than
the 10 s a run may spend before its first step, so by default a file is identified by its size, its
modification time and the hashes of ``SAMPLED_BLOCKS`` blocks spread evenly over it, first and last
included (about 1 MiB read: milliseconds). Any append, truncation, rewrite or ``touch`` changes the
fingerprint; an edit that keeps size and mtime and misses every sampled block would not, which is
what ``full=True`` (every byte hashed, about 1-2 s per GB) is for.

The file's directory is not part of it: a moved or copied file keeps its prepared shards.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SAMPLED_BLOCKS = 16
BLOCK_BYTES = 1 << 16
_FULL_READ_BYTES = 1 << 24


def file_fingerprint(path: str, full: bool = False) -> dict[str, object]:
    """``{"name", "bytes", "mtime_ns", "sampled_sha256" or "sha256"}`` of one file."""
    stat = os.stat(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if full:
            while chunk := handle.read(_FULL_READ_BYTES):
                digest.update(chunk)
        else:
            for offset in _sample_offsets(stat.st_size):
                handle.seek(offset)
                digest.update(handle.read(BLOCK_BYTES))
    return {
        "name": Path(path).name,
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        ("sha256" if full else "sampled_sha256"): digest.hexdigest(),
    }


def _sample_offsets(size: int) -> list[int]:
    """Evenly spaced block offsets covering the first and the last block."""
    last = max(0, size - BLOCK_BYTES)
    if last == 0:
        return [0]
    return sorted({last * i // (SAMPLED_BLOCKS - 1) for i in range(SAMPLED_BLOCKS)})
