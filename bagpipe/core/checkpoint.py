"""Checkpoints of a training run on disk: atomic, checksummed, the last ``keep`` kept.

A checkpoint is taken by the runner at a step boundary, when the system's update of every step so
far is applied and none is in flight (``System.full_state`` materialises the tables and dense part
from wherever they live, flushing what a cache still holds). Every system in this project trains
with plain SGD, so the optimizer has no state beyond the learning rate in the config: the model, the
data position (the step: sources are random access) and the driver's torch RNG state are the whole
training state. The Bagpipe oracle's state (leases, last-seen positions) is a function of the data
order from the resumed step on, so it is rebuilt, not stored.

Layout of a store directory::

    step_00000040/              one complete checkpoint (the directory name carries the step)
        manifest.json           step, run fingerprint, and per file: bytes + sha256
        tables.pt  dense.pt  rng.pt
    step_00000080/ ...
    .tmp-step_00000120-<pid>/   a checkpoint being written (never read; removed on the next save)

**Atomicity.** Files are written into a temporary directory and fsynced, the manifest last; then the
directory is renamed to its final name (``os.replace``) and the parent directory fsynced. A crash
at any moment leaves either the old set of checkpoints or the old set plus the new one, never a
half-written one under a ``step_*`` name.

**Integrity.** :meth:`CheckpointStore.load_latest` verifies every file against the manifest
(size and sha256). A missing or corrupt checkpoint is reported (``CheckpointWarning`` naming the
file and what is wrong) and the previous valid one is used; if checkpoints exist but none is valid,
:class:`CheckpointError` lists why each was rejected. A checkpoint of another run (a different
fingerprint: system, seed, schema, model) is an error, never a fallback.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bagpipe.core.interface import ModelState, ResumePoint
from bagpipe.core.recovery import update_digest

__all__ = ["Checkpoint", "CheckpointError", "CheckpointStore", "CheckpointWarning", "state_digest"]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
_log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No usable checkpoint: every one found is corrupt, or one belongs to another run."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (missing file, bad checksum, unreadable manifest)."""


@dataclass
class Checkpoint:
    """The training state after ``step`` global batches.

    Attributes:
        step: batches trained; training resumes with batch number ``step``.
        state: every embedding table and the dense ``state_dict``.
        rng_state: the driver's ``torch.get_rng_state()`` at that point.
        fingerprint: what identifies the run (system, seed, schema, model); JSON-able.
        path: the directory it was read from or written to.
    """

    step: int
    state: ModelState
    rng_state: torch.Tensor
    fingerprint: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def resume_point(self) -> ResumePoint:
        """What a system needs to start from this checkpoint (``TrainContext.resume``)."""
        return ResumePoint(step=self.step, state=self.state)

    def nbytes(self) -> int:
        """Bytes of tensor payload (tables, dense, RNG)."""
        tensors = [*self.state.tables.values(), *self.state.dense.values(), self.rng_state]
        return sum(t.numel() * t.element_size() for t in tensors)


def state_digest(state: ModelState) -> str:
    """sha256 over every table and dense tensor (names, dtypes, shapes, bytes), in name order.

    Two runs ended with bit-identical models exactly when their digests are equal; a run on
    another machine (SLURM) reports this instead of its tensors.
    """
    digest = hashlib.sha256()
    for kind, tensors in (("table", state.tables), ("dense", state.dense)):
        update_digest(digest, tensors, f"{kind}:")
    return digest.hexdigest()



def _serialise(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _jsonable(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint as it reads back from JSON (tuples become lists), so equality is stable."""
    return dict(json.loads(json.dumps(dict(fingerprint), sort_keys=True, default=str)))


class CheckpointStore:
    """Checkpoints of one run in one directory (see the module docstring).

    Args:
        root: the directory (created if missing).
        keep: how many of the newest valid checkpoints to keep (>= 1; older ones are deleted
            after each save). Keeping two or more is what makes falling back possible.
        fingerprint: identifies the run; saved in every manifest and checked on load.
    """

    def __init__(
        self, root: Path | str, keep: int = 2, fingerprint: Mapping[str, Any] | None = None
    ) -> None:
        if keep < 1:
            raise ValueError(f"checkpoint.keep: must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.fingerprint = _jsonable(fingerprint or {})
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------ writing
    def save(self, step: int, state: ModelState, rng_state: torch.Tensor) -> Checkpoint:
        """Write the checkpoint of ``step`` atomically; then keep only the newest ``keep``."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        final = self.root / f"step_{step:08d}"
        self._remove_stale_temporaries()
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}"
        tmp.mkdir()
        try:
            payloads = {
                "tables.pt": _serialise(dict(state.tables)),
                "dense.pt": _serialise(dict(state.dense)),
                "rng.pt": _serialise(rng_state),
            }
            for name, data in payloads.items():
                _write_synced(tmp / name, data)
            manifest = {
                "format": FORMAT_VERSION,
                "step": step,
                "fingerprint": self.fingerprint,
                "files": {
                    name: {"bytes": len(data), "sha256": _sha256(data)}
                    for name, data in payloads.items()
                },
            }
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
            _fsync_dir(tmp)
            self._publish(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return Checkpoint(step, state, rng_state, dict(self.fingerprint), final)

    def _publish(self, tmp: Path, final: Path) -> None:
        """Rename ``tmp`` to ``final``; an older checkpoint of the same step is replaced."""
        if final.exists():  # re-taken after falling back past a corrupt one
            old = self.root / f".tmp-old-{final.name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.root)

    def _remove_stale_temporaries(self) -> None:
        for path in self.root.glob(".tmp-*"):
            shutil.rmtree(path, ignore_errors=True)

    def _prune(self) -> None:
        for _, path in self.steps()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    # ------------------------------------------------------------------------------ reading
    def steps(self) -> list[tuple[int, Path]]:
        """``(step, directory)`` of every published checkpoint, oldest first (not verified)."""
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def load_latest(self) -> Checkpoint | None:
        """The newest valid checkpoint, ``None`` if there is none at all.

        Corrupt or incomplete ones are skipped with a :class:`CheckpointWarning` naming the file.

        Raises:
            CheckpointError: checkpoints exist but none is valid, or the newest valid one belongs
                to another run (fingerprint mismatch).
        """
        rejected: list[str] = []
        for _, path in reversed(self.steps()):
            try:
                return self.load(path)
            except _CorruptCheckpoint as corrupt:
                message = f"skipping corrupt checkpoint: {corrupt}"
                _log.warning(message)
                warnings.warn(message, CheckpointWarning, stacklevel=2)
                rejected.append(str(corrupt))
        if rejected:
            raise CheckpointError(
                f"no valid checkpoint in {self.root}:\n  " + "\n  ".join(rejected)
            )
        return None

    def load(self, path: Path | str) -> Checkpoint:
        """Read and verify the checkpoint in directory ``path``.

        Raises:
            CheckpointError: it is valid but of another run (fingerprint differs).
            _CorruptCheckpoint: (a ``CheckpointError``) a file is missing, truncated or corrupt.
        """
        path = Path(path)
        manifest = self._read_manifest(path)
        payloads = {name: self._verified(path / name, entry) for name, entry in manifest["files"].items()}
        if manifest.get("fingerprint", {}) != self.fingerprint:
            raise CheckpointError(
                f"{path / MANIFEST}: checkpoint of another run: its fingerprint "
                f"{manifest.get('fingerprint')} differs from this run's {self.fingerprint}"
            )
        try:
            tables = torch.load(io.BytesIO(payloads["tables.pt"]), weights_only=True)
            dense = torch.load(io.BytesIO(payloads["dense.pt"]), weights_only=True)
            rng_state = torch.load(io.BytesIO(payloads["rng.pt"]), weights_only=True)
        except KeyError as missing:
            raise _CorruptCheckpoint(f"{path / MANIFEST}: lists no file {missing}") from None
        except Exception as exc:
            raise _CorruptCheckpoint(f"{path}: cannot be unpickled: {exc}") from exc
        return Checkpoint(
            step=int(manifest["step"]),
            state=ModelState(tables=tables, dense=dense),
            rng_state=rng_state,
            fingerprint=manifest.get("fingerprint", {}),
            path=path,
        )

    @staticmethod
    def _read_manifest(path: Path) -> dict[str, Any]:
        file = path / MANIFEST
        try:
            manifest = json.loads(file.read_text())
        except FileNotFoundError:
            raise _CorruptCheckpoint(f"{file}: missing") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _CorruptCheckpoint(f"{file}: unreadable: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
            raise _CorruptCheckpoint(
                f"{file}: not a format-{FORMAT_VERSION} checkpoint manifest"
            )
        if not isinstance(manifest.get("files"), dict) or "step" not in manifest:
            raise _CorruptCheckpoint(f"{file}: lacks 'step' or 'files'")
        return manifest

    @staticmethod
    def _verified(file: Path, entry: Mapping[str, Any]) -> bytes:
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise _CorruptCheckpoint(f"{file}: missing") from None
        if len(data) != entry.get("bytes"):
            raise _CorruptCheckpoint(
                f"{file}: {len(data)} bytes, the manifest says {entry.get('bytes')} (truncated?)"
            )
        digest = _sha256(data)
        if digest != entry.get("sha256"):
            raise _CorruptCheckpoint(
                f"{file}: sha256 {digest[:16]}... does not match the manifest's "
                f"{str(entry.get('sha256'))[:16]}..."
            )
        return data

    def clear(self) -> None:
        """Delete every checkpoint of this store (a fresh run that must not resume)."""
        for _, path in self.steps():
            shutil.rmtree(path, ignore_errors=True)
        self._remove_stale_temporaries()


class _CorruptCheckpoint(CheckpointError):
    """One checkpoint is unusable (the message names the file); the store falls back past it."""
