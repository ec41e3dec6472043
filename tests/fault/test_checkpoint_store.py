"""The checkpoint store: round trip, atomic publication, keep-K, checksum fallback, clear errors."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import torch

import bagpipe.core.checkpoint as checkpoint_module
from bagpipe.core.checkpoint import (
    CheckpointError,
    CheckpointStore,
    CheckpointWarning,
    state_digest,
)
from bagpipe.core.interface import ModelState


def _state(value: float) -> ModelState:
    return ModelState(
        tables={"t_a": torch.full((5, 3), value), "t_b": torch.arange(8.0).reshape(4, 2) + value},
        dense={"w": torch.full((2, 2), -value), "b": torch.zeros(2)},
    )


def _save(store: CheckpointStore, step: int) -> None:
    torch.manual_seed(step)
    store.save(step, _state(float(step)), torch.get_rng_state())


def test_round_trip_is_exact(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, fingerprint={"system": "local", "sizes": (5, 4)})
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    saved = store.save(40, _state(1.5), rng)
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 40 and loaded.path == saved.path
    for name, table in _state(1.5).tables.items():
        assert torch.equal(loaded.state.tables[name], table)
    for name, tensor in _state(1.5).dense.items():
        assert torch.equal(loaded.state.dense[name], tensor)
    assert torch.equal(loaded.rng_state, rng)
    assert loaded.resume_point().step == 40
    manifest = json.loads((saved.path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"tables.pt", "dense.pt", "rng.pt"}
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())


def test_empty_store_has_no_checkpoint(tmp_path: Path) -> None:
    assert CheckpointStore(tmp_path / "new").load_latest() is None


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (10, 20, 30, 40):
        _save(store, step)
    assert [step for step, _ in store.steps()] == [30, 40]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: (d / "tables.pt").write_bytes((d / "tables.pt").read_bytes()[:-7]), "truncated"),
        (lambda d: _flip_byte(d / "dense.pt"), "sha256"),
        (lambda d: (d / "rng.pt").unlink(), "rng.pt: missing"),
        (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json: unreadable"),
        (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
    ],
)
def test_corrupt_newest_falls_back_to_previous(
    tmp_path: Path, damage, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    _save(store, 10)
    _save(store, 20)
    damage(tmp_path / "step_00000020")
    with pytest.warns(CheckpointWarning, match=expected) as caught:
        loaded = store.load_latest()
    assert "step_00000020" in str(caught[0].message)
    assert [r.getMessage() for r in caplog.records] == [str(caught[0].message)]
    assert str(caught[0].message).startswith("skipping corrupt checkpoint: ")
    assert loaded is not None and loaded.step == 10
    assert torch.equal(loaded.state.tables["t_a"], _state(10.0).tables["t_a"])


def test_all_corrupt_is_an_error_naming_each_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    _save(store, 20)
    _flip_byte(tmp_path / "step_00000010" / "tables.pt")
    (tmp_path / "step_00000020" / "dense.pt").unlink()
    with pytest.warns(CheckpointWarning), pytest.raises(CheckpointError) as error:
        store.load_latest()
    lines = str(error.value).splitlines()
    assert lines[0] == f"no valid checkpoint in {tmp_path}:"
    assert lines[1] == f"  {tmp_path}/step_00000020/dense.pt: missing"  # newest first
    assert lines[2].startswith(f"  {tmp_path}/step_00000010/tables.pt: sha256 ")
    assert len(lines) == 3


def test_step_zero_is_a_step_and_a_negative_one_is_refused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 0)
    assert [step for step, _ in store.steps()] == [0]
    with pytest.raises(ValueError, match=r"^checkpoint step must be >= 0, got -1$"):
        _save(store, -1)


def test_checkpoint_of_another_run_is_refused(tmp_path: Path) -> None:
    mine = {"seed": 1, "batch": 64}
    CheckpointStore(tmp_path, fingerprint=mine).save(5, _state(0.0), torch.get_rng_state())
    with pytest.raises(CheckpointError, match="another run") as refused:
        CheckpointStore(tmp_path, fingerprint={"seed": 2, "batch": 64}).load_latest()
    # both fingerprints, keys sorted (as they are stored)
    assert ("fingerprint {'batch': 64, 'seed': 1} differs from this run's "
            "{'batch': 64, 'seed': 2}") in str(refused.value)


def test_a_manifest_without_a_fingerprint_is_one_of_a_run_without_one(tmp_path: Path) -> None:
    CheckpointStore(tmp_path).save(5, _state(0.0), torch.get_rng_state())
    manifest_path = tmp_path / "step_00000005" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["fingerprint"]
    manifest_path.write_text(json.dumps(manifest))
    loaded = CheckpointStore(tmp_path).load_latest()
    assert loaded is not None and loaded.fingerprint == {}
    with pytest.raises(CheckpointError, match="another run"):
        CheckpointStore(tmp_path, fingerprint={"seed": 2}).load_latest()


class _Payload:
    """Not a tensor: unpickling it would run arbitrary code, which ``weights_only`` refuses."""


@pytest.mark.parametrize("name", ["tables.pt", "dense.pt", "rng.pt"])
def test_a_payload_that_is_not_tensors_is_refused_even_with_a_valid_checksum(
    tmp_path: Path, name: str
) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    step = tmp_path / "step_00000010"
    buffer = io.BytesIO()
    torch.save({"t_a": _Payload()}, buffer)
    data = buffer.getvalue()
    (step / name).write_bytes(data)
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"^{step}: cannot be unpickled: "):
        store.load(step)


def test_size_resume_point_and_clear(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    _save(store, 20)
    loaded = store.load_latest()
    assert loaded is not None
    rng_bytes = torch.get_rng_state().numel()  # uint8
    assert loaded.nbytes() == (5 * 3 + 4 * 2 + 2 * 2 + 2) * 4 + rng_bytes
    point = loaded.resume_point()
    assert point.step == 20 and point.state is loaded.state
    store.clear()
    assert store.steps() == [] and store.load_latest() is None


def test_the_digest_names_every_tensor_by_kind_name_dtype_and_shape() -> None:
    digest = state_digest(_state(1.0))
    assert digest == state_digest(_state(1.0)) and len(digest) == 64
    changed = _state(1.0)
    changed.tables["t_a"][4, 2] += 1.0
    reshaped = _state(1.0)
    reshaped.tables["t_b"] = reshaped.tables["t_b"].reshape(2, 4)
    retyped = _state(1.0)
    retyped.dense["b"] = torch.zeros(2, dtype=torch.int32)  # the same four zero bytes each
    renamed = _state(1.0)
    renamed.dense["c"] = renamed.dense.pop("b")
    moved = _state(1.0)
    moved.dense["t_b"] = moved.tables.pop("t_b")
    others = [state_digest(s) for s in (changed, reshaped, retyped, renamed, moved)]
    assert len({digest, *others}) == 6


def test_crash_while_writing_leaves_previous_valid(tmp_path: Path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    real_write = checkpoint_module._write_synced
    calls = []

    def crash_on_second_file(path: Path, data: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (injected)")
        real_write(path, data)

    monkeypatch.setattr(checkpoint_module, "_write_synced", crash_on_second_file)
    with pytest.raises(OSError, match="injected"):
        _save(store, 20)
    monkeypatch.undo()
    assert [step for step, _ in store.steps()] == [10]
    assert not list(tmp_path.glob(".tmp-*"))
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 10


def test_half_written_temporary_is_ignored_then_removed(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    orphan = tmp_path / ".tmp-step_00000020-99999"  # a writer killed before the rename
    orphan.mkdir()
    (orphan / "tables.pt").write_bytes(b"partial")
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 10
    _save(store, 20)
    assert not orphan.exists()


def test_retaking_a_step_replaces_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(10, _state(1.0), torch.get_rng_state())
    store.save(10, _state(2.0), torch.get_rng_state())
    loaded = store.load_latest()
    assert loaded is not None
    assert torch.equal(loaded.state.tables["t_a"], _state(2.0).tables["t_a"])
    assert [step for step, _ in store.steps()] == [10]
    assert not list(tmp_path.glob(".tmp-*"))  # the replaced one is gone, not left aside


def test_bad_keep_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"checkpoint\.keep"):
        CheckpointStore(tmp_path, keep=0)


@pytest.mark.parametrize(("keep", "kept"), [(None, [30, 40]), (1, [40])])
def test_keep_defaults_to_two_and_may_be_one(tmp_path: Path, keep, kept) -> None:
    store = CheckpointStore(tmp_path / "a" / "b", **({} if keep is None else {"keep": keep}))
    for step in (10, 20, 30, 40):
        _save(store, step)
    assert [step for step, _ in store.steps()] == kept


def test_save_returns_what_it_wrote_and_any_fingerprint_value_reads_back(tmp_path: Path) -> None:
    fingerprint = {"dir": tmp_path / "data", "sizes": (5, 4), "seed": 3}
    store = CheckpointStore(tmp_path, fingerprint=fingerprint)
    rng = torch.get_rng_state()
    saved = store.save(7, _state(1.0), rng)
    assert (saved.step, saved.path) == (7, tmp_path / "step_00000007")
    assert torch.equal(saved.state.tables["t_a"], _state(1.0).tables["t_a"])
    assert torch.equal(saved.rng_state, rng)
    assert saved.fingerprint == {"dir": str(tmp_path / "data"), "sizes": [5, 4], "seed": 3}
    loaded = CheckpointStore(tmp_path, fingerprint=fingerprint).load_latest()
    assert loaded is not None and loaded.fingerprint == saved.fingerprint


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _manifest_edit(edit):
    def damage(step: Path) -> None:
        manifest = json.loads((step / "manifest.json").read_text())
        (step / "manifest.json").write_text(json.dumps(edit(manifest)))
    return damage


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_manifest_edit(lambda m: {**m, "format": 2}),
         "manifest.json: not a format-1 checkpoint manifest"),
        (_manifest_edit(lambda m: [m]), "manifest.json: not a format-1 checkpoint manifest"),
        (_manifest_edit(lambda m: {k: v for k, v in m.items() if k != "step"}),
         "manifest.json: lacks 'step' or 'files'"),
        (_manifest_edit(lambda m: {**m, "files": list(m["files"])}),
         "manifest.json: lacks 'step' or 'files'"),
        (_manifest_edit(lambda m: {**m, "files": {k: v for k, v in m["files"].items()
                                                  if k != "rng.pt"}}),
         "manifest.json: lists no file 'rng.pt'"),
    ],
)
def test_each_corrupt_manifest_is_named_with_its_fault(tmp_path: Path, damage, message) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    damage(tmp_path / "step_00000010")
    with pytest.raises(CheckpointError) as error:
        store.load(tmp_path / "step_00000010")
    assert str(error.value) == f"{tmp_path / 'step_00000010'}/{message}"


def test_a_truncated_or_altered_file_is_named_with_both_sizes_or_both_checksums(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 10)
    step = tmp_path / "step_00000010"
    manifest = json.loads((step / "manifest.json").read_text())
    size = manifest["files"]["tables.pt"]["bytes"]
    (step / "tables.pt").write_bytes((step / "tables.pt").read_bytes()[:-7])
    with pytest.raises(CheckpointError) as error:
        store.load(step)
    assert str(error.value) == (
        f"{step / 'tables.pt'}: {size - 7} bytes, the manifest says {size} (truncated?)"
    )
    _flip_byte(step / "dense.pt")
    (step / "tables.pt").unlink()
    manifest["files"].pop("tables.pt")
    (step / "manifest.json").write_text(json.dumps(manifest))
    now = hashlib.sha256((step / "dense.pt").read_bytes()).hexdigest()
    with pytest.raises(CheckpointError) as error:
        store.load(step)
    assert str(error.value) == (
        f"{step / 'dense.pt'}: sha256 {now[:16]}... does not match the manifest's "
        f"{manifest['files']['dense.pt']['sha256'][:16]}..."
    )


def test_a_loaded_checkpoint_carries_its_fingerprint(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, fingerprint={"seed": 1}).save(5, _state(0.0), torch.get_rng_state())
    loaded = CheckpointStore(tmp_path, fingerprint={"seed": 1}).load_latest()
    assert loaded is not None and loaded.fingerprint == {"seed": 1}
